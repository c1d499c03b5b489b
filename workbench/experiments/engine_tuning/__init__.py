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
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from workbench import checks
from workbench.errors import ParameterError
from workbench.experiments.engine_tuning.charts import fig_guard, fig_prediction, fig_speed, fig_speedup
from workbench.experiments.engine_tuning.search import coordinate_search
from workbench.inputs.prompts import build_batch
from workbench.measure import config_models, contention, guard, models
from workbench.measure.device import supported_attention, supported_dtypes, threads, usable_cores
from workbench.measure.generation import GenerationSettings, generate_measured, warm_up
from workbench.predict import predictions, roofline_calibration
from workbench.predict.roofline_calibration import measured_utilisation
from workbench.run import design, drift, point_result, results, rung_timing, sweeps
from workbench.run.point_result import PointResult
from workbench.run.sweeps import SweepConfig
from workbench.share.plots import split_by_device
from workbench.stats import blocks, evidence, slo
from workbench.stats.evidence import repeat_statistics
from workbench.techniques import rungs
from workbench.techniques.configurations import (
    AXES,
    JOINT,
    aa_moved,
    aa_sentence,
    build_configuration,
    config_key,
    config_name,
    configurations,
    designed,
    generate_kwargs,
    load_configuration,
    objective,
    recommend,
    speedup_phrase,
    valid,
)

EXPERIMENT = "engine_tuning"
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
        dev = models.pick_device(self.device)
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

    def design_arms(self) -> int:
        """The design's arms (``workbench plan``): one per configuration, its workloads measured together."""
        return len(self.configurations())

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


E2E = design.Outcome("e2e_s", False, "request latency (e2e)", "time_ratio")


def _records_wall(records: list[dict]) -> float:
    """The timed wall time of a point's rounds: one batch wall time per round."""
    seen = {}
    for r in records:
        seen.setdefault(r.get("repeat"), float(r.get("batch_wall_s") or 0.0))
    return float(sum(seen.values()))


def design_configurations(loaded, cfg: Config, configurations: list[dict], state: dict,
                          run_dir=None) -> dict[str, PointResult]:
    """Measure configurations as the arms of one design (:mod:`workbench.run.design`).

    Every round measures every configuration once at every workload (round ``r`` at seed ``cfg.seed + r``), plus
    the baseline a second time (the A/A control), in an order shuffled per round (``cfg.order == "interleaved"``:
    every configuration stays loaded, :func:`load_configuration`'s models kept here) or forward then reverse
    (``"blocks"``, A B B A: one configuration loaded at a time, loaded and warmed up again at each switch, where a
    device's memory cannot hold them all). The control is the baseline, :meth:`Config.baseline` (marked, never the
    first row of a table); the primary outcome a configuration's request latency in a round: the geometric mean over
    workloads of its batch's mean ``e2e_s``. Before its first round each configuration warms up at each workload
    (``cfg.warmup`` batches; a compiled one runs one full untimed request instead: ``compile_s``). The design adds
    rounds up to ``cfg.max_rounds`` while a configuration's comparison is undecided and the budget allows.

    Args:
        loaded: the notebook's model (unused for timing; each configuration runs its own).
        configurations: configuration dicts (:meth:`Config.configurations`); the baseline among them.
        state: the sweep's shared state (``logits_processor`` applies here too).
        run_dir: the run folder (rounds stored and resumed there).

    Returns:
        ``{point_id: PointResult}`` per configuration x workload: ``requests`` with ``repeat`` = round, ``extra``
        with ``config``, ``baseline`` (True on the baseline's points), ``compile_s``, the design's point columns
        (:meth:`workbench.run.design.DesignResult.point_columns`: ``time_ratio`` with its simultaneous interval and
        verdict, the A/A columns, ``rounds``, ``rounds_needed``) and ``speedup_vs_baseline`` / ``speedup_low`` /
        ``speedup_high`` (``1 / time_ratio``); ``contamination``: other processes' load over all rounds.

    Raises:
        ParameterError: fewer than 2 configurations, or duplicate ones.
    """
    names = [config_name(c) for c in configurations]
    if len(set(names)) != len(names):
        raise ParameterError(f"configurations: duplicates in {names}")
    dev = models.pick_device(cfg.device)
    lp = state.get("logits_processor")
    settings = cfg.settings()
    by_name = dict(zip(names, configurations))
    base = config_name(cfg.baseline())
    kept: dict = {}
    meta: dict = {}

    def model_of(name):
        if name not in kept:
            if cfg.order == "blocks":
                kept.clear()                      # one configuration in memory at a time
            kept[name] = (load_configuration(cfg, by_name[name]), generate_kwargs(by_name[name], dev))
            return kept[name], True
        return kept[name], False

    def warm(name, model, kw):
        c = by_name[name]
        t0 = time.perf_counter()
        for w in cfg.workloads():
            prompts = build_batch(model.tokenizer, int(w["batch_size"]), int(w["prompt_tokens"]))
            with threads(c.get("torch_threads")):
                t1 = time.perf_counter()
                if c.get("compile"):
                    generate_measured(model, prompts, settings, generate_kwargs=kw, logits_processor=lp)
                    meta.setdefault((name, w["batch_size"], w["prompt_tokens"]), time.perf_counter() - t1)
                else:
                    warm_up(model, prompts, settings, cfg.warmup, generate_kwargs=kw, logits_processor=lp)
        return time.perf_counter() - t0

    def prepare(name):
        (model, kw), _ = model_of(name)
        return warm(name, model, kw)

    def measure(name, rnd):
        (model, kw), fresh = model_of(name)
        if fresh and cfg.order == "blocks":      # loaded again after a switch: warmed up again, untimed
            warm(name, model, kw)
        recs, logs, wall = [], [], 0.0
        for w in cfg.workloads():
            prompts = build_batch(model.tokenizer, int(w["batch_size"]), int(w["prompt_tokens"]))
            with threads(by_name[name].get("torch_threads")):
                res = generate_measured(model, prompts, dataclasses.replace(settings, seed=cfg.seed + rnd),
                                        generate_kwargs=kw, logits_processor=lp)
            done = [r["e2e_s"] for r in res.records if r.get("output_tokens", 0) >= 1 and r.get("e2e_s")]
            logs.append(math.log(sum(done) / len(done)) if done else float("nan"))
            for rec in res.records:
                rec.update(batch_size=len(prompts), batch_wall_s=res.wall_s, prompt_tokens_point=w["prompt_tokens"])
            recs += res.records
            wall += res.wall_s
        return design.Measured({E2E.name: math.exp(sum(logs) / len(logs))}, recs, wall)

    d = design.Design(EXPERIMENT, names, base, E2E, order=cfg.order, **cfg.design_kwargs())
    monitor = contention.LoadMonitor()
    result = design.run_design(d, measure, prepare, run_dir=run_dir)
    contamination = monitor.stop()
    design.remember_spread(result, Path(run_dir).name if run_dir is not None else "")
    state["design"] = result
    out = {}
    for name, c in by_name.items():
        cols = result.point_columns(name)
        t, lo, hi = cols["time_ratio"], cols["time_ratio_low"], cols["time_ratio_high"]
        inv = (lambda x: 1.0 / x if x and math.isfinite(x) else float("nan"))
        cols.update(config=name, baseline=name == base, speedup_vs_baseline=inv(t), speedup_low=inv(hi),
                    speedup_high=inv(lo))
        for w in cfg.workloads():
            B, L = int(w["batch_size"]), int(w["prompt_tokens"])
            mine = [r for r in result.requests.get(name, []) if r.get("prompt_tokens_point") == L
                    and r.get("batch_size") == B]
            for r in mine:
                r.pop("prompt_tokens_point", None)
            pid = point_result.point_id(EXPERIMENT, {**c, "batch_size": B, "prompt_tokens": L})
            out[pid] = PointResult(requests=mine, wall_s=_records_wall(mine),
                                   warmup_s=result.warmup_s.get(name),
                                   extra={**cols, "compile_s": meta.get((name, B, L), float("nan"))},
                                   contamination=dict(contamination))
    return out


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


# ----------------------------------------------------------------------------- search and recommendation




def replay_search(configs: pd.DataFrame, axes: dict[str, list]) -> dict:
    """Run :func:`workbench.experiments.engine_tuning.search.coordinate_search` over a measured grid (evaluation = a table lookup) and compare with the
    full grid's :func:`recommend`: ``{"evaluated", "grid", "adaptive", "full", "same", "converged"}``."""
    table = {config_key(r): objective(r) for _, r in configs.iterrows()}
    axes = {a: axes.get(a, [None]) for a in AXES}
    best, seen, converged = coordinate_search(axes, lambda c: table.get(config_key(c), math.inf), is_valid=valid,
                                              joint=JOINT)
    full = recommend(configs)
    adaptive = config_name(best) if math.isfinite(seen.get(config_key(best), math.inf)) else None
    full_name = None if full is None else full["config"]
    return {"evaluated": len(seen), "grid": sum(1 for c in sweeps.expand_grid(**axes) if valid(c)),
            "adaptive": adaptive, "full": full_name, "same": adaptive == full_name, "converged": converged}


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


# ----------------------------------------------------------------------------- findings and figures


def _analysis(configs: pd.DataFrame, run_dir=None) -> blocks.Analysis | None:
    """The design's analysis of the configurations: rebuilt from the run folder's design table when ``run_dir``
    holds it (the runner-up comparison needs the rounds), else from the decisions the rows carry."""
    if run_dir is not None:
        again = design.reanalyse(run_dir, EXPERIMENT)
        if again is not None and again[1] is not None:
            return again[1]
    if not designed(configs):
        return None
    base = configs.loc[configs["baseline"], "config"].iloc[0]
    arms = {}
    for _, r in configs[~configs["baseline"]].iterrows():
        d = design.decision_from_row(r, E2E)
        if d is not None:
            arms[r["config"]] = dataclasses.replace(d, arm=r["config"], control=base)
    r0 = configs.iloc[0]
    return blocks.Analysis(base, None, arms, str(r0.get("time_ratio_method") or ""), True, float("nan"),
                           float("nan"), checks.int_or(r0.get("rounds"), 0), 1 - checks.float_or_nan(
                               r0.get("time_ratio_level")), checks.float_or_nan(r0.get("margin")), float("nan"),
                           pd.DataFrame())


def choice(configs: pd.DataFrame, run_dir=None) -> blocks.Pick | None:
    """The recommendation as a decision (:func:`workbench.stats.blocks.best_of` over the eligible configurations,
    latency lower is better): the fastest estimate, against the baseline and its runner-up; the baseline itself only
    when every other eligible configuration is slower beyond noise or equivalent. None without a design or an
    eligible configuration."""
    if not designed(configs) or "baseline" not in configs or not configs["baseline"].any():
        return None
    eligible = configs.loc[configs["eligible"].astype(bool), "config"].tolist()
    analysis = _analysis(configs, run_dir)
    if analysis is None or not eligible:
        return None
    eligible = [c for c in eligible if c == analysis.control or c in analysis.arms]
    return blocks.best_of(analysis, eligible, higher_is_better=False) if eligible else None


def _flags(r) -> str:
    flags = "" if r["guard_passed"] else f" [guard FAILED: {r['guard_reason']}]"
    if r.get("valid") is False or r.get("valid") == False:  # noqa: E712
        flags += f" [invalid: {r.get('invalid_reason', '')}]"
    if r.get("meets_slo") is False:
        flags += f" [misses the SLO: {r.get('slo_note', '')}]"
    if r.get("recompiles", 0) > 0:  # NaN (uncompiled) compares False
        flags += f" [torch.compile built {int(r['recompiles'])} more graph(s) during the timed repeats]"
    if math.isfinite(r.get("compile_s", float("nan"))):
        flags += f" [compile {r['compile_s']:.0f} s, not in the timings]"
    return flags


def _quality(r) -> str:
    return (f"perplexity x{r['perplexity_ratio']:.4g} (95% upper {r['perplexity_ratio_high']:.4g}), mean KL "
            f"{r['kl_mean']:.3g} nats vs float32; SLO {r.get('slo_note', '')}")


def headline(configs: pd.DataFrame, search: dict | None = None, run_dir=None) -> str:
    """ONE recommendation, the search that produced it, and what holds it up, in one paragraph.

    The recommendation comes from the full grid (``search`` given: the :func:`replay_search` of a grid run,
    whose disagreement becomes a caveat) or from the adaptive search (``configs`` of an adaptive run: then
    the caveat says the rest of the grid was not measured and whether the search converged). A grid measured as
    one design says the decision behind its choice (:func:`choice`): the pick against the baseline and its
    runner-up, or "keep the baseline" only when every other configuration is slower beyond noise or equivalent.
    Every configuration's ratio to the baseline carries its interval and verdict (:func:`speedup_phrase`); the SLO
    verdict says at which percentile it was checked.
    """
    if configs.empty:
        return "No configuration measured."
    best = recommend(configs)
    base = configs[configs["baseline"]].iloc[0] if "baseline" in configs and configs["baseline"].any() else \
        configs.iloc[0]
    adaptive_run = "search" in configs and configs["search"].iloc[0] == "adaptive"
    if adaptive_run:
        source = (f"the adaptive search ({int(configs['search_evaluated'].iloc[0])} of "
                  f"{int(configs['search_grid'].iloc[0])} configurations measured)")
    else:
        source = f"the full grid ({len(configs)} configurations measured)"
    parts = []
    pick = choice(configs, run_dir)
    words = ("slower", "faster")
    if best is None:
        parts.append(f"No configuration of {source} met the SLO and the quality guard on valid points: none is "
                     f"recommended.")
    elif pick is not None and pick.keeps_control:
        row = configs[configs["config"] == pick.pick].iloc[0]
        if pick.verdict == "undecided":
            need = (f"; about {pick.rounds_needed} rounds would decide "
                    f"{'it' if len(pick.open) == 1 else 'them'} at the observed spread" if pick.rounds_needed else "")
            why = (f"none is shown faster, but {', '.join(map(str, pick.open))} "
                   f"{'is' if len(pick.open) == 1 else 'are'} undecided against it{need}")
        elif pick.verdict == "equivalent":
            why = f"every other configuration is equivalent to it within +-{configs['margin'].iloc[0] - 1:.0%}"
        else:
            why = "every other configuration is slower beyond noise or equivalent within the margin"
        parts.append(f"Keep the baseline{' for now' if pick.verdict == 'undecided' else ''} "
                     f"({source.replace(' (', ', ').rstrip(')')}): {pick.pick} ({row['e2e_s_p50']:.3f} s per "
                     f"request): {why}; {_quality(row)}.")
    elif pick is not None:
        row = configs[configs["config"] == pick.pick].iloc[0]
        spr = checks.float_or_nan(row.get("seconds_per_round"))
        versus = pick.versus_control.describe(f"against the baseline {pick.control}", invert=True, words=words,
                                              seconds_per_round=spr)
        parts.append(f"Recommended by {source}: {pick.pick} ({row['e2e_s_p50']:.3f} s per request; {versus}; "
                     f"{_quality(row)}).")
        if pick.versus_runner_up is not None:
            parts.append(pick.versus_runner_up.describe(f"Against the runner-up {pick.runner_up}", invert=True,
                                                        words=words, seconds_per_round=spr) + ".")
    else:
        versus = ("it is the baseline" if best["config"] == base["config"] else
                  f"{speedup_phrase(best)} against the baseline {base['config']}")
        parts.append(f"Recommended by {source}: {best['config']} ({best['e2e_s_p50']:.3f} s per request; "
                     f"{versus}; {_quality(best)}).")
    stated = {base["config"], *([pick.pick] if pick is not None else [])}
    for _, r in configs[~configs["config"].isin(stated)].iterrows():
        if not math.isfinite(r["speedup_vs_baseline"]):
            continue
        parts.append(f"{r['config']}: {speedup_phrase(r)}{_flags(r)}.")
    floor = aa_sentence(configs)  # the noise floor beside the comparisons it judges
    if floor:
        parts.append(floor)
    if adaptive_run:
        conv = bool(configs["search_converged"].iloc[0])
        parts.append("Caveat: the rest of the grid was not measured; the search " + (
            "converged (no single knob change improves its choice), which is the grid's optimum only if the knobs "
            "do not interact." if conv else
            "stopped on its budget before converging, so it could not establish the grid's optimum."))
    elif search and best is not None:
        if search["same"]:
            parts.append(f"The adaptive search, replayed on this grid, finds the same configuration with "
                         f"{search['evaluated']} of {search['grid']} measurements.")
        else:
            why = ("it converged on a different configuration: the knobs interact" if search.get("converged") else
                   "it stopped on its budget before converging")
            parts.append(f"Caveat: the adaptive search, replayed on this grid, could not find this optimum: after "
                         f"{search['evaluated']} of {search['grid']} measurements it would pick "
                         f"{search['adaptive'] or 'nothing'} ({why}).")
    return " ".join(parts)


def finding(configs: pd.DataFrame, search: dict | None = None, points: pd.DataFrame | None = None,
            run_dir=None) -> evidence.Finding:
    """The report's finding: :func:`headline` as its text, with the evidence behind the recommendation.

    Its verdict: a grid measured as one design carries :func:`choice`'s (the pick against the baseline: a
    direction, equivalent within the margin, or undecided with the rounds it needs; the baseline kept only when every
    other eligible configuration is slower beyond noise or equivalent), undecided when the A/A control moved.
    Without a design (one repeat, the adaptive search) a recommendation other than the baseline is a direction only
    when its Welch interval excludes 1; anything else is undecided.

    Returns:
        :class:`workbench.stats.evidence.Finding` (point ids: the usable points of ``points`` when given).
    """
    text = headline(configs, search, run_dir)
    ids = evidence.point_ids(evidence.usable_points(points)) if points is not None else ()
    if configs.empty:
        return evidence.Finding(text, "no configuration measured", False, verdict="undecided")
    best = recommend(configs)
    base = configs[configs["baseline"]].iloc[0] if "baseline" in configs and configs["baseline"].any() else \
        configs.iloc[0]
    pick = choice(configs, run_dir)
    guard_ev = ("quality guard (perplexity ratio and mean KL vs float32 on held-out text, upper 95% bounds over "
                "windows); SLO at the preset's own percentile where the sample supports it")
    if designed(configs):
        an = _analysis(configs, run_dir)
        row = configs[configs["config"] == (pick.pick if pick is not None else base["config"])].iloc[0]
        fields = design.finding_fields(row)
        fields["verdict"] = pick.verdict if pick is not None else "undecided"   # nothing eligible: no choice
        if pick is not None and pick.verdict == "undecided":
            spr = checks.float_or_nan(row.get("seconds_per_round"))
            fields["rounds_needed"] = pick.rounds_needed
            fields["seconds_needed"] = (max(pick.rounds_needed - fields["rounds"], 0) * spr
                                        if pick.rounds_needed is not None and math.isfinite(spr) else None)
        if aa_moved(configs):
            fields["verdict"] = "undecided"
        how = (f"block model on the log scale, rounds as blocks, one residual variance pooled over the "
               f"{an.table.shape[1]} arms ({an.method})" if an.pooled and not an.table.empty else an.method)
        ev = (f"{len(configs)} configurations, one design; request latency (the geometric mean over workloads of a "
              f"round's mean e2e) vs the marked baseline {base['config']}: {how}; {design.evidence_text(row)}; the "
              f"pick against its runner-up at Tukey's level; {guard_ev}")
        return evidence.Finding(text, ev, True, ids, **fields)
    src = points if points is not None and "n_repeats" in points else pd.DataFrame()
    reps = pd.to_numeric(src.get("n_repeats", pd.Series(dtype=float)), errors="coerce")
    n_rep = f"at least {int(reps.min())} repeats each" if reps.notna().any() else "repeats per point in the table"
    ev = (f"{len(configs)} configurations measured one after another, {n_rep}; speed-up vs the baseline "
          f"{base['config']}: 95% Welch t interval on log e2e over repeats (no rounds, no A/A control); {guard_ev}")
    faster = (best is not None and best["config"] != base["config"]
              and best.get("speedup_low", float("nan")) > 1)
    return evidence.Finding(text, ev, True, ids, verdict="direction" if faster else "undecided")


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
