"""The house plotly template and the label lookup every experiment's figures use.

Importing this module registers the ``workbench`` template (plotly ``doc/python/templates.md``) and
makes it the default. Axis labels and units come from the column table
(:data:`workbench.metrics.COLUMNS`) through :func:`label`; each experiment module builds its own
figures from tidy point and request tables (DESIGN.md section 5).
"""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import plotly.io as pio

from . import metrics

pio.templates["workbench"] = go.layout.Template(
    layout=dict(
        font=dict(family="Inter, Helvetica, Arial, sans-serif", size=13),
        colorway=px.colors.qualitative.Safe,
        margin=dict(l=70, r=30, t=60, b=60),
        hovermode="closest",
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1),
    )
)
pio.templates.default = "plotly_white+workbench"

def label(column: str) -> str:
    """Axis label with unit of a column or aggregate, from the one column table (:data:`workbench.metrics.COLUMNS`)."""
    return metrics.label(column)


def labels(*columns: str, **extra: str) -> dict[str, str]:
    """``labels=`` mapping for plotly express: each column's :func:`label`, plus ``extra`` names."""
    return {**{c: label(c) for c in columns}, **extra}


def ok_points(points: pd.DataFrame) -> pd.DataFrame:
    """Points whose status is ``ok`` (failed points carry no figures)."""
    return points[points["status"] == "ok"].copy() if "status" in points else points.copy()


def legend_below(fig: go.Figure, y: float = -0.18, bottom: int = 140) -> go.Figure:
    """Put the legend under the plot (horizontal, left-aligned) so long trace names never cover the title.

    Args:
        fig: the figure (changed in place).
        y: legend top in paper coordinates (below the x axis title).
        bottom: bottom margin in pixels that makes room for it.

    Returns:
        ``fig``.
    """
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=y, xanchor="left", x=0),
                      margin=dict(b=bottom))
    return fig


def mark_invalid(fig: go.Figure, points: pd.DataFrame, x: str, y: str) -> go.Figure:
    """Overlay grey crosses on the points marked invalid (other load or drift while measured).

    Args:
        fig: the figure (changed in place).
        points: the points table with ``valid``, ``invalid_reason`` and the ``x`` / ``y`` columns.

    Returns:
        ``fig``; unchanged when no point is invalid.
    """
    if "valid" not in points or x not in points or y not in points:
        return fig
    bad = points[points["valid"].eq(False)]
    if bad.empty:
        return fig
    fig.add_trace(go.Scatter(x=bad[x], y=bad[y], mode="markers", name="invalid (greyed)",
                             marker=dict(symbol="x-thin-open", size=16, color="#999", line=dict(width=2)),
                             hovertext=bad.get("invalid_reason"), hoverinfo="text"))
    return fig


def error_y(df: pd.DataFrame, column: str) -> dict | None:
    """``error_y`` arrays for a ``<column>`` p50 from its bootstrap CI columns, or None when absent."""
    lo, hi = f"{column}_ci_low", f"{column}_ci_high"
    if lo not in df or hi not in df or df[[lo, hi]].isna().all().all():
        return None
    return dict(type="data", symmetric=False, array=(df[hi] - df[column]).clip(lower=0),
                arrayminus=(df[column] - df[lo]).clip(lower=0))
