"""Figures of the streaming-anatomy experiment (:mod:`workbench.experiments.streaming_anatomy`, notebook
``04_streaming_anatomy``), from its requests and points.

:func:`itl_histogram_figure` and :func:`itl_position_figure` (inter-token latency, from :func:`itl_long_form`),
:func:`perceived_latency_figure` (streaming vs waiting, with the roofline's prediction), :func:`timeline_figure`
(per request), :func:`granularity_figure`, :func:`transport_figure` (client vs engine TTFT over HTTP) and
:func:`tpot_ratio_figure` and :func:`http_ratio_figure` (the designs' ratios); :func:`figures` assembles them by
file name.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.experiments.streaming_anatomy.summaries import CLIENT_TTFT, TPOT, granularity_table, sweep_rows
from workbench.predict import predictions
from workbench.share import plots


def itl_long_form(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per inter-token gap: ``position`` (the later token's index, 1-based from the 2nd token) and ``itl_ms``."""
    rows = []
    for _, q in requests.iterrows():
        for i, v in enumerate(list(q["itl_s"])):
            rows.append({"position": i + 1, "itl_ms": 1000 * float(v), "max_new_tokens": q.get("max_new_tokens"),
                         "length": f"{q.get('max_new_tokens')} tokens", "repeat": q.get("repeat", 0),
                         "request_id": q.get("request_id", 0)})
    return pd.DataFrame(rows)


def itl_histogram_figure(requests: pd.DataFrame) -> go.Figure:
    """Histogram of inter-token latency (ms), one colour per output length."""
    df = itl_long_form(requests)
    return px.histogram(df, x="itl_ms", color="length", barmode="overlay", nbins=60, opacity=0.6,
                        labels={"itl_ms": "inter-token latency (ms)", "length": "output length"},
                        title="Inter-token latency distribution")


def itl_position_figure(requests: pd.DataFrame) -> go.Figure:
    """ITL (ms) against token position, one line per output length (first repeat, first request)."""
    df = itl_long_form(requests)
    df = df[(df["repeat"] == df["repeat"].min()) & (df["request_id"] == df["request_id"].min())]
    return px.line(df, x="position", y="itl_ms", color="length",
                   labels={"position": "token position", "itl_ms": "inter-token latency (ms)", "length": "output length"},
                   title="Inter-token latency vs position in the output")


def perceived_latency_figure(requests: pd.DataFrame) -> go.Figure:
    """Time to first visible text when streaming vs when waiting for the whole answer, against output tokens."""
    g = requests.groupby("max_new_tokens", as_index=False).agg(
        output_tokens=("output_tokens", "median"), ttft_s=("ttft_s", "median"),
        first_display_s=("first_display_s", "median"), e2e_s=("e2e_s", "median"))
    long = pd.concat([
        g.assign(mode="streaming (first text at TTFT)", seconds=g["first_display_s"]),
        g.assign(mode="whole answer (text at e2e)", seconds=g["e2e_s"]),
    ])
    fig = px.line(long, x="output_tokens", y="seconds", color="mode", markers=True,
                  labels={"output_tokens": "output tokens (median)", "seconds": "time until the user sees text (s)"},
                  title="Perceived latency: streaming vs waiting for the whole answer")
    pred = predictions.predict_rows(requests).groupby("max_new_tokens", as_index=False).agg(  # dotted: the roofline
        output_tokens=("output_tokens", "median"), predicted_ttft_s=("predicted_ttft_s", "median"),
        predicted_e2e_s=("predicted_e2e_s", "median"))
    predictions.add_predicted_line(fig, pred, "output_tokens", "predicted_ttft_s", name="predicted TTFT")
    predictions.add_predicted_line(fig, pred, "output_tokens", "predicted_e2e_s", name="predicted whole answer")
    return fig


def timeline_figure(requests: pd.DataFrame, title: str = "Per-request timeline") -> go.Figure:
    """Per-request timeline: a bar from start to first token (TTFT), then a tick per token (or per chunk).

    Args:
        requests: rows with ``request_id``, ``ttft_s``, ``itl_s`` (token gaps) or, for HTTP rows,
            ``chunk_itl_s`` (text-chunk gaps), and optional ``t_start_s`` (request start relative
            to the first request's, s).
    """
    fig = go.Figure()
    for _, q in requests.iterrows():
        y = f"req {q['request_id']}"
        start = float(q.get("t_start_s", 0.0) or 0.0)
        first = start + float(q["ttft_s"])
        gaps = q.get("itl_s")
        if not isinstance(gaps, (list, tuple, np.ndarray)):
            gaps = q.get("chunk_itl_s")
        gaps = list(gaps) if isinstance(gaps, (list, tuple, np.ndarray)) else []
        ticks = first + np.concatenate([[0.0], np.cumsum(np.asarray(gaps, dtype=float))])
        fig.add_trace(go.Bar(x=[first - start], base=[start], y=[y], orientation="h", name="TTFT",
                             marker_color="#bbbbbb", showlegend=bool(q["request_id"] == requests["request_id"].iloc[0]),
                             legendgroup="ttft"))
        fig.add_trace(go.Scatter(x=ticks, y=[y] * len(ticks), mode="markers", name="token",
                                 marker={"symbol": "line-ns-open", "size": 10}, legendgroup="tok",
                                 showlegend=bool(q["request_id"] == requests["request_id"].iloc[0])))
    fig.update_layout(title=title, xaxis_title="time since first submit (s)", yaxis_title="request",
                      barmode="overlay")
    return fig


def granularity_figure(requests: pd.DataFrame) -> go.Figure:
    """Updates, mean display lag and added time to first text per granularity (medians over requests)."""
    t = granularity_table(requests)
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "display updates per request", "mean display lag (ms)", "added time to first text (ms)"))
    x = t["granularity"].astype(str)
    fig.add_trace(go.Bar(x=x, y=t["updates_p50"], name="updates"), row=1, col=1)
    fig.add_trace(go.Bar(x=x, y=1000 * t["display_lag_s_mean_p50"], name="lag"), row=1, col=2)
    fig.add_trace(go.Bar(x=x, y=1000 * t["added_first_display_s_p50"], name="first text"), row=1, col=3)
    fig.update_layout(title="Display granularity: fewer updates cost lag", showlegend=False)
    fig.update_xaxes(title_text="granularity")
    fig.update_yaxes(title_text="updates", row=1, col=1)
    fig.update_yaxes(title_text="ms", row=1, col=2)
    fig.update_yaxes(title_text="ms", row=1, col=3)
    return fig


def transport_figure(requests: pd.DataFrame) -> go.Figure:
    """Client vs engine TTFT per request, by concurrency (what HTTP adds is the gap)."""
    df = sweep_rows(requests, "http").copy()
    df["concurrency"] = df["concurrency"].astype(int)
    df["label"] = "r" + df["repeat"].astype(int).astype(str) + " #" + df["request_id"].astype(int).astype(str)
    sides = [df.assign(side="engine TTFT (arrival to first token)", ms=1000 * df["engine_ttft_s"])]
    if "engine_first_text_s" in df:
        sides.append(df.assign(side="engine first text (arrival to first text)", ms=1000 * df["engine_first_text_s"]))
    sides.append(df.assign(side="client TTFT (send to first chunk)", ms=1000 * df["ttft_s"]))
    long = pd.concat(sides)
    fig = px.bar(long, x="label", y="ms", color="side", barmode="group",
                 facet_col="concurrency", labels={"label": "request (repeat, index)", "ms": "time to first token (ms)"},
                 title="HTTP streaming: client-side vs engine-side TTFT")
    fig.update_xaxes(matches=None)
    return fig


def tpot_ratio_figure(points: pd.DataFrame, run_dir=None) -> go.Figure:
    """Each output length's time per output token over the shortest's, with the simultaneous interval its verdict
    was read from, each round's ratio faint, the equivalence band and the A/A control's interval
    (:func:`workbench.share.figures_design.ratio_figure`)."""
    from workbench.share import figures_design

    rounds = figures_design.round_ratios(run_dir, "streaming", TPOT.name)
    return figures_design.ratio_figure(
        sweep_rows(points, "streaming"), "max_new_tokens", TPOT.prefix, rounds, name="TPOT", log_x=True,
        x_title="output tokens", y_title="TPOT / the shortest output's (x)",
        title="Decode speed vs output length: TPOT over the shortest output (simultaneous 95% intervals; faint: each "
              "round)")


def http_ratio_figure(points: pd.DataFrame, run_dir=None) -> go.Figure:
    """The primary comparison's figure: each concurrency's client TTFT over one request alone's, with the
    simultaneous interval its verdict was read from, each round's ratio faint, the equivalence band and the A/A
    control's interval (:func:`workbench.share.figures_design.ratio_figure`, the HTTP design's analysis)."""
    from workbench.share import figures_design

    rounds = figures_design.round_ratios(run_dir, "http", CLIENT_TTFT.name)
    return figures_design.ratio_figure(
        sweep_rows(points, "http"), "concurrency", CLIENT_TTFT.prefix, rounds, name="client TTFT",
        x_title="requests sent together", y_title="client TTFT / one request alone's (x)",
        title="What a concurrent request does to the first token: client TTFT over one request alone "
              "(simultaneous 95% intervals; faint: each round)")


@plots.split_by_device
def figures(requests: pd.DataFrame, points: pd.DataFrame | None = None, run_dir=None) -> dict[str, go.Figure]:
    """Every figure of the notebook, by file name (the http ones only if that sweep ran; the client-TTFT ratio when
    the concurrencies, and the TPOT ratio when the lengths, were measured as a design).

    Args:
        requests: the run's request rows (``results.read_requests(run)``); each figure takes its sweep's rows.
        points: the run's points (the streaming design's decision columns), or None.
        run_dir: the run folder (the design's rounds for the ratio figure's faint points), or None.
    """
    req = sweep_rows(requests, "streaming")
    gran = sweep_rows(requests, "granularity")
    first = gran[gran["granularity"] == gran["granularity"].iloc[0]]
    first = first[first["repeat"] == first["repeat"].min()]
    figs = {
        "itl_histogram": itl_histogram_figure(req),
        "itl_vs_position": itl_position_figure(req),
        "perceived_latency": perceived_latency_figure(req),
        "granularity": granularity_figure(gran),
        "timeline_batch": timeline_figure(first, "Per-request timeline: one batch"),
    }
    http = sweep_rows(requests, "http")
    if not http.empty:
        top = http[(http["concurrency"] == http["concurrency"].max()) & (http["repeat"] == 0)]
        figs["http_ttft"] = transport_figure(http)
        figs["timeline_http"] = timeline_figure(top, "Per-request timeline: concurrent HTTP requests (queued; a tick "
                                                     "per text chunk)")
    served = sweep_rows(points, "http") if points is not None else None
    if served is not None and CLIENT_TTFT.prefix in served and served[CLIENT_TTFT.prefix].notna().any():
        figs["http_ttft_ratio"] = http_ratio_figure(points, run_dir)
    streams = sweep_rows(points, "streaming") if points is not None else None
    if streams is not None and TPOT.prefix in streams and streams[TPOT.prefix].notna().any():
        figs["streaming_tpot_ratio"] = tpot_ratio_figure(points, run_dir)
    return figs
