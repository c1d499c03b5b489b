"""Context length: prefill scaling fit, KV-cache memory (computed and measured), and the L x batch sweep.

What it measures (notebook ``02_context_length``): for each (batch size,
context length L) point, prompts of exactly L tokens (chat template included,
:mod:`workbench.inputs.prompts`), a fixed number of new tokens, and the usual
TTFT / prefill / TPOT records; plus the KV cache the model's config predicts and
the memory actually measured while it is live.

Methods:

- Prefill fit: ``prefill_s = a + b*L + c*L^2`` by ordinary least squares
  (``numpy.linalg.lstsq`` on the design matrix ``[1, L, L^2]``), with the
  coefficient of determination ``R^2 = 1 - SS_res / SS_tot``. The linear term is
  the weight matmuls (``2 N`` FLOPs per token, Kaplan et al. 2020), the
  quadratic term attention over the prompt; they are equal at ``L = b / c`` (the
  crossover: beyond it attention dominates prefill). One observation per point (the
  median of its repeats: the repeats of a point share its moment on the machine),
  with 95% intervals of ``b`` and ``c`` (OLS standard errors, t over the residual
  dof); a crossover is stated only when the interval of ``c`` excludes 0.
- KV cache from the config (:func:`workbench.measure.memory.kv_cache_bytes`) at ``L x
  batch`` tokens, compared with the memory growth measured at the first
  generated step (:class:`workbench.measure.memory.MemoryTracker`: CUDA allocated bytes,
  or process RSS after ``malloc_trim`` on CPU, a few MiB above the cache).
- Warm-up: :func:`workbench.measure.generation.warm_up` (``warmup`` untimed runs) before
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

from workbench.stats import evidence
from workbench.share import plots
from workbench.predict import predictions
from workbench.checks import check_bool, check_choice, check_int, check_int_list
from workbench.errors import ParameterError
from workbench.measure.generation import GenerationSettings, warm_up
from workbench.measure.memory import MemoryTracker, kv_cache_bytes
from workbench.run.point_result import PointResult
from workbench.run.sweeps import SweepConfig, expand_grid, measure_generation, run_sweep

EXPERIMENT = "context_length"


# ----------------------------------------------------------------------------- prefill fit


@dataclasses.dataclass(frozen=True)
class QuadraticFit:
    """``y = a + b*L + c*L^2`` (or ``a + b*L`` when ``degree`` is 1, ``c`` then 0) fitted by least squares.

    Attributes:
        a: intercept (seconds).
        b: linear coefficient (seconds per token).
        c: quadratic coefficient (seconds per token^2).
        r2: coefficient of determination on the fitted points.
        n: number of fitted observations (one per point and repeat when fitted by :func:`fit_by_batch`).
        degree: 2 (quadratic) or 1 (straight line).
        n_lengths: distinct lengths behind the fit (0: not recorded, then ``n`` is used).
        b_low, b_high: 95% interval of ``b`` (OLS standard error, Student t over :attr:`dof`); NaN when
            ``dof`` is 0.
        c_low, c_high: the same interval of ``c`` (NaN without dof): a crossover is stated only when it excludes 0
            (:attr:`crossover_shown`). On a straight line chosen by :func:`fit_by_batch` over a quadratic whose
            ``c`` interval included 0, that quadratic's interval (why the line was kept; ``c`` itself is 0).
        l_min, l_max: the shortest and longest fitted length (tokens; NaN when not recorded): ``a`` is an
            extrapolation to 0 tokens from ``l_min``, and can fall below 0 when the growth steepens at the long end.
    """

    a: float
    b: float
    c: float
    r2: float
    n: int
    degree: int = 2
    n_lengths: int = 0
    b_low: float = float("nan")
    b_high: float = float("nan")
    c_low: float = float("nan")
    c_high: float = float("nan")
    l_min: float = float("nan")
    l_max: float = float("nan")

    @property
    def dof(self) -> int:
        """Residual degrees of freedom: observations minus parameters."""
        return self.n - (self.degree + 1)

    @property
    def support(self) -> tuple[bool, str]:
        """:func:`workbench.stats.evidence.fit_support` over the distinct lengths: ``(supported, "not supported: ...")``."""
        return evidence.fit_support(self.n_lengths or self.n, self.degree + 1)

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

    @property
    def crossover_shown(self) -> bool:
        """Whether the fit carries a crossover: a quadratic whose ``c`` interval lies above 0 (an interval that
        includes 0 cannot say the quadratic term exists, let alone where it overtakes the linear one)."""
        return self.degree == 2 and math.isfinite(self.c_low) and self.c_low > 0

    def predict(self, L) -> np.ndarray:
        """Fitted values at ``L`` (scalar or array of tokens)."""
        L = np.asarray(L, dtype=float)
        return self.a + self.b * L + self.c * L**2

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "dof": self.dof, "supported": self.support[0],
                "crossover_tokens": self.crossover_tokens}


def fit_quadratic(L: Sequence[float], y: Sequence[float], degree: int = 2) -> QuadraticFit:
    """Least-squares fit of ``y = a + b*L + c*L^2`` (``degree=1``: ``a + b*L``); non-finite pairs dropped.

    Args:
        L: prompt lengths (tokens), at least ``degree + 1`` distinct values.
        y: seconds (e.g. ``prefill_s`` per request).
        degree: 2 or 1.

    Returns:
        :class:`QuadraticFit` with R^2, the observations, the distinct lengths and the 95% intervals of ``b`` and
        ``c`` (OLS standard errors, Student t over the residual dof).

    Raises:
        ParameterError: fewer than ``degree + 1`` distinct lengths (the fit is underdetermined).
    """
    L = np.asarray(L, dtype=float)
    y = np.asarray(y, dtype=float)
    keep = np.isfinite(L) & np.isfinite(y)
    L, y = L[keep], y[keep]
    distinct = len(np.unique(L))
    if distinct < degree + 1:
        raise ParameterError(
            f"context_tokens: the degree-{degree} fit needs at least {degree + 1} distinct lengths (got {distinct})"
        )
    X = np.column_stack([L**k for k in range(degree + 1)])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    ss_res = float((resid**2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")
    dof = len(L) - (degree + 1)
    b_low = b_high = c_low = c_high = float("nan")
    if dof > 0:
        cov = ss_res / dof * np.linalg.pinv(X.T @ X)
        iv = evidence.estimate_interval(float(coef[1]), math.sqrt(max(cov[1, 1], 0.0)), dof, "OLS")
        b_low, b_high = iv.low, iv.high
        if degree >= 2:
            iv = evidence.estimate_interval(float(coef[2]), math.sqrt(max(cov[2, 2], 0.0)), dof, "OLS")
            c_low, c_high = iv.low, iv.high
    c = float(coef[2]) if degree >= 2 else 0.0
    return QuadraticFit(float(coef[0]), float(coef[1]), c, r2, int(len(L)), degree, distinct, b_low, b_high,
                        c_low, c_high, float(L.min()), float(L.max()))


def fit_by_batch(requests, y: str = "prefill_s", x: str = "prompt_tokens", points=None) -> dict:
    """One fit of ``y`` on ``x`` per batch size, over valid points only.

    Rows of one batch share one stamp per step, and the repeats of one point share its moment on the machine
    (they run back to back), so each point is one observation: the median over its repeats of each repeat's
    median row (when ``point_id`` and ``repeat`` are present; ``point_id`` alone: the median of its rows). Fitting
    the repeats as independent observations would count one length's drift three times and narrow the intervals.
    The quadratic is kept when the distinct lengths support it (:func:`workbench.stats.evidence.fit_support`:
    parameters + 2) and its ``c`` interval excludes 0 (the curvature is shown); otherwise the straight line when
    the lengths support that (backward elimination of the term the data cannot carry: with ``c`` in the model the
    two collinear coefficients share the growth, and both intervals can include 0 while prefill plainly grows),
    carrying the quadratic's ``c`` interval; else the fit that can be computed, marked unsupported. Batch sizes
    with fewer than 2 distinct lengths are skipped.

    Args:
        requests: one row per request with ``batch_size``, ``x`` and ``y`` (and ``point_id``, ``repeat``).
        y, x: the columns fitted.
        points: the points table; when given, only requests of its usable points
            (:func:`workbench.stats.evidence.usable_points`: status ok and valid) are fitted.

    Returns:
        ``{batch_size: QuadraticFit}``.
    """
    if points is not None and "point_id" in requests:
        usable = evidence.usable_points(points)
        requests = requests[requests["point_id"].isin(usable["point_id"])]
    if {"point_id", "repeat"} <= set(requests.columns):
        requests = requests.groupby(["batch_size", "point_id", "repeat"], as_index=False)[[x, y]].median()
    if "point_id" in requests.columns:
        requests = requests.groupby(["batch_size", "point_id"], as_index=False)[[x, y]].median()
    fits = {}
    for bs, g in requests.groupby("batch_size"):
        candidates = []
        for degree in (2, 1):
            try:
                candidates.append(fit_quadratic(g[x], g[y], degree))
            except ParameterError:
                continue
        if candidates:
            fits[int(bs)] = _choose(candidates)
    return fits


def _choose(candidates: list) -> "QuadraticFit":
    """The quadratic when supported with its curvature shown, else the supported line (with the quadratic's ``c``
    interval), else the first supported fit, else the first (:func:`fit_by_batch`)."""
    quad = next((f for f in candidates if f.degree == 2), None)
    line = next((f for f in candidates if f.degree == 1), None)
    if quad is not None and quad.support[0] and (quad.c_low > 0 or quad.c_high < 0):
        return quad
    if line is not None and line.support[0]:
        if quad is not None and math.isfinite(quad.c_low) and quad.support[0]:
            return dataclasses.replace(line, c_low=quad.c_low, c_high=quad.c_high)
        return line
    return next((f for f in candidates if f.support[0]), candidates[0])


def fits_table(fits: dict, quantity: str = "prefill_s"):
    """``pandas.DataFrame``: one row per batch size with a, b, c, r2, n, degree, n_lengths, b_low, b_high, c_low,
    c_high, l_min, l_max (tokens), dof, supported, crossover_tokens."""
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

    context_tokens: list = dataclasses.field(default_factory=lambda: [128, 512, 1024, 1536, 2048])
    batch_sizes: list = dataclasses.field(default_factory=lambda: [1, 4])
    max_new_tokens: int = 8
    ignore_eos: bool = True
    source: str = "en"
    repeats: int = 3  # the median outlasts one disturbed run (the notebook's default, one place: its parameters cell agrees)

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
        loaded: :class:`workbench.measure.models.LoadedModel`.
        cfg: the sweep's config.
        point: ``{"batch_size": B, "context_tokens": L}``.
        state: the sweep's shared state: ``state["warmed"]`` (a set of batch sizes) says which batch sizes
            already ran their ``cfg.warmup`` untimed batches (:func:`workbench.measure.generation.warm_up`); the first
            point of each batch size warms up and adds its batch size.

    Returns:
        :class:`workbench.run.point_result.PointResult`: ``requests`` (records with ``context_tokens`` and ``source``), ``wall_s``,
        ``warmup_s`` and ``extra``: ``kv_bytes_computed`` (config formula at
        ``L x B`` tokens, the cache at the first generated step),
        ``kv_bytes_measured`` (memory growth at that step, see :class:`workbench.measure.memory.MemoryTracker`),
        ``memory_max_growth_bytes`` (over all steps), ``memory_peak_growth_bytes``
        (CUDA: allocator peak, prefill included) and ``memory_kind``.
    """
    from workbench.inputs.prompts import build_batch, random_batch

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
    """Every (batch_size, context_tokens) point of ``cfg`` through :func:`workbench.run.sweeps.run_sweep`.

    Returns:
        The ``context_length`` points DataFrame, with the roofline's prediction per point and
        ``ttft_ratio`` / ``tpot_ratio`` (residuals saved as ``residuals/context_length.txt``).
    """
    state: dict = {}

    def measure(p):
        return measure_point(loaded, cfg, p, state)

    predictor = predictions.calibrated_predictor(loaded)  # predict before measuring
    points = run_sweep(run_dir, EXPERIMENT, cfg.grid(), measure, resume=resume, info=loaded.info, loaded=loaded,
                       config=cfg, speed_probe=True)  # the twin's calibration: its speed at the moment
    points = predictions.with_predictions(points, loaded.info, predictor)
    predictions.save_residuals(run_dir, EXPERIMENT, points)
    return points


# ----------------------------------------------------------------------------- figures


def finding(fits: dict, max_context: int, points=None) -> evidence.Finding:
    """Per batch size: the fitted prefill curve, with its R^2 and degrees of freedom, or why it is not supported.

    A quadratic fit is a finding only over at least 5 distinct lengths (3 parameters + 2); with 4 lengths the
    straight line's per-token cost is the finding and the quadratic term is "not supported". A per-token
    cost whose 95% interval includes 0 is "no difference from 0 beyond noise".

    Args:
        fits: ``{batch_size: QuadraticFit}`` of ``prefill_s`` (:func:`fit_by_batch`, over valid points).
        max_context: the longest measured context (tokens), to say whether the crossover was reached.
        points: the points table, for the ids of the usable points the fits rest on.

    Returns:
        :class:`workbench.stats.evidence.Finding`.
    """
    ids = evidence.point_ids(evidence.usable_points(points)) if points is not None else ()
    if not fits:
        counts = f" ({len(ids)} of {len(points)} points valid)" if points is not None else ""
        return evidence.Finding("Prefill vs context length: not supported: fewer than 2 valid lengths per batch "
                                f"size{counts}.", "no fit", False, ids)
    parts, notes, supported = [], [], False
    for bs, f in sorted(fits.items()):
        ok, why = f.support
        kind = "quadratic" if f.degree == 2 else "straight-line"
        notes.append(f"batch {bs}: {kind} fit over {f.n_lengths} lengths ({f.n} per-point medians): R^2 {f.r2:.3f}, "
                     f"{f.dof} dof" + (f", per-token cost 95% interval {f.b_low * 1e6:.1f}-{f.b_high * 1e6:.1f} us "
                                       f"(OLS, t over {f.dof} dof)" if math.isfinite(f.b_low) else "")
                     + (f", {'the quadratic (not kept): its ' if f.degree == 1 else ''}quadratic term 95% interval "
                        f"{f.c_low * 1e9:.3g}-{f.c_high * 1e9:.3g} ns/token^2" if math.isfinite(f.c_low) else ""))
        if not ok:
            parts.append(f"batch {bs}: prefill vs length {why}")
            continue
        grows = math.isfinite(f.b_low) and (f.b_low > 0 or f.b_high < 0)
        if not grows:
            parts.append(f"batch {bs}: prefill per token: no difference from 0 beyond noise "
                         f"({f.b * 1e6:.1f} us/token)")
            continue
        supported = True
        text = f"batch {bs}: prefill {f.a * 1e3:.1f} ms + {f.b * 1e6:.1f} us/token"
        if f.a < 0 and math.isfinite(f.l_min):
            # A fixed cost below 0 is no cost: the fit's intercept extrapolates past the shortest length, pulled
            # down by growth that steepens at the long end. Say the per-token cost and the fitted value measured.
            text = (f"batch {bs}: prefill {f.b * 1e6:.1f} us/token over {f.l_min:,.0f}-{f.l_max:,.0f} tokens "
                    f"({float(f.predict(f.l_min)) * 1e3:.0f} ms at {f.l_min:,.0f}; the fit's intercept, "
                    f"{f.a * 1e3:.0f} ms at 0 tokens, is below 0: the growth steepens at the long end, no fixed "
                    f"cost is read from it)")
        if f.degree == 1 and math.isfinite(f.c_low):
            text += (f"; the quadratic (attention) term's 95% interval includes 0 at these lengths "
                     f"({f.c_low * 1e9:.3g} to {f.c_high * 1e9:.3g} ns/token^2): the straight line carries the "
                     f"per-token cost, no crossover is supported")
        elif f.degree == 1:
            quad_ok, quad_why = evidence.fit_support(f.n_lengths, 3)
            text += f"; the quadratic (attention) term is {quad_why}"
        elif not f.crossover_shown:
            text += ("; the quadratic term's 95% interval includes 0 (no crossover with the linear term is supported)"
                     if not (math.isfinite(f.c_high) and f.c_high < 0) else
                     "; the quadratic term is below 0 beyond noise (it never overtakes the linear one here)")
        elif f.crossover_tokens == float("inf"):
            text += "; the quadratic term never overtakes the linear one (c <= 0)"
        else:
            where = "beyond" if f.crossover_tokens > max_context else "within"
            text += (f"; attention's quadratic term overtakes the linear one at {f.crossover_tokens:,.0f} tokens "
                     f"({where} the measured range)")
        parts.append(text)
    return evidence.Finding("; ".join(parts) + ".", "valid points only; " + "; ".join(notes), supported, ids)


def _l_label() -> str:
    return f"context length L ({plots.label('prompt_tokens')})"


def fig_latency_vs_context(requests, fits: dict, quantity: str = "prefill_s"):
    """TTFT and ``quantity`` per request vs L (markers), with the fitted ``a + bL + cL^2`` (or ``a + bL``) curve
    per batch size, its R^2 and dof in the legend, "not supported" when too few lengths carry it."""
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
            shape = f"{f.a:.3g} + {f.b:.3g}L + {f.c:.3g}L²" if f.degree == 2 else f"{f.a:.3g} + {f.b:.3g}L"
            note = "" if f.support[0] else ", not supported"
            fig.add_scatter(x=xs, y=f.predict(xs), mode="lines", line=dict(color=col, dash="dash"),
                            name=f"fit b={bs}: {shape} (R²={f.r2:.3f}, {f.dof} dof{note})")
    fig.update_layout(title="TTFT and prefill vs context length, with the fit over valid points",
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
