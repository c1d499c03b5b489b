"""Figures of the serving-load experiment (:mod:`workbench.experiments.serving_load`, notebook ``08_serving_load``),
from its points and requests: the sweep's (latency against throughput, goodput and queue against rate, the Gantt
chart, time slices: :mod:`workbench.share.figures_serving`), :func:`recommendation_table` (the
:func:`workbench.load.saturation.recommend` table) and :func:`engine_ratio_figure` (the engine comparison);
:func:`figures` assembles them by file name.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from workbench import checks
from workbench.experiments.serving_load.runs import EXPERIMENT, TTFT
from workbench.experiments.serving_load.summaries import compared, recommend
from workbench.load import saturation
from workbench.serving import engines as engines_mod
from workbench.share import figures_design
from workbench.share.figures_serving import gantt, goodput_vs_rate, latency_vs_throughput, queue_vs_rate, time_slices
from workbench.share.plots import split_by_device, table_figure
from workbench.stats import evidence


def recommendation_table(points: pd.DataFrame, target: float = 0.9) -> go.Figure:
    """The :func:`workbench.load.saturation.recommend` table as a figure."""
    points = saturation.sweep_points(points)
    rec = recommend(points, target)
    cols = ["slo", "engine", "max_rate_rps", "goodput_rps", "attainment", "attainment_low", "attainment_high",
            "attainment_lower", "requests", "verdict", "source"]
    usable = evidence.usable_points(points, serving=True) if not points.empty else points
    why = ("no usable open-loop point (valid, not stopped early)" if usable.empty
           else f"no SLO preset scored on the {len(usable)} usable points")
    if not rec.empty:   # no rate met it: "none", not a rate of 0 req/s
        rec = rec.assign(max_rate_rps=rec["max_rate_rps"].astype(object).where(rec["max_rate_rps"] > 0, None),
                         goodput_rps=rec["goodput_rps"].astype(object).where(rec["max_rate_rps"] > 0, None))
    return table_figure(rec[[c for c in cols if c in rec]] if not rec.empty else rec,
                        f"Recommended engine per SLO (one-sided 95% lower bound of attainment >= {target:.0%}; "
                        "MLPerf presets at p99 from >= 100 requests)", empty_reason=why)


@split_by_device
def figures(points: pd.DataFrame, requests: pd.DataFrame, target: float = 0.9, run_dir=None) -> dict[str, go.Figure]:
    """All figures of the serving-load notebook, by file name: the sweep's (the engine comparison's runs left out)
    and, with the comparison, its engines' ratio figure (``run_dir``: its rounds, drawn faint)."""
    sweep = saturation.sweep_points(points)
    req = requests[requests["point_id"].isin(sweep["point_id"])] if "point_id" in requests and "point_id" in sweep \
        else requests
    out = {
        "load_latency_vs_throughput": latency_vs_throughput(sweep),
        "load_goodput_vs_rate": goodput_vs_rate(sweep),
        "load_queue_vs_rate": queue_vs_rate(sweep),
        "load_gantt": gantt(sweep, req),
        "load_time_slices": time_slices(sweep),
        "load_recommendation": recommendation_table(sweep, target),
    }
    if not compared(points).empty:
        out["load_engine_ratio"] = engine_ratio_figure(points, run_dir)
    return out


def engine_ratio_figure(points: pd.DataFrame, run_dir=None) -> go.Figure:
    """Each engine's run TTFT p50 over the control's under the same load, with the simultaneous interval its verdict
    was read from, each round's ratio faint, the equivalence band and the A/A control's interval
    (:func:`workbench.share.figures_design.ratio_figure`)."""
    rows = compared(points)
    rows = rows[rows.index != "aa"].reset_index()
    order = {e: i for i, e in enumerate(engines_mod.ENGINES)}
    df = rows.assign(point_id=rows["_arm"], engine_order=rows["_arm"].map(order))
    rate = checks.float_or_nan(rows["offered_rps"].iloc[0]) if len(rows) and "offered_rps" in rows else float("nan")
    fig = figures_design.ratio_figure(df, "engine_order", TTFT.prefix,
                                      figures_design.round_ratios(run_dir, EXPERIMENT, TTFT.name),
                                      name="TTFT p50 ratio", x_title="engine",
                                      y_title="run TTFT p50 / the control's (x, log scale)",
                                      title=f"Engines under the same load ({rate:.2f} req/s): TTFT p50 against the "
                                            "control, the run as the unit (simultaneous 95% intervals; faint: each "
                                            "round; grey band: the A/A control)")
    fig.update_xaxes(tickmode="array", tickvals=list(order.values()), ticktext=list(order))
    fig.update_yaxes(type="log")
    return fig
