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
- KV cache from the config: ``2 (K and V) x layers x kv_heads x head_dim x
  bytes/element x tokens x batch`` (:meth:`workbench.models.ModelInfo.kv_cache_bytes_per_token`).
- KV cache measured: memory at the first generated step (the prompt's cache is
  complete, the prefill's temporaries freed) minus a baseline read just before
  the timed batch (:class:`MemoryTracker`). CUDA: ``torch.cuda.memory_allocated``
  (live tensors only). CPU: process RSS (``psutil``), with glibc
  ``malloc_trim(0)`` before the baseline and at the first step so freed memory
  leaves the RSS; it still counts allocator slack and a step's activations, so
  on CPU it reads a few MiB above the cache. Compared with the config formula
  at ``L x batch`` tokens. The largest growth over all steps (the cache growing,
  plus fragmentation from the cache's re-allocations) is kept as well.
- Warm-up: untimed runs (``warmup`` of them, 2 new tokens) before the first point
  of each batch size only. Eager PyTorch has no per-shape compilation, so
  warming every context length would double the sweep's time for nothing.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from typing import Sequence

import numpy as np

from .errors import ParameterError
from .generation import GenerationSettings, generate_measured
from .sweeps import SweepConfig, _check_int, _check_list, expand_grid, measure_generation, run_sweep

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


# ----------------------------------------------------------------------------- KV cache memory


def kv_cache_bytes(info, tokens: int, batch_size: int = 1) -> int:
    """KV-cache bytes for ``batch_size`` sequences of ``tokens`` each, from the model config.

    ``2 x num_layers x num_kv_heads x head_dim x bytes/element x tokens x batch_size``.
    """
    return int(info.kv_cache_bytes_per_token()) * int(tokens) * int(batch_size)


def _malloc_trim() -> None:
    """Return freed heap memory to the OS (glibc only; a no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except Exception:
        pass


class MemoryTracker:
    """Memory growth over a baseline, sampled on every generated step.

    Use ``tracker.start()`` right before the timed batch and pass
    ``tracker.on_step`` as ``generate_measured(..., on_step=...)``.

    At the first generated step the prompt's KV cache is complete and the
    prefill's temporaries are freed; on CPU the tracker then calls glibc
    ``malloc_trim(0)`` once (~5-10 ms, which lands in the second token's ITL) so
    that freed memory leaves the RSS, and reads the growth: that reading is the
    measured KV cache (``first_step_growth_bytes``). Later steps only update
    ``max_growth_bytes`` (the cache's growth plus allocator fragmentation).

    Attributes:
        kind: ``cuda_allocated`` or ``rss``.
        baseline: bytes at ``start()``.
        first_step_growth_bytes: growth at the first generated step (None before it).
        max_growth_bytes: largest growth over all steps.
        peak_bytes: CUDA: ``max_memory_allocated`` since ``start()`` minus
            baseline (prefill activations included); CPU: ``max_growth_bytes``.
    """

    def __init__(self, device: str):
        self.cuda = str(device).startswith("cuda")
        self.kind = "cuda_allocated" if self.cuda else "rss"
        self.baseline = 0
        self.first_step_growth_bytes: int | None = None
        self.max_growth_bytes = 0

    def _now(self) -> int:
        if self.cuda:
            import torch

            return int(torch.cuda.memory_allocated())
        import psutil

        return int(psutil.Process().memory_info().rss)

    def start(self) -> None:
        gc.collect()
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        else:
            _malloc_trim()
        self.baseline = self._now()
        self.first_step_growth_bytes = None
        self.max_growth_bytes = 0

    def on_step(self, ids, t) -> None:
        if self.first_step_growth_bytes is None:
            if not self.cuda:
                _malloc_trim()
            self.first_step_growth_bytes = self._now() - self.baseline
            growth = self.first_step_growth_bytes
        else:
            growth = self._now() - self.baseline
        self.max_growth_bytes = max(self.max_growth_bytes, growth)

    @property
    def peak_bytes(self) -> int:
        if self.cuda:
            import torch

            return int(torch.cuda.max_memory_allocated()) - self.baseline
        return self.max_growth_bytes


# ----------------------------------------------------------------------------- config and sweep


@dataclasses.dataclass
class ContextConfig(SweepConfig):
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
        _check_int("max_new_tokens", self.max_new_tokens, 2)
        _check_list("batch_sizes", self.batch_sizes, int, lo=1)
        limit = self.max_context() - self.max_new_tokens
        _check_list("context_tokens", self.context_tokens, int, lo=64, hi=limit)
        if self.source not in ("en", "zh", "random"):
            raise ParameterError(f"source: must be one of en, zh, random (got {self.source!r})")
        if not isinstance(self.ignore_eos, bool):
            raise ParameterError(f"ignore_eos: must be true or false (got {self.ignore_eos!r})")

    def settings(self, seed: int | None = None) -> GenerationSettings:
        """Greedy, fixed-length settings of every point."""
        return GenerationSettings(max_new_tokens=self.max_new_tokens, ignore_eos=self.ignore_eos,
                                  seed=self.seed if seed is None else seed)

    def grid(self) -> list[dict]:
        """Points: batch size outermost, then L ascending (so RSS growth is read against smaller earlier peaks)."""
        return expand_grid(batch_size=self.batch_sizes, context_tokens=sorted(self.context_tokens))


def measure_context_point(loaded, cfg: ContextConfig, point: dict, warm: bool) -> dict:
    """Measure one (batch_size, context_tokens) point: the measure-dict of :func:`workbench.sweeps.run_sweep`.

    Args:
        loaded: :class:`workbench.models.LoadedModel`.
        cfg: the sweep's config.
        point: ``{"batch_size": B, "context_tokens": L}``.
        warm: run ``cfg.warmup`` untimed 2-token batches first.

    Returns:
        ``requests`` (records with ``context_tokens`` and ``source``), ``wall_s``,
        ``warmup_s`` and ``extra``: ``kv_bytes_computed`` (config formula at
        ``L x B`` tokens, the cache at the first generated step),
        ``kv_bytes_measured`` (memory growth at that step, see :class:`MemoryTracker`),
        ``memory_max_growth_bytes`` (over all steps), ``memory_peak_growth_bytes``
        (CUDA: allocator peak, prefill included) and ``memory_kind``.
    """
    import time

    from .prompts import build_batch, build_batch_ids

    B, L = int(point["batch_size"]), int(point["context_tokens"])
    tok = loaded.tokenizer
    if cfg.source == "random":
        kwargs = {"input_ids": build_batch_ids(tok, B, L, source="random", seed=cfg.seed)}
        prompts = [""] * B
    else:
        kwargs, prompts = {}, build_batch(tok, B, L, source=cfg.source)
    t0 = time.perf_counter()
    if warm:
        warm_settings = GenerationSettings(max_new_tokens=2, seed=cfg.seed)
        for _ in range(cfg.warmup):
            generate_measured(loaded, prompts, warm_settings, **kwargs)
    warmup_s = time.perf_counter() - t0
    tracker = MemoryTracker(loaded.info.device)
    tracker.start()
    out = measure_generation(loaded, prompts, cfg.settings(), cfg.repeats, 0, on_step=tracker.on_step, **kwargs)
    for rec in out["requests"]:
        rec.update(context_tokens=L, source=cfg.source)
    out["warmup_s"] = warmup_s
    out["extra"] = {
        "source": cfg.source,
        "kv_bytes_computed": kv_cache_bytes(loaded.info, L, B),
        "kv_bytes_measured": int(tracker.first_step_growth_bytes or 0),
        "memory_max_growth_bytes": int(tracker.max_growth_bytes),
        "memory_peak_growth_bytes": int(tracker.peak_bytes),
        "memory_kind": tracker.kind,
    }
    return out


def run_context_sweep(cfg: ContextConfig, run_dir, loaded, resume: bool = False):
    """Every (batch_size, context_tokens) point of ``cfg`` through :func:`workbench.sweeps.run_sweep`.

    Returns:
        The ``context_length`` points DataFrame.
    """
    warmed: set[int] = set()

    def measure(p):
        warm = p["batch_size"] not in warmed
        warmed.add(p["batch_size"])
        return measure_context_point(loaded, cfg, p, warm)

    return run_sweep(run_dir, EXPERIMENT, cfg.grid(), measure, resume=resume, info=loaded.info, config=cfg)


# ----------------------------------------------------------------------------- figures


def _legend_below(fig):
    """Legend under the plot, so long trace names never cover the title."""
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.18, xanchor="left", x=0),
                      margin=dict(b=140))
    return fig


def _ok(df):
    return df[df["status"] == "ok"].copy() if "status" in df else df.copy()


def fig_latency_vs_context(requests, fits: dict, quantity: str = "prefill_s"):
    """TTFT and ``quantity`` per request vs L (markers), with the fitted ``a + bL + cL^2`` curve per batch size."""
    import plotly.graph_objects as go
    import plotly.express as px

    from . import plots  # noqa: F401  (registers the template)

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
                      xaxis_title="context length L (prompt tokens)", yaxis_title="seconds")
    return _legend_below(fig)


def fig_tpot_vs_context(points):
    """Decode TPOT p50 vs L, one line per batch size."""
    import plotly.express as px

    from . import plots  # noqa: F401

    df = _ok(points).sort_values("context_tokens")
    fig = px.line(df, x="context_tokens", y="tpot_s_p50", color=df["batch_size"].astype(str), markers=True,
                  labels={"context_tokens": "context length L (prompt tokens)", "tpot_s_p50": "TPOT p50 (s/token)",
                          "color": "batch size"},
                  title="Decode time per output token vs context length")
    return _legend_below(fig)


def fig_kv_bytes(points):
    """KV-cache MiB vs L: computed from the config (lines) and measured memory growth (markers)."""
    import pandas as pd
    import plotly.express as px

    from . import plots  # noqa: F401

    df = _ok(points).sort_values("context_tokens")
    kind = df["memory_kind"].iloc[0] if "memory_kind" in df and len(df) else "memory"
    long = pd.concat([
        df.assign(MiB=df["kv_bytes_computed"] / 2**20, how="computed (config)"),
        df.assign(MiB=df["kv_bytes_measured"] / 2**20, how=f"measured ({kind} growth)"),
    ])
    long["batch size"] = long["batch_size"].astype(str)
    fig = px.line(long, x="context_tokens", y="MiB", color="batch size", line_dash="how", markers=True,
                  labels={"context_tokens": "context length L (prompt tokens)", "MiB": "KV cache (MiB)"},
                  title="KV-cache size vs context length: computed vs measured")
    return _legend_below(fig)


def fig_heatmap(points, value: str, title: str, unit: str):
    """Batch size x L heatmap of a point column (e.g. ``ttft_s_p50``), cells annotated."""
    import plotly.express as px

    from . import plots  # noqa: F401

    df = _ok(points)
    table = df.pivot_table(index="batch_size", columns="context_tokens", values=value, aggfunc="median")
    fig = px.imshow(table, text_auto=".3g", aspect="auto", color_continuous_scale="Viridis",
                    labels={"x": "context length L (prompt tokens)", "y": "batch size", "color": unit},
                    title=title)
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig


def context_figures(points, requests, fits: dict) -> dict:
    """Every figure of the notebook, by name, in report order."""
    return {
        "context_ttft_prefill_fit": fig_latency_vs_context(requests, fits),
        "context_tpot": fig_tpot_vs_context(points),
        "context_kv_bytes": fig_kv_bytes(points),
        "context_heatmap_ttft": fig_heatmap(points, "ttft_s_p50", "TTFT p50 (s) by batch size and context length",
                                            "TTFT p50 (s)"),
        "context_heatmap_throughput": fig_heatmap(points, "output_throughput_tps",
                                                  "Output throughput (tokens/s) by batch size and context length",
                                                  "tokens/s"),
    }
