"""Experiment 09: engine tuning with a quality guard and a recommendation (notebook ``09_engine_tuning``).

Knobs that change speed: ``dtype``, ``attn_implementation`` (``transformers``' attention kernel),
``cache_implementation`` (``dynamic`` / ``static``) with ``compile`` (``torch.compile`` of the decode forward,
which needs the static cache's fixed shapes), ``torch_threads`` (CPU) and ``quantization`` (the speed ladder's
weight schemes, :mod:`workbench.techniques.rungs`: torchao int8 / int4 weight-only, torch.ao ``int8_dynamic`` as a labelled
reference; ``group_size`` and ``lm_head`` apply to every quantized configuration). Each
configuration is measured at one or two workloads (batch size x prompt length, fixed-length greedy outputs)
with the calibrated roofline's prediction beside it (:mod:`workbench.predict.roofline`).

Method:

- Compile time: a compiled point first runs one full request untimed (``compile_s``: the first compiled call,
  recorded separately), then one full-length warm-up; the timed repeats come after both, and graphs compiled
  during them are counted (``recompiles``; :func:`workbench.run.rung_timing.measure`).
- Quality guard (per configuration; :mod:`workbench.measure.guard`, the one guard of every technique): perplexity and
  mean KL divergence against the float32 ``eager`` reference on shipped held-out English and Chinese text
  (``guard_text_tokens`` per language in windows of ``guard_window``), teacher-forced top-1 agreement, and the
  greedy view (``token_agreement`` / ``first_divergence`` over ``guard_prompts`` x ``guard_tokens``; reported,
  not judged). A configuration passes when the upper 95% bounds of ``perplexity_ratio`` and ``kl_mean`` are
  within ``max_perplexity_ratio`` and ``max_kl_mean``; one that fails is shown and marked, never recommended.
- Utilisation: MBU and MFU of a point count the bytes of the model it measured (the configuration's dtype) over
  the peaks probed in that dtype (:func:`workbench.predict.roofline_calibration.measured_utilisation`), not the notebook's float32 model.
- Recommendation: the fastest configuration on valid points that passes the guard and does not miss the SLO at the
  SLO's own percentile (p99 for MLPerf presets and ``custom``, p90 for DistServe's), judged only where the point's
  samples support that percentile (:func:`workbench.stats.slo.slo_verdict`). A grid of 2+ configurations with
  ``repeats`` >= 2 is one design (:func:`design_configurations`, :mod:`workbench.run.design`): the configurations
  are the arms, the baseline (:meth:`Config.baseline`, each axis's first value) the marked control, measured again
  each round as the A/A control; the primary outcome is a round's request latency (geometric mean over workloads of
  the batch's mean ``e2e_s``), analysed as a block design (rounds as blocks, one pooled variance, Dunnett's
  simultaneous intervals; :mod:`workbench.stats.blocks`) with three verdicts, rounds added while a comparison is
  open (:mod:`workbench.stats.sequential`). The recommendation's decision is
  :func:`workbench.stats.blocks.best_of` (:func:`choice`): the fastest estimate against the baseline and against
  its runner-up (Tukey); the baseline itself only when every other eligible configuration is slower beyond noise or
  equivalent (the baseline's best estimate alone decided ~1 in 4 null runs). Configurations that cost a model load
  (dtype, quantization) stay loaded (``order="interleaved"``); where a device's memory cannot hold them,
  ``order="blocks"`` loads one at a time in A B B A order. (One repeat, and the adaptive search, whose
  configurations are measured one after another: Welch's t on log repeat latencies, :func:`speedup_interval`, a
  direction only when it excludes 1.)
- ``search="adaptive"``: coordinate descent (:func:`workbench.experiments.engine_tuning.search.coordinate_search`; one axis at a time from the baseline,
  keeping the best value, the way a tuner bisects one knob while holding the rest) measuring at most a third
  of the grid (at least one full pass), with the drift reference measured around the whole search as around a
  grid sweep; it says whether it converged. :func:`replay_search` runs the same search over a measured grid to
  show whether it reaches the full grid's recommendation. The finding prints ONE recommendation, names the
  search that produced it, and gives the other's disagreement as a caveat (:func:`headline`).

The first value of each axis list is the baseline that ratios are taken against (marked in the design and in
the ``baseline`` column, never read from a table's row order).

**Parts** (this module is the experiment's face: :class:`Config`, the quality guard, :func:`measure_point`,
:func:`finish_point`, :func:`make_predictor`, :func:`run`, and every name below re-exported): :mod:`.rounds` (the
configurations as one design, :func:`design_configurations`), :mod:`.summaries` (:func:`replay_search`,
:func:`choice`, :func:`headline`, :func:`finding`), :mod:`.charts` (the figures and :func:`figures`), :mod:`.search`
(coordinate descent over a configuration grid).
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from workbench import checks
from workbench.errors import ParameterError
from workbench.experiments.engine_tuning.charts import (
    fig_guard,
    fig_prediction,
    fig_speed,
    fig_speedup,
    fig_speedup_rounds,
    figures,
)
from workbench.experiments.engine_tuning.rounds import E2E, EXPERIMENT, design_configurations
from workbench.experiments.engine_tuning.search import coordinate_search
from workbench.experiments.engine_tuning.summaries import choice, finding, headline, replay_search
from workbench.inputs.prompts import build_batch
from workbench.measure import config_models, guard, models
from workbench.measure.device import supported_attention, supported_dtypes, threads, usable_cores
from workbench.measure.generation import GenerationSettings
from workbench.predict import predictions, roofline_calibration
from workbench.predict.roofline_calibration import measured_utilisation
from workbench.run import design, drift, point_result, results, rung_timing, sweeps
from workbench.run.point_result import PointResult
from workbench.run.sweeps import SweepConfig
from workbench.stats import slo
from workbench.stats.evidence import repeat_statistics
from workbench.techniques import rungs
from workbench.techniques.configurations import (
    AXES,
    JOINT,
    build_configuration,
    config_key,
    config_name,
    configurations,
    designed,
    generate_kwargs,
    objective,
    recommend,
    speedup_phrase,
    valid,
)

CACHE_IMPLEMENTATIONS = ("dynamic", "static")
SEARCHES = ("grid", "adaptive")



@dataclasses.dataclass
class Config(SweepConfig, design.DesignFields):
    """The engine-tuning sweep (notebook ``09_engine_tuning``).

    A grid with 2+ configurations and ``repeats`` >= 2 is one design (:func:`design_configurations`): ``repeats``
    rounds first, then up to ``max_rounds`` while a configuration's comparison with the baseline is undecided and
    ``budget_s`` allows; ``margin`` is the equivalence margin. The baseline (:meth:`baseline`) is the grid's first
    configuration, each axis's first value: the design's marked control.

    Attributes:
        dtypes: weight/compute dtypes (:func:`workbench.measure.device.supported_dtypes` of the device).
        attn_implementations: attention kernels (:func:`workbench.measure.device.supported_attention`).
        cache_implementations: ``dynamic`` and/or ``static`` KV cache.
        compile: ``[False]``, ``[True]`` or both; ``True`` compiles the decode forward of static-cache points
            (dynamic-cache points always run uncompiled) and needs ``static`` in ``cache_implementations``.
        torch_threads: intra-op threads (1..usable cores); empty: this process's setting, not an axis.
        batch_sizes, prompt_tokens: the workloads (every pair).
        max_new_tokens: fixed-length greedy outputs (>= 2).
        quantizations: weight schemes (:data:`workbench.techniques.rungs.QUANTIZATIONS`; ``none`` first for the baseline).
        group_size: int4 weights per scale group (checked against the model's layer widths).
        lm_head: ``float`` (kept float) or ``quantize`` (quantized with the rest).
        guard_prompts, guard_tokens: the guard's greedy view: held-out prefixes and greedy tokens per prefix.
        guard_text_tokens, guard_window: held-out tokens per language and tokens per window of the guard.
        max_perplexity_ratio, max_kl_mean: the guard's limits on the upper 95% bounds (:class:`workbench.measure.guard.Limits`).
        slo_preset: a :mod:`workbench.stats.slo` preset or ``custom`` (then ``slo_ttft_s`` / ``slo_tpot_s``).
        search: ``grid`` (every configuration) or ``adaptive`` (:func:`workbench.experiments.engine_tuning.search.coordinate_search`, <= 1/3 of the grid).
        calibrate: fit the roofline's overheads on this machine first when no calibration is cached.
        order: ``interleaved`` (every configuration kept loaded, the order shuffled per round) or ``blocks`` (one
            configuration loaded at a time, A B B A: where a device's memory cannot hold every dtype and
            quantization at once).
    """

    dtypes: list = dataclasses.field(default_factory=lambda: ["float32", "bfloat16"])
    attn_implementations: list = dataclasses.field(default_factory=lambda: ["sdpa", "eager"])
    cache_implementations: list = dataclasses.field(default_factory=lambda: ["dynamic", "static"])
    compile: list = dataclasses.field(default_factory=lambda: [False])
    torch_threads: list = dataclasses.field(default_factory=list)
    batch_sizes: list = dataclasses.field(default_factory=lambda: [1])
    prompt_tokens: list = dataclasses.field(default_factory=lambda: [128])
    max_new_tokens: int = 16
    quantizations: list = dataclasses.field(default_factory=lambda: ["none"])
    group_size: int = 64
    lm_head: str = "float"
    guard_prompts: int = 2
    guard_tokens: int = 16
    guard_text_tokens: int = 512
    guard_window: int = 128
    max_perplexity_ratio: float = guard.MAX_PERPLEXITY_RATIO
    max_kl_mean: float = guard.MAX_KL_MEAN
    slo_preset: str = "custom"
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.25
    search: str = "grid"
    calibrate: bool = True
    order: str = "interleaved"
    repeats: int = 2  # an interval over rounds needs 2 (the notebook's default, one place: its parameters cell agrees)

    def __post_init__(self):
        super().__post_init__()
        self.check_design()
        checks.check_choice("order", self.order, design.ORDERS)
        dev = models.resolve_names(self.device)[0]   # no torch import in the command that validates it
        checks.check_str_list("dtypes", self.dtypes)
        for d in self.dtypes:
            if d not in supported_dtypes(dev):
                raise ParameterError(f"dtypes: {d!r} is not supported on {dev} "
                                     f"(supported: {', '.join(supported_dtypes(dev))})")
        checks.check_str_list("attn_implementations", self.attn_implementations)
        for a in self.attn_implementations:
            if a not in supported_attention(dev):
                raise ParameterError(f"attn_implementations: {a!r} is not supported on {dev} with the installed "
                                     f"transformers (supported: {', '.join(supported_attention(dev))})")
        checks.check_choice_list("cache_implementations", self.cache_implementations, CACHE_IMPLEMENTATIONS)
        checks.check_choice_list("compile", self.compile, (False, True))
        if True in self.compile and "static" not in self.cache_implementations:
            raise ParameterError("compile: torch.compile needs a static cache (fixed shapes); "
                                 "add 'static' to cache_implementations or set compile: [false]")
        cores = usable_cores()
        checks.check_int_list("torch_threads", self.torch_threads, lo=1, allow_empty=True)
        if any(t > cores for t in self.torch_threads):
            raise ParameterError(f"torch_threads: {max(self.torch_threads)} exceeds the {cores} CPU cores this "
                                 f"process may use (got {self.torch_threads})")
        if self.torch_threads and dev != "cpu":
            raise ParameterError(f"torch_threads: only a CPU axis (device is {dev}); leave it empty")
        checks.check_int_list("batch_sizes", self.batch_sizes, lo=1)
        checks.check_int("max_new_tokens", self.max_new_tokens, 2)
        checks.check_int_list("prompt_tokens", self.prompt_tokens, lo=32, hi=self.max_context() - self.max_new_tokens)
        checks.check_choice_list("quantizations", self.quantizations, rungs.QUANTIZATIONS)
        for q in self.quantizations:
            rungs.check_device(q, dev)
        rungs.Rung(group_size=self.group_size, lm_head=self.lm_head)  # one-line errors for both
        if "int4_weight_only" in self.quantizations:
            widths = rungs.model_widths(self.model)
            if widths:
                rungs.check_group_size(self.group_size, widths, self.lm_head)
        checks.check_int("guard_prompts", self.guard_prompts, 0)
        checks.check_int("guard_tokens", self.guard_tokens, 1)
        checks.check_int("guard_text_tokens", self.guard_text_tokens, 32)
        checks.check_int("guard_window", self.guard_window, 16, self.guard_text_tokens)
        self.limits()
        self.slo()
        checks.check_choice("search", self.search, SEARCHES)
        checks.check_bool("calibrate", self.calibrate)

    def limits(self) -> guard.Limits:
        return guard.Limits(self.max_perplexity_ratio, self.max_kl_mean)

    def slo(self) -> slo.SLO:
        return slo.get(self.slo_preset, self.slo_ttft_s, self.slo_tpot_s)

    def settings(self, max_new_tokens: int | None = None) -> GenerationSettings:
        return GenerationSettings(max_new_tokens=max_new_tokens or self.max_new_tokens, ignore_eos=True,
                                  seed=self.seed)

    def axes(self) -> dict[str, list]:
        """The configuration axes (``torch_threads`` is ``[None]`` when not swept)."""
        return {"dtype": list(self.dtypes), "attn_implementation": list(self.attn_implementations),
                "quantization": list(self.quantizations),
                "cache_implementation": list(self.cache_implementations), "compile": list(self.compile),
                "torch_threads": list(self.torch_threads) or [None]}

    def configurations(self) -> list[dict]:
        """Every valid configuration (compile only with a static cache), grid order (dtype outermost)."""
        return [c for c in sweeps.expand_grid(**self.axes()) if valid(c)]

    def planned_design(self) -> tuple[str, int, int, int] | None:
        """The design (``workbench plan``): one arm per configuration, its workloads measured together."""
        arms = len(self.configurations())
        return (EXPERIMENT, arms, int(self.repeats), int(self.max_rounds)) if arms >= 2 and self.repeats >= 2 else None

    def baseline(self) -> dict:
        """The configuration every other is compared with: the grid's first, each axis's first value (the first
        valid one), marked as the design's control."""
        return self.configurations()[0]

    def workloads(self) -> list[dict]:
        return sweeps.expand_grid(batch_size=self.batch_sizes, prompt_tokens=self.prompt_tokens)

    def grid(self) -> list[dict]:
        """Points: configuration x workload, configuration outermost (a model loads once per dtype/kernel)."""
        return [{**c, **w} for c in self.configurations() for w in self.workloads()]




# ----------------------------------------------------------------------------- quality guard


def reference(cfg: Config) -> guard.Reference:
    """The float32 ``eager`` reference of the guard (:func:`workbench.measure.guard.reference`) on the shipped
    held-out text, with the config's window and greedy-view sizes."""
    ref = models.load_model(cfg.model, cfg.device, "float32", attn_implementation="eager")
    return guard.reference(ref, tokens=cfg.guard_text_tokens, window=cfg.guard_window,
                           greedy_prompts=cfg.guard_prompts, greedy_tokens=cfg.guard_tokens)


def quality_guard(loaded, ref: guard.Reference, cfg: Config, gen_kwargs: dict | None = None) -> dict:
    """The guard of one configuration (model already built, threads already set): :func:`workbench.measure.guard.judge`
    with the config's limits; ``gen_kwargs`` (its cache / compile keywords) apply to the greedy view."""
    return guard.judge(loaded, ref, cfg.limits(), gen_kwargs)


# ----------------------------------------------------------------------------- one point


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """Measure one (configuration, workload) point.

    Compiled points run one full untimed request first (``compile_s``), which is their warm-up; the timed
    repeats follow.

    Args:
        loaded: the notebook's model (not measured here: each point runs the model loaded in its own dtype
            and attention kernel, :func:`load_configuration`).
        cfg: the sweep's config.
        point: a configuration (:meth:`Config.configurations`) plus ``batch_size`` and ``prompt_tokens``.
        state: shared by the points of one sweep: ``reference`` (:func:`reference`; computed on the first
            point and kept when absent), ``predictor`` (:class:`workbench.predict.roofline_calibration.Predictor`,
            optional: the prediction columns) and ``logits_processor`` (optional, tests: applies to the timed runs and the
            guard).

    Returns:
        :class:`workbench.run.point_result.PointResult`; ``extra`` holds the configuration's name, ``compile_s``, the
        ``recompiles``, the build's columns (:meth:`workbench.techniques.rungs.Built.columns`), the guard's columns
        (:func:`quality_guard`) and, with a predictor, its prediction.
    """
    if "reference" not in state:  # none for a random-weight model (model: config:PATH): quality is off
        state["reference"] = None if config_models.is_config_spec(cfg.model) else reference(cfg)
    ref, predictor, logits_processor = state["reference"], state.get("predictor"), state.get("logits_processor")
    gen_kwargs = generate_kwargs(point, models.pick_device(cfg.device))
    built = build_configuration(cfg, point)
    loaded = built.loaded
    B, L = int(point["batch_size"]), int(point["prompt_tokens"])
    prompts = build_batch(loaded.tokenizer, B, L)
    settings = cfg.settings()
    extra: dict = {"config": config_name(point), **built.columns()}
    if point["dtype"] == "bfloat16" and models.pick_device(cfg.device) == "cpu":
        extra["dtype_note"] = rungs.bf16_support("cpu")[1]
    with threads(point.get("torch_threads")):
        out, timing = rung_timing.measure(loaded, prompts, settings, cfg.repeats, cfg.warmup, gen_kwargs,
                                    bool(point.get("compile")), logits_processor)
        extra.update(timing)
        guard_kwargs = rungs.generate_kwargs(point.get("cache_implementation", "dynamic"), False)
        if ref is None:
            extra.update({c: float("nan") for c in guard.COLUMNS},
                         guard_passed=True, guard_reason="not judged: random weights (quality off)")
        else:
            extra.update(quality_guard(loaded, ref, cfg, guard_kwargs))
    add_prediction_and_use(extra, out.requests, point, cfg, loaded, predictor)
    out.extra = extra
    return out


def add_prediction_and_use(extra: dict, requests: list, point: dict, cfg: Config, model, predictor) -> None:
    """A measured configuration's shared columns, into ``extra``: the roofline's prediction for its workload (and the
    dtype it was calibrated in), each request's ``context_tokens``, the measured bandwidth and FLOP/s use
    (:func:`workbench.predict.roofline_calibration.measured_utilisation`) and the repeat statistics."""
    B, L = int(point["batch_size"]), int(point["prompt_tokens"])
    if predictor is not None:
        extra.update(predictor.predict(B, L, cfg.max_new_tokens, dtype=point["dtype"],
                                       threads=point.get("torch_threads")))
        extra["calibrated_dtype"] = predictor.calibrated_dtype(point["dtype"])
    for rec in requests:
        rec.update(context_tokens=L)
    extra.update(measured_utilisation(model, requests, point, predictor))
    extra.update(repeat_statistics(requests))

def finish_point(loaded, cfg: Config, point: dict, state: dict, out: PointResult) -> PointResult:
    """A point of a design (:func:`design_configurations`) completed as :func:`measure_point` completes a point
    measured alone: its quality guard (once per configuration), the roofline's prediction, utilisation and repeat
    statistics.

    Returns:
        :class:`workbench.run.point_result.PointResult` of the point.
    """
    if "reference" not in state:  # a random-weight model has no quality to guard
        state["reference"] = None if config_models.is_config_spec(cfg.model) else reference(cfg)
    predictor = state.get("predictor")
    built = build_configuration(cfg, point)
    model = built.loaded
    extra = {**built.columns(), **out.extra}
    guards = state.setdefault("guards", {})
    if config_key(point) not in guards:
        if state["reference"] is None:
            guards[config_key(point)] = {**{c: float("nan") for c in guard.COLUMNS}, "guard_passed": True,
                                         "guard_reason": "not judged: random weights (quality off)"}
        else:
            with threads(point.get("torch_threads")):
                guard_kwargs = rungs.generate_kwargs(point.get("cache_implementation", "dynamic"), False)
                guards[config_key(point)] = quality_guard(model, state["reference"], cfg, guard_kwargs)
    extra.update(guards[config_key(point)])
    if point["dtype"] == "bfloat16" and models.pick_device(cfg.device) == "cpu":
        extra["dtype_note"] = rungs.bf16_support("cpu")[1]
    add_prediction_and_use(extra, out.requests, point, cfg, model, predictor)
    return dataclasses.replace(out, extra=extra)


# ----------------------------------------------------------------------------- the sweep


def make_predictor(cfg: Config, loaded) -> roofline_calibration.Predictor:
    """The roofline for ``loaded``'s model with one calibration per swept dtype: the cached one (checked against
    today's probe and refitted when off by more than 15%,
    :func:`workbench.predict.roofline_calibration.check_calibration`), else (``cfg.calibrate``) a fresh one on the
    model loaded in that dtype (the small workload, one repeat, 3 probe trials; once per machine and dtype); a
    dtype left uncalibrated uses its own probed FLOP/s with ``loaded``'s overheads
    (:meth:`workbench.predict.roofline_calibration.Predictor.for_dtype`); a point's ``calibrated_dtype`` says which
    calibration it used (:func:`workbench.predict.roofline_calibration.predictor_for`)."""
    return roofline_calibration.predictor_for(loaded, cfg.model, cfg.device, cfg.dtypes, cfg.calibrate)


def run(cfg: Config, run_dir, loaded, resume: bool = False) -> pd.DataFrame:
    """Every configuration x workload (``search="grid"``), or the adaptive search's share of them.

    Args:
        loaded: the notebook's model (the drift reference and the roofline calibration run on it).

    Returns:
        The measured points (``engine_tuning``) with predictions, guard columns and ``ttft_ratio`` /
        ``tpot_ratio``; the residual table is saved as ``residuals/engine_tuning.txt``.
    """
    state = {"reference": reference(cfg), "predictor": make_predictor(cfg, loaded)}
    lim = cfg.slo()

    def measure(p):
        return measure_point(loaded, cfg, p, state)

    kw = dict(resume=resume, slo_ttft_s=lim.ttft_s, slo_tpot_s=lim.tpot_s, info=loaded.info, config=cfg)
    grid = cfg.grid()
    if cfg.search == "grid" and cfg.repeats >= 2 and len(cfg.configurations()) >= 2:
        # every configuration an arm of one design, interleaved by round with the A/A control (issue 49)
        done = results.finished_points(run_dir) if resume else set()
        todo = [p for p in grid if point_result.point_id(EXPERIMENT, p) not in done]
        made = design_configurations(loaded, cfg, cfg.configurations(), state, run_dir) if todo else {}
        sweeps.run_sweep(run_dir, EXPERIMENT, grid, lambda p: finish_point(
            loaded, cfg, p, state, made[point_result.point_id(EXPERIMENT, p)]), loaded=loaded, **kw)
    elif cfg.search == "grid":  # one round (or one configuration): each point on its own, nothing paired
        sweeps.run_sweep(run_dir, EXPERIMENT, grid, measure, loaded=loaded, **kw)
    else:
        ids: list[str] = []

        def evaluate(c):
            pts = [{**c, **w} for w in cfg.workloads()]
            ids.extend(point_result.point_id(EXPERIMENT, p) for p in pts)
            done = sweeps.run_sweep(run_dir, EXPERIMENT, pts, measure, **kw)
            done = done[done["point_id"].isin([point_result.point_id(EXPERIMENT, p) for p in pts])]
            row = configurations(done, lim)
            return objective(row.iloc[0]) if len(row) else math.inf

        # the drift reference of the whole search, as run_sweep measures one around a grid: start, end, verdict
        ref_start = drift.start(loaded)
        _, seen, converged = coordinate_search(cfg.axes(), evaluate, is_valid=valid, joint=JOINT)
        done = results.read_points(run_dir, EXPERIMENT)
        done = done[done["point_id"].isin(ids)]
        drift.finish(run_dir, EXPERIMENT, loaded, ref_start, [(r["point_id"], r) for r in done.to_dict("records")])
        exp = results.read_manifest(run_dir)["experiments"][EXPERIMENT]
        summary = {"search": "adaptive", "search_evaluated": len(seen), "search_grid": len(cfg.configurations()),
                   "search_converged": bool(converged)}
        results.update_manifest(run_dir, experiments={EXPERIMENT: {**exp, "points": ids, **summary}})
    points = results.read_points(run_dir, EXPERIMENT)
    if cfg.search == "adaptive":
        points = points[points["point_id"].isin(ids)].copy()
        for k, v in summary.items():
            points[k] = v
    if "predicted_ttft_s" in points:
        points["ttft_ratio"] = points["ttft_s_p50"] / points["predicted_ttft_s"]
        points["tpot_ratio"] = points["tpot_s_p50"] / points["predicted_tpot_s"]
        predictions.save_residuals(run_dir, EXPERIMENT, points)
    return points


#: the experiment's face: what notebook 09, the report, the benchmarks and the tests read as ``engine_tuning.<name>``
__all__ = [
    "EXPERIMENT", "CACHE_IMPLEMENTATIONS", "SEARCHES", "E2E", "AXES", "JOINT", "Config", "reference",
    "quality_guard", "measure_point", "add_prediction_and_use", "design_configurations", "finish_point",
    "replay_search", "make_predictor", "run", "choice", "headline", "finding", "configurations", "config_name",
    "config_key", "generate_kwargs", "recommend", "speedup_phrase", "valid", "designed", "objective",
    "fig_speed", "fig_speedup", "fig_speedup_rounds", "fig_prediction", "fig_guard", "figures",
]
