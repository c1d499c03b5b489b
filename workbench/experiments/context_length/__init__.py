"""Context length: prefill scaling fit, KV-cache memory (computed and measured), and the L x batch sweep.

What it measures (notebook ``02_context_length``): for each (batch size,
context length L) point, prompts of exactly L tokens (chat template included,
:mod:`workbench.inputs.prompts`), a fixed number of new tokens, and the usual
TTFT / prefill / TPOT records; plus the KV cache the model's config predicts and
the memory actually measured while it is live.

Methods:

- Design (:mod:`workbench.run.design`, :func:`sweep_design`): with 2+ points and ``repeats`` >= 2 the lengths are the
  arms of one design: each round measures every (batch size, L) point once, in an order shuffled per round, plus the
  shortest length of the first batch size again (the A/A control); each batch size's shortest length is its marked
  control (each length's ``prefill_vs_shortest`` ratio: the block analysis's, trivially a direction). The comparison
  the design decides, and stops on (its ``judge``), is the fit's.
- Prefill fit with the rounds as blocks (:func:`fit_rounds`): each round's values are divided by the round's own
  level (its geometric mean over the lengths over the geometric mean of all rounds: a drift that slows a whole round
  cancels, as in the block analysis on the log scale), then ``prefill_s = a + b*L + c*L^2`` is fitted over every
  (round, length) value with errors proportional to the mean (a Gamma GLM with the identity link, weights
  ``1 / fitted^2``: the machine's noise is a share of each prefill, ~10% at 128 tokens and at 2,048 alike, so an
  unweighted fit let the longest lengths' seconds of noise swamp the short ones), ``R*K - 3 - (R - 1)`` residual dof
  (R rounds, K lengths; the residual holds the rounds' noise and any lack of fit). The linear term is the weight matmuls (``2 N`` FLOPs per
  token, Kaplan et al. 2020), the quadratic term attention over the prompt.
- The decision (:func:`curvature_decision`): the quadratic term's weight at the longest measured length, the fit's
  prediction there over the same fit without its ``c*L^2`` term, ``(a + b L + c L^2) / (a + b L)`` at ``L_max``,
  with a t interval on its log (delta method, the fit's covariance) at the look's alpha: a **direction** when it
  excludes 1 ("higher": attention's term adds that share of prefill at ``L_max``), **equivalent** within the margin
  (a straight line describes prefill over the measured lengths to within +-5%), else **undecided** with the rounds
  that would decide it (:func:`workbench.stats.blocks.rounds_needed`, paired form: conservative). Why this and not a
  crossover: ``b / c`` lies beyond the measured lengths on this model and moves with the noise in ``c`` (two runs
  of one clone: "no crossover", then "5,059 tokens"); a share at a measured length is what the data carry. Why
  not the quadratic's prediction over a separately fitted line: a line fitted to curved data bends toward it, so
  the two differ by ~3% at ``L_max`` where the term carries ~28% (one fit's two parts, one covariance, say it).
  A crossover ``b / c`` is stated only when the term is a direction and the crossover lies within the measured
  lengths; never extrapolated.
- One round (``repeats`` 1): the same fit over the points (one round: no block), the older
  :func:`fit_by_batch` over per-point medians for TTFT and for runs without a design.
- KV cache from the config (:func:`workbench.measure.memory.kv_cache_bytes`) at ``L x
  batch`` tokens, compared with the memory growth measured at the first
  generated step (:class:`workbench.measure.memory.MemoryTracker`: CUDA allocated bytes,
  or process RSS after ``malloc_trim`` on CPU, a few MiB above the cache), on each point's first measurement.
- Warm-up: :func:`workbench.measure.generation.warm_up` (``warmup`` untimed runs) before
  the first point of each batch size only. Eager PyTorch has no per-shape
  compilation, so warming every context length would double the sweep's time
  for nothing.

Entry points: :class:`Config`, :func:`measure_point`, :func:`sweep_design`, :func:`run`, the fits
(:func:`fit_quadratic`, :func:`fit_rounds`, :func:`curvature_decision`, :func:`fits_from_run`, :func:`fit_by_batch`,
:func:`fits_table`), :func:`finding` and :func:`figures`.
Parts (this module is the experiment's face and re-exports them): :mod:`.fits` (the fits and the curvature
decision), :mod:`.charts` (the figures from the points and requests).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from workbench import checks
from workbench.checks import check_bool, check_choice, check_int, check_int_list
from workbench.errors import ParameterError
from workbench.experiments.context_length.charts import (
    fig_heatmap,
    fig_kv_bytes,
    fig_latency_vs_context,
    fig_tpot_vs_context,
    length_label,
)
from workbench.experiments.context_length.fits import (
    QuadraticFit,
    curvature_decision,
    fit_quadratic,
    fit_rounds,
    fits_table,
)
from workbench.measure.generation import GenerationSettings, generate_measured, warm_up
from workbench.measure.memory import MemoryTracker, kv_cache_bytes
from workbench.predict import predictions
from workbench.run import design, design_sweep, point_result
from workbench.run.point_result import PointResult
from workbench.run.sweeps import SweepConfig, expand_grid, measure_generation, run_sweep
from workbench.share import plots
from workbench.stats import blocks, evidence

EXPERIMENT = "context_length"

#: the experiment's face: what notebook 02, the report and the tests read as ``context_length.<name>``
__all__ = [
    "EXPERIMENT", "QuadraticFit", "fit_quadratic", "fits_table", "fit_rounds", "curvature_decision", "Config",
    "measure_point", "PREFILL", "TTFT", "CURVATURE", "sweep_design", "curvature_columns", "run", "fits_from_run",
    "fits", "finding", "length_label", "fig_latency_vs_context", "fig_prefill_ratio", "fig_tpot_vs_context",
    "fig_kv_bytes", "fig_heatmap", "figures",
]


# ----------------------------------------------------------------------------- config and sweep


@dataclasses.dataclass
class Config(SweepConfig, design.DesignFields):
    """The context-length sweep (notebook ``02_context_length``).

    With 2+ points and ``repeats`` >= 2 the points are the arms of one design (:func:`sweep_design`): ``repeats``
    rounds first, then up to ``max_rounds`` while the fit's decision (:func:`curvature_decision`) is open and
    ``budget_s`` allows; ``margin`` is its equivalence margin.

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
        self.check_design()
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
    B, L = int(point["batch_size"]), int(point["context_tokens"])
    kwargs, prompts = _inputs(loaded, cfg, B, L)
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


PREFILL = design.Outcome("prefill_s", False, "prefill time", "prefill_vs_shortest")
TTFT = design.Outcome("ttft_s", False, "TTFT", "ttft_vs_shortest")
#: the fit's decision as its point columns carry it (:func:`curvature_columns`)
CURVATURE = design.Outcome("prefill_s", True, "the quadratic term at the longest length", "quadratic_share")


def _inputs(loaded, cfg: Config, B: int, L: int) -> tuple[dict, list]:
    """``(generate kwargs, prompts)`` of a (batch, length) point: random ids (templated inside the clock: TTFT) or
    real text of exactly L tokens."""
    from workbench.inputs.prompts import build_batch, random_batch

    if cfg.source == "random":
        return {"input_ids": random_batch(loaded.tokenizer, B, L, seed=cfg.seed)}, [""] * B
    return {}, build_batch(loaded.tokenizer, B, L, source=cfg.source)


def _values(table, arms: dict, outcome: str = "prefill_s") -> dict:
    """``{batch size: (rounds x lengths values, lengths)}`` from a design's table (``arms``: ``{arm: (B, L)}``)."""
    t = table[table["arm"].isin(list(arms))]
    if t.empty:
        return {}
    wide = t.pivot_table(index="round", columns="arm", values=outcome, aggfunc="first")
    out = {}
    for b in sorted({bl[0] for bl in arms.values()}):
        cols = sorted((a for a, bl in arms.items() if bl[0] == b and a in wide), key=lambda a: arms[a][1])
        if cols:
            out[b] = (wide[cols].to_numpy(dtype=float), np.array([arms[a][1] for a in cols], dtype=float))
    return out


def sweep_design(loaded, cfg: Config, points: list[dict]) -> design_sweep.SweepDesign:
    """The points as one design (:mod:`workbench.run.design`): each round measures one batch of every (batch size,
    length) point, round ``r`` at seed ``cfg.seed + r``, in an order shuffled per round, and the first batch size's
    shortest length again (the A/A control). Each batch size's shortest length is its marked control; the primary
    outcome is prefill (the rows' median ``prefill_s`` of the batch), TTFT secondary. The design stops when every
    batch size's :func:`curvature_decision` is decided at a look (its ``judge``). Memory is tracked on each point's
    first measurement (:class:`workbench.measure.memory.MemoryTracker`); the points' ``extra`` adds the KV columns
    and the fit's decision (:func:`curvature_columns`).

    Returns:
        :class:`workbench.run.design_sweep.SweepDesign` for :func:`workbench.run.sweeps.run_sweep`.
    """
    settings = cfg.settings()
    pid = (lambda p: point_result.point_id(EXPERIMENT, p))
    arms = {pid(p): (int(p["batch_size"]), int(p["context_tokens"])) for p in points}
    inputs: dict = {}
    memory: dict = {}
    warmed: set = set()

    def get(p):
        key = pid(p)
        if key not in inputs:
            inputs[key] = _inputs(loaded, cfg, int(p["batch_size"]), int(p["context_tokens"]))
        return inputs[key]

    def prepare(p):
        kwargs, prompts = get(p)
        first = int(p["batch_size"]) not in warmed
        warmed.add(int(p["batch_size"]))
        return warm_up(loaded, prompts, settings, n=cfg.warmup if first else 0, **kwargs)

    def measure(p, rnd):
        kwargs, prompts = get(p)
        B, L = int(p["batch_size"]), int(p["context_tokens"])
        tracker = None
        if pid(p) not in memory:
            tracker = MemoryTracker(loaded.info.device)
            tracker.start()
        res = generate_measured(loaded, prompts, dataclasses.replace(settings, seed=settings.seed + rnd),
                                on_step=tracker.on_step if tracker else None, **kwargs)
        if tracker is not None:
            memory[pid(p)] = {"kv_bytes_computed": kv_cache_bytes(loaded.info, L, B),
                              "kv_bytes_measured": int(tracker.first_step_growth_bytes or 0),
                              "memory_max_growth_bytes": int(tracker.max_growth_bytes),
                              "memory_peak_growth_bytes": int(tracker.peak_bytes), "memory_kind": tracker.kind}
        for rec in res.records:
            rec.update(context_tokens=L, source=cfg.source, batch_size=B, batch_wall_s=res.wall_s)
        med = (lambda k: float(np.median([r[k] for r in res.records])))
        return design.Measured({PREFILL.name: med("prefill_s"), TTFT.name: med("ttft_s")}, res.records, res.wall_s)

    def judge(table, alpha):
        got = _values(table, arms)
        return bool(got) and all(curvature_decision(v, ls, alpha, cfg.margin).decided for v, ls in got.values())

    def extra(point_id, result):
        cols = {"source": cfg.source, **memory.get(point_id, {})}
        alpha = result.looks[-1]["alpha"] if result.looks else blocks.ALPHA
        got = _values(result.table, arms).get(arms[point_id][0])
        if got is not None:
            d = curvature_decision(*got, alpha, cfg.margin, f"batch {arms[point_id][0]}")
            cols.update(curvature_columns(d, result.seconds_per_round))
        return cols

    groups: dict = {}
    for p in sorted(points, key=lambda p: (p["batch_size"], p["context_tokens"])):
        groups.setdefault(int(p["batch_size"]), []).append(pid(p))
    controls = {members[0]: members for members in groups.values()}
    first = next(iter(controls))
    d = design.Design(EXPERIMENT, [pid(p) for p in points], first, PREFILL, (TTFT,), groups=controls, judge=judge,
                      **cfg.design_kwargs())
    return design_sweep.SweepDesign(d, measure, prepare, extra)


def curvature_columns(d: blocks.Decision, seconds_per_round: float = float("nan")) -> dict:
    """The point columns of a batch size's :func:`curvature_decision`: ``quadratic_share`` (``q / l`` at the longest
    length) with ``_low`` / ``_high`` / ``_level`` / ``_method`` / ``_verdict`` / ``_direction``, and the fit's
    ``rounds_needed`` / ``seconds_needed`` (they replace the arm's own, which the shortest length decides at once)."""
    p = CURVATURE.prefix
    need = d.rounds_needed
    secs = (max(need - d.rounds, 0) * seconds_per_round if need else (0.0 if d.decided else float("nan")))
    return {p: d.estimate, f"{p}_low": d.low, f"{p}_high": d.high, f"{p}_level": d.level,
            f"{p}_method": d.method if d.shown else (d.reason or d.method), f"{p}_verdict": d.verdict,
            f"{p}_direction": d.direction, "rounds_needed": float(need) if need is not None else float("nan"),
            "seconds_needed": float(secs) if math.isfinite(secs) else float("nan")}


def run(cfg: Config, run_dir, loaded, resume: bool = False):
    """Every (batch_size, context_tokens) point of ``cfg`` through :func:`workbench.run.sweeps.run_sweep`: with 2+
    points and ``repeats`` >= 2 as one design (:func:`sweep_design`; every finished round on disk in
    ``design/context_length.parquet``, a resume continues from the last), else point by point
    (:func:`measure_point`).

    Returns:
        The ``context_length`` points DataFrame, with the roofline's prediction per point and
        ``ttft_ratio`` / ``tpot_ratio`` (residuals saved as ``residuals/context_length.txt``).
    """
    state: dict = {}

    def measure(p):
        return measure_point(loaded, cfg, p, state)

    grid = cfg.grid()
    designed = sweep_design(loaded, cfg, grid) if len(grid) >= 2 and cfg.repeats >= 2 else None
    predictor = predictions.calibrated_predictor(loaded)  # predict before measuring
    points = run_sweep(run_dir, EXPERIMENT, grid, measure, resume=resume, info=loaded.info, loaded=loaded,
                       config=cfg, speed_probe=True,  # the twin's calibration: its speed at the moment
                       design=designed)
    points = predictions.with_predictions(points, loaded.info, predictor)
    predictions.save_residuals(run_dir, EXPERIMENT, points)
    return points


def fits_from_run(run_dir, points, outcome: str = "prefill_s") -> dict:
    """``{batch size: QuadraticFit}`` of ``outcome`` from the run's design table (:func:`fit_rounds`, the rounds as
    blocks) over the usable points of ``points`` (:func:`workbench.stats.evidence.usable_points`); empty when the run
    holds no design of this experiment (measured point by point: :func:`fit_by_batch`)."""
    import pandas as pd

    path = Path(run_dir) / "design" / f"{EXPERIMENT}.parquet" if run_dir is not None else None
    if path is None or not path.exists() or points is None or points.empty:
        return {}
    table = pd.read_parquet(path)
    arms = {str(r["point_id"]): (int(r["batch_size"]), int(r["context_tokens"]))
            for _, r in evidence.usable_points(points).iterrows()}
    out = {}
    for b, (v, ls) in _values(table, arms, outcome).items():
        try:
            out[b] = fit_rounds(v, ls)
        except ParameterError:
            continue
    return out


# ----------------------------------------------------------------------------- the fits of a run and the finding


def fits(points, requests=None, run_dir=None, outcome: str = "prefill_s") -> dict:
    """``{batch size: QuadraticFit}`` of ``outcome`` over the usable points: from the run's design table with the
    rounds as blocks (:func:`fits_from_run`), else (measured point by point) over each point's median of its rows
    (:func:`fit_rounds` of one round). Batch sizes whose lengths cannot carry a quadratic (fewer than 3) are left
    out."""
    got = fits_from_run(run_dir, points, outcome)
    if got or requests is None:
        return got
    out = {}
    for b, (v, ls) in _medians(points, requests, outcome).items():
        try:
            out[b] = fit_rounds(v, ls)
        except ParameterError:
            continue
    return out


def _medians(points, requests, outcome: str = "prefill_s") -> dict:
    """``{batch size: (1 x lengths values, lengths)}``: each usable point's median ``outcome`` over its rows (a
    point measured on its own: one round)."""
    usable = evidence.usable_points(points)
    req = requests[requests["point_id"].isin(usable["point_id"])] if "point_id" in requests else requests.iloc[0:0]
    med = req.groupby("point_id")[outcome].median()
    out = {}
    for b, g in usable.groupby("batch_size"):
        g = g[g["point_id"].isin(med.index)].sort_values("context_tokens")
        if len(g):
            out[int(b)] = (med.loc[g["point_id"]].to_numpy(dtype=float)[None, :],
                           g["context_tokens"].to_numpy(dtype=float))
    return out


def _fit_text(b: int, f: QuadraticFit) -> str:
    """``"batch 1: prefill 31 ms + 1,328 us/token + 0.26 ns/token^2 over 128-2,048 tokens"``; a negative intercept
    is named as an extrapolation, never printed as a fixed cost below 0."""
    span = f"over {f.l_min:,.0f}-{f.l_max:,.0f} tokens"
    curve = f"{f.b * 1e6:,.0f} us/token {'+' if f.c >= 0 else '-'} {abs(f.c) * 1e9:.3g} ns/token^2"
    if f.a < 0:
        # A fixed cost below 0 is no cost: the intercept extrapolates past the shortest length, pulled down by growth
        # that steepens at the long end. Say the fitted value measured instead.
        return (f"batch {b}: prefill {curve} {span} ({float(f.predict(f.l_min)) * 1e3:.0f} ms at {f.l_min:,.0f} "
                f"tokens; the fit's intercept, {f.a * 1e3:.0f} ms at 0 tokens, is below 0: no fixed cost is read "
                f"from it)")
    return f"batch {b}: prefill {f.a * 1e3:.1f} ms + {curve} {span}"


def _curvature_text(b: int, f: QuadraticFit | None, d: blocks.Decision, seconds_per_round: float) -> str:
    """The fit's decision in words for an inference engineer (the module's method)."""
    lm = f"{f.l_max:,.0f} tokens" if f is not None else "the longest length"
    core = d.describe(f"at {lm}, the fit over its straight part (a + bL)", words=("higher", "lower"),
                      seconds_per_round=seconds_per_round)
    if d.verdict == "direction" and d.direction == "higher":
        share = 1 - 1 / d.estimate
        text = f"{core}: attention's quadratic term carries {share:.0%} of prefill at {lm}"
        if f is not None and f.c > 0 and f.b > 0 and f.l_min <= f.b / f.c <= f.l_max:
            text += f", and equals the linear term at {f.b / f.c:,.0f} tokens (within the measured lengths)"
        return text
    if d.verdict == "direction":
        return f"{core}: the growth flattens at the long end (no attention term shows at these lengths)"
    if d.verdict == "equivalent":
        return (f"{core}: the quadratic term is within +-{d.margin - 1:.0%} of prefill at {lm}, so a "
                f"straight line describes prefill over the measured lengths")
    return core


def finding(points, requests=None, run_dir=None) -> evidence.Finding:
    """Per batch size: the prefill fit (rounds as blocks) and its decision on the quadratic term at the longest
    measured length (:func:`curvature_decision`; the module's method and why); no crossover extrapolated beyond the
    measured lengths.

    The verdict: every batch size decided (a direction where any is, else equivalent), else undecided with the
    most rounds any batch size needs; undecided too when the A/A control moved (drift, not length).

    Args:
        points: this experiment's points (a design's carry the decision, ``quadratic_share`` columns).
        requests: its requests (point by point: the fit over each point's median).
        run_dir: the run folder (the design's table: the fit drawn and quoted).

    Returns:
        :class:`workbench.stats.evidence.Finding` with its verdict.
    """
    usable = evidence.usable_points(points)
    ids = evidence.point_ids(usable)
    fitted = fits(points, requests, run_dir)
    designed = f"{CURVATURE.prefix}_verdict" in usable and usable[f"{CURVATURE.prefix}_verdict"].fillna("").ne("").any()
    parts, notes, decisions = [], [], []
    for b, g in usable.groupby("batch_size"):
        b = int(b)
        g = g.sort_values("context_tokens")
        f = fitted.get(b)
        row = g.iloc[0]
        if designed:
            d = design.decision_from_row(row, CURVATURE)
        else:
            got = _medians(points, requests, "prefill_s").get(b) if requests is not None else None
            d = curvature_decision(*got, name=f"batch {b}") if got is not None else None
        if d is None or (not d.shown and f is None):
            why = d.reason if d is not None else f"{len(g)} valid lengths"
            ok, need = evidence.fit_support(g["context_tokens"].nunique(), 3)
            parts.append(f"batch {b}: prefill vs length {need or why}")
            decisions.append(d or blocks.Decision(f"batch {b}", "", float("nan"), float("nan"), float("nan"), 0.95,
                                                  "undecided", "", blocks.MARGIN, 0, float("nan"), "", float("nan"),
                                                  None, why))
            continue
        decisions.append(d)
        spr = checks.float_or_nan(row.get("seconds_per_round"))
        text = _fit_text(b, f) + "; " if f is not None else f"batch {b}: "
        parts.append(text + _curvature_text(b, f, d, spr))
        if f is not None:
            bounds = (f"per-token cost 95% interval {f.b_low * 1e6:,.0f} to {f.b_high * 1e6:,.0f} us, quadratic term "
                      f"{f.c_low * 1e9:.3g} to {f.c_high * 1e9:.3g} ns/token^2 ({f.method}, t)"
                      if math.isfinite(f.b_low) and math.isfinite(f.c_low) else
                      "no intervals (no residual degrees of freedom)")
            notes.append(f"batch {b}: quadratic fit over {f.n_lengths} lengths ({f.n} values), R^2 {f.r2:.3f}, "
                         f"{f.dof} dof; {bounds}")
    if not parts:
        counts = (f": {evidence.none_valid(points, run_dir)}" if usable.empty and len(points) else
                  f" ({len(usable)} of {len(points)} points valid)")
        return evidence.Finding(f"Prefill vs context length: no valid length{counts}.", "no fit", False, ids,
                                verdict="undecided")
    open_ = [d for d in decisions if not d.decided]
    pick = (max(open_, key=lambda d: d.rounds_needed if d.rounds_needed is not None else math.inf) if open_ else
            next((d for d in decisions if d.verdict == "direction"), decisions[0]))
    text = "; ".join(parts) + "."
    ev = ("valid points only; the rounds' values over their round's level (rounds as blocks), one least-squares fit "
          "a + bL + cL^2 per batch size; decided: the fit at the longest length over its straight part a + bL "
          "(delta-method t interval; a crossover b/c only within the measured lengths); " + "; ".join(notes))
    if designed:
        row = usable.iloc[0]
        fields = design.finding_fields(row, pick)
        ev += f"; {design.evidence_text(row)}"
        if row.get("aa_verdict") == "direction":
            text += " The A/A control moved (the shortest length against itself shows a direction): drift, not length."
            fields["verdict"] = "undecided"
    else:
        fields = {"verdict": pick.verdict, "margin": pick.margin, "rounds": 1}
        if pick.verdict == "undecided":
            fields.update(rounds_needed=pick.rounds_needed, seconds_needed=None)
        text += " Measured point by point (one round: no rounds as blocks, no A/A control)."
    return evidence.Finding(text, ev, True, ids, **fields)


# ----------------------------------------------------------------------------- figures


def fig_prefill_ratio(points, run_dir=None):
    """Each length's prefill over its batch size's shortest length, with the simultaneous interval of the block
    analysis and each round's ratio faint (:func:`workbench.share.figures_design.ratio_figure`)."""
    from workbench.share import figures_design

    rounds = figures_design.round_ratios(run_dir, EXPERIMENT, PREFILL.name)
    return figures_design.ratio_figure(
        plots.ok_points(points), "context_tokens", PREFILL.prefix, rounds, group="batch_size",
        name=lambda b: f"batch {b}", x_title=length_label(), y_title="prefill / the shortest length's (x)",
        title="Prefill vs the shortest length (simultaneous 95% intervals; faint: each round)")


@plots.split_by_device
def figures(points, requests, fits: dict, run_dir=None) -> dict:
    """Every figure of the notebook, by name, in report order (``run_dir``: the design's rounds for the ratio
    figure's faint points)."""
    out = {
        "context_ttft_prefill_fit": fig_latency_vs_context(requests, fits),
        "context_tpot": fig_tpot_vs_context(points),
        "context_kv_bytes": fig_kv_bytes(points),
        "context_heatmap_ttft": fig_heatmap(points, "ttft_s_p50", "TTFT p50 (s) by batch size and context length",
                                            plots.label("ttft_s_p50")),
        "context_heatmap_throughput": fig_heatmap(points, "output_throughput_tps",
                                                  "Output throughput (tokens/s) by batch size and context length",
                                                  "tokens/s"),
    }
    if PREFILL.prefix in points and points[PREFILL.prefix].notna().any():
        out["context_prefill_ratio"] = fig_prefill_ratio(points, run_dir)
    return out
