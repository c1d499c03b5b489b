"""Context length: prefill scaling fit, KV-cache memory (computed and measured), and the L x batch sweep.

What it measures (notebook ``02_context_length``): for each (batch size,
context length L) point, prompts of exactly L tokens (chat template included,
:mod:`workbench.prompts`), a fixed number of new tokens, and the usual
TTFT / prefill / TPOT records; plus the KV cache the model's config predicts and
the memory actually measured while it is live.

Methods:

- Prefill fit: ``prefill_s = a + b*L + c*L^2`` by ordinary least squares
  (``numpy.linalg.lstsq`` on the design matrix ``[1, L, L^2]``), with the
  coefficient of determination ``R^2 = 1 - SS_res / SS_tot``. The linear term is
  the weight matmuls (``2 N`` FLOPs per token, Kaplan et al. 2020), the
  quadratic term attention over the prompt; they are equal at ``L = b / c`` (the
  crossover: beyond it attention dominates prefill).
- KV cache from the config (:func:`workbench.memory.kv_cache_bytes`) at ``L x
  batch`` tokens, compared with the memory growth measured at the first
  generated step (:class:`workbench.memory.MemoryTracker`: CUDA allocated bytes,
  or process RSS after ``malloc_trim`` on CPU, a few MiB above the cache).
- Warm-up: :func:`workbench.generation.warm_up` (``warmup`` untimed runs) before
  the first point of each batch size only. Eager PyTorch has no per-shape
  compilation, so warming every context length would double the sweep's time
  for nothing.

Entry points: :class:`Config`, :func:`measure_point`, :func:`run`, the fits
(:func:`fit_quadratic`, :func:`fit_by_batch`, :func:`fits_table`) and
:func:`figures`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from .. import plots, roofline
from ..checks import check_bool, check_choice, check_int, check_int_list
from ..errors import ParameterError
from ..generation import GenerationSettings, warm_up
from ..memory import MemoryTracker, kv_cache_bytes
from ..results import PointResult
from ..sweeps import SweepConfig, expand_grid, measure_generation, run_sweep

EXPERIMENT = "context_length"


# ----------------------------------------------------------------------------- prefill fit


@dataclasses.dataclass(frozen=True)
class QuadraticFit:
    """``y = a + b*L + c*L^2`` fitted by least squares.

    Attributes:
        a: intercept (seconds).
        b: linear coefficient (seconds per token).
        c: quadratic coefficient (seconds per token^2).
        r2: coefficient of determination on the fitted points.
        n: number of points.
    """

    a: float
    b: float
    c: float
    r2: float
    n: int

    @property
    def crossover_tokens(self) -> float:
        """L where the quadratic term equals the linear one, ``b / c``.

        ``inf`` when ``c <= 0`` (the quadratic term never overtakes, e.g. the
        lengths measured are too short to show it); ``0`` when ``b <= 0 < c``.
        """
        if self.c <= 0:
            return math.inf
        if self.b <= 0:
            return 0.0
        return self.b / self.c

    def predict(self, L) -> np.ndarray:
        """Fitted values at ``L`` (scalar or array of tokens)."""
        L = np.asarray(L, dtype=float)
        return self.a + self.b * L + self.c * L**2

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "crossover_tokens": self.crossover_tokens}


def fit_quadratic(L: Sequence[float], y: Sequence[float]) -> QuadraticFit:
    """Least-squares fit of ``y = a + b*L + c*L^2`` (non-finite pairs dropped).

    Args:
        L: prompt lengths (tokens), at least 3 distinct values.
        y: seconds (e.g. ``prefill_s`` per request).

    Returns:
        :class:`QuadraticFit`.

    Raises:
        ParameterError: fewer than 3 distinct lengths (the fit is underdetermined).
    """
    L = np.asarray(L, dtype=float)
    y = np.asarray(y, dtype=float)
    keep = np.isfinite(L) & np.isfinite(y)
    L, y = L[keep], y[keep]
    if len(np.unique(L)) < 3:
        raise ParameterError(
            f"context_tokens: the quadratic fit needs at least 3 distinct lengths (got {len(np.unique(L))})"
        )
    X = np.column_stack([np.ones_like(L), L, L**2])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / ss_tot if ss_tot > 0 else float("nan")
    return QuadraticFit(float(coef[0]), float(coef[1]), float(coef[2]), r2, int(len(L)))


def fit_by_batch(requests, y: str = "prefill_s", x: str = "prompt_tokens") -> dict:
    """One :class:`QuadraticFit` of ``y`` on ``x`` per batch size, over every request row.

    Batch sizes with fewer than 3 distinct lengths are skipped.
    """
    fits = {}
    for bs, g in requests.groupby("batch_size"):
        try:
            fits[int(bs)] = fit_quadratic(g[x], g[y])
        except ParameterError:
            continue
    return fits


def fits_table(fits: dict, quantity: str = "prefill_s"):
    """``pandas.DataFrame``: one row per batch size with a, b, c, r2, n, crossover_tokens."""
    import pandas as pd

    return pd.DataFrame([{"quantity": quantity, "batch_size": bs, **f.to_dict()} for bs, f in sorted(fits.items())])


# ----------------------------------------------------------------------------- config and sweep


@dataclasses.dataclass
class Config(SweepConfig):
    """The context-length sweep (notebook ``02_context_length``).

    Attributes:
        context_tokens: prompt lengths L in tokens (chat template included), each
            in [64, model maximum - max_new_tokens].
        batch_sizes: requests per ``generate`` call, each >= 1.
        max_new_tokens: new tokens per request (>= 2, so TPOT is defined).
        ignore_eos: fixed-length outputs (``min_new_tokens = max_new_tokens``), so
            TPOT and throughput compare equal work.
        source: prompt text: ``en`` (Python docs), ``zh`` (Chinese essays) or
            ``random`` (random token ids, pure compute).
    """

    context_tokens: list = dataclasses.field(default_factory=lambda: [128, 512, 1024, 2048])
    batch_sizes: list = dataclasses.field(default_factory=lambda: [1, 4])
    max_new_tokens: int = 8
    ignore_eos: bool = True
    source: str = "en"

    def __post_init__(self):
        super().__post_init__()
        check_int("max_new_tokens", self.max_new_tokens, 2)
        check_int_list("batch_sizes", self.batch_sizes, lo=1)
        check_int_list("context_tokens", self.context_tokens, lo=64, hi=self.max_context() - self.max_new_tokens)
        check_choice("source", self.source, ("en", "zh", "random"))
        check_bool("ignore_eos", self.ignore_eos)

    def settings(self, seed: int | None = None) -> GenerationSettings:
        """Greedy, fixed-length settings of every point."""
        return GenerationSettings(max_new_tokens=self.max_new_tokens, ignore_eos=self.ignore_eos,
                                  seed=self.seed if seed is None else seed)

    def grid(self) -> list[dict]:
        """Points: batch size outermost, then L ascending (so RSS growth is read against smaller earlier peaks)."""
        return expand_grid(batch_size=self.batch_sizes, context_tokens=sorted(self.context_tokens))


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """Measure one (batch_size, context_tokens) point.

    Args:
        loaded: :class:`workbench.models.LoadedModel`.
        cfg: the sweep's config.
        point: ``{"batch_size": B, "context_tokens": L}``.
        state: the sweep's shared state: ``state["warmed"]`` (a set of batch sizes) says which batch sizes
            already ran their ``cfg.warmup`` untimed batches (:func:`workbench.generation.warm_up`); the first
            point of each batch size warms up and adds its batch size.

    Returns:
        :class:`workbench.results.PointResult`: ``requests`` (records with ``context_tokens`` and ``source``), ``wall_s``,
        ``warmup_s`` and ``extra``: ``kv_bytes_computed`` (config formula at
        ``L x B`` tokens, the cache at the first generated step),
        ``kv_bytes_measured`` (memory growth at that step, see :class:`workbench.memory.MemoryTracker`),
        ``memory_max_growth_bytes`` (over all steps), ``memory_peak_growth_bytes``
        (CUDA: allocator peak, prefill included) and ``memory_kind``.
    """
    from ..prompts import build_batch, random_batch

    B, L = int(point["batch_size"]), int(point["context_tokens"])
    tok = loaded.tokenizer
    if cfg.source == "random":
        kwargs = {"input_ids": random_batch(tok, B, L, seed=cfg.seed)}  # templated inside the clock (TTFT)
        prompts = [""] * B
    else:
        kwargs, prompts = {}, build_batch(tok, B, L, source=cfg.source)
    warmed = state.setdefault("warmed", set())
    warm = B not in warmed
    warmed.add(B)
    warmup_s = warm_up(loaded, prompts, cfg.settings(), n=cfg.warmup if warm else 0, **kwargs)
    tracker = MemoryTracker(loaded.info.device)
    tracker.start()
    out = measure_generation(loaded, prompts, cfg.settings(), cfg.repeats, 0, on_step=tracker.on_step, **kwargs)
    for rec in out.requests:
        rec.update(context_tokens=L, source=cfg.source)
    out.warmup_s = warmup_s
    out.extra = {
        "source": cfg.source,
        "kv_bytes_computed": kv_cache_bytes(loaded.info, L, B),
        "kv_bytes_measured": int(tracker.first_step_growth_bytes or 0),
        "memory_max_growth_bytes": int(tracker.max_growth_bytes),
        "memory_peak_growth_bytes": int(tracker.peak_bytes),
        "memory_kind": tracker.kind,
    }
    return out


def run(cfg: Config, run_dir, loaded, resume: bool = False):
    """Every (batch_size, context_tokens) point of ``cfg`` through :func:`workbench.sweeps.run_sweep`.

    Returns:
        The ``context_length`` points DataFrame, with the roofline's prediction per point and
        ``ttft_ratio`` / ``tpot_ratio`` (residuals saved as ``residuals/context_length.txt``).
    """
    state: dict = {}

    def measure(p):
        return measure_point(loaded, cfg, p, state)

    predictor = roofline.calibrated_predictor(loaded)  # predict before measuring
    points = run_sweep(run_dir, EXPERIMENT, cfg.grid(), measure, resume=resume, info=loaded.info, loaded=loaded,
                       config=cfg)
    points = roofline.with_predictions(points, loaded.info, predictor)
    roofline.save_residuals(run_dir, EXPERIMENT, points)
    return points


# ----------------------------------------------------------------------------- figures


def finding(fits: dict, max_context: int) -> str:
    """One sentence per batch size: the fitted prefill curve and where its quadratic term overtakes the linear.

    Args:
        fits: ``{batch_size: QuadraticFit}`` of ``prefill_s`` (:func:`fit_by_batch`).
        max_context: the longest measured context (tokens), to say whether the crossover was reached.
    """
    if not fits:
        return "No fit: too few context lengths measured."
    parts = []
    for bs, f in sorted(fits.items()):
        if f.crossover_tokens == float("inf"):
            cross = "the quadratic term never overtakes the linear one (c <= 0)"
        else:
            where = "beyond" if f.crossover_tokens > max_context else "within"
            cross = f"attention's quadratic term overtakes the linear one at {f.crossover_tokens:,.0f} tokens ({where} the measured range)"
        parts.append(f"batch {bs}: prefill {f.a * 1e3:.1f} ms + {f.b * 1e6:.1f} us/token (R^2 {f.r2:.3f}); {cross}")
    return "; ".join(parts) + "."


def _l_label() -> str:
    return f"context length L ({plots.label('prompt_tokens')})"


def fig_latency_vs_context(requests, fits: dict, quantity: str = "prefill_s"):
    """TTFT and ``quantity`` per request vs L (markers), with the fitted ``a + bL + cL^2`` curve per batch size."""
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
            fig.add_scatter(x=xs, y=f.predict(xs), mode="lines", line=dict(color=col, dash="dash"),
                            name=f"fit b={bs}: {f.a:.3g} + {f.b:.3g}L + {f.c:.3g}L² (R²={f.r2:.3f})")
    fig.update_layout(title="TTFT and prefill vs context length, with a + bL + cL² fit",
                      xaxis_title=_l_label(), yaxis_title="seconds")
    return plots.legend_below(fig)


def fig_tpot_vs_context(points):
    """Decode TPOT p50 vs L, one line per batch size."""
    import plotly.express as px

    df = plots.ok_points(points).sort_values("context_tokens")
    fig = px.line(df, x="context_tokens", y="tpot_s_p50", color=df["batch_size"].astype(str), markers=True,
                  labels={"context_tokens": _l_label(), "tpot_s_p50": plots.label("tpot_s_p50"),
                          "color": plots.label("batch_size")},
                  title="Decode time per output token vs context length")
    roofline.add_predicted_line(fig, df, "context_tokens", "predicted_tpot_s", group="batch_size",
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
                  labels={"context_tokens": _l_label(), "MiB": "KV cache (MiB)"},
                  title="KV-cache size vs context length: computed vs measured")
    return plots.legend_below(fig)


def fig_heatmap(points, value: str, title: str, unit: str):
    """Batch size x L heatmap of a point column (e.g. ``ttft_s_p50``), cells annotated."""
    import plotly.express as px

    df = plots.ok_points(points)
    table = df.pivot_table(index="batch_size", columns="context_tokens", values=value, aggfunc="median")
    fig = px.imshow(table, text_auto=".3g", aspect="auto", color_continuous_scale="Viridis",
                    labels={"x": _l_label(), "y": plots.label("batch_size"), "color": unit},
                    title=title)
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig


@plots.split_by_device
def figures(points, requests, fits: dict) -> dict:
    """Every figure of the notebook, by name, in report order."""
    return {
        "context_ttft_prefill_fit": fig_latency_vs_context(requests, fits),
        "context_tpot": fig_tpot_vs_context(points),
        "context_kv_bytes": fig_kv_bytes(points),
        "context_heatmap_ttft": fig_heatmap(points, "ttft_s_p50", "TTFT p50 (s) by batch size and context length",
                                            plots.label("ttft_s_p50")),
        "context_heatmap_throughput": fig_heatmap(points, "output_throughput_tps",
                                                  "Output throughput (tokens/s) by batch size and context length",
                                                  "tokens/s"),
    }
