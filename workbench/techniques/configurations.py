"""An engine configuration grid: dtype, attention kernel, KV cache, compile, threads and weight quantization
(notebook ``09_engine_tuning``).

:data:`AXES` are the knobs; :func:`valid` is the grid's validity rule (compile needs a static cache, ``int8_dynamic``
float32 weights), :func:`config_key` / :func:`config_name` a configuration's key and short name;
:func:`generate_kwargs` its cache / compile keywords and :func:`load_configuration` / :func:`build_configuration` its
model (memoised, quantized with :mod:`workbench.techniques.rungs`). :func:`configurations` is the per-configuration
table of measured points (the objective, the guard, the SLO verdict at its percentile, the speed-up over the baseline
with its interval), :func:`recommend` its choice and :func:`objective` a search's cost; :func:`speedup_phrase`,
:func:`aa_sentence` and :func:`aa_moved` put its ratios and its A/A control into words.
"""

from __future__ import annotations

import math

import pandas as pd

from workbench import checks
from workbench.measure import models
from workbench.stats import comparison, evidence, slo
from workbench.stats.slo import slo_verdict
from workbench.techniques import rungs

AXES = ("dtype", "attn_implementation", "cache_implementation", "compile", "torch_threads", "quantization")
#: the design's per-configuration columns a point carries (engine_tuning.design_configurations): one value per
#: configuration, copied to its row of :func:`configurations`
DESIGN_COLUMNS = ("speedup_vs_baseline", "speedup_low", "speedup_high", "baseline", "time_ratio", "time_ratio_low",
                  "time_ratio_high", "time_ratio_level", "time_ratio_method", "time_ratio_verdict",
                  "time_ratio_direction", "rounds_needed", "seconds_needed", "margin", "aa_ratio", "aa_low", "aa_high",
                  "aa_verdict", "design", "rounds", "round_drift", "round_speed_drift", "design_seconds",
                  "seconds_per_round", "design_stopped")
JOINT = ("cache_implementation", "compile")  # searched as one axis: compile only exists with a static cache


def valid(config: dict) -> bool:
    """False for a compiled dynamic-cache configuration (``torch.compile`` needs static shapes) and for
    ``int8_dynamic`` off float32 (torch.ao quantizes float32 models only)."""
    if config.get("quantization") == "int8_dynamic" and config.get("dtype") not in (None, "float32"):
        return False
    return not (config.get("compile") and config.get("cache_implementation") != "static")


def config_key(point: dict) -> tuple:
    return tuple(point.get(a) for a in AXES)


def config_name(point) -> str:
    """``float32/sdpa/static+compile/2t``-style short name of a configuration."""
    g = point.get if isinstance(point, dict) else point.__getitem__
    cache = g("cache_implementation") + ("+compile" if bool(g("compile")) else "")
    threads = g("torch_threads")
    t = "" if threads is None or (isinstance(threads, float) and math.isnan(threads)) else f"/{int(threads)}t"
    try:
        q = g("quantization")
    except (KeyError, IndexError):
        q = None
    q = "" if q in (None, "none") or (isinstance(q, float) and math.isnan(q)) else f"+{q}"
    return f"{g('dtype')}{q}/{g('attn_implementation')}/{cache}{t}"


# ----------------------------------------------------------------------------- applying a configuration


def generate_kwargs(point: dict, device: str = "cpu") -> dict:
    """``generate`` keywords of a configuration's cache and compile choice (:func:`workbench.techniques.rungs.generate_kwargs`).

    Raises:
        ParameterError: ``compile`` without a static cache.
    """
    return rungs.generate_kwargs(point.get("cache_implementation") or "dynamic", bool(point.get("compile")), device)


_BUILT: dict = {}


def load_configuration(cfg, point: dict):
    """``cfg``: an engine-tuning config (``model``, ``device``, ``group_size``, ``lm_head``). The model in the point's dtype and attention kernel (memoised by :func:`workbench.measure.models.load_model`)
    with the point's quantization applied (:func:`workbench.techniques.rungs.build`; the last build is kept, so the
    points of one configuration share it). Returns the :class:`workbench.measure.models.LoadedModel`."""
    return build_configuration(cfg, point).loaded


def build_configuration(cfg, point: dict) -> rungs.Built:
    """:func:`load_configuration` with what the build did (:class:`workbench.techniques.rungs.Built`)."""
    loaded = models.load_model(cfg.model, cfg.device, point["dtype"], attn_implementation=point["attn_implementation"])
    rung = rungs.Rung(quantization=point.get("quantization") or "none", group_size=cfg.group_size, lm_head=cfg.lm_head)
    key = (id(loaded), rung.quantization, rung.group_size, rung.lm_head)
    if key not in _BUILT:
        _BUILT.clear()
        _BUILT[key] = rungs.build(loaded, rung)
    return _BUILT[key]


# ----------------------------------------------------------------------------- the table of measured configurations


speedup_interval = evidence.summary_ratio_interval  # the formula's home is workbench.stats.evidence


def configurations(points: pd.DataFrame, cfg_slo: slo.SLO | None = None) -> pd.DataFrame:
    """One row per configuration: mean ``e2e_s_p50`` over workloads (the objective), worst TTFT/TPOT p50,
    predictions, the guard, the SLO verdict at the SLO's own percentile (:func:`workbench.stats.slo.slo_verdict`: ``meets_slo``
    True, False or None when the sample cannot decide, ``slo_percentile``, ``slo_note``), ``valid`` (no point
    marked invalid), ``eligible`` (ok, valid, guard passed, SLO not missed), ``baseline`` (True on the row of the
    design's marked control; older runs: the first row) and the speed-up over the baseline: a design's block
    analysis (:data:`DESIGN_COLUMNS`: ``time_ratio`` with its simultaneous interval and verdict, ``speedup_*`` its
    inverse, the A/A columns), else a 95% Welch interval over repeats (:func:`speedup_interval`:
    ``speedup_vs_baseline``, ``speedup_low``, ``speedup_high``; NaN bounds with a single repeat)."""
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
                         ("perplexity_ratio", "max"), ("perplexity_ratio_high", "max"), ("kl_mean", "max"),
                         ("kl_mean_high", "max"), ("top1_agreement", "min"), ("token_agreement", "min"),
                         ("first_divergence", "min"), ("recompiles", "max")):
            r[col] = float(getattr(ok[col], how)()) if col in ok and len(ok) else float("nan")
        r["guard_passed"] = bool(len(ok) and ok.get("guard_passed", pd.Series([False])).astype(bool).all())
        r["guard_reason"] = "" if r["guard_passed"] else "; ".join(
            sorted(set(str(x) for x in ok.get("guard_reason", pd.Series(["not measured"])) if x))) or r["status"]
        lim_ttft = cfg_slo.ttft_s if cfg_slo else (ok["slo_ttft_s"].iloc[0] if "slo_ttft_s" in ok and len(ok) else None)
        lim_tpot = cfg_slo.tpot_s if cfg_slo else (ok["slo_tpot_s"].iloc[0] if "slo_tpot_s" in ok and len(ok) else None)
        pct = cfg_slo.percentile if cfg_slo else 99
        r["slo_percentile"] = int(pct)
        if len(ok):
            r["meets_slo"], r["slo_note"] = slo_verdict(ok, {"ttft_s": lim_ttft, "tpot_s": lim_tpot}, pct)
        else:
            r["meets_slo"], r["slo_note"] = False, "not measured"
        invalid = (ok["valid"].astype(object) == False) if "valid" in ok else pd.Series(False, index=ok.index)  # noqa: E712
        r["valid"] = bool(len(ok)) and not bool(invalid.any())
        r["invalid_reason"] = "" if r["valid"] or not len(ok) else str(ok.loc[invalid, "invalid_reason"].iloc[0]) \
            if "invalid_reason" in ok else "invalid"
        r["eligible"] = r["status"] == "ok" and r["valid"] and r["guard_passed"] and r["meets_slo"] is not False
        for col in DESIGN_COLUMNS:
            if "design" in ok and len(ok) and isinstance(ok["design"].iloc[0], str) and col in ok:
                r["_" + col] = ok[col].iloc[0]  # the design's decision (engine_tuning.design_configurations)
        r["_workloads"] = {(w.get("batch_size"), w.get("prompt_tokens")):
                           (w.get("log_e2e_s_mean", float("nan")), w.get("log_e2e_s_sd", float("nan")),
                            checks.int_or(w.get("n_repeats"), 0)) for _, w in ok.iterrows()}
        rows.append(r)
    out = pd.DataFrame(rows)
    out["meets_slo"] = out["meets_slo"].astype(object)
    marked = out.index[out["_baseline"].fillna(False).astype(bool)] if "_baseline" in out else []
    base = marked[0] if len(marked) else out.index[0]     # the marked control; older runs: the first row
    base_e2e, base_w = out.loc[base, "e2e_s_p50"], out.loc[base, "_workloads"]
    ratios = []
    for _, r in out.iterrows():
        common = [k for k in base_w if k in r["_workloads"]]
        stats = [base_w[k] for k in common], [r["_workloads"][k] for k in common]
        if common and all(math.isfinite(m) for m, _, _ in [*stats[0], *stats[1]]):
            ratios.append(speedup_interval(*stats))
        else:  # no repeat statistics (older runs): the ratio of mean e2e p50, no interval
            ratios.append((base_e2e / r["e2e_s_p50"], float("nan"), float("nan")))
    out["speedup_vs_baseline"], out["speedup_low"], out["speedup_high"] = zip(*ratios) if ratios else ((), (), ())
    if "_design" in out and out["_design"].notna().all():  # one design: the block analysis's decisions
        for col in DESIGN_COLUMNS:
            if "_" + col in out:
                out[col] = out["_" + col]
    out["baseline"] = out.index == base
    out = out.drop(columns=[c for c in out if c.startswith("_") and c != "_workloads"])
    out["e2e_ratio"] = out["e2e_s_p50"] / out["predicted_e2e_s"]
    for col in ("search", "search_evaluated", "search_grid", "search_converged"):  # set by an adaptive run
        if col in points and len(points):
            out[col] = points[col].iloc[0]
    return out.drop(columns=["_workloads"])


def recommend(configs: pd.DataFrame) -> pd.Series | None:
    """The fastest eligible configuration (ok and valid points, guard passed, SLO not missed), or None.

    Measured as one design (a ``design`` on every row, :func:`workbench.experiments.engine_tuning.design_configurations`)
    the fastest is the highest ``speedup_vs_baseline`` from the block analysis of the rounds (the baseline at 1): the
    rounds as blocks cancel a drift shared by a round, which the medians of absolute ``e2e_s_p50`` over the rounds
    keep (a run whose baseline moved 69% between neighbouring rounds recommended bfloat16+int8 at 1.17x over
    bfloat16 at 1.30x on its 2% lower median). Whether the pick is decided is :func:`workbench.stats.blocks.best_of`'s
    (the finding's). Otherwise (configurations measured one after another) the lowest mean ``e2e_s_p50``."""
    if configs.empty:
        return None
    ok = configs[configs["eligible"]]
    if ok.empty:
        return None
    designed = ("design" in ok and "speedup_vs_baseline" in ok and ok["design"].map(lambda d: isinstance(d, str)).all()
                and ok["speedup_vs_baseline"].notna().all())
    if designed:
        return ok.loc[ok["speedup_vs_baseline"].astype(float).idxmax()]
    return ok.sort_values("e2e_s_p50").iloc[0]


def objective(row) -> float:
    """Search cost of a configuration row: its mean ``e2e_s_p50``, ``inf`` when it is not eligible."""
    return float(row["e2e_s_p50"]) if bool(row["eligible"]) else math.inf


# ----------------------------------------------------------------------------- in words


def designed(configs) -> bool:
    """True when the rows come from one design (every row carries its ``time_ratio_verdict``)."""
    return (not configs.empty and "time_ratio_verdict" in configs and "design" in configs
            and configs["design"].map(lambda d: isinstance(d, str)).all())


def aa_moved(configs: pd.DataFrame) -> bool:
    """True when the configurations carry an A/A control that moved: a direction in the design's analysis (older
    runs: an A/A interval excluding 1)."""
    if configs.empty or "aa_low" not in configs:
        return False
    if designed(configs):
        return bool((configs["aa_verdict"] == "direction").any())
    lo, hi = configs["aa_low"].iloc[0], configs["aa_high"].iloc[0]
    return bool(lo == lo and hi == hi and (lo > 1 or hi < 1))


def aa_sentence(configs: pd.DataFrame) -> str:
    """The noise floor beside the finding: ``"A/A control (the baseline against itself, 4 interleaved rounds):
    1.01x, 95% interval 0.95-1.07x, equivalent."``; empty for a run without the control."""
    if configs.empty or "aa_ratio" not in configs or not isinstance(configs["design"].iloc[0], str):
        return ""
    r = configs.iloc[0]
    rounds = checks.int_or(r.get("rounds"), 0)
    if not (r["aa_low"] == r["aa_low"]):
        floor = f"{r['aa_ratio']:.2f}x (no interval: {rounds} round)"
    else:
        floor = f"{r['aa_ratio']:.2f}x, interval {r['aa_low']:.2f}-{r['aa_high']:.2f}x"
    verdict = f", {r['aa_verdict']}" if isinstance(r.get("aa_verdict"), str) and r.get("aa_verdict") else ""
    moved = " The A/A control moved: drift, not configurations; no comparison here is decided." if aa_moved(
        configs) else ""
    drifted = comparison.drift_text(r.get("round_drift", float("nan")))
    return (f"A/A control (the baseline's latency against itself, {rounds} {r['design']} rounds): {floor}"
            f"{verdict}.{moved}" + (f" {drifted}" if drifted else ""))


def speedup_phrase(r) -> str:
    """``1.59x (95% simultaneous interval 1.41-1.79x: faster)``. A row of one design: the block analysis's verdict
    (faster / slower, equivalent within the margin, or undecided with the rounds that would decide it); an older
    run's row: a direction only when its Welch interval excludes 1."""
    x, lo, hi = r["speedup_vs_baseline"], r.get("speedup_low", float("nan")), r.get("speedup_high", float("nan"))
    v = r.get("time_ratio_verdict")
    if isinstance(v, str) and v:
        level = checks.float_or_nan(r.get("time_ratio_level"))
        body = (f"{x:.2f}x ({level:.0%} simultaneous interval {lo:.2f}-{hi:.2f}x" if lo == lo else
                f"{x:.2f}x (no interval: {r.get('time_ratio_method') or 'too few rounds'}")
        if v == "direction":
            return f"{body}: {'faster' if r.get('time_ratio_direction') == 'lower' else 'slower'})"
        if v == "equivalent":
            return f"{body}: equivalent within +-{checks.float_or_nan(r.get('margin')) - 1:.0%})"
        need = checks.float_or_nan(r.get("rounds_needed"))
        return f"{body}: undecided" + (f", about {need:.0f} rounds would decide it)" if need == need else ")")
    if not (lo == lo and hi == hi):
        return f"{x:.2f}x (no interval: a single repeat, so no direction)"
    verdict = "faster" if lo > 1 else ("slower" if hi < 1 else "no difference beyond noise")
    return f"{x:.2f}x (95% interval {lo:.2f}-{hi:.2f}x: {verdict})"
