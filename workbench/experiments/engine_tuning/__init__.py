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
- Recommendation: the fastest configuration (lowest mean ``e2e_s_p50`` over the workloads) on valid points that
  passes the guard and does not miss the SLO at the SLO's own percentile (p99 for MLPerf presets and ``custom``,
  p90 for DistServe's), judged only where the point's samples support that percentile (:func:`workbench.stats.slo.slo_verdict`).
  Its speed-up over the baseline comes with an interval, and "faster" / "slower" only when it excludes 1. A grid
  is measured interleaved (:func:`measure_configurations`, :mod:`workbench.stats.comparison`): every round measures
  every configuration once plus the baseline a second time (the A/A control), the order shuffled per round;
  the speed-up is the t interval over rounds of the paired within-round log ratios, each configuration at its
  Holm level over the configurations compared (the recommendation is the best of ``m``). The A/A interval is
  the noise floor printed beside the finding and shaded on ``engine_speedup``; when it excludes 1 the
  comparative claims are "not supported: the A/A control moved". (Older runs and the adaptive search, whose
  configurations are measured one after another: Welch's t on log repeat latencies, :func:`speedup_interval`.)
- ``search="adaptive"``: coordinate descent (:func:`workbench.experiments.engine_tuning.search.coordinate_search`; one axis at a time from the baseline,
  keeping the best value, the way a tuner bisects one knob while holding the rest) measuring at most a third
  of the grid (at least one full pass), with the drift reference measured around the whole search as around a
  grid sweep; it says whether it converged. :func:`replay_search` runs the same search over a measured grid to
  show whether it reaches the full grid's recommendation. The finding prints ONE recommendation, names the
  search that produced it, and gives the other's disagreement as a caveat (:func:`headline`).

The first value of each axis list is the baseline that ratios are taken against.
"""

from __future__ import annotations

import dataclasses
import math
import time

import pandas as pd
import plotly.graph_objects as go

from workbench.measure import contention
from workbench.run import point_result
from workbench import checks
from workbench.stats import comparison, evidence, slo
from workbench.stats.evidence import repeat_statistics
from workbench.run import drift, results, rung_timing, sweeps
from workbench.measure import config_models, guard, models, quality
from workbench.measure.device import supported_attention, supported_dtypes, threads, usable_cores
from workbench.predict import predictions, roofline_calibration
from workbench.predict.roofline_calibration import measured_utilisation
from workbench.techniques import rungs
from workbench.techniques.configurations import (AXES, JOINT, aa_moved, aa_sentence, build_configuration, config_key,
                                                 config_name, configurations, generate_kwargs, load_configuration,
                                                 objective, recommend, speedup_interval, speedup_phrase, valid)
from workbench.experiments.engine_tuning.charts import fig_guard, fig_prediction, fig_speed, fig_speedup
from workbench.errors import ParameterError
from workbench.measure.generation import GenerationSettings, generate_measured, warm_up
from workbench.share.plots import split_by_device
from workbench.inputs.prompts import build_batch
from workbench.run.point_result import PointResult
from workbench.experiments.engine_tuning.search import coordinate_search
from workbench.run.sweeps import SweepConfig

EXPERIMENT = "engine_tuning"
CACHE_IMPLEMENTATIONS = ("dynamic", "static")
SEARCHES = ("grid", "adaptive")


@dataclasses.dataclass
class Config(SweepConfig):
    """The engine-tuning sweep (notebook ``09_engine_tuning``).

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
    repeats: int = 2  # an interval over rounds needs 2 (the notebook's default, one place: its parameters cell agrees)

    def __post_init__(self):
        super().__post_init__()
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


def measure_configurations(loaded, cfg: Config, configurations: list[dict], state: dict) -> dict[str, PointResult]:
    """Measure configurations as interleaved arms (:mod:`workbench.stats.comparison`) with the A/A control.

    Every round measures every configuration once at every workload, plus the baseline (the first configuration)
    a second time as the A/A control (:data:`workbench.stats.comparison.AA`), in an order shuffled per round from
    ``cfg.seed``; ``cfg.repeats`` rounds. All configurations stay loaded (:func:`load_configuration` is
    memoised), so switching costs nothing. Before round 0 each configuration warms up at each workload
    (``cfg.warmup`` batches; a compiled one runs one full untimed request instead: ``compile_s``). Round ``r``
    uses seed ``cfg.seed + r`` for every arm, so a round's arms see the same inputs.

    The speed-up of each configuration over the baseline is judged from the paired within-round ratios of the
    request latency (mean ``e2e_s`` of a round's batch, geometric mean over workloads), Holm over the
    configurations compared (:func:`workbench.stats.comparison.compare`).

    Args:
        loaded: the notebook's model (unused for timing; each configuration runs its own).
        configurations: configuration dicts (:meth:`Config.configurations`); the first is the baseline.
        state: the sweep's shared state (``logits_processor`` applies here too).

    Returns:
        ``{point_id: PointResult}`` per configuration x workload: ``requests`` with ``repeat`` = round,
        ``extra`` with ``config``, ``compile_s``, ``speedup_vs_baseline`` / ``speedup_low`` / ``speedup_high``
        (baseline e2e / configuration e2e, at the configuration's Holm level), ``speedup_p_holm`` and the
        A/A columns (``aa_ratio``, ``aa_low``, ``aa_high``: speed-up of the second baseline over the first,
        ``design``, ``rounds``); ``contamination``: the load of other processes over all rounds.

    Raises:
        ParameterError: no configurations, or duplicate ones.
    """
    if not configurations:
        raise ParameterError("configurations: at least one configuration to measure (got none)")
    names = [config_name(c) for c in configurations]
    if len(set(names)) != len(names):
        raise ParameterError(f"configurations: duplicates in {names}")
    dev = models.pick_device(cfg.device)
    lp = state.get("logits_processor")
    settings = cfg.settings()
    by_name = dict(zip(names, configurations))
    arms = names + ([comparison.AA] if len(names) else [])
    monitor = contention.LoadMonitor()
    prep: dict = {}
    for name, c in by_name.items():  # warm-up (or compile) of every configuration at every workload
        model, kw = load_configuration(cfg, c), generate_kwargs(c, dev)
        for w in cfg.workloads():
            prompts = build_batch(model.tokenizer, int(w["batch_size"]), int(w["prompt_tokens"]))
            with threads(c.get("torch_threads")):
                t0, compile_s = time.perf_counter(), float("nan")
                if c.get("compile"):
                    generate_measured(model, prompts, settings, generate_kwargs=kw, logits_processor=lp)
                    compile_s = time.perf_counter() - t0
                else:
                    warm_up(model, prompts, settings, cfg.warmup, generate_kwargs=kw, logits_processor=lp)
            prep[(name, w["batch_size"], w["prompt_tokens"])] = dict(
                model=model, kw=kw, prompts=prompts, compile_s=compile_s, warmup_s=time.perf_counter() - t0,
                requests=[], wall_s=0.0)
    rows = []
    for rnd, arm in comparison.schedule(arms, cfg.repeats, cfg.seed):
        name = names[0] if arm == comparison.AA else arm
        for w in cfg.workloads():
            p = prep[(name, w["batch_size"], w["prompt_tokens"])]
            with threads(by_name[name].get("torch_threads")):
                res = generate_measured(p["model"], p["prompts"], dataclasses.replace(settings, seed=cfg.seed + rnd),
                                        generate_kwargs=p["kw"], logits_processor=lp)
            done = [r["e2e_s"] for r in res.records if r.get("output_tokens", 0) >= 1 and r.get("e2e_s")]
            rows.append({"arm": arm, "round": rnd, "value": sum(done) / len(done) if done else float("nan")})
            if arm != comparison.AA:
                for rec in res.records:
                    rec.update(repeat=rnd, batch_size=len(p["prompts"]), batch_wall_s=res.wall_s)
                p["requests"] += res.records
                p["wall_s"] += res.wall_s
    contamination = monitor.stop()
    comp = comparison.compare(pd.DataFrame(rows), names[0], comparison.AA)
    cols = comp.columns()
    if comp.aa is not None:  # the A/A as a speed-up (first baseline / second), like the configurations' ratios
        inv = comparison.invert_interval(comp.aa)
        cols.update(aa_ratio=inv.estimate, aa_low=inv.low, aa_high=inv.high)
    state["comparison"] = comp
    out = {}
    for (name, B, L), p in prep.items():
        c = by_name[name]
        if name == names[0]:
            sp = dict(speedup_vs_baseline=1.0, speedup_low=float("nan"), speedup_high=float("nan"),
                      speedup_p_holm=float("nan"))
        else:
            iv = comparison.invert_interval(comp.arms[name].interval)
            sp = dict(speedup_vs_baseline=iv.estimate, speedup_low=iv.low, speedup_high=iv.high,
                      speedup_p_holm=comp.arms[name].p_adjusted)
        pid = point_result.point_id(EXPERIMENT, {**c, "batch_size": B, "prompt_tokens": L})
        out[pid] = PointResult(requests=p["requests"], wall_s=p["wall_s"], warmup_s=p["warmup_s"],
                               extra={"config": name, "compile_s": p["compile_s"], **sp, **cols},
                               contamination=contamination)
    return out


def measure_interleaved_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """One point of an interleaved grid: the first call measures every configuration of ``cfg`` at once
    (:func:`measure_configurations`, kept in ``state``); each call then adds its point's quality guard,
    prediction, utilisation and repeat statistics (as :func:`measure_point` does for a point measured alone).

    Returns:
        :class:`workbench.run.point_result.PointResult` of the point.
    """
    out = sweeps.block_share(state, point_result.point_id(EXPERIMENT, point), lambda: measure_configurations(
        loaded, cfg, state.get("configurations") or cfg.configurations(), state))
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
    if cfg.search == "grid":  # every configuration interleaved by round with the A/A control (issue 32)
        sweeps.run_sweep(run_dir, EXPERIMENT, cfg.grid(), lambda p: measure_interleaved_point(loaded, cfg, p, state),
                         loaded=loaded, **kw)
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


def headline(configs: pd.DataFrame, search: dict | None = None) -> str:
    """ONE recommendation, the search that produced it, and what holds it up, in one paragraph.

    The recommendation comes from the full grid (``search`` given: the :func:`replay_search` of a grid run,
    whose disagreement becomes a caveat) or from the adaptive search (``configs`` of an adaptive run: then
    the caveat says the rest of the grid was not measured and whether the search converged). Every
    configuration's ratio to the baseline carries its interval (:func:`speedup_phrase`); the SLO verdict says
    at which percentile it was checked.
    """
    if configs.empty:
        return "No configuration measured."
    best = recommend(configs)
    base = configs.iloc[0]
    adaptive_run = "search" in configs and configs["search"].iloc[0] == "adaptive"
    if adaptive_run:
        source = (f"the adaptive search ({int(configs['search_evaluated'].iloc[0])} of "
                  f"{int(configs['search_grid'].iloc[0])} configurations measured)")
    else:
        source = f"the full grid ({len(configs)} configurations measured)"
    parts = []
    if best is None:
        parts.append(f"No configuration of {source} met the SLO and the quality guard on valid points: none is "
                     f"recommended.")
    else:
        versus = ("it is the baseline" if best["config"] == base["config"] else
                  f"{speedup_phrase(best)} against the baseline {base['config']}")
        parts.append(f"Recommended by {source}: {best['config']} ({best['e2e_s_p50']:.3f} s per request; "
                     f"{versus}; perplexity x{best['perplexity_ratio']:.4g} (95% upper "
                     f"{best['perplexity_ratio_high']:.4g}), mean KL {best['kl_mean']:.3g} nats vs float32; SLO "
                     f"{best.get('slo_note', '')}).")
    for _, r in configs.iloc[1:].iterrows():
        if not math.isfinite(r["speedup_vs_baseline"]):
            continue
        flags = "" if r["guard_passed"] else f" [guard FAILED: {r['guard_reason']}]"
        if r.get("valid") is False or r.get("valid") == False:  # noqa: E712
            flags += f" [invalid: {r.get('invalid_reason', '')}]"
        if r.get("meets_slo") is False:
            flags += f" [misses the SLO: {r.get('slo_note', '')}]"
        if r.get("recompiles", 0) > 0:  # NaN (uncompiled) compares False
            flags += f" [torch.compile built {int(r['recompiles'])} more graph(s) during the timed repeats]"
        if math.isfinite(r.get("compile_s", float("nan"))):
            flags += f" [compile {r['compile_s']:.0f} s, not in the timings]"
        parts.append(f"{r['config']}: {speedup_phrase(r)}{flags}.")
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


def finding(configs: pd.DataFrame, search: dict | None = None, points: pd.DataFrame | None = None) -> evidence.Finding:
    """The report's finding: :func:`headline` as its text, with the evidence behind the recommendation.

    Supported when a configuration is recommended and it is the baseline or its speed-up interval excludes 1
    (a recommended configuration whose ratio is within noise is an equal choice, not a speed-up).

    Returns:
        :class:`workbench.stats.evidence.Finding` (point ids: the usable points of ``points`` when given).
    """
    text = headline(configs, search)
    if configs.empty:
        return evidence.Finding(text, "no configuration measured", False)
    best = recommend(configs)
    src = points if points is not None and "n_repeats" in points else pd.DataFrame()
    reps = pd.to_numeric(src.get("n_repeats", pd.Series(dtype=float)), errors="coerce")
    n_rep = f"at least {int(reps.min())} repeats each" if reps.notna().any() else "repeats per point in the table"
    interleaved = bool(aa_sentence(configs))
    how = (f"paired t over {int(configs.iloc[0]['rounds'])} interleaved rounds of the within-round log e2e ratios, "
           f"Holm over {len(configs) - 1} comparisons, A/A control {configs.iloc[0]['aa_low']:.2f}-"
           f"{configs.iloc[0]['aa_high']:.2f}x" if interleaved else "95% Welch t interval on log e2e over repeats")
    ev = (f"{len(configs)} configurations, {n_rep}; speed-up vs the baseline "
          f"{configs.iloc[0]['config']}: {how}; quality guard (perplexity "
          f"ratio and mean KL vs float32 on held-out text, upper 95% bounds over windows); SLO at the preset's own "
          f"percentile where the sample supports it")
    direction = best is not None and "no difference" not in speedup_phrase(best) and (
        best.get("speedup_low", float("nan")) > 1 or best.get("speedup_high", float("nan")) < 1)
    supported = best is not None and not aa_moved(configs) and (best["config"] == configs.iloc[0]["config"]
                                                                or direction)
    ids = evidence.point_ids(evidence.usable_points(points)) if points is not None else ()
    return evidence.Finding(text, ev, bool(supported), ids)


@split_by_device
def figures(points: pd.DataFrame, configs: pd.DataFrame) -> dict[str, go.Figure]:
    """The notebook's figures by file name."""
    return {"engine_speed": fig_speed(configs, recommend(configs)),
            "engine_speedup": fig_speedup(configs),
            "engine_prediction": fig_prediction(points),
            "engine_guard": fig_guard(configs)}
