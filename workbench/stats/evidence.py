"""What a finding may claim, in one place: usable points, fit support, intervals and their verdicts.

docs/design.md section 4: a finding names its evidence (samples or requests, the interval and its method, fit
quality and degrees of freedom) and says "not supported" where that evidence cannot carry a direction.
The rules, each a plain function every experiment calls:

- :func:`usable_points`: the points a fit, knee, recommendation or best-of choice may use: ``status`` ok
  and the validity verdict ``valid`` (and, for serving, open-loop points not stopped early).
- :func:`fit_support`: a fit needs at least two more distinct x values than parameters (``dof >= 2``
  beyond the parameters: with ``n == p`` the fit is exact, with ``n == p + 1`` one residual decides R^2).
- :func:`t_interval`: a Student-t interval of a mean over independent units (repeat medians, prompts).
  Exact under normality at any ``n >= 2`` and close to nominal for repeat medians, which are near-normal
  even when single latencies are skewed (central limit for order statistics; tests/stats/test_evidence.py
  simulates it). It replaces the percentile bootstrap over repeats, which with two repeats is the range of
  two medians and covers the true value about half the time.
- :func:`ratio_interval`: a speed-up ``a / b`` from two independent samples: Welch's t on the log values
  (Welch 1947; Satterthwaite degrees of freedom), back-transformed, i.e. the ratio of geometric means.
- :func:`mean_difference_interval`: a difference of two means by Welch's t; :func:`mean_interval`: Wilson
  for a share, else t.
- :func:`paired_ratio_interval`: a ratio from matched pairs (t over the log ratios).
- :func:`repeat_statistics`: a point's per-repeat log-latency mean and SD, the input of
  :func:`summary_ratio_interval` when two points' repeats are compared afterwards.
- :func:`wilson_interval`, :func:`difference_interval`: a share (accuracy, truncation) by Wilson's score
  interval (Wilson 1927) and the difference of two shares by Newcombe's hybrid score interval (Newcombe
  1998, method 10), both close to nominal at the small counts of a sweep point.
- :func:`ratio_verdict` / :func:`difference_verdict`: a direction only when the interval excludes 1 (a
  ratio) or 0 (a difference), else "no difference beyond noise".
- :class:`Finding`: text + evidence + supported flag + point ids, what ``results.save_finding`` records.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from workbench.stats import decisions

#: The largest move of a drift reference (or of a comparison's baseline between neighbouring rounds) a verdict
#: accepts, as a ratio - 1 (:mod:`workbench.run.drift`, :mod:`workbench.stats.comparison`).
DRIFT_LIMIT = 0.25

CONFIDENCE = 0.95
# the arrival profiles of a serving sweep that are closed-loop (a fixed number of requests in flight): their
# throughput is a burst, not an offered rate a recommendation can name
CLOSED_LOOP_PROFILES = ("synchronous", "concurrency", "throughput")


# ----------------------------------------------------------------------------- which points


def _true(v) -> bool:
    """A verdict cell that is set and true (None / NaN count as not set)."""
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and bool(v)


def none_valid(points: pd.DataFrame, run_dir=None) -> str:
    """What a finding says when none of its points is valid: ``"0 of N valid (the first invalid reason); measure
    them again with `workbench run --rerun-invalid RUN_DIR`"`` - the reason a drift or other load gave, and the way
    on (not a change of the experiment's settings: issue 49, a run told to relax its SLO after a 55% drift).

    Args:
        points: the experiment's points (all of them, valid or not).
        run_dir: the run folder, named in the command (None: ``RUN_DIR``).
    """
    reasons = points["invalid_reason"].dropna() if "invalid_reason" in points else pd.Series(dtype=object)
    reasons = reasons[reasons.astype(str).str.len() > 0]
    why = f" ({reasons.iloc[0]})" if len(reasons) else ""
    return f"0 of {len(points)} valid{why}; {rerun_invalid(run_dir)}"


def any_invalid(points: pd.DataFrame) -> bool:
    """Whether any of ``points`` was marked invalid (``valid`` False): the points ``--rerun-invalid`` re-measures (a
    point stopped early or failed is not one of them: re-measuring does not help it)."""
    return bool("valid" in points and points["valid"].eq(False).any())


def rerun_invalid(run_dir=None) -> str:
    """The way on from invalid points, one wording everywhere: ``"measure them again with `workbench run
    --rerun-invalid RUN_DIR`"`` (``run_dir`` named when known)."""
    return f"measure them again with `workbench run --rerun-invalid {run_dir or 'RUN_DIR'}`"


def usable_points(points: pd.DataFrame, *, serving: bool = False) -> pd.DataFrame:
    """The points a fit, knee, recommendation or best-of choice may use.

    Checks, each only where the column exists (older run folders lack some):
    ``status == "ok"``; ``valid`` is True (the run's verdict: enough samples, no contamination by other load,
    no drift; a point without a verdict, NaN, is not usable); with ``serving=True`` also ``profile`` not
    closed-loop (:data:`CLOSED_LOOP_PROFILES`) and ``stopped_early`` not True (an over-saturated point).

    Args:
        points: a ``points.parquet`` table (any experiment).
        serving: apply the serving rules as well.

    Returns:
        A copy of the usable rows, index kept (so callers can map back to the table).
    """
    keep = pd.Series(True, index=points.index)
    if "status" in points:
        keep &= points["status"].eq("ok")
    if "valid" in points:
        keep &= points["valid"].map(_true)
    if serving:
        if "profile" in points:
            keep &= ~points["profile"].isin(CLOSED_LOOP_PROFILES)
        if "stopped_early" in points:
            keep &= ~points["stopped_early"].map(_true)
    return points[keep].copy()


def point_ids(points: pd.DataFrame) -> tuple[str, ...]:
    """The ``point_id`` values of a table, as a tuple (empty when the column is absent)."""
    return tuple(str(p) for p in points["point_id"]) if "point_id" in points else ()


# ----------------------------------------------------------------------------- fits


def fit_support(n_distinct: int, n_params: int, what: str = "lengths") -> tuple[bool, str]:
    """Whether a fit of ``n_params`` parameters over ``n_distinct`` distinct x values can be a finding.

    Rule: ``n_distinct >= n_params + 2`` (at least two residual degrees of freedom in the shape).

    Returns:
        ``(True, "")`` or ``(False, "not supported: 4 lengths for 3 parameters")``.
    """
    if n_distinct >= n_params + 2:
        return True, ""
    word = what[:-1] if n_distinct == 1 and what.endswith("s") else what
    return False, f"not supported: {n_distinct} {word} for {n_params} parameters (needs {n_params + 2})"


# ----------------------------------------------------------------------------- intervals


@dataclasses.dataclass(frozen=True)
class Interval:
    """An estimate with its interval, or with the reason no interval is shown.

    Attributes:
        estimate: the point estimate (unit of the values; a ratio for :func:`ratio_interval`).
        low, high: the interval bounds, NaN when not shown.
        n: independent units behind it (for a ratio: ``"n_a+n_b"`` is in ``method``).
        method: how it was computed, for the finding's evidence.
        confidence: nominal coverage.
        reason: why there is no interval (empty when there is one).
    """

    estimate: float
    low: float
    high: float
    n: int
    method: str
    confidence: float = CONFIDENCE
    reason: str = ""

    @property
    def shown(self) -> bool:
        """True when the interval exists (finite bounds)."""
        return math.isfinite(self.low) and math.isfinite(self.high)

    def describe(self, fmt: str = "{:.3g}", suffix: str = "") -> str:
        """``"1.03x, 95% interval 0.94-1.12x (method)"``, ``"1.03x (no interval: reason)"`` or ``"no estimate (...)"``."""
        if not math.isfinite(self.estimate):   # never "nanx"
            return f"no estimate ({self.reason or 'too few samples'})"
        est = fmt.format(self.estimate) + suffix
        if not self.shown:
            return f"{est} (no interval: {self.reason or 'too few samples'})"
        sep = " to " if self.low < 0 or self.high < 0 or "+" in fmt else "-"
        return (f"{est}, {decisions.level_text(self.confidence)} interval {fmt.format(self.low)}{suffix}{sep}"
                f"{fmt.format(self.high)}{suffix} ({self.method})")


def _finite(values: Iterable) -> np.ndarray:
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    return arr[np.isfinite(arr)]


def t_interval(values: Iterable[float], confidence: float = CONFIDENCE, unit: str = "values") -> Interval:
    """Student-t interval of the mean of independent values: ``mean +- t_{n-1} * sd / sqrt(n)``.

    Args:
        values: independent units (one median per repeat, one score per prompt); NaN and None dropped.
        confidence: nominal coverage in (0, 1).
        unit: what a value is, for the method text (``"repeat medians"``).

    Returns:
        :class:`Interval`; fewer than 2 values: no interval, with the reason.
    """
    from scipy import stats

    arr = _finite(values)
    n = int(arr.size)
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0, "", confidence, "no samples")
    mean = float(arr.mean())
    if n < 2:
        return Interval(mean, float("nan"), float("nan"), n, "", confidence,
                        f"1 {unit.rstrip('s') if unit.endswith('s') else unit}, an interval needs at least 2")
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * arr.std(ddof=1) / math.sqrt(n))
    return Interval(mean, mean - half, mean + half, n, f"t over {n} {unit}, {n - 1} dof", confidence)


def estimate_interval(estimate: float, std_error: float, dof: float, method: str,
                      confidence: float = CONFIDENCE) -> Interval:
    """``estimate +- t_dof * std_error`` (e.g. a least-squares coefficient with its standard error); no
    interval when ``dof < 1`` (an exact fit has no residuals to estimate the error from)."""
    from scipy import stats

    if not dof >= 1 or not math.isfinite(std_error):
        return Interval(estimate, float("nan"), float("nan"), 0, method, confidence,
                        "no residual degrees of freedom")
    half = float(stats.t.ppf(0.5 + confidence / 2, dof)) * std_error
    return Interval(estimate, estimate - half, estimate + half, int(dof), method, confidence)


def summary_ratio_interval(base: list[tuple[float, float, int]], other: list[tuple[float, float, int]],
                     confidence: float = 0.95) -> tuple[float, float, float]:
    """Speed-up of ``other`` over ``base`` (``e2e_base / e2e_other``) with a confidence interval.

    Each argument holds one ``(log_e2e_s_mean, log_e2e_s_sd, n_repeats)`` per workload (same order). The
    log-ratio is the mean over workloads of the difference of log means; its interval is Welch's t
    (Welch-Satterthwaite degrees of freedom) on the log scale, exponentiated: the geometric-mean speed-up.
    Coverage holds at small repeat counts for log-normal latencies (a t interval, not a bootstrap over two
    values; tests simulate it at 2 and 3 repeats). Engine tuning's speed-up (``speedup_interval`` there).

    Returns:
        ``(speedup, low, high)``; low and high NaN when a workload has fewer than 2 repeats on either side.
    """
    from scipy import stats

    if not base or len(base) != len(other):
        return float("nan"), float("nan"), float("nan")
    w = len(base)
    d = sum(b[0] - o[0] for b, o in zip(base, other)) / w
    ratio = math.exp(d)
    if any(n < 2 or not math.isfinite(sd) for _, sd, n in [*base, *other]):
        return ratio, float("nan"), float("nan")
    parts = [sd * sd / n for _, sd, n in [*base, *other]]
    var = sum(parts) / (w * w)
    if var <= 0:
        return ratio, ratio, ratio
    df = sum(parts) ** 2 / sum(p * p / (n - 1) for p, (_, _, n) in zip(parts, [*base, *other]))
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(var)
    return ratio, math.exp(d - half), math.exp(d + half)


def ratio_interval(numerator: Iterable[float], denominator: Iterable[float], confidence: float = CONFIDENCE,
                   unit: str = "repeats") -> Interval:
    """Interval of ``a / b`` from two independent samples of positive values (e.g. repeat medians of two
    configurations): Welch's t on ``log a - log b``, back-transformed (the ratio of geometric means).

    Args:
        numerator, denominator: positive values; non-finite and non-positive ones dropped.
        confidence: nominal coverage.
        unit: what a value is, for the method text.

    Returns:
        :class:`Interval` of the ratio; no interval (with the reason) when a side has fewer than 2 values.
    """
    from scipy import stats

    a, b = _finite(numerator), _finite(denominator)
    a, b = np.log(a[a > 0]), np.log(b[b > 0])
    if a.size == 0 or b.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0, "", confidence, "no samples on one side")
    est = float(math.exp(a.mean() - b.mean()))
    if a.size < 2 or b.size < 2:
        return Interval(est, float("nan"), float("nan"), int(a.size + b.size), "", confidence,
                        f"{a.size}+{b.size} {unit}; a ratio interval needs at least 2 on each side")
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    method = f"Welch t on log values, {a.size}+{b.size} {unit}"
    if se == 0:
        return Interval(est, est, est, int(a.size + b.size), method + ", no spread", confidence)
    dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, dof)) * se
    d = a.mean() - b.mean()
    return Interval(est, float(math.exp(d - half)), float(math.exp(d + half)), int(a.size + b.size),
                    f"{method}, {dof:.1f} dof", confidence)


def mean_difference_interval(a: Iterable[float], b: Iterable[float], confidence: float = CONFIDENCE,
                             unit: str = "values") -> Interval:
    """Interval of ``mean(a) - mean(b)`` from two independent samples: Welch's t (Satterthwaite dof).

    Returns:
        :class:`Interval` of the difference; no interval when a side has fewer than 2 values.
    """
    from scipy import stats

    a, b = _finite(a), _finite(b)
    if a.size == 0 or b.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0, "", confidence, "no samples on one side")
    d = float(a.mean() - b.mean())
    if a.size < 2 or b.size < 2:
        return Interval(d, float("nan"), float("nan"), int(a.size + b.size), "", confidence,
                        f"{a.size}+{b.size} {unit}; an interval needs at least 2 on each side")
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    method = f"Welch t, {a.size}+{b.size} {unit}"
    if va + vb == 0:
        return Interval(d, d, d, int(a.size + b.size), method + ", no spread", confidence)
    dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, dof)) * math.sqrt(va + vb)
    return Interval(d, d - half, d + half, int(a.size + b.size), f"{method}, {dof:.1f} dof", confidence)


def mean_interval(values: Iterable[float], confidence: float = CONFIDENCE, unit: str = "values") -> Interval:
    """Interval of a mean: Wilson's for a share (every value 0 or 1), else :func:`t_interval`."""
    arr = _finite(values)
    if arr.size and np.isin(arr, (0.0, 1.0)).all():
        return wilson_interval(int(arr.sum()), int(arr.size), confidence)
    return t_interval(arr, confidence, unit)


def paired_ratio_interval(numerator: Iterable[float], denominator: Iterable[float],
                          confidence: float = CONFIDENCE, unit: str = "pairs") -> Interval:
    """Interval of a ratio from matched pairs (the same repeat, language or prompt measured both ways): a
    t-interval over the pairs' log ratios, back-transformed (the geometric mean ratio).

    Returns:
        :class:`Interval` of the ratio; no interval from fewer than 2 pairs.
    """
    num = np.asarray(list(numerator), dtype=float)
    den = np.asarray(list(denominator), dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(num / den)
    iv = t_interval(logs[np.isfinite(logs)], confidence, unit)
    return Interval(float(math.exp(iv.estimate)) if math.isfinite(iv.estimate) else float("nan"),
                    float(math.exp(iv.low)) if iv.shown else float("nan"),
                    float(math.exp(iv.high)) if iv.shown else float("nan"), iv.n,
                    f"t over the log ratios of {iv.n} {unit}, {iv.n - 1} dof" if iv.shown else "", confidence,
                    iv.reason)


def wilson_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """Wilson score interval of a share ``successes / n`` (Wilson 1927; ``scipy.stats.binomtest``).

    Returns:
        :class:`Interval` of the share in [0, 1]; ``n == 0``: no interval.
    """
    from scipy import stats

    if n <= 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0, "", confidence, "no samples")
    ci = stats.binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return Interval(successes / n, float(ci.low), float(ci.high), int(n), f"Wilson over {n}", confidence)


def difference_interval(k1: int, n1: int, k2: int, n2: int, confidence: float = CONFIDENCE) -> Interval:
    """Interval of the difference of two shares ``k1/n1 - k2/n2`` (Newcombe 1998, hybrid score, method 10).

    Returns:
        :class:`Interval` of the difference in [-1, 1]; a side with ``n == 0``: no interval.
    """
    w1, w2 = wilson_interval(k1, n1, confidence), wilson_interval(k2, n2, confidence)
    if not (w1.shown and w2.shown):
        return Interval(float("nan"), float("nan"), float("nan"), 0, "", confidence, "no samples on one side")
    d = w1.estimate - w2.estimate
    lo = d - math.sqrt((w1.estimate - w1.low) ** 2 + (w2.high - w2.estimate) ** 2)
    hi = d + math.sqrt((w1.high - w1.estimate) ** 2 + (w2.estimate - w2.low) ** 2)
    return Interval(d, lo, hi, n1 + n2, f"Newcombe score interval, {n1}+{n2}", confidence)


def _verdict(iv: Interval, null: float) -> str:
    if not iv.shown:
        return "not supported"
    if iv.low > null:
        return "higher"
    if iv.high < null:
        return "lower"
    return "no difference beyond noise"


def ratio_verdict(iv: Interval) -> str:
    """``"higher"`` / ``"lower"`` when the ratio's interval excludes 1, else ``"no difference beyond noise"``
    (or ``"not supported"`` when there is no interval)."""
    return _verdict(iv, 1.0)


def difference_verdict(iv: Interval) -> str:
    """``"higher"`` / ``"lower"`` when the difference's interval excludes 0, else ``"no difference beyond
    noise"`` (or ``"not supported"`` when there is no interval)."""
    return _verdict(iv, 0.0)


def effect_word(verdict: str, higher_is_better: bool) -> str:
    """``"helps"`` / ``"hurts"`` for a verdict of :func:`ratio_verdict` on a metric's direction, else the verdict."""
    if verdict == "higher":
        return "helps" if higher_is_better else "hurts"
    if verdict == "lower":
        return "hurts" if higher_is_better else "helps"
    return verdict


def describe_ratio(iv: Interval, name: str) -> str:
    """``"<name>: 1.59x, 95% interval 1.40-1.80x (Welch ...)"`` or ``"<name>: no difference beyond noise: 1.03x,
    95% interval 0.94-1.12x (...)"``; ``"not supported"`` with the reason when there is no interval."""
    verdict = ratio_verdict(iv)
    body = iv.describe("{:.2f}", "x")
    if verdict == "no difference beyond noise":
        return f"{name}: no difference beyond noise: {body}"
    if verdict == "not supported":
        return f"{name}: not supported: {body}"
    return f"{name}: {body}"


# ----------------------------------------------------------------------------- findings


VERDICTS = ("direction", "equivalent", "undecided")   # docs/design.md section 11; "" : a measurement, not a decision


@dataclasses.dataclass(frozen=True)
class Finding:
    """An experiment's headline: the sentence, the evidence behind it, and the decision it carries.

    Attributes:
        text: the sentence the report leads with.
        evidence: samples or requests, intervals and their method, fit quality and dof.
        supported: whether the evidence carries the text. With a ``verdict`` it is derived: True exactly for
            ``direction`` and ``equivalent``; and forced False when the headline (first claim) says "not supported"
            (:func:`headline_supported`).
        point_ids: the points it rests on (the report links them to the point table).
        verdict: the primary comparison's verdict (docs/design.md section 11): ``direction``, ``equivalent`` or
            ``undecided``; ``""`` for a finding that decides nothing (a measurement, or an old manifest's).
        margin: the equivalence margin (a ratio, e.g. 1.05), None without a comparison.
        rounds: rounds the comparison used; seconds: the measuring's clock time.
        rounds_needed, seconds_needed: for an undecided verdict, the rounds (and seconds more) that would decide it
            at the observed spread (None: no estimate).
    """

    text: str
    evidence: str = ""
    supported: bool = True
    point_ids: tuple[str, ...] = ()
    verdict: str = ""
    margin: float | None = None
    rounds: int = 0
    seconds: float | None = None
    rounds_needed: int | None = None
    seconds_needed: float | None = None

    def __post_init__(self):
        if self.verdict and self.verdict not in VERDICTS:
            raise ValueError(f"verdict: one of {', '.join(VERDICTS)} or '' (got {self.verdict!r})")
        if self.verdict:
            object.__setattr__(self, "supported", self.verdict in ("direction", "equivalent"))
        # the mark agrees with the headline: a first claim that says "not supported" or "no difference beyond
        # noise" is never marked supported, whatever a later part of the text carries (issue 32)
        if self.supported and not headline_supported(self.text):
            object.__setattr__(self, "supported", False)

    @property
    def decided(self) -> bool:
        """True for a ``direction`` or ``equivalent`` verdict."""
        return self.verdict in ("direction", "equivalent")

    def __str__(self) -> str:
        return f"{self.text} Evidence: {self.evidence}" if self.evidence else self.text

    def to_dict(self) -> dict:
        """JSON-ready dict (what ``manifest.json`` stores; NaN figures as None)."""
        num = (lambda v: float(v) if v is not None and isinstance(v, (int, float)) and math.isfinite(v) else None)
        out = {"text": self.text, "evidence": self.evidence, "supported": bool(self.supported),
               "point_ids": list(self.point_ids)}
        if self.verdict:
            out.update(verdict=self.verdict, margin=num(self.margin), rounds=int(self.rounds),
                       seconds=num(self.seconds))
            if self.verdict == "undecided":
                out.update(rounds_needed=int(self.rounds_needed) if self.rounds_needed is not None else None,
                           seconds_needed=num(self.seconds_needed))
        return out

    @classmethod
    def from_value(cls, value) -> "Finding":
        """A :class:`Finding` from what a manifest holds: a dict of :meth:`to_dict`, or a plain string (old
        manifests: its support unknown, recorded as supported with no evidence)."""
        if isinstance(value, Finding):
            return value
        if isinstance(value, dict):
            fl = (lambda v: float(v) if v is not None else None)
            need = value.get("rounds_needed")
            return cls(str(value.get("text", "")), str(value.get("evidence", "") or ""),
                       bool(value.get("supported", True)), tuple(str(p) for p in value.get("point_ids", ()) or ()),
                       str(value.get("verdict") or ""), fl(value.get("margin")), int(value.get("rounds") or 0),
                       fl(value.get("seconds")), int(need) if need is not None else None,
                       fl(value.get("seconds_needed")))
        return cls(str(value))


def nothing_valid(what: str, points: pd.DataFrame | None = None, run_dir=None) -> Finding:
    """The finding of an experiment left with nothing to decide from: ``"No valid <what>."``, and when it has points
    but none is usable (:func:`usable_points`), why and the way on (:func:`none_valid`): ``"No valid <what>: 0 of 5
    valid (reference TPOT drifted 55% ...); measure them again with `workbench run --rerun-invalid RUN`."``.
    Undecided, not supported.

    Args:
        what: what was not there, e.g. ``"reasoning point finished"``.
        points: the experiment's points (valid or not), or None.
        run_dir: the run folder named in the command (None: ``RUN_DIR``).
    """
    if points is not None and len(points) and usable_points(points).empty:
        return Finding(f"No valid {what}: {none_valid(points, run_dir)}.", f"0 valid points of {len(points)}", False,
                       verdict="undecided")
    return Finding(f"No valid {what}.", "", False, verdict="undecided")


def verdict_counts(findings) -> dict:
    """``{"decided", "direction", "equivalent", "undecided", "measurements"}`` over findings (dicts of
    :meth:`Finding.to_dict` or :class:`Finding` s): what the report's summary and ``metrics.json`` count."""
    out = {"decided": 0, "direction": 0, "equivalent": 0, "undecided": 0, "measurements": 0}
    for v in findings:
        f = Finding.from_value(v)
        if f.verdict:
            out[f.verdict] += 1
            out["decided"] += f.decided
        else:
            out["measurements"] += 1
    return out


def verdict_summary(counts: dict) -> str:
    """``"9 decided: 6 directions, 3 equivalent; 3 undecided"`` (and the measurements, when any)."""
    d = counts.get("direction", 0)
    text = (f"{counts.get('decided', 0)} decided: {d} direction{'s' if d != 1 else ''}, "
            f"{counts.get('equivalent', 0)} equivalent; {counts.get('undecided', 0)} undecided")
    m = counts.get("measurements", 0)
    return text + (f" ({m} measurement{'s' if m != 1 else ''} without a comparison)" if m else "")


NOT_SUPPORTED_PHRASES = ("not supported", "no difference beyond noise")


def headline(text: str) -> str:
    """A finding's headline claim: its text up to the first sentence end (``". "``) or clause end (``"; "``),
    whichever comes first (the decimal point of ``0.96x`` ends neither). Findings lead with their main claim
    and add caveats and secondary claims after it."""
    text = text.strip()
    ends = [i for i in (text.find(". "), text.find("; ")) if i >= 0]
    return text if not ends else text[: min(ends) + 1]


def headline_supported(text: str) -> bool:
    """False when a finding's headline (:func:`headline`) says its claim is not supported or finds no
    difference beyond noise (:data:`NOT_SUPPORTED_PHRASES`): such a finding must not be marked supported."""
    head = headline(text).lower()
    return not any(p in head for p in NOT_SUPPORTED_PHRASES)


def join(findings: Sequence[Finding], sep: str = " ") -> Finding:
    """One finding from several (e.g. a main claim and a secondary one): texts and evidence joined; the first
    part's decision (verdict, margin, rounds, ...) is the finding's (the later parts ride along, marked in their own
    words), and its first claim must not say otherwise (:class:`Finding` checks that)."""
    findings = [f for f in findings if f is not None]
    if not findings:
        return Finding("Nothing measured.", "", False)
    first = findings[0]
    return dataclasses.replace(first, text=sep.join(f.text for f in findings),
                               evidence="; ".join(f.evidence for f in findings if f.evidence),
                               point_ids=tuple(dict.fromkeys(p for f in findings for p in f.point_ids)))


def repeat_statistics(requests: list[dict]) -> dict:
    """Per-repeat spread of a point's request latency, the input of :func:`summary_ratio_interval`: the repeats are
    the independent units (rows of one batch share one clock).

    Returns:
        ``n_repeats``; ``log_e2e_s_mean`` and ``log_e2e_s_sd`` (mean and sample standard deviation over repeats
        of ``ln`` of the repeat's mean ``e2e_s``; the SD is NaN with one repeat).
    """
    req = pd.DataFrame(requests)
    if req.empty or "repeat" not in req:
        return {"n_repeats": 0, "log_e2e_s_mean": float("nan"), "log_e2e_s_sd": float("nan")}
    per = req[req["output_tokens"] >= 1].groupby("repeat")["e2e_s"].mean()
    logs = [math.log(v) for v in per if v > 0]
    n = len(logs)
    mean = sum(logs) / n if n else float("nan")
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1)) if n > 1 else float("nan")
    return {"n_repeats": n, "log_e2e_s_mean": mean, "log_e2e_s_sd": sd}
