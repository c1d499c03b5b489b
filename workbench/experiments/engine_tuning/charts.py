"""Figures comparing engine configurations against a baseline (notebook ``09_engine_tuning``; the table of
:func:`workbench.techniques.configurations.configurations`).

:func:`fig_speed`: request latency per configuration with the roofline's prediction, guard failures crossed out and
the recommendation starred; :func:`fig_speedup`: the speed-up over the baseline with its interval and the A/A noise
floor shaded; :func:`fig_prediction`: TTFT and TPOT measured against predicted; :func:`fig_guard`: the quality
guard's perplexity ratio and KL divergence against the float32 reference; :func:`fig_speedup_rounds`: the design's
speed-ups with their simultaneous intervals and each round faint. :func:`figures` assembles them by file name.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from workbench.experiments.engine_tuning.rounds import E2E, EXPERIMENT
from workbench.share.plots import label, legend_below, split_by_device
from workbench.stats import comparison
from workbench.techniques.configurations import designed, recommend


def fig_speed(configs: pd.DataFrame, recommended: pd.Series | None = None) -> go.Figure:
    """Mean e2e p50 per configuration (bars; guard failures hatched grey) with the prediction (diamonds)."""
    df = configs
    colours = ["#4c78a8" if g else "#bbbbbb" for g in df["guard_passed"]]
    fig = go.Figure()
    fig.add_bar(x=df["config"], y=df["e2e_s_p50"], name="measured (e2e p50)", marker_color=colours,
                marker_pattern_shape=["" if g else "x" for g in df["guard_passed"]],
                hovertext=[r or "guard passed" for r in df["guard_reason"]])
    fig.add_scatter(x=df["config"], y=df["predicted_e2e_s"], mode="markers", name="predicted (roofline)",
                    marker=dict(symbol="diamond", size=11, color="black"))
    if recommended is not None:
        fig.add_scatter(x=[recommended["config"]], y=[recommended["e2e_s_p50"]], mode="markers",
                        name="recommended", marker=dict(symbol="star", size=20, color="gold",
                                                        line=dict(width=1, color="black")))
    fig.update_layout(title="Request latency per engine configuration (grey, crossed: quality guard failed)",
                      xaxis_title="configuration (dtype+quant / attn / cache)", yaxis_title=label("e2e_s"))
    return legend_below(fig)


def fig_speedup(configs: pd.DataFrame) -> go.Figure:
    """Speed-up over the baseline per configuration with its interval (error bars), and the A/A control's
    interval shaded: the noise floor a speed-up must clear (:func:`workbench.stats.comparison.add_noise_band`)."""
    df = configs
    lo = df.get("speedup_low", pd.Series(float("nan"), index=df.index))
    hi = df.get("speedup_high", pd.Series(float("nan"), index=df.index))
    fig = go.Figure()
    fig.add_scatter(x=df["config"], y=df["speedup_vs_baseline"], mode="markers", name="speed-up",
                    marker=dict(size=11, color="#4c78a8"),
                    error_y=dict(type="data", symmetric=False, array=(hi - df["speedup_vs_baseline"]).tolist(),
                                 arrayminus=(df["speedup_vs_baseline"] - lo).tolist()))
    fig.add_hline(y=1.0, line=dict(dash="dot", color="#555"))
    if "aa_low" in df and len(df):
        comparison.add_noise_band(fig, low=df["aa_low"].iloc[0], high=df["aa_high"].iloc[0])
    fig.update_layout(title="Speed-up over the baseline (interval; grey band: the A/A noise floor)",
                      xaxis_title="configuration (dtype+quant / attn / cache)",
                      yaxis_title="speed-up (baseline e2e / its e2e)")
    return legend_below(fig)


def fig_prediction(points: pd.DataFrame) -> go.Figure:
    """TTFT and TPOT p50, measured versus predicted, one marker per point (the diagonal is a perfect model)."""
    fig = go.Figure()
    for q, sym in (("ttft", "circle"), ("tpot", "square")):
        m, p = f"{q}_s_p50", f"predicted_{q}_s"
        if m in points and p in points:
            fig.add_scatter(x=points[p], y=points[m], mode="markers", name=q.upper(), marker=dict(symbol=sym, size=9),
                            hovertext=points.get("config"))
    vals = pd.concat([points.get(c, pd.Series(dtype=float)) for c in
                      ("ttft_s_p50", "tpot_s_p50", "predicted_ttft_s", "predicted_tpot_s")]).dropna()
    if len(vals):
        lo, hi = float(vals.min()) * 0.8, float(vals.max()) * 1.2
        fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(dash="dot", color="#555"), name="measured = predicted")
    fig.update_layout(title="Measured vs predicted (calibrated roofline)", xaxis_title="predicted (s)",
                      yaxis_title="measured p50 (s)")
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return legend_below(fig)


def fig_guard(configs: pd.DataFrame, cfg_limits: tuple[float, float] | None = None) -> go.Figure:
    """Perplexity ratio (bars, with the upper 95% bound) and mean KL (diamonds) per configuration against the
    float32 eager reference (:mod:`workbench.measure.guard`)."""
    fig = go.Figure()
    ratio = configs.get("perplexity_ratio", pd.Series(float("nan"), index=configs.index))
    high = configs.get("perplexity_ratio_high", ratio)
    fig.add_bar(x=configs["config"], y=ratio, name=label("perplexity_ratio"),
                error_y=dict(type="data", symmetric=False, array=(high - ratio).clip(lower=0),
                             arrayminus=[0] * len(ratio)))
    fig.add_scatter(x=configs["config"], y=configs.get("kl_mean"), mode="markers", yaxis="y2",
                    name=label("kl_mean"), marker=dict(symbol="diamond", size=11))
    if cfg_limits:
        fig.add_hline(y=cfg_limits[0], line_dash="dot", annotation_text="perplexity tolerance")
    fig.update_layout(title="Quality guard: perplexity and KL divergence against the float32 eager reference",
                      yaxis=dict(title=label("perplexity_ratio")),
                      yaxis2=dict(title=label("kl_mean"), overlaying="y", side="right"))
    return legend_below(fig)


def fig_speedup_rounds(configs: pd.DataFrame, run_dir=None) -> go.Figure:
    """Each configuration's speed-up over the baseline with the simultaneous interval its verdict was read from, each
    round's ratio faint, the equivalence band and the A/A control's interval
    (:func:`workbench.share.figures_design.ratio_figure`, inverted: baseline latency / the configuration's)."""
    from workbench.share import figures_design

    rounds = figures_design.round_ratios(run_dir, EXPERIMENT, E2E.name)
    return figures_design.ratio_figure(
        configs.assign(point_id=configs["config"]), "config", E2E.prefix, rounds, invert=True,
        name="speed-up", x_title="configuration (dtype+quant / attn / cache)",
        y_title="speed-up (baseline e2e / its e2e)",
        title="Speed-up over the baseline (simultaneous 95% intervals; faint: each round; grey: the A/A control)")


@split_by_device
def figures(points: pd.DataFrame, configs: pd.DataFrame, run_dir=None) -> dict[str, go.Figure]:
    """The notebook's figures by file name (``run_dir``: the design's rounds, drawn faint on ``engine_speedup``)."""
    return {"engine_speed": fig_speed(configs, recommend(configs)),
            "engine_speedup": fig_speedup_rounds(configs, run_dir) if designed(configs) else fig_speedup(configs),
            "engine_prediction": fig_prediction(points),
            "engine_guard": fig_guard(configs)}
