"""Experiment 09: engine tuning with a quality guard and a recommendation (notebook ``09_engine_tuning``).

Knobs that change speed without changing the model: ``dtype``, ``attn_implementation`` (``transformers``'
attention kernel), ``cache_implementation`` (``dynamic`` / ``static``) with ``compile`` (``torch.compile`` of
the decode forward, which needs the static cache's fixed shapes) and ``torch_threads`` (CPU). Each
configuration is measured at one or two workloads (batch size x prompt length, fixed-length greedy outputs)
with the calibrated roofline's prediction beside it (:mod:`workbench.roofline`).

Method:

- Compile time: a compiled point first runs one full request untimed (``compile_s``: the first compiled call,
  recorded separately); that run is the warm-up, and the timed repeats come after it.
- Quality guard (per configuration, on ``guard_prompts`` fixed prompts of real text): greedy output against the
  float32 ``eager`` reference (``token_agreement``: share of identical tokens position by position;
  ``first_divergence``: the first differing position, minimum over prompts) and the mean absolute drift of
  the reference continuation's per-token log-probability (:func:`workbench.quality.continuation_logprobs`,
  nats). A configuration passes when agreement >= ``min_token_agreement`` and drift <=
  ``max_logprob_drift``; one that fails is shown and marked, never recommended.
- Recommendation: the fastest configuration (lowest mean ``e2e_s_p50`` over the workloads) that meets the SLO
  (``ttft_s_p50`` and ``tpot_s_p50`` within the limits at every workload) and the guard.
- ``search="adaptive"``: coordinate descent (:func:`coordinate_search`; one axis at a time from the baseline,
  keeping the best value, the way a tuner bisects one knob while holding the rest) measuring at most a third
  of the grid. :func:`replay_search` runs the same search over a measured grid to show whether it reaches the
  full grid's recommendation.

The first value of each axis list is the baseline that ratios are taken against.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import time
from typing import Callable

import pandas as pd
import plotly.graph_objects as go

from .. import checks, models, results, roofline, slo, sweeps
from ..errors import ParameterError
from ..generation import GenerationSettings, encode_prompts, generate_measured
from ..plots import label, legend_below, split_by_device
from ..prompts import build_batch
from ..quality import continuation_logprobs
from ..results import PointResult
from ..sweeps import SweepConfig

EXPERIMENT = "engine_tuning"
AXES = ("dtype", "attn_implementation", "cache_implementation", "compile", "torch_threads")
CACHE_IMPLEMENTATIONS = ("dynamic", "static")
SEARCHES = ("grid", "adaptive")
REFERENCE = {"dtype": "float32", "attn_implementation": "eager", "cache_implementation": "dynamic", "compile": False}


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask), the ceiling of ``torch_threads``."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def supported_dtypes(device: str) -> tuple[str, ...]:
    """Dtypes worth tuning on a device: float32 and bfloat16 on CPU; plus float16 on CUDA and MPS (bfloat16 on
    CUDA only where the GPU supports it)."""
    if device == "cpu":
        return ("float32", "bfloat16")
    if device == "cuda":
        import torch

        return ("float32", "bfloat16", "float16") if torch.cuda.is_bf16_supported() else ("float32", "float16")
    return ("float32", "float16")


def supported_attention(device: str) -> tuple[str, ...]:
    """Attention kernels the installed ``transformers`` offers on a device: ``eager`` and ``sdpa`` everywhere;
    on CUDA also ``flex_attention`` and ``flash_attention_2``/``_3`` when the ``flash_attn`` package is
    installed (FlashAttention kernels are CUDA-only)."""
    import importlib.util

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    out = ["eager", "sdpa"]
    if device == "cuda":
        out += [k for k in ("flex_attention",) if k in ALL_ATTENTION_FUNCTIONS]
        if importlib.util.find_spec("flash_attn") is not None:
            out += [k for k in ("flash_attention_2", "flash_attention_3") if k in ALL_ATTENTION_FUNCTIONS]
    return tuple(out)


@dataclasses.dataclass
class Config(SweepConfig):
    """The engine-tuning sweep (notebook ``09_engine_tuning``).

    Attributes:
        dtypes: weight/compute dtypes (:func:`supported_dtypes` of the device).
        attn_implementations: attention kernels (:func:`supported_attention`).
        cache_implementations: ``dynamic`` and/or ``static`` KV cache.
        compile: ``[False]``, ``[True]`` or both; ``True`` compiles the decode forward of static-cache points
            (dynamic-cache points always run uncompiled) and needs ``static`` in ``cache_implementations``.
        torch_threads: intra-op threads (1..usable cores); empty: this process's setting, not an axis.
        batch_sizes, prompt_tokens: the workloads (every pair).
        max_new_tokens: fixed-length greedy outputs (>= 2).
        guard_prompts, guard_tokens: quality-guard prompts and greedy tokens per prompt.
        min_token_agreement, max_logprob_drift: the guard's limits.
        slo_preset: a :mod:`workbench.slo` preset or ``custom`` (then ``slo_ttft_s`` / ``slo_tpot_s``).
        search: ``grid`` (every configuration) or ``adaptive`` (:func:`coordinate_search`, <= 1/3 of the grid).
        calibrate: fit the roofline's overheads on this machine first when no calibration is cached (~15 s).
    """

    dtypes: list = dataclasses.field(default_factory=lambda: ["float32", "bfloat16"])
    attn_implementations: list = dataclasses.field(default_factory=lambda: ["sdpa", "eager"])
    cache_implementations: list = dataclasses.field(default_factory=lambda: ["dynamic", "static"])
    compile: list = dataclasses.field(default_factory=lambda: [False])
    torch_threads: list = dataclasses.field(default_factory=list)
    batch_sizes: list = dataclasses.field(default_factory=lambda: [1])
    prompt_tokens: list = dataclasses.field(default_factory=lambda: [128])
    max_new_tokens: int = 16
    guard_prompts: int = 3
    guard_tokens: int = 16
    min_token_agreement: float = 0.9
    max_logprob_drift: float = 0.05
    slo_preset: str = "custom"
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.25
    search: str = "grid"
    calibrate: bool = True

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
        checks.check_int("guard_prompts", self.guard_prompts, 1)
        checks.check_int("guard_tokens", self.guard_tokens, 1)
        checks.check_float("min_token_agreement", self.min_token_agreement, 0, 1)
        checks.check_float("max_logprob_drift", self.max_logprob_drift, 0)
        self.slo()
        checks.check_choice("search", self.search, SEARCHES)
        checks.check_bool("calibrate", self.calibrate)

    def slo(self) -> slo.SLO:
        return slo.get(self.slo_preset, self.slo_ttft_s, self.slo_tpot_s)

    def settings(self, max_new_tokens: int | None = None) -> GenerationSettings:
        return GenerationSettings(max_new_tokens=max_new_tokens or self.max_new_tokens, ignore_eos=True,
                                  seed=self.seed)

    def axes(self) -> dict[str, list]:
        """The configuration axes (``torch_threads`` is ``[None]`` when not swept)."""
        return {"dtype": list(self.dtypes), "attn_implementation": list(self.attn_implementations),
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


def valid(config: dict) -> bool:
    """False for a compiled dynamic-cache configuration (``torch.compile`` needs static shapes)."""
    return not (config.get("compile") and config.get("cache_implementation") != "static")


def config_key(point: dict) -> tuple:
    return tuple(point.get(a) for a in AXES)


def config_name(point) -> str:
    """``float32/sdpa/static+compile/2t``-style short name of a configuration."""
    g = point.get if isinstance(point, dict) else point.__getitem__
    cache = g("cache_implementation") + ("+compile" if bool(g("compile")) else "")
    threads = g("torch_threads")
    t = "" if threads is None or (isinstance(threads, float) and math.isnan(threads)) else f"/{int(threads)}t"
    return f"{g('dtype')}/{g('attn_implementation')}/{cache}{t}"


# ----------------------------------------------------------------------------- applying a configuration


@contextlib.contextmanager
def threads(n: int | None):
    """Run the body with ``torch.set_num_threads(n)`` (None: unchanged), restoring the previous count."""
    import torch

    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def generate_kwargs(point: dict, device: str = "cpu") -> dict:
    """``generate`` keywords of a configuration: the cache implementation, and either a ``CompileConfig``
    (compile; on CPU with ``_compile_all_devices``, since ``transformers`` auto-compiles only on accelerators)
    or ``disable_compile=True`` (a static cache alone must not compile behind our back).

    Raises:
        ParameterError: ``compile`` without a static cache.
    """
    if not valid(point):
        raise ParameterError("compile: torch.compile needs cache_implementation 'static'")
    out: dict = {}
    if point.get("cache_implementation") == "static":
        out["cache_implementation"] = "static"
    if point.get("compile"):
        from transformers import CompileConfig

        cc = CompileConfig(mode="default" if device == "cpu" else "reduce-overhead")
        cc._compile_all_devices = True
        out["compile_config"] = cc
    else:
        out["disable_compile"] = True
    return out


def load_configuration(cfg: Config, point: dict):
    """The model in the point's dtype and attention kernel (memoised by :func:`workbench.models.load_model`)."""
    return models.load_model(cfg.model, cfg.device, point["dtype"], attn_implementation=point["attn_implementation"])


# ----------------------------------------------------------------------------- quality guard


def guard_prompts(tokenizer, n: int) -> list[str]:
    """The guard's fixed prompts: ``n`` windows of real text, 48 tokens each."""
    return build_batch(tokenizer, n, 48)


def _context_ids(tokenizer, prompts) -> list[list[int]]:
    enc = encode_prompts(tokenizer, prompts)
    return [[int(t) for t, m in zip(ids, mask) if m] for ids, mask in zip(enc["input_ids"].tolist(),
                                                                            enc["attention_mask"].tolist())]


def reference(cfg: Config) -> dict:
    """The float32 ``eager`` reference on the guard prompts: prompts, context ids, greedy output ids, their
    per-token log-probs."""
    ref = models.load_model(cfg.model, cfg.device, "float32", attn_implementation="eager")
    prompts = guard_prompts(ref.tokenizer, cfg.guard_prompts)
    res = generate_measured(ref, prompts, cfg.settings(cfg.guard_tokens), generate_kwargs={"disable_compile": True})
    outputs = [r["output_ids"] for r in res.records]
    contexts = _context_ids(ref.tokenizer, prompts)
    return {"prompts": prompts, "contexts": contexts, "outputs": outputs,
            "logprobs": continuation_logprobs(ref, contexts, outputs)}


def agreement(reference_ids: list[list[int]], ids: list[list[int]]) -> tuple[float, int]:
    """``(share of identical tokens, first divergence)``: position by position against the reference (a
    missing token is a mismatch); the first divergence is the minimum over prompts (the reference length when
    all agree)."""
    same = total = 0
    first = min((len(r) for r in reference_ids), default=0)
    for r, o in zip(reference_ids, ids):
        for i, t in enumerate(r):
            total += 1
            if i < len(o) and o[i] == t:
                same += 1
            else:
                first = min(first, i)
                break
        else:
            continue
        total += len(r) - i - 1
        same += sum(1 for j in range(i + 1, len(r)) if j < len(o) and o[j] == r[j])
    return (same / total if total else float("nan")), int(first)


def quality_guard(loaded, ref: dict, cfg: Config, gen_kwargs: dict | None = None, logits_processor=None) -> dict:
    """The guard of one configuration (model already loaded in its dtype and kernel, threads already set).

    Returns:
        ``token_agreement``, ``first_divergence``, ``logprob_drift`` (mean |delta log-prob|, nats/token) and
        ``guard_passed`` (bool) with ``guard_reason`` when it fails.
    """
    res = generate_measured(loaded, ref["prompts"], cfg.settings(cfg.guard_tokens), logits_processor=logits_processor,
                            generate_kwargs=gen_kwargs)
    share, first = agreement(ref["outputs"], [r["output_ids"] for r in res.records])
    lps = continuation_logprobs(loaded, ref["contexts"], ref["outputs"])
    diffs = [abs(a - b) for la, lb in zip(lps, ref["logprobs"]) for a, b in zip(la, lb)]
    drift = sum(diffs) / len(diffs) if diffs else float("nan")
    reasons = []
    if not share >= cfg.min_token_agreement:
        reasons.append(f"token agreement {share:.2f} < {cfg.min_token_agreement}")
    if not drift <= cfg.max_logprob_drift:
        reasons.append(f"log-prob drift {drift:.3f} > {cfg.max_logprob_drift} nats")
    return {"token_agreement": share, "first_divergence": first, "logprob_drift": drift,
            "guard_passed": not reasons, "guard_reason": "; ".join(reasons)}


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
            point and kept when absent), ``predictor`` (:class:`workbench.roofline.Predictor`, optional: the
            prediction columns) and ``logits_processor`` (optional, tests: applies to the timed runs and the
            guard).

    Returns:
        :class:`workbench.results.PointResult`; ``extra`` holds the configuration's name, ``compile_s``, the
        guard's columns (:func:`quality_guard`) and, with a predictor, its prediction.
    """
    if "reference" not in state:
        state["reference"] = reference(cfg)
    ref, predictor, logits_processor = state["reference"], state.get("predictor"), state.get("logits_processor")
    gen_kwargs = generate_kwargs(point, models.pick_device(cfg.device))
    loaded = load_configuration(cfg, point)
    B, L = int(point["batch_size"]), int(point["prompt_tokens"])
    prompts = build_batch(loaded.tokenizer, B, L)
    settings = cfg.settings()
    extra: dict = {"config": config_name(point), "compile_s": float("nan")}
    with threads(point.get("torch_threads")):
        warmup = cfg.warmup
        if point.get("compile"):
            t0 = time.perf_counter()
            generate_measured(loaded, prompts, settings, generate_kwargs=gen_kwargs, logits_processor=logits_processor)
            extra["compile_s"] = time.perf_counter() - t0
            warmup = 0
        out = sweeps.measure_generation(loaded, prompts, settings, cfg.repeats, warmup, generate_kwargs=gen_kwargs,
                                        logits_processor=logits_processor)
        extra.update(quality_guard(loaded, ref, cfg, gen_kwargs, logits_processor))
    if predictor is not None:
        extra.update(predictor.predict(B, L, cfg.max_new_tokens, dtype=point["dtype"],
                                       threads=point.get("torch_threads")))
        extra["calibrated_dtype"] = predictor.calibrated_dtype(point["dtype"])
    for rec in out.requests:
        rec.update(context_tokens=L)
    out.extra = extra
    return out


# ----------------------------------------------------------------------------- search and recommendation


JOINT = ("cache_implementation", "compile")  # searched as one axis: compile only exists with a static cache


def coordinate_search(axes: dict[str, list], evaluate: Callable[[dict], float], start: dict | None = None,
                      budget: int | None = None, is_valid: Callable[[dict], bool] = valid) -> tuple[dict, dict]:
    """Coordinate descent over a configuration grid: from ``start`` (default: the first value of each axis),
    try every value of one axis while holding the others, keep the best, go to the next axis; repeat passes
    until a pass changes nothing or the budget is spent. ``cache_implementation`` and ``compile`` are one
    joint axis (``dynamic``, ``static``, ``static+compile``), since compile only exists with a static cache.

    Args:
        axes: ``{axis: [values]}``.
        evaluate: cost of a configuration (lower is better; ``inf`` for one that fails the SLO or guard).
        budget: most configurations evaluated (default: a third of the valid grid, at least 1).

    Returns:
        ``(best configuration, {config key: cost} of every evaluated configuration)``.
    """
    names = list(axes)
    grid = [c for c in sweeps.expand_grid(**axes) if is_valid(c)]
    budget = max(1, len(grid) // 3) if budget is None else budget
    joint = [a for a in JOINT if a in axes]
    search_axes: dict[str, list] = {}
    for a in names:
        if a in joint and len(joint) == len(JOINT):
            if a == joint[0]:
                search_axes["+".join(joint)] = [v for v in itertools.product(*(axes[j] for j in joint))
                                                if is_valid(dict(zip(joint, v)))]
        else:
            search_axes[a] = list(axes[a])

    def expand(c: dict) -> dict:
        out = {}
        for a, v in c.items():
            out.update(dict(zip(joint, v)) if "+" in a else {a: v})
        return out

    seen: dict = {}

    def cost(c):
        full = expand(c)
        key = tuple(full[a] for a in names)
        if key not in seen:
            if len(seen) >= budget or not is_valid(full):
                return math.inf
            seen[key] = evaluate(dict(full))
        return seen[key]

    current = {a: v[0] for a, v in search_axes.items()}
    if start:
        current = {a: (tuple(start[j] for j in joint) if "+" in a else start[a]) for a in search_axes}
    best = cost(current)
    changed = True
    while changed and len(seen) < budget:
        changed = False
        for a, values in search_axes.items():
            for v in values:
                cand = {**current, a: v}
                c = cost(cand)
                if c < best:
                    current, best, changed = cand, c, True
    return expand(current), seen


def configurations(points: pd.DataFrame, cfg_slo: slo.SLO | None = None) -> pd.DataFrame:
    """One row per configuration: mean ``e2e_s_p50`` over workloads (the objective), worst TTFT/TPOT p50,
    predictions, the guard, ``meets_slo``, ``eligible`` (ok, guard passed, SLO met) and the speed ratio to the
    baseline (the first configuration measured in grid order)."""
    if points.empty:
        return pd.DataFrame()
    df = points.copy()
    for a in AXES:
        if a not in df:
            df[a] = None
    df["torch_threads"] = df["torch_threads"].astype(object).where(df["torch_threads"].notna(), None)
    rows = []
    for key, g in df.groupby(list(AXES), dropna=False, sort=False):
        ok = g[g["status"] == "ok"] if "status" in g else g
        r = {a: (None if isinstance(v, float) and math.isnan(v) else v) for a, v in zip(AXES, key)}  # groupby: None -> NaN
        r["config"] = config_name(r)
        r["status"] = "ok" if len(ok) == len(g) else str(g["status"][g["status"] != "ok"].iloc[0])
        for col, how in (("e2e_s_p50", "mean"), ("ttft_s_p50", "max"), ("tpot_s_p50", "max"),
                         ("output_throughput_tps", "mean"), ("predicted_e2e_s", "mean"),
                         ("predicted_ttft_s", "max"), ("predicted_tpot_s", "max"), ("compile_s", "mean"),
                         ("token_agreement", "min"), ("first_divergence", "min"), ("logprob_drift", "max")):
            r[col] = float(getattr(ok[col], how)()) if col in ok and len(ok) else float("nan")
        r["guard_passed"] = bool(len(ok) and ok.get("guard_passed", pd.Series([False])).astype(bool).all())
        r["guard_reason"] = "" if r["guard_passed"] else "; ".join(
            sorted(set(str(x) for x in ok.get("guard_reason", pd.Series(["not measured"])) if x))) or r["status"]
        lim_ttft = cfg_slo.ttft_s if cfg_slo else (ok["slo_ttft_s"].iloc[0] if "slo_ttft_s" in ok and len(ok) else None)
        lim_tpot = cfg_slo.tpot_s if cfg_slo else (ok["slo_tpot_s"].iloc[0] if "slo_tpot_s" in ok and len(ok) else None)
        r["meets_slo"] = bool(len(ok)) and (lim_ttft is None or r["ttft_s_p50"] <= lim_ttft) and (
            lim_tpot is None or r["tpot_s_p50"] <= lim_tpot)
        r["eligible"] = r["status"] == "ok" and r["guard_passed"] and r["meets_slo"]
        rows.append(r)
    out = pd.DataFrame(rows)
    base = out["e2e_s_p50"].iloc[0]
    out["speedup_vs_baseline"] = base / out["e2e_s_p50"]
    out["e2e_ratio"] = out["e2e_s_p50"] / out["predicted_e2e_s"]
    return out


def recommend(configs: pd.DataFrame) -> pd.Series | None:
    """The eligible configuration with the lowest mean ``e2e_s_p50``, or None."""
    if configs.empty:
        return None
    ok = configs[configs["eligible"]]
    return None if ok.empty else ok.sort_values("e2e_s_p50").iloc[0]


def objective(row) -> float:
    """Search cost of a configuration row: its mean ``e2e_s_p50``, ``inf`` when it is not eligible."""
    return float(row["e2e_s_p50"]) if bool(row["eligible"]) else math.inf


def replay_search(configs: pd.DataFrame, axes: dict[str, list]) -> dict:
    """Run :func:`coordinate_search` over a measured grid (evaluation = a table lookup) and compare with the
    full grid's :func:`recommend`: ``{"evaluated", "grid", "adaptive", "full", "same"}``."""
    table = {config_key(r): objective(r) for _, r in configs.iterrows()}
    axes = {a: axes.get(a, [None]) for a in AXES}
    best, seen = coordinate_search(axes, lambda c: table.get(config_key(c), math.inf))
    full = recommend(configs)
    adaptive = config_name(best) if math.isfinite(seen.get(config_key(best), math.inf)) else None
    full_name = None if full is None else full["config"]
    return {"evaluated": len(seen), "grid": sum(1 for c in sweeps.expand_grid(**axes) if valid(c)),
            "adaptive": adaptive, "full": full_name, "same": adaptive == full_name}


# ----------------------------------------------------------------------------- the sweep


def make_predictor(cfg: Config, loaded) -> roofline.Predictor:
    """The roofline for ``loaded``'s model with one calibration per swept dtype: the cached one, else
    (``cfg.calibrate``) a fresh one on the model loaded in that dtype (the small workload, one repeat, 3 probe
    trials; ~20 s once per machine and dtype); a dtype left uncalibrated uses its own probed FLOP/s with
    ``loaded``'s overheads (:meth:`workbench.roofline.Predictor.for_dtype`); a point's ``calibrated_dtype`` says
    which calibration it used."""
    info = loaded.info
    dev = info.device.split(":")[0]
    threads = roofline._threads()
    cached = roofline.load_cached(info.path, dev, info.dtype, threads)
    if cached is None and cfg.calibrate:
        cached = roofline.calibrate(loaded)
    if cached is None:
        cached = (roofline.Device.probe(dev, info.dtype), roofline.Calibration())
    predictor = roofline.Predictor(roofline.shape_of(info), *cached, model_path=info.path)
    for dtype in cfg.dtypes:
        if dtype != info.dtype and cfg.calibrate and roofline.load_cached(info.path, dev, dtype, threads) is None:
            predictor.add(dtype, *roofline.calibrate(models.load_model(cfg.model, cfg.device, dtype), repeats=1,
                                                     trials=3, runs=roofline.CALIBRATION_RUNS_SMALL))
    return predictor


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
    if cfg.search == "grid":
        sweeps.run_sweep(run_dir, EXPERIMENT, cfg.grid(), measure, loaded=loaded, **kw)
    else:
        ids: list[str] = []

        def evaluate(c):
            pts = [{**c, **w} for w in cfg.workloads()]
            ids.extend(results.point_id(EXPERIMENT, p) for p in pts)
            done = sweeps.run_sweep(run_dir, EXPERIMENT, pts, measure, **kw)
            done = done[done["point_id"].isin([results.point_id(EXPERIMENT, p) for p in pts])]
            row = configurations(done, lim)
            return objective(row.iloc[0]) if len(row) else math.inf

        coordinate_search(cfg.axes(), evaluate)
        exp = results.read_manifest(run_dir)["experiments"][EXPERIMENT]
        results.update_manifest(run_dir, experiments={EXPERIMENT: {**exp, "points": ids, "search": "adaptive"}})
    points = results.read_points(run_dir, EXPERIMENT)
    if "predicted_ttft_s" in points:
        points["ttft_ratio"] = points["ttft_s_p50"] / points["predicted_ttft_s"]
        points["tpot_ratio"] = points["tpot_s_p50"] / points["predicted_tpot_s"]
        roofline.save_residuals(run_dir, EXPERIMENT, points)
    return points


# ----------------------------------------------------------------------------- findings and figures


def headline(configs: pd.DataFrame, search: dict | None = None) -> str:
    """The recommendation and which knobs help (ratio to the baseline), in one paragraph."""
    if configs.empty:
        return "No configuration measured."
    best = recommend(configs)
    base = configs.iloc[0]
    parts = []
    if best is None:
        parts.append("No configuration met both the SLO and the quality guard: none is recommended.")
    else:
        parts.append(f"Recommended: {best['config']} ({best['e2e_s_p50']:.3f} s per request, "
                     f"{best['speedup_vs_baseline']:.2f}x the baseline {base['config']}; token agreement "
                     f"{best['token_agreement']:.2f}, log-prob drift {best['logprob_drift']:.3f} nats).")
    for _, r in configs.iloc[1:].iterrows():
        if not math.isfinite(r["speedup_vs_baseline"]):
            continue
        verdict = "helps" if r["speedup_vs_baseline"] > 1.05 else ("hurts" if r["speedup_vs_baseline"] < 0.95 else
                                                                    "no clear change")
        guard = "" if r["guard_passed"] else f" [guard FAILED: {r['guard_reason']}]"
        parts.append(f"{r['config']}: {r['speedup_vs_baseline']:.2f}x ({verdict}){guard}.")
    if search:
        parts.append(f"Adaptive search on this grid: {search['evaluated']} of {search['grid']} configurations, "
                     f"recommends {search['adaptive']} ({'same as' if search['same'] else 'differs from'} the full "
                     f"grid's {search['full']}).")
    return " ".join(parts)


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
                      xaxis_title="configuration (dtype / attention / cache / threads)", yaxis_title=label("e2e_s"))
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
    """Greedy token agreement and log-prob drift per configuration against the float32 eager reference."""
    fig = go.Figure()
    fig.add_bar(x=configs["config"], y=configs["token_agreement"], name=label("token_agreement"))
    fig.add_scatter(x=configs["config"], y=configs["logprob_drift"], mode="markers", yaxis="y2",
                    name=label("logprob_drift"), marker=dict(symbol="diamond", size=11))
    fig.update_layout(title="Quality guard: agreement with the float32 eager reference",
                      yaxis=dict(title=label("token_agreement"), range=[0, 1.05]),
                      yaxis2=dict(title=label("logprob_drift"), overlaying="y", side="right"))
    return legend_below(fig)


@split_by_device
def figures(points: pd.DataFrame, configs: pd.DataFrame) -> dict[str, go.Figure]:
    """The notebook's figures by file name."""
    return {"engine_speed": fig_speed(configs, recommend(configs)),
            "engine_prediction": fig_prediction(points),
            "engine_guard": fig_guard(configs)}
