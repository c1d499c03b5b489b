"""Plotly figures with one house template, built from tidy point and request tables.

Importing this module registers the ``workbench`` template (plotly
``doc/python/templates.md``) and makes it the default. Every axis names its
quantity and unit; figure functions take DataFrames in the schema of
DESIGN.md section 5 and return ``plotly.graph_objects.Figure``.
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

LABELS = {
    "batch_size": "batch size (requests)",
    "prompt_tokens": "prompt tokens",
    "context_tokens": "context tokens",
    "ttft_s_p50": "TTFT p50 (s)",
    "ttft_s_p99": "TTFT p99 (s)",
    "tpot_s_p50": "TPOT p50 (s/token)",
    "output_throughput_tps": "output throughput (tokens/s)",
    "goodput_rps": "goodput (requests/s within SLO)",
    "decode_tps": "per-request decode speed (tokens/s)",
    "request_throughput_rps": "request throughput (requests/s)",
    "mbu": "MBU (fraction of peak bandwidth)",
}


def ok_points(points: pd.DataFrame) -> pd.DataFrame:
    """Points whose status is ``ok`` (failed points carry no figures)."""
    return points[points["status"] == "ok"].copy() if "status" in points else points.copy()


def ttft_vs_batch(points: pd.DataFrame) -> go.Figure:
    """TTFT p50 (solid) and p99 (dashed) versus batch size, one colour per prompt length."""
    df = ok_points(points).sort_values("batch_size")
    long = df.melt(id_vars=["batch_size", "prompt_tokens"], value_vars=["ttft_s_p50", "ttft_s_p99"],
                   var_name="percentile", value_name="ttft_s")
    long["percentile"] = long["percentile"].str.replace("ttft_s_", "")
    long["prompt_tokens"] = long["prompt_tokens"].astype(str)
    fig = px.line(long, x="batch_size", y="ttft_s", color="prompt_tokens", line_dash="percentile", markers=True,
                  labels={**LABELS, "ttft_s": "TTFT (s)", "prompt_tokens": "prompt tokens"},
                  title="Time to first token vs batch size")
    fig.update_xaxes(type="log", dtick=0.30103)
    return fig


def throughput_vs_batch(points: pd.DataFrame) -> go.Figure:
    """Output throughput (all rows' tokens / wall time) versus batch size."""
    df = ok_points(points).sort_values("batch_size")
    df["prompt_tokens"] = df["prompt_tokens"].astype(str)
    fig = px.line(df, x="batch_size", y="output_throughput_tps", color="prompt_tokens", markers=True,
                  labels=LABELS, title="Output throughput vs batch size")
    fig.update_xaxes(type="log", dtick=0.30103)
    return fig


def pareto(points: pd.DataFrame) -> go.Figure:
    """TTFT p50 versus output throughput, one curve per prompt length, batch sizes as labels.

    The Pareto-optimal points (no other point has both higher throughput and
    lower TTFT) are drawn larger with a black outline.
    """
    df = ok_points(points).sort_values(["prompt_tokens", "batch_size"])
    df["prompt_tokens_label"] = df["prompt_tokens"].astype(str)
    fig = px.line(df, x="output_throughput_tps", y="ttft_s_p50", color="prompt_tokens_label", markers=True,
                  text="batch_size", labels={**LABELS, "prompt_tokens_label": "prompt tokens"},
                  title="TTFT vs throughput trade-off (labels: batch size)")
    fig.update_traces(textposition="top center")
    front = metrics.pareto_front(df)
    fig.add_trace(go.Scatter(x=front["output_throughput_tps"], y=front["ttft_s_p50"], mode="markers",
                             marker=dict(size=14, color="rgba(0,0,0,0)", line=dict(width=2, color="black")),
                             name="Pareto front", hovertext=front["point_id"]))
    return fig


def decode_speed_vs_batch(requests: pd.DataFrame) -> go.Figure:
    """Per-request decode speed (box over requests) versus batch size."""
    df = requests[requests["output_tokens"] > 1].copy()
    df["prompt_tokens"] = df["context_tokens"].fillna(df["prompt_tokens"]).astype(int).astype(str)
    fig = px.box(df, x="batch_size", y="decode_tps", color="prompt_tokens", points=False,
                 labels={**LABELS, "prompt_tokens": "prompt tokens"},
                 title="Per-request decode speed vs batch size")
    fig.update_xaxes(type="category")
    return fig


def goodput_vs_batch(points: pd.DataFrame, recommended: pd.Series | None = None) -> go.Figure:
    """Goodput under the SLO versus batch size, with the recommended point starred."""
    df = ok_points(points).sort_values("batch_size")
    df["prompt_tokens"] = df["prompt_tokens"].astype(str)
    slo = ""
    if not df.empty:
        slo = f" (SLO: TTFT <= {df['slo_ttft_s'].iloc[0]:g} s, TPOT <= {df['slo_tpot_s'].iloc[0]:g} s)"
    fig = px.line(df, x="batch_size", y="goodput_rps", color="prompt_tokens", markers=True, labels=LABELS,
                  title="Goodput vs batch size" + slo)
    if recommended is not None:
        fig.add_trace(go.Scatter(x=[recommended["batch_size"]], y=[recommended["goodput_rps"]], mode="markers",
                                 marker=dict(symbol="star", size=20, color="gold", line=dict(width=1, color="black")),
                                 name=f"recommended: batch {int(recommended['batch_size'])}"))
    fig.update_xaxes(type="log", dtick=0.30103)
    return fig


def batch_size_figures(points: pd.DataFrame, requests: pd.DataFrame) -> dict[str, go.Figure]:
    """All figures of the batch-size notebook, by file name."""
    rec = metrics.recommend_batch_size(points)
    return {
        "batch_ttft": ttft_vs_batch(points),
        "batch_throughput": throughput_vs_batch(points),
        "batch_pareto": pareto(points),
        "batch_decode_speed": decode_speed_vs_batch(requests),
        "batch_goodput": goodput_vs_batch(points, rec),
    }
