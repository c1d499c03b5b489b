"""Figures of the context-compression experiment (notebook ``06_context_compression``), from its point tables.

The point columns they read (names of :mod:`workbench.stats.columns`) are defined here, the experiment and its
summaries (:mod:`.summaries`) import them:
:func:`quality_vs_ratio` and :func:`time_vs_ratio` (per strategy, from the summary over depths),
:func:`total_vs_length`, :func:`depth_length_heatmap`, :func:`chat` and :func:`table_figure`
(:func:`workbench.share.plots.table_figure`: the break-even lengths, the best strategy per length). Each returns a
plotly figure; the experiment assembles them in ``figures`` (its total-time comparison is the design's figure,
:func:`workbench.share.figures_design.ratio_figure`).
"""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from workbench.share import plots
from workbench.share.plots import table_figure  # noqa: F401 - the tables' one home, used as fc.table_figure

# point columns the summaries and figures read
MATCH, LOGPROB, ROUGE = "substring_match_mean", "gold_logprob_mean", "rouge_l_mean"
ACHIEVED, COMPRESSOR, TTFT, TTFT_TOTAL, TOTAL, PREFILLED = (
    "achieved_ratio_p50", "compressor_s_p50", "ttft_s_p50", "ttft_total_s_p50", "total_s_p50", "prefilled_tokens_p50")


def quality_vs_ratio(s: pd.DataFrame) -> go.Figure:
    """Answer match, gold log-likelihood and ROUGE-L vs achieved ratio (``s``: the summary over depths)."""
    q = s.melt(id_vars=["strategy", "ratio", "context_tokens", ACHIEVED],
               value_vars=[c for c in (MATCH, LOGPROB, ROUGE) if c in s],
               var_name="metric", value_name="value")
    q["metric"] = q["metric"].map({MATCH: "answer match (share)", LOGPROB: "gold log-lik (nats)",
                                   ROUGE: "ROUGE-L vs uncompressed"})
    fig = px.line(q.sort_values(ACHIEVED), x=ACHIEVED, y="value", color="strategy", markers=True,
                  facet_row="metric", facet_col="context_tokens", title="Answer quality vs achieved compression ratio")
    fig.update_yaxes(matches=None, title_text="")
    fig.update_xaxes(title_text="achieved ratio (x)")
    return fig


def time_vs_ratio(s: pd.DataFrame) -> go.Figure:
    """TTFT (model only), compressor + TTFT, and total time vs target ratio."""
    t = s.melt(id_vars=["strategy", "ratio", "context_tokens"],
               value_vars=[c for c in (TTFT, TTFT_TOTAL, TOTAL) if c in s],
               var_name="metric", value_name="seconds")
    t["metric"] = t["metric"].map({TTFT: "TTFT, model (s)", TTFT_TOTAL: "compressor + TTFT (s)",
                                   TOTAL: "total: compressor + answer (s)"})
    fig = px.line(t.sort_values("ratio"), x="ratio", y="seconds", color="strategy", markers=True,
                  facet_row="metric", facet_col="context_tokens", title="Time vs target compression ratio")
    fig.update_yaxes(matches=None)
    fig.update_xaxes(title_text="target ratio (x)", type="log")
    return fig


def total_vs_length(s: pd.DataFrame) -> go.Figure:
    """Total time vs context length, one line per (strategy, ratio)."""
    s = s.assign(label=s["strategy"] + " " + s["ratio"].map(lambda r: f"{r:g}x"))
    return px.line(s.sort_values("context_tokens"), x="context_tokens", y=TOTAL, color="label", markers=True,
                   title="Total time (compressor + answer) vs context length",
                   labels={"context_tokens": "context length (tokens)", TOTAL: "total time (s)"})


def depth_length_heatmap(points: pd.DataFrame) -> go.Figure:
    """Gold log-likelihood per needle depth x context length, at the largest ratio (and ``none``)."""
    h = plots.ok_points(points)
    h = h[(h["ratio"] == max(h["ratio"])) | (h["strategy"] == "none")]
    h = h.assign(depth_label=h["depth"].map(lambda d: f"{d:g}"),
                 length_label=h["context_tokens"].map(lambda n: f"{n:g}"))
    return px.density_heatmap(h, x="depth_label", y="length_label", z=LOGPROB, histfunc="avg",
                              facet_col="strategy", facet_col_wrap=4, text_auto=".2f",
                              title=f"Gold-answer log-likelihood (nats) by needle depth and context length "
                                    f"(ratio {max(h['ratio']):g}x)",
                              labels={"depth_label": "needle depth", "length_label": "context (tokens)",
                                      LOGPROB: plots.label(LOGPROB)})


def chat(chat_points: pd.DataFrame) -> go.Figure:
    """The chat experiment: compressor + TTFT, prefilled tokens and answer match per strategy and history length."""
    c = plots.ok_points(chat_points)
    c["label"] = c["strategy"] + " " + c["ratio"].map(lambda r: f"{r:g}x")
    cm = c.melt(id_vars=["label", "context_tokens"], value_vars=[v for v in (TTFT_TOTAL, PREFILLED, MATCH) if v in c],
                var_name="metric", value_name="value")
    cm["metric"] = cm["metric"].map({TTFT_TOTAL: "compressor + TTFT (s)", PREFILLED: "prefilled tokens",
                                     MATCH: "answer match (share)"})
    fig = px.bar(cm, x="context_tokens", y="value", color="label", barmode="group", facet_row="metric",
                 title="Chat history: KV prefix reuse vs compression",
                 labels={"context_tokens": "history length (tokens)"})
    fig.update_yaxes(matches=None, title_text="")
    fig.update_xaxes(type="category")
    return fig
