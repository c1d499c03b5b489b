"""The serving twin beside a run's measured serving points, as notebooks 08 and 11 and the report show it: the
figure (per point TTFT and e2e p50, measured and simulated) and the notebooks' section (validate, save the figure,
add the disagreement to the experiment's finding, the sentence). The numbers are
:mod:`workbench.predict.twin_validation`'s.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.errors import ParameterError
from workbench.load import load
from workbench.predict import twin_validation
from workbench.run import results
from workbench.share.plots import tidy_legend


def figure(table: pd.DataFrame, experiment: str):
    """The twin beside the measurement: per point TTFT p50 and e2e p50, measured (markers) and simulated (dashed,
    open markers); ``serving_load`` against the offered rate per engine, ``scheduling`` per policy / workload."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT p50 (s)", "e2e p50 (s)"))
    df = table[table["experiment"] == experiment] if not table.empty else table
    if experiment == "serving_load":
        groups = [(e, g[g["profile"].isin(load.OPEN_LOOP)].sort_values("offered_rps")) for e, g in df.groupby("engine")]
        xcol = "offered_rps"
    else:
        work = df.get("workload", pd.Series([None] * len(df), index=df.index))
        cache = ["prefix_sharing=True" in str(pid) for pid in df["point_id"]]   # multi-turn with / without the cache
        df = df.assign(label=[f"{w or 'mixed'}:{p}" + (" +cache" if c else "")
                              for w, p, c in zip(work, df["policy"], cache)])
        groups, xcol = [("", df)], "label"
    # against the offered rate a line joins one engine's simulated rates; per policy / workload (a category, each
    # measured per round) a line would zig-zag between rounds and categories: open markers only
    sim_mode = "lines+markers" if experiment == "serving_load" else "markers"
    for name, g in groups:
        for col, c in (("ttft_s_p50", 1), ("e2e_s_p50", 2)):
            fig.add_trace(go.Scatter(x=g[xcol], y=g[f"measured_{col}"], mode="markers", name=f"{name} measured".strip(),
                                     legendgroup=f"{name}m", showlegend=c == 1), row=1, col=c)
            fig.add_trace(go.Scatter(x=g[xcol], y=g[f"simulated_{col}"], mode=sim_mode,
                                     line=dict(dash="dash"), marker=dict(symbol="circle-open", size=9),
                                     name=f"{name} simulated".strip(), legendgroup=f"{name}s", showlegend=c == 1),
                          row=1, col=c)
    fig.update_layout(title="The serving twin (source=simulated, a prediction) beside the measured points")
    tidy_legend(fig)   # at the top the legend sat on the subplot titles
    # from 0 s: on an axis fitted to two points 3% apart a twin within a few percent looked far off
    fig.update_yaxes(rangemode="tozero")
    if experiment == "serving_load":
        fig.update_xaxes(title_text="offered rate (req/s)")
    return fig


def notebook_section(run_dir, experiment: str, finding=None):
    """What notebooks 08 and 11 show of the twin: :func:`~workbench.predict.twin_validation.validate` on the run (writing ``twin_validation.csv`` and
    ``metrics.json``), the figure ``twin_<experiment>`` saved, and its ``sentence`` with its ``disagreement``.
    Given the experiment's saved ``finding`` (:class:`workbench.stats.evidence.Finding`), it is saved again with
    the disagreement added to its evidence, so the report's serving finding says where the twin and the
    measurement part (its text and mark unchanged). Without a calibration in the run (no batch-size /
    context-length rows, no ``twin_calibration.json``) it says why and shows nothing.

    Returns:
        ``(table, figure or None, sentence)``.
    """
    try:
        table, summ = twin_validation.validate(run_dir)
    except ParameterError as exc:
        return pd.DataFrame(), None, f"twin: not shown ({exc})"
    fig = figure(table, experiment)
    results.save_figure(run_dir, f"twin_{experiment}", fig)
    apart = twin_validation.disagreement(table, experiment)
    if finding is not None and apart and hasattr(finding, "evidence"):
        evidence = f"{finding.evidence.rstrip('. ')}. {apart}" if finding.evidence else apart
        results.save_finding(run_dir, experiment, dataclasses.replace(finding, evidence=evidence))
    return table, fig, " ".join(t for t in (twin_validation.sentence(summ), apart) if t)


def show_section(run_dir, experiment: str, finding=None) -> pd.DataFrame:
    """The twin cell of notebooks 08 and 11: :func:`notebook_section`, its figure shown and its sentence printed.

    Returns:
        The validation table (empty when the run has no calibration).
    """
    table, fig, text = notebook_section(run_dir, experiment, finding)
    if fig is not None:
        fig.show()
    print(text)
    return table
