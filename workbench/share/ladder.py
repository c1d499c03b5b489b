"""The speed ladder's figures: where one decode step's time goes, per rung (:mod:`workbench.predict.profile_step`)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from workbench.predict.profile_step import COMPONENTS, LABELS
from workbench.share.plots import label, legend_below


def fig_profile(table: pd.DataFrame, reference_s: float | None = None, reference_name: str = "llama.cpp") -> go.Figure:
    """Stacked bars: per rung (``rung`` column), milliseconds per decode step in each component, with the
    roofline's bytes-at-bandwidth time (``roofline_s``) as a marker and an external engine's step time as a
    line when given."""
    fig = go.Figure()
    for c in COMPONENTS:
        if c in table:
            fig.add_bar(x=table["rung"], y=table[c] * 1e3, name=LABELS[c])
    if "roofline_s" in table:
        fig.add_scatter(x=table["rung"], y=table["roofline_s"] * 1e3, mode="markers", name="roofline (bytes / bandwidth)",
                        marker=dict(symbol="line-ew-open", size=28, line=dict(width=3, color="#222")))
    if reference_s is not None and reference_s == reference_s:
        fig.add_hline(y=reference_s * 1e3, line_dash="dot", annotation_text=f"{reference_name} decode step")
    fig.update_layout(barmode="stack", title="Where one decode step's time goes, per rung (batch 1)",
                      yaxis_title="ms per decode step", xaxis_title=label("quantization"))
    return legend_below(fig)
