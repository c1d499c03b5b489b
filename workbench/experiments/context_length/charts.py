"""Figures of the context-length experiment (notebook ``02_context_length``), from its points and requests:
:func:`fig_latency_vs_context` (TTFT and prefill vs L with the fit), :func:`fig_tpot_vs_context`,
:func:`fig_kv_bytes` and :func:`fig_heatmap`; :func:`length_label` is their x axis's title. The experiment assembles
them in ``figures`` (its prefill-ratio figure, the design's, is its own: it reads the design's rounds)."""

from __future__ import annotations

import numpy as np

from workbench.predict import predictions
from workbench.share import plots


def length_label() -> str:
    """The context-length axis's title, with the prompt tokens' unit (:func:`workbench.share.plots.label`)."""
    return f"context length L ({plots.label('prompt_tokens')})"


def fig_latency_vs_context(requests, fits: dict, quantity: str = "prefill_s"):
    """TTFT and ``quantity`` per request vs L (markers), with the fitted ``a + bL + cL^2`` curve per batch size (the
    rounds as blocks: :func:`fits`), its R^2 and dof in the legend, and the fit's straight part ``a + bL`` dotted:
    the gap at the longest length is the quadratic term the finding decides."""
    import plotly.express as px
    import plotly.graph_objects as go

    fig = go.Figure()
    colors = px.colors.qualitative.Safe
    for i, (bs, g) in enumerate(sorted(requests.groupby("batch_size"), key=lambda kv: kv[0])):
        col = colors[i % len(colors)]
        fig.add_scatter(x=g["prompt_tokens"], y=g["ttft_s"], mode="markers", name=f"TTFT, batch {bs}",
                        marker=dict(color=col, symbol="circle"))
        fig.add_scatter(x=g["prompt_tokens"], y=g[quantity], mode="markers", name=f"prefill, batch {bs}",
                        marker=dict(color=col, symbol="x"))
        f = fits.get(int(bs))
        if f is not None:
            xs = np.linspace(0, float(g["prompt_tokens"].max()), 100)
            shape = f"{f.a:.3g} + {f.b:.3g}L + {f.c:.3g}L²"
            note = "" if f.support[0] else ", not supported"
            fig.add_scatter(x=xs, y=f.predict(xs), mode="lines", line=dict(color=col, dash="dash"),
                            name=f"fit b={bs}: {shape} (R²={f.r2:.3f}, {f.dof} dof{note})")
            fig.add_scatter(x=xs, y=f.a + f.b * xs, mode="lines", line=dict(color=col, dash="dot", width=1),
                            name=f"its straight part a + bL, b={bs}")
    fig.update_layout(title="TTFT and prefill vs context length, with the fit over valid points (rounds as blocks)",
                      xaxis_title=length_label(), yaxis_title="seconds")
    return plots.legend_below(fig)

def fig_tpot_vs_context(points):
    """Decode TPOT p50 vs L, one line per batch size."""
    import plotly.express as px

    df = plots.ok_points(points).sort_values("context_tokens")
    fig = px.line(df, x="context_tokens", y="tpot_s_p50", color=df["batch_size"].astype(str), markers=True,
                  labels={"context_tokens": length_label(), "tpot_s_p50": plots.label("tpot_s_p50"),
                          "color": plots.label("batch_size")},
                  title="Decode time per output token vs context length")
    predictions.add_predicted_line(fig, df, "context_tokens", "predicted_tpot_s", group="batch_size",
                                name="predicted, batch")
    plots.mark_invalid(fig, df, "context_tokens", "tpot_s_p50")
    return plots.legend_below(fig)


def fig_kv_bytes(points):
    """KV-cache MiB vs L: computed from the config (lines) and measured memory growth (markers)."""
    import pandas as pd
    import plotly.express as px

    df = plots.ok_points(points).sort_values("context_tokens")
    kind = df["memory_kind"].iloc[0] if "memory_kind" in df and len(df) else "memory"
    long = pd.concat([
        df.assign(MiB=df["kv_bytes_computed"] / 2**20, how="computed (config)"),
        df.assign(MiB=df["kv_bytes_measured"] / 2**20, how=f"measured ({kind} growth)"),
    ])
    long["batch size"] = long["batch_size"].astype(str)
    fig = px.line(long, x="context_tokens", y="MiB", color="batch size", line_dash="how", markers=True,
                  labels={"context_tokens": length_label(), "MiB": "KV cache (MiB)"},
                  title="KV-cache size vs context length: computed vs measured")
    return plots.legend_below(fig)


def fig_heatmap(points, value: str, title: str, unit: str):
    """Batch size x L heatmap of a point column (e.g. ``ttft_s_p50``), cells annotated."""
    import plotly.express as px

    df = plots.ok_points(points)
    table = df.pivot_table(index="batch_size", columns="context_tokens", values=value, aggfunc="median")
    fig = px.imshow(table, text_auto=".3g", aspect="auto", color_continuous_scale="Viridis",
                    labels={"x": length_label(), "y": plots.label("batch_size"), "color": unit},
                    title=title)
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig
