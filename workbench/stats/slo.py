"""SLO presets with their sources, per-point attainment and goodput, and the SLO search.

A preset is a pair of per-request limits (TTFT and TPOT, seconds) plus the percentile at which its source
states them (MLPerf states p99 limits; the others are per-request targets). Per point
(:func:`evaluate`): ``slo_attainment`` (requests meeting every limit over the requests *planned* for the
window: failed, unsent and incomplete ones count as misses) with its Wilson 95% interval
(``slo_attainment_low`` / ``_high``, :func:`attainment`), ``goodput_rps`` (meeting requests completed inside
the measured window per second of it, :func:`workbench.load.load.apply_window`) and ``percentiles_ok`` (TTFT
and TPOT at the preset's own percentile within the limits; None where the point's independent samples cannot
support that percentile, :data:`workbench.stats.metrics.MIN_SAMPLES`).

:func:`slo_verdict` judges a group of points (one configuration's) at the SLO's own percentile the same way:
met, missed, or unknown where no point has the samples for it and no lower percentile already proves a miss.

The limits are the sources' figures for data-centre GPUs and 13B-405B models; on a CPU with the embedded
135M model most are out of reach, which is itself the finding; ``custom`` takes any pair.

Sources, checked against the files themselves (2026-11-30):

- MLPerf: https://github.com/mlcommons/inference/blob/master/loadgen/mlperf.conf (``<model>.Server.ttft_latency``
  / ``tpot_latency`` in ms; ``*.Server.target_latency_percentile = 99``) and the rules,
  https://github.com/mlcommons/inference_policies/blob/master/inference_rules.adoc (Scenarios table:
  Server/Interactive are Poisson arrivals with a 99% tail-latency percentile, Offline has no latency
  constraint; Datacenter benchmarks table, "Server latency constraint" column, where the llama2-70b Server
  limits are called the "Conversational category").
- DistServe: Zhong et al., "DistServe: Disaggregating Prefill and Decoding for Goodput-optimized Large
  Language Model Serving", OSDI 2024 (arXiv 2401.09670), Table 1 (applications, models, TTFT and TPOT
  requirements, datasets) with a 90% SLO-attainment target; the same values are in its artifact,
  https://github.com/LLMServe/DistServe/blob/main/evaluation/ae-scripts/e2e/_plot.py (figures 8 and 9).

============================  =========  =========  ====  =================================================
preset                        TTFT       TPOT       pct   source
============================  =========  =========  ====  =================================================
``interactive_chat``          0.25 s     0.1 s      90    DistServe Table 1, chatbot (OPT-13B, ShareGPT)
``code_completion``           0.125 s    0.2 s      90    DistServe Table 1, code completion (OPT-66B, HumanEval)
``rag``                       15 s       0.15 s     90    DistServe Table 1, summarization (OPT-66B, LongBench)
``batch_offline``             none       none       --    MLPerf Offline scenario (no latency constraint)
``mlperf_server``             2 s        200 ms     99    MLPerf llama2-70b Server (mlperf.conf)
``mlperf_interactive``        450 ms     40 ms      99    MLPerf llama2-70b-interactive (mlperf.conf)
``mlperf_405b_server``        6 s        175 ms     99    MLPerf llama3_1-405b Server (mlperf.conf)
``mlperf_405b_interactive``   4.5 s      80 ms      99    MLPerf llama3_1-405b-interactive (mlperf.conf)
============================  =========  =========  ====  =================================================

DistServe's chatbot limits grow with the model (OPT-175B: TTFT 4 s, TPOT 0.2 s); the preset takes the
OPT-13B row, the smallest model. MLPerf states the limits at the 99th percentile over a 600 s
Poisson run (Server/Interactive) with early stopping; here attainment is the share of a point's planned
requests meeting both limits, and ``percentiles_ok`` checks the stated percentile directly where the sample
supports it (p99 needs 100 independent samples, p90 10).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import pandas as pd

from workbench import checks
from workbench.errors import ParameterError
from workbench.stats import metrics


@dataclasses.dataclass(frozen=True)
class SLO:
    """Per-request limits: ``ttft_s`` and ``tpot_s`` (None: no limit), at ``percentile`` (the source's)."""

    name: str
    ttft_s: float | None
    tpot_s: float | None
    percentile: int = 99
    source: str = ""


_DISTSERVE = "DistServe (Zhong et al., OSDI 2024) Table 1, 90% attainment"
_MLPERF = "MLPerf Inference loadgen/mlperf.conf, p99"

PRESETS: dict[str, SLO] = {s.name: s for s in [
    SLO("interactive_chat", 0.25, 0.10, 90, f"{_DISTSERVE}: chatbot (OPT-13B, ShareGPT) TTFT 0.25 s, TPOT 0.1 s"),
    SLO("code_completion", 0.125, 0.20, 90, f"{_DISTSERVE}: code completion (OPT-66B, HumanEval) TTFT 0.125 s, "
        "TPOT 0.2 s"),
    SLO("rag", 15.0, 0.15, 90, f"{_DISTSERVE}: summarization (OPT-66B, LongBench) TTFT 15 s, TPOT 0.15 s "
        "(long prompt, short answer; the RAG label is the workbench's)"),
    SLO("batch_offline", None, None, 99, "MLPerf Inference rules, Offline scenario: no latency constraint, "
        "throughput only"),
    SLO("mlperf_server", 2.0, 0.20, 99, f"{_MLPERF}: llama2-70b Server TTFT 2000 ms, TPOT 200 ms"),
    SLO("mlperf_interactive", 0.45, 0.04, 99, f"{_MLPERF}: llama2-70b-interactive TTFT 450 ms, TPOT 40 ms"),
    SLO("mlperf_405b_server", 6.0, 0.175, 99, f"{_MLPERF}: llama3_1-405b Server TTFT 6000 ms, TPOT 175 ms"),
    SLO("mlperf_405b_interactive", 4.5, 0.08, 99, f"{_MLPERF}: llama3_1-405b-interactive TTFT 4500 ms, TPOT 80 ms"),
]}


def get(name: str, ttft_s: float | None = None, tpot_s: float | None = None) -> SLO:
    """A preset by name, or ``custom`` with the given limits (seconds, > 0; at least one).

    Raises:
        ParameterError: an unknown preset or a bad custom limit (one line).
    """
    if name == "custom":
        if ttft_s is None and tpot_s is None:
            raise ParameterError("slo: custom needs slo_ttft_s and/or slo_tpot_s")
        if ttft_s is not None:
            checks.check_float("slo_ttft_s", ttft_s, lo=0, lo_open=True)
        if tpot_s is not None:
            checks.check_float("slo_tpot_s", tpot_s, lo=0, lo_open=True)
        return SLO("custom", ttft_s, tpot_s, 99, "custom limits")
    checks.check_choice("slo", name, tuple(PRESETS) + ("custom",))
    return PRESETS[name]


def attainment(requests: pd.DataFrame, slo: SLO, planned: int | None = None, confidence: float = 0.95) -> dict:
    """SLO attainment over the requests planned for a window, with a binomial interval.

    Args:
        requests: the window's request rows (``output_tokens``, ``ttft_s``, ``tpot_s``, ``error``).
        slo: the limits (:func:`workbench.stats.metrics.meets_slo`; failed requests are misses).
        planned: requests planned for the window (default ``len(requests)``); requests without a row (never
            sent after an early stop, or still in flight when the run stopped waiting) count as misses. Must be
            at least the number of rows.
        confidence: the interval's coverage (0-1).

    Returns:
        ``slo_attainment`` (met / planned), ``slo_attainment_low`` / ``slo_attainment_high`` (the Wilson score
        interval, :meth:`scipy.stats.binomtest` ``proportion_ci(method="wilson")``; Wilson, J. Am. Stat. Assoc.
        1927), ``slo_attainment_lower`` / ``_upper`` (the one-sided 95% bounds, :func:`one_sided_bounds`),
        ``slo_met`` and ``slo_planned``. NaN figures when nothing was planned.

    Raises:
        ParameterError: ``planned`` below the number of rows, or ``confidence`` outside (0, 1].
    """
    from scipy.stats import binomtest

    checks.check_float("confidence", confidence, lo=0, hi=1, lo_open=True)
    n_rows = 0 if requests is None else len(requests)
    n = n_rows if planned is None else int(planned)
    if n < n_rows:
        raise ParameterError(f"planned: must be at least the {n_rows} request rows (got {n})")
    met = int(metrics.slo_met(requests, slo.ttft_s, slo.tpot_s).sum()) if n_rows else 0
    if n == 0:
        nan = float("nan")
        return {"slo_attainment": nan, "slo_attainment_low": nan, "slo_attainment_high": nan,
                "slo_attainment_lower": nan, "slo_attainment_upper": nan, "slo_met": 0, "slo_planned": 0}
    ci = binomtest(met, n).proportion_ci(confidence_level=confidence, method="wilson")
    lower, upper = one_sided_bounds(met, n)
    return {"slo_attainment": met / n, "slo_attainment_low": float(ci.low), "slo_attainment_high": float(ci.high),
            "slo_attainment_lower": lower, "slo_attainment_upper": upper, "slo_met": met, "slo_planned": n}


ONE_SIDED = 0.95  # a rate qualifies when attainment's one-sided 95% lower bound reaches the target


def one_sided_bounds(met: int, planned: int, confidence: float = ONE_SIDED) -> tuple[float, float]:
    """One-sided Wilson score bounds of an attainment ``met / planned``: the lower bound a qualifying rate must
    bring to its target, and the upper bound below which "the target was missed" is shown.

    Each is the matching end of the two-sided Wilson interval at ``2 * confidence - 1`` (the 90% interval's ends
    are the one-sided 95% bounds; Wilson 1927, :meth:`scipy.stats.binomtest` ``proportion_ci``). 36 of 40 at a
    0.90 target: lower bound 0.79, not qualified; 40 of 40: 0.94.

    Returns:
        ``(lower, upper)`` in [0, 1]; NaN both with nothing planned.

    Raises:
        ParameterError: ``met`` outside [0, ``planned``] or ``confidence`` outside (0.5, 1).
    """
    from scipy.stats import binomtest

    checks.check_float("confidence", confidence, lo=0.5, hi=1, lo_open=True)
    if confidence >= 1:
        raise ParameterError(f"confidence: must be in (0.5, 1) (got {confidence})")
    met, planned = int(met), int(planned)
    if planned <= 0:
        return float("nan"), float("nan")
    checks.check_int("met", met, lo=0, hi=planned)
    ci = binomtest(met, planned).proportion_ci(confidence_level=2 * confidence - 1, method="wilson")
    return float(ci.low), float(ci.high)


MET, MISSED, UNDETERMINED = "met", "missed", "undetermined"


def judged_at_percentile(s: SLO) -> bool:
    """Whether a preset is judged at its stated percentile (the MLPerf p99 presets: TTFT and TPOT at p99 within
    the limits) rather than by attainment against a target (DistServe's 90% presets, ``custom``,
    ``batch_offline`` without limits)."""
    return s.name != "custom" and s.percentile >= 99 and (s.ttft_s is not None or s.tpot_s is not None)


def verdict(point, name: str, target: float) -> tuple[str, str]:
    """Whether a load point met SLO ``name``: :data:`MET`, :data:`MISSED` or :data:`UNDETERMINED`, with why.

    Rules: a preset judged at its stated percentile (:func:`judged_at_percentile`) is met when
    ``percentiles_ok_<name>`` is True (its percentile of TTFT and TPOT within the limits, from enough independent
    samples: :func:`percentile_supported`), missed when False, undetermined when None (p99 needs 100 requests).
    Every other SLO is met when attainment's one-sided 95% lower bound reaches ``target``, missed when its
    upper bound is below ``target``, else undetermined (:func:`one_sided_bounds` from ``slo_attainment_<name>`` x
    ``requests_planned_window``, or the stored ``slo_attainment_lower_<name>`` / ``_upper_<name>``).

    Args:
        point: a points row (Series or dict) of :mod:`workbench.experiments.serving_load`.
        name: the SLO's name (a preset or ``custom``).
        target: the attainment target (0-1).

    Returns:
        ``(verdict, reason)``.
    """
    get = point.get
    s = PRESETS.get(name)
    if s is not None and judged_at_percentile(s):
        ok = get(f"percentiles_ok_{name}")
        if ok is None or ok != ok:
            return UNDETERMINED, f"p{s.percentile} needs {metrics.MIN_SAMPLES.get(f'p{s.percentile}', 100)} " \
                                 f"independent requests"
        return (MET, f"p{s.percentile} within the limits") if bool(ok) else \
            (MISSED, f"p{s.percentile} beyond a limit")
    lower, upper = get(f"slo_attainment_lower_{name}"), get(f"slo_attainment_upper_{name}")
    if lower is None or upper is None or lower != lower:
        att, planned = get(f"slo_attainment_{name}"), get("requests_planned_window", get("requests"))
        if att is None or planned is None or att != att or planned != planned or int(planned) <= 0:
            return UNDETERMINED, "no attainment"
        lower, upper = one_sided_bounds(int(round(float(att) * int(planned))), int(planned))
    if lower >= target:
        return MET, f"one-sided 95% lower bound {lower:.2f} >= {target:.2f}"
    if upper < target:
        return MISSED, f"one-sided 95% upper bound {upper:.2f} < {target:.2f}"
    return UNDETERMINED, f"one-sided 95% bounds {lower:.2f}-{upper:.2f} straddle {target:.2f}"


def percentile_supported(percentile: float, n_samples: int) -> bool:
    """Whether ``n_samples`` independent samples support a ``percentile`` (0-100): the rule of
    :data:`workbench.stats.metrics.MIN_SAMPLES` (p50 from 1, p90 from 10, p99 from 100; other percentiles
    ``ceil(100 / (100 - percentile))``, the samples for one to lie beyond it)."""
    need = metrics.MIN_SAMPLES.get(f"p{percentile:g}", math.ceil(100 / max(1e-9, 100 - percentile)))
    return n_samples >= need


def evaluate(requests: pd.DataFrame, slo: SLO, window_s: float, planned: int | None = None) -> dict:
    """One point's figures under ``slo``.

    Args:
        requests: the kept request rows; an ``in_window`` column (:func:`workbench.load.load.apply_window`)
            marks the completions counted by the measured window (all rows count without it).
        slo: the preset or custom limits.
        window_s: the measured window's length (seconds).
        planned: requests planned for the window (:func:`attainment`; default the number of rows).

    Returns:
        :func:`attainment`'s ``slo_attainment``, ``slo_attainment_low``, ``slo_attainment_high``,
        ``slo_attainment_lower``, ``slo_attainment_upper``;
        ``goodput_rps`` (counted completions meeting the SLO / ``window_s``; NaN without a window) and
        ``percentiles_ok``: TTFT and TPOT at ``slo.percentile`` within the limits (False when any request
        failed), or None when the completed requests' independent samples (:func:`workbench.stats.metrics.n_samples`)
        do not support that percentile (:func:`percentile_supported`).
    """
    att = attainment(requests, slo, planned)
    n_rows = 0 if requests is None else len(requests)
    if n_rows:
        counted = requests["in_window"].fillna(False).astype(bool) if "in_window" in requests else True
        good = int((metrics.slo_met(requests, slo.ttft_s, slo.tpot_s) & counted).sum())
    else:
        good = 0
    done = requests[requests["output_tokens"] >= 1] if n_rows else requests
    ok: bool | None = True
    if slo.ttft_s is not None or slo.tpot_s is not None:
        if not percentile_supported(slo.percentile, metrics.n_samples(done) if n_rows else 0):
            ok = None
        else:
            for col, limit in (("ttft_s", slo.ttft_s), ("tpot_s", slo.tpot_s)):
                if limit is None:
                    continue
                v = metrics.percentiles(done[col].tolist() if col in done else [],
                                        (slo.percentile,))[f"p{slo.percentile}"]
                ok = ok and v == v and v <= limit
            if (requests["output_tokens"] < 1).any() or (att["slo_planned"] > n_rows):
                ok = False  # a failed or missing request breaks any percentile limit
    return {"slo_attainment": att["slo_attainment"], "slo_attainment_low": att["slo_attainment_low"],
            "slo_attainment_high": att["slo_attainment_high"], "slo_attainment_lower": att["slo_attainment_lower"],
            "slo_attainment_upper": att["slo_attainment_upper"],
            "goodput_rps": good / window_s if window_s and window_s == window_s and window_s > 0 else float("nan"),
            "percentiles_ok": None if ok is None else bool(ok)}


def search_rate(attainment_at: Callable[[float], float], lo: float, hi: float, target: float = 0.99,
                tolerance: float = 0.05, max_steps: int = 8) -> dict:
    """The highest rate whose attainment stays >= ``target``, by bisection between ``lo`` and ``hi``.

    ``attainment_at(rate)`` measures one point (one measurement per step). The search keeps a bracket
    ``[good, bad]`` (``good`` met the target, ``bad`` did not) and halves it until ``bad - good <=
    tolerance * good`` (relative tolerance) or ``max_steps`` measurements. If ``hi`` meets the target the
    answer is ``hi`` (not bracketed); if ``lo`` misses it the answer is 0 (nothing meets it).

    Returns:
        ``{"rate": highest rate found meeting the target, "bracket": (good, bad), "steps": measurements,
        "bracketed": bool, "history": [(rate, attainment), ...], "tolerance": tolerance}``.
    """
    checks.check_float("lo", lo, lo=0, lo_open=True)
    checks.check_float("hi", hi, lo=lo, lo_open=True)
    checks.check_float("target", target, lo=0, hi=1, lo_open=True)
    checks.check_float("tolerance", tolerance, lo=0, lo_open=True)
    checks.check_int("max_steps", max_steps, lo=2)
    hist = []

    def meets(rate):
        a = attainment_at(rate)
        hist.append((rate, a))
        return a == a and a >= target

    if not meets(lo):
        return {"rate": 0.0, "bracket": (0.0, lo), "steps": 1, "bracketed": False, "history": hist,
                "tolerance": tolerance}
    if meets(hi):
        return {"rate": hi, "bracket": (hi, math.inf), "steps": 2, "bracketed": False, "history": hist,
                "tolerance": tolerance}
    good, bad = lo, hi
    while len(hist) < max_steps and bad - good > tolerance * good:
        mid = (good + bad) / 2
        if meets(mid):
            good = mid
        else:
            bad = mid
    return {"rate": good, "bracket": (good, bad), "steps": len(hist), "bracketed": True, "history": hist,
            "tolerance": tolerance}


def slo_verdict(rows: pd.DataFrame, limits: dict[str, float | None], percentile: int) -> tuple[bool | None, str]:
    """Whether every point of a configuration meets the SLO limits at the SLO's own percentile.

    A percentile counts only where the point's ``n_samples`` supports it (:data:`workbench.stats.metrics.MIN_SAMPLES`:
    no p99 from a handful of values). Where the stated percentile is not supported, a supported lower one
    (p50, p90) above the limit still proves a miss (the p99 is at least the p50); otherwise the verdict is
    unknown.

    Args:
        rows: the configuration's points (``{col}_p50/_p90/_p99`` and ``n_samples``).
        limits: ``{"ttft_s": limit or None, "tpot_s": limit or None}`` in seconds.
        percentile: the SLO's percentile (90 or 99).

    Returns:
        ``(True | False | None, note)``: None when the sample cannot decide; the note says why.
    """
    key = f"p{int(percentile)}"
    need = metrics.MIN_SAMPLES.get(key, 100)
    lower = [q for q in metrics.MIN_SAMPLES if int(q[1:]) < int(percentile)]
    verdict: bool | None = True
    notes = []
    for col, limit in limits.items():
        if limit is None:
            continue
        for _, r in rows.iterrows():
            n = r.get("n_samples", float("nan"))
            n = 0 if n is None or (isinstance(n, float) and math.isnan(n)) else int(n)
            v = r.get(f"{col}_{key}", float("nan"))
            if n >= need and v == v:
                if v > limit:
                    return False, f"{col} {key} {v:.3g} s > {limit:g} s"
                continue
            bounds = [(q, r.get(f"{col}_{q}")) for q in lower if n >= metrics.MIN_SAMPLES[q]]
            over = [(q, b) for q, b in bounds if b is not None and b == b and b > limit]
            if over:
                q, b = over[-1]
                return False, f"{col} {q} {b:.3g} s > {limit:g} s, so its {key} is too"
            verdict = None
            notes.append(f"{key} needs {need} samples, a point has {n}")
    if verdict is None:
        return None, f"not checked at {key} ({sorted(set(notes))[0]}); lower percentiles within the limits"
    return True, f"checked at {key}"
