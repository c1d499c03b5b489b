"""Figures of the serving experiments: a load sweep per engine (notebook ``08_serving_load``) and a mixed workload
per scheduling policy (notebook ``11_scheduling``).

Load sweep (points of :mod:`workbench.load.load` runs, one curve per engine, :func:`engine_colours`): latency
against achieved throughput, goodput and SLO attainment against offered rate with the knee
(:func:`workbench.load.saturation.knees`), queue time against offered rate, and at the busiest swept rate
(:func:`busiest_points`) a per-request timeline and the time slices. Mixed workload (request rows with
``request_class`` and ``policy``, tables of :mod:`workbench.stats.classes`, :func:`policy_colours`): latency per class
and policy, slowdown against request length, the longest wait, the ETA told against the actual wait, goodput per
class, TTFT by turn of multi-turn conversations, and the cache hit rate of prefix sharing against the TTFT it saved.
Each takes the points / requests tables and returns a plotly figure; the experiments assemble them (with their own recommendation tables) in ``figures``.
"""

from __future__ import annotations

import json

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.load import load, saturation
from workbench.serving import engines as engines_mod
from workbench.serving import scheduling
from workbench.share.plots import label, mark_invalid, ok_points
from workbench.stats.classes import CLASSES, bucket_summary, class_summary, mixed_rows

# ----------------------------------------------------------------------------- a load sweep, per engine


def engine_colours(names=()):
    """A colour per built-in engine, then per other label (an external endpoint) in ``names``."""
    import plotly.express as px

    labels = list(engines_mod.ENGINES) + sorted({str(n) for n in names} - set(engines_mod.ENGINES))
    return dict(zip(labels, px.colors.qualitative.Safe))


def latency_vs_throughput(points: pd.DataFrame) -> go.Figure:
    """TTFT p50 (solid) and p90/p99 (dashed/dotted, where enough samples) and TPOT p50 versus achieved output
    throughput, one curve per engine; hover shows the profile and offered rate."""
    df = ok_points(points).sort_values(["engine", "output_throughput_tps"])
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT", "TPOT p50"))
    col = engine_colours(points.get("engine", ()))
    for e, g in df.groupby("engine"):
        hover = [f"{p} @ {o:.2f} req/s offered" for p, o in zip(g["profile"], g["offered_rps"])]
        for stat, dash in (("p50", "solid"), ("p90", "dash"), ("p99", "dot")):
            y = g.get(f"ttft_s_{stat}")
            if y is None or y.isna().all():
                continue
            fig.add_trace(go.Scatter(x=g["output_throughput_tps"], y=y, mode="lines+markers", name=f"{e} TTFT {stat}",
                                     line=dict(color=col.get(e), dash=dash), hovertext=hover), row=1, col=1)
        fig.add_trace(go.Scatter(x=g["output_throughput_tps"], y=g["tpot_s_p50"], mode="lines+markers",
                                 name=f"{e} TPOT p50", line=dict(color=col.get(e)), hovertext=hover,
                                 showlegend=True), row=1, col=2)
    mark_invalid(fig, df, "output_throughput_tps", "ttft_s_p50", row=1, col=1)
    mark_invalid(fig, df, "output_throughput_tps", "tpot_s_p50", row=1, col=2)
    fig.update_xaxes(title_text=label("output_throughput_tps"))
    fig.update_yaxes(title_text=label("ttft_s"), row=1, col=1)
    fig.update_yaxes(title_text=label("tpot_s"), row=1, col=2)
    fig.update_layout(title="Latency vs achieved output throughput, per engine")
    return fig


def knee_offered_rps(points: pd.DataFrame, engine: str, knee: float) -> float:
    """Where an engine's knee sits on an offered-rate axis: the offered rate of the point the knee is (the knee is that
    point's realised arrival rate, :func:`workbench.load.saturation.point_rates`, a few percent off its offered
    one); ``knee`` itself when no point matches."""
    kp = saturation.knee_points(points)
    kp = kp[kp["engine"] == engine] if "engine" in kp else kp
    if kp.empty:
        return knee
    hit = kp.loc[(saturation.point_rates(kp).astype(float) - knee).abs() <= 1e-9 * max(1.0, abs(knee)), "offered_rps"]
    return float(hit.iloc[0]) if len(hit) else knee


def _by_loop(g: pd.DataFrame) -> list:
    """``g`` split into its open-loop points (an arrival rate offered: joined by a line) and its closed-loop ones
    (synchronous, concurrency, throughput: their "offered" rate is the rate they reached, another experiment:
    markers only, never on the open-loop line), as ``[(rows, closed, suffix), ...]`` for the non-empty parts."""
    closed = g["profile"].isin(load.CLOSED_LOOP) if "profile" in g else pd.Series(False, index=g.index)
    return [(part, c, " (closed loop)" if c else "") for part, c in ((g[~closed], False), (g[closed], True))
            if not part.empty]


def _loop_style(closed: bool) -> dict:
    """Plotly trace arguments: a line through open-loop points; open diamonds, no line, for closed-loop ones."""
    return dict(mode="markers", marker=dict(symbol="diamond-open", size=9)) if closed else dict(mode="lines+markers")


def goodput_vs_rate(points: pd.DataFrame) -> go.Figure:
    """Goodput (custom SLO) and SLO attainment (with its Wilson 95% interval over the planned requests) versus
    offered rate per engine, the knee (:func:`workbench.load.saturation.knees`) marked. The open-loop points
    (an offered arrival rate) are joined by a line; closed-loop points (their rate is what they reached) are open
    diamonds beside it (:func:`_by_loop`)."""
    df = ok_points(points).sort_values(["engine", "offered_rps"])
    fig = make_subplots(rows=1, cols=2, subplot_titles=("goodput (custom SLO)", "SLO attainment (custom SLO)"))
    col = engine_colours(points.get("engine", ()))
    kn = saturation.knees(points)
    for e, eg in df.groupby("engine"):
        for g, closed, suffix in _by_loop(eg):
            style = _loop_style(closed)
            fig.add_trace(go.Scatter(x=g["offered_rps"], y=g["goodput_rps"], name=f"{e} goodput{suffix}",
                                     line=dict(color=col.get(e)), hovertext=g["profile"], legendgroup=e, **style),
                          row=1, col=1)
            err = None
            if {"slo_attainment_low", "slo_attainment_high"} <= set(g.columns):
                err = dict(type="data", symmetric=False,
                           array=(g["slo_attainment_high"] - g["slo_attainment"]).clip(lower=0),
                           arrayminus=(g["slo_attainment"] - g["slo_attainment_low"]).clip(lower=0))
            hover = [f"{p}; kept up: {saturation.kept_up(r)}" for p, (_, r) in zip(g["profile"], g.iterrows())]
            fig.add_trace(go.Scatter(x=g["offered_rps"], y=g["slo_attainment"], error_y=err,
                                     name=f"{e} attainment{suffix}", line=dict(color=col.get(e), dash="dash"),
                                     hovertext=hover, legendgroup=e, **style), row=1, col=2)
        knee = kn.get(e, float("nan"))  # NaN: no usable point, or none kept up
        if knee == knee:
            x = knee_offered_rps(points, e, knee)
            for c in (1, 2):
                fig.add_vline(x=x, line=dict(color=col.get(e), dash="dot"), row=1, col=c)
            # labelled in the legend, not beside the line: an annotation by a line near the axis ran over the axis
            # title in the paper-size image
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line=dict(color=col.get(e), dash="dot"),
                                     name=f"{e} knee: {knee:.3g} req/s arrived", legendgroup=e), row=1, col=1)
    mark_invalid(fig, df, "offered_rps", "goodput_rps", row=1, col=1)
    mark_invalid(fig, df, "offered_rps", "slo_attainment", row=1, col=2)
    fig.update_xaxes(title_text="offered rate (requests/s)")
    fig.update_yaxes(title_text=label("goodput_rps"), row=1, col=1)
    fig.update_yaxes(title_text=label("slo_attainment"), range=[0, 1.05], row=1, col=2)
    fig.update_layout(title="Goodput and SLO attainment (bars: 95% Wilson interval) vs offered rate (dotted: the knee; "
                            "diamonds: closed-loop points at the rate they reached)")
    return fig


def queue_vs_rate(points: pd.DataFrame) -> go.Figure:
    """Engine-side queue time p50 (solid) and p90 (dashed) versus offered rate, per engine; open-loop points joined,
    closed-loop points as open diamonds (:func:`_by_loop`)."""
    df = ok_points(points).sort_values(["engine", "offered_rps"])
    fig = go.Figure()
    col = engine_colours(points.get("engine", ()))
    for e, eg in df.groupby("engine"):
        for g, closed, suffix in _by_loop(eg):
            style = _loop_style(closed)
            fig.add_trace(go.Scatter(x=g["offered_rps"], y=g["queue_s_p50"], name=f"{e} p50{suffix}",
                                     line=dict(color=col.get(e)), legendgroup=e, **style))
            if g["queue_s_p90"].notna().any():
                fig.add_trace(go.Scatter(x=g["offered_rps"], y=g["queue_s_p90"], name=f"{e} p90{suffix}",
                                         line=dict(color=col.get(e), dash="dash"), legendgroup=e, **style))
    mark_invalid(fig, df, "offered_rps", "queue_s_p50")
    fig.update_layout(title="Queue time (arrival to admission) vs offered rate (diamonds: closed-loop points)",
                      xaxis_title="offered rate (requests/s)", yaxis_title=label("queue_s"))
    return fig


def busiest_points(points: pd.DataFrame) -> pd.DataFrame:
    """The highest open-loop step of each engine (the busiest swept rate)."""
    df = ok_points(points)
    sw = df[df["profile"].isin(load.ARRIVALS)]
    return sw.sort_values("step").groupby("engine").tail(1) if not sw.empty else df.groupby("engine").tail(1)


def gantt(points: pd.DataFrame, requests: pd.DataFrame) -> go.Figure:
    """Per-request timeline at the busiest swept rate, one panel per engine: grey from arrival to admission
    (queue), coloured from admission to the last token."""
    pick = busiest_points(points)
    fig = make_subplots(rows=max(1, len(pick)), cols=1, shared_xaxes=True,
                        subplot_titles=[f"{r.engine}, {r.profile} {r.offered_rps:.2f} req/s" for r in pick.itertuples()])
    col = engine_colours(points.get("engine", ()))
    for i, r in enumerate(pick.itertuples(), 1):
        q = requests[requests["point_id"] == r.point_id].sort_values("request_id")
        if q.empty:
            continue
        start = q["t_scheduled_s"]
        queue = q["queue_s"].fillna(0).clip(lower=0) + (q["t_start_s"] - q["t_scheduled_s"])
        end = start + q["e2e_s"]
        fig.add_trace(go.Bar(y=q["request_id"], x=queue, base=start, orientation="h", marker_color="lightgrey",
                             name="queued", showlegend=i == 1), row=i, col=1)
        fig.add_trace(go.Bar(y=q["request_id"], x=end - start - queue, base=start + queue, orientation="h",
                             marker_color=col.get(r.engine), name=f"{r.engine} served"), row=i, col=1)
    fig.update_layout(barmode="overlay", title="Per-request timeline (queued, then served)", height=250 * max(1, len(pick)))
    fig.update_xaxes(title_text="seconds after the first arrival")
    return fig


def time_slices(points: pd.DataFrame) -> go.Figure:
    """Requests in flight and completed per time slice at the busiest swept rate, per engine (steady state?)."""
    pick = busiest_points(points)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("in flight at slice end", "completed per slice"))
    col = engine_colours(points.get("engine", ()))
    for r in pick.itertuples():
        sl = pd.DataFrame(json.loads(r.slices_json)) if isinstance(r.slices_json, str) else pd.DataFrame()
        if sl.empty:
            continue
        fig.add_trace(go.Scatter(x=sl["slice_start_s"], y=sl["in_flight"], mode="lines+markers", name=f"{r.engine}",
                                 line=dict(color=col.get(r.engine))), row=1, col=1)
        fig.add_trace(go.Bar(x=sl["slice_start_s"], y=sl["completed"], name=f"{r.engine} completed",
                             marker_color=col.get(r.engine)), row=1, col=2)
    fig.update_xaxes(title_text="slice start (s after the first arrival)")
    fig.update_layout(title="Time slices at the busiest swept rate")
    return fig


# ----------------------------------------------------------------------------- a mixed workload, per policy


def policy_colours():
    """A colour per scheduling policy (:data:`workbench.serving.scheduling.POLICIES`)."""
    import plotly.express as px

    return dict(zip(scheduling.POLICIES, px.colors.qualitative.Safe))


def class_latency(requests: pd.DataFrame) -> go.Figure:
    """TTFT p50 / p90 and queue time p50 per class (panels) and policy (bars)."""
    summ = class_summary(requests)
    fig = make_subplots(rows=1, cols=3, subplot_titles=("TTFT p50", "TTFT p90", "queue time p50"))
    col = policy_colours()
    for p, g in summ.groupby("policy", sort=False):
        for i, c in enumerate(("ttft_s_p50", "ttft_s_p90", "queue_s_p50"), 1):
            fig.add_trace(go.Bar(x=g["request_class"], y=g[c], name=p, marker_color=col.get(p), showlegend=i == 1,
                                 legendgroup=p), row=1, col=i)
    fig.update_yaxes(title_text="seconds")
    fig.update_layout(barmode="group", title="Latency per class and policy (mixed workload)")
    return fig


def slowdown_vs_length(requests: pd.DataFrame) -> go.Figure:
    """Median slowdown (e2e over the service alone) per output-length bucket, one line per policy."""
    b = bucket_summary(requests)
    fig = go.Figure()
    col = policy_colours()
    for p, g in b.groupby("policy", sort=False):
        fig.add_trace(go.Scatter(x=g["max_tokens"], y=g["slowdown_p50"], mode="lines+markers", name=p,
                                 line=dict(color=col.get(p))))
    fig.update_layout(title="Slowdown vs request length (1 = as fast as alone)", xaxis_title="output tokens",
                      yaxis_title="slowdown p50 (e2e / service alone)")
    return fig


def longest_wait(points: pd.DataFrame) -> go.Figure:
    """The longest queue wait per policy (starvation)."""
    df = ok_points(points)
    df = df[df.get("workload", pd.Series(dtype=str)) == "mixed"] if not df.empty else df
    fig = go.Figure(go.Bar(x=df.get("policy", []), y=df.get("queue_s_max", []),
                           marker_color=[policy_colours().get(p) for p in df.get("policy", [])]))
    fig.update_layout(title="Longest wait in the queue per policy", yaxis_title="queue time max (s)")
    return fig


def eta_error(requests: pd.DataFrame) -> go.Figure:
    """The ETA told at arrival against the actual wait, per policy (the diagonal: an exact ETA)."""
    df = mixed_rows(requests)
    fig = go.Figure()
    col = policy_colours()
    for p, g in df.groupby("policy", sort=False):
        fig.add_trace(go.Scatter(x=g["queue_s"], y=g.get("eta_s"), mode="markers", name=p, marker_color=col.get(p)))
    hi = float(pd.to_numeric(df.get("queue_s", pd.Series(dtype=float)), errors="coerce").max() or 1.0) if len(df) else 1.0
    fig.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", name="exact", line=dict(color="grey", dash="dot")))
    fig.update_layout(title="ETA told at arrival vs actual wait", xaxis_title="actual queue time (s)",
                      yaxis_title="ETA at arrival (s)")
    return fig


def goodput_per_class(points: pd.DataFrame) -> go.Figure:
    """Goodput per class under the class's TTFT SLO, per policy."""
    df = ok_points(points)
    df = df[df.get("workload", pd.Series(dtype=str)) == "mixed"] if not df.empty else df
    fig = go.Figure()
    col = policy_colours()
    for r in df.itertuples():
        ys = [getattr(r, f"goodput_rps_{c}", float("nan")) for c in CLASSES]
        fig.add_trace(go.Bar(x=list(CLASSES), y=ys, name=r.policy, marker_color=col.get(r.policy)))
    fig.update_layout(barmode="group", title="Goodput per class under its TTFT SLO", yaxis_title="goodput (requests/s)")
    return fig


def ttft_by_turn(points: pd.DataFrame, requests: pd.DataFrame) -> go.Figure:
    """TTFT p50 by turn index of the multi-turn conversations (the prompt grows with the history), one line per
    prefix-sharing setting, its cache hit rate in the legend ("n/a" where the engine reports none)."""
    df = requests[requests.get("workload", pd.Series(dtype=str)) == "multiturn"] if not requests.empty else requests
    fig = go.Figure()
    hit = {}
    if not points.empty and "cache_hit_rate" in points and "prefix_sharing" in points:
        hit = {bool(r.prefix_sharing): r.cache_hit_rate for r in points.itertuples() if r.workload == "multiturn"}
    if not df.empty and "turn" in df:
        share = df["prefix_sharing"].fillna(False).astype(bool) if "prefix_sharing" in df else pd.Series(False, df.index)
        for v, g in df.groupby(share):
            med = g.groupby("turn")["ttft_s"].median()
            h = hit.get(bool(v), float("nan"))
            name = f"prefix sharing {'on' if v else 'off'} (hit rate {'n/a' if h != h else f'{h:.0%}'})"
            fig.add_trace(go.Scatter(x=med.index, y=med.values, mode="lines+markers", name=name))
    fig.update_layout(title="Multi-turn: TTFT by turn", xaxis_title="turn", yaxis_title="TTFT p50 (s)",
                      xaxis=dict(dtick=1, tick0=1))  # turns are whole numbers
    return fig


def prefix_savings_figure(sav: pd.DataFrame, measured_both_ways: bool = False) -> go.Figure:
    """Cache hit rate with prefix sharing on against the run TTFT ratio on / off (the prefix design's simultaneous
    interval as the bar: :func:`workbench.experiments.scheduling.prefix_savings`), one marker per prefix workload, its
    verdict and rounds in the label, the line at 1; an empty ``sav`` says why (``measured_both_ways``: points with
    sharing off and on exist, none usable)."""
    fig = go.Figure()
    for r in sav.itertuples():
        shown = r.sharing_ttft_ratio_low == r.sharing_ttft_ratio_low
        fig.add_trace(go.Scatter(
            x=[r.cache_hit_rate_on], y=[r.sharing_ttft_ratio], mode="markers+text", text=[r.verdict],
            textposition="top center", name=f"{r.workload} ({r.rounds} rounds)",
            error_y=dict(type="data", symmetric=False,
                         array=[r.sharing_ttft_ratio_high - r.sharing_ttft_ratio if shown else 0],
                         arrayminus=[r.sharing_ttft_ratio - r.sharing_ttft_ratio_low if shown else 0])))
    fig.add_hline(y=1, line=dict(color="grey", dash="dot"))
    if sav.empty:
        fig.add_annotation(text="no usable pair of points with sharing off and on" if measured_both_ways
                           else "prefix sharing was not measured both ways", showarrow=False, xref="paper",
                           yref="paper", x=0.5, y=0.5)
    fig.update_layout(title="Prefix sharing: cache hit rate vs run TTFT on / off (the run as the unit; bars: the "
                            "design's simultaneous 95% interval)",
                      xaxis_title="cache hit rate with sharing on (cached / prompt tokens)",
                      yaxis_title="run TTFT with sharing on / off (x)", xaxis=dict(tickformat=".0%", range=[0, 1.02]))
    return fig


