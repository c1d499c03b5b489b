"""Dunnett's critical values and the decision of one comparison, for the block analysis
(:mod:`workbench.stats.blocks`, docs/design.md section 11).

Critical values: :func:`critical_value` (the max-|t| quantile of the contrasts' multivariate t at a correlation:
Dunnett's many-to-one value; exact for an equicorrelated one, :func:`equicorrelated_t_coverage`), :func:`balanced_corr` (a balanced design's correlation) and
:func:`planning_critical_value` (a fast Sidak-calibrated value for planning). A comparison's decision:
:class:`Decision` (an arm's ratio to the control with its simultaneous interval, one of :data:`VERDICTS` and the
rounds that would decide it), the three verdicts on a ratio (:func:`verdict`) or a difference
(:func:`additive_verdict`), :func:`rounds_needed` and an interval's level as text (:func:`level_text`).
Multiplicity for the per-comparison paired analyses (:mod:`workbench.stats.comparison`): :func:`holm` (Holm 1979),
:func:`holm_levels` (the intervals that agree with its decisions) and :func:`paired_log_ratio_pvalue`.
:mod:`workbench.stats.blocks` re-exports the names of the block analysis.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Iterable, Sequence

import numpy as np

from workbench.errors import ParameterError

ALPHA = 0.05               # family-wise error of one analysis (one look)
MARGIN = 1.05              # the default equivalence margin, as a ratio: equivalent inside [1/1.05, 1.05]
VERDICTS = ("direction", "equivalent", "undecided")
MAX_ROUNDS_NEEDED = 1000   # rounds_needed beyond this is reported as None ("more than 1000 rounds")


def level_text(level: float) -> str:
    """A confidence level as a percentage with the digits it needs: 0.95 -> ``"95%"``, 0.975 -> ``"97.5%"``,
    0.9967 -> ``"99.7%"``, 0.99996 -> ``"99.996%"``; a level below 1 never reads ``"100%"`` (a first look's
    O'Brien-Fleming level does: ``f"{level:.0%}"`` wrote "100% interval" and "98%" for 97.5%).

    Args:
        level: the interval's coverage, a fraction in (0, 1].

    Returns:
        The percentage text with its ``%`` sign.
    """
    pct = 100.0 * float(level)
    for digits in range(5):
        r = round(pct, digits)
        if abs(r - pct) < 1e-9 or (digits >= 1 and r < 100.0):
            return f"{r:.{digits}f}%"
    return f"{pct:.5f}%"


# ----------------------------------------------------------------------------- critical values


@functools.lru_cache(maxsize=512)
def _critical_cached(corr_key: tuple, m: int, dof: float, alpha: float) -> float:
    from scipy import optimize, stats

    if m == 1:
        return float(stats.t.ppf(1 - alpha / 2, dof))
    corr = np.asarray(corr_key, dtype=float).reshape(m, m)
    lo = float(stats.t.ppf(1 - alpha / 2, dof))                    # one comparison: the smallest possible
    hi = float(stats.t.ppf(1 - alpha / (2 * m), dof)) * 1.05 + 0.1  # Bonferroni (+ room): the largest
    off = corr[~np.eye(m, dtype=bool)]
    if np.ptp(off) < 1e-9 and 0 <= off[0] < 1:                     # equicorrelated (a balanced design): exact
        rho = float(off[0])
        return float(optimize.brentq(lambda c: equicorrelated_t_coverage(c, m, dof, rho) - (1 - alpha), lo * 0.999,
                                     hi, xtol=1e-6))
    dist = stats.multivariate_t(loc=np.zeros(m), shape=corr, df=dof, allow_singular=True)

    def coverage(c):  # P(max |T_i| <= c), a fixed seed: the same value every call
        return float(dist.cdf(c * np.ones(m), lower_limit=-c * np.ones(m), random_state=np.random.default_rng(0),
                              maxpts=10_000 * m))

    return float(optimize.brentq(lambda c: coverage(c) - (1 - alpha), lo * 0.999, hi, xtol=1e-3))


def critical_value(corr: np.ndarray, dof: float, alpha: float = ALPHA) -> float:
    """The two-sided max-|t| critical value of ``m`` contrasts: ``c`` with ``P(max_i |T_i| <= c) = 1 - alpha``
    where ``T`` is multivariate t with ``dof`` degrees of freedom and correlation ``corr`` (Dunnett 1955; Hothorn,
    Bretz and Westfall 2008), by Brent's root search; cached by (correlation, dof, alpha). An equicorrelated
    ``corr`` (every balanced many-to-one design: 0.5 off the diagonal) is solved on the exact coverage
    (:func:`equicorrelated_t_coverage`: to ~1e-6 in ``c``, ~0.1 s); any other on ``scipy.stats.multivariate_t``'s CDF
    (Genz's quasi-Monte Carlo with a fixed seed: ~1e-3 in ``c``, 0.5-3 s at 4-12 contrasts on a 2-core CPU).

    Args:
        corr: ``m x m`` correlation matrix of the contrasts' estimates (0.5 off the diagonal for many-to-one
            comparisons in a balanced design).
        dof: the residual degrees of freedom (finite).
        alpha: the family-wise error.

    Returns:
        The critical value (``t_{dof, 1 - alpha/2}`` for one contrast).

    Raises:
        ParameterError: ``alpha`` outside (0, 1) or ``dof`` below 1.
    """
    if not 0 < alpha < 1:
        raise ParameterError(f"alpha: must be in (0, 1) (got {alpha})")
    if not (dof >= 1 and math.isfinite(dof)):
        raise ParameterError(f"dof: must be >= 1 (got {dof})")
    corr = np.atleast_2d(np.asarray(corr, dtype=float))
    m = corr.shape[0]
    key = tuple(np.round(corr, 3).ravel().tolist())
    return _critical_cached(key, m, float(dof), float(round(alpha, 12)))


def balanced_corr(m: int) -> np.ndarray:
    """The correlation of ``m`` many-to-one contrasts in a balanced design: 1 on the diagonal, 0.5 elsewhere."""
    return np.full((m, m), 0.5) + np.eye(m) * 0.5


def equicorrelated_coverage(c: float, m: int, rho: float = 0.5) -> float:
    """``P(max_i |Z_i| <= c)`` for ``m`` standard normal variables with a common correlation ``rho >= 0``: the
    one-dimensional integral ``int phi(y) [Phi((c - sqrt(rho) y) / sqrt(1 - rho)) - Phi((-c - sqrt(rho) y) /
    sqrt(1 - rho))]^m dy`` (Dunnett and Sobel 1955; Tong 1990, ch. 5), by ``scipy.integrate.quad``: exact to
    ~1e-10 where Genz's quasi-Monte Carlo CDF is random at ~1e-5 and takes seconds at ``m`` = 12.

    Args:
        c: the bound (> 0); m: the number of variables (>= 1); rho: their correlation, in [0, 1).

    Returns:
        The probability.
    """
    from scipy import integrate

    def f(y):
        return math.exp(-y * y / 2) / math.sqrt(2 * math.pi) * _all_inside(c, y, m, rho)

    return float(integrate.quad(f, -np.inf, np.inf, epsabs=1e-12, epsrel=1e-10)[0])


def _all_inside(x, y, m: int, rho: float):
    """``P(max_i |Z_i| <= x | Y = y)`` for ``m`` equicorrelated standard normals ``Z_i = sqrt(rho) Y + sqrt(1 - rho)
    E_i``: ``[Phi((x - sqrt(rho) y) / sqrt(1 - rho)) - Phi((-x - sqrt(rho) y) / sqrt(1 - rho))]^m``, the integrand of
    :func:`equicorrelated_coverage` and :func:`equicorrelated_t_coverage` over ``y`` (scalars or arrays)."""
    from scipy import special

    a, b = math.sqrt(rho), math.sqrt(1 - rho)
    return (special.ndtr((x - a * y) / b) - special.ndtr((-x - a * y) / b)) ** m


#: Gauss-Hermite nodes and weights for the standard normal (``numpy.polynomial.hermite_e``, weight exp(-y^2/2)
#: over sqrt(2 pi)): the inner integral of :func:`equicorrelated_t_coverage`, exact for polynomials to degree 199.
_HERMITE = None


def equicorrelated_t_coverage(c: float, m: int, dof: float, rho: float = 0.5) -> float:
    """``P(max_i |T_i| <= c)`` for ``m`` t variables with ``dof`` degrees of freedom sharing one scale and a common
    correlation ``rho >= 0`` (a balanced many-to-one design's contrasts: Dunnett 1955): the scale
    ``S = sqrt(chi2_dof / dof)`` integrated out of :func:`equicorrelated_coverage` at ``c S``, ``int
    P(max_i |Z_i| <= c s) f_S(s) ds`` (Dunnett and Sobel 1955; Tong 1990, ch. 9). The inner integral by 100-node
    Gauss-Hermite quadrature (vectorized; within 1e-9 of :func:`equicorrelated_coverage`'s adaptive integral up to 20
    variables), the outer by ``scipy.integrate.quad`` between the scale's 1e-13 and 1 - 1e-13 quantiles:
    deterministic.

    Args:
        c: the bound (> 0); m: the number of variables (>= 1); dof: degrees of freedom (> 0, not necessarily an
            integer); rho: their correlation, in [0, 1).

    Returns:
        The probability.
    """
    global _HERMITE
    from scipy import integrate, special, stats

    if _HERMITE is None:
        y, w = np.polynomial.hermite_e.hermegauss(100)
        _HERMITE = (y, w / math.sqrt(2 * math.pi))
    y, w = _HERMITE
    half = dof / 2
    log_norm = math.log(2) + half * math.log(half) - special.gammaln(half)

    def integrand(s):
        inner = float(np.dot(w, _all_inside(c * s, y, m, rho)))
        return inner * math.exp(log_norm + (dof - 1) * math.log(s) - dof * s * s / 2)

    scale = stats.chi(dof, scale=1 / math.sqrt(dof))
    lo, hi = float(scale.ppf(1e-13)), float(scale.isf(1e-13))
    return float(integrate.quad(integrand, lo, hi, epsabs=1e-11, epsrel=1e-10, limit=200)[0])


@functools.lru_cache(maxsize=256)
def per_comparison_alpha(m: int, alpha: float) -> float:
    """The per-comparison error equivalent to Dunnett's over ``m`` balanced comparisons at infinite dof: the
    two-sided normal tail of the bound ``c`` with :func:`equicorrelated_coverage` ``(c, m, 0.5) = 1 - alpha``
    (Brent's method to 1e-8; cached by ``(m, alpha)``).

    Args:
        m: the comparisons (>= 1); alpha: the family-wise error, in (0, 1).

    Returns:
        The per-comparison two-sided error (``alpha`` itself for one comparison).
    """
    from scipy import optimize, special, stats

    if m == 1:
        return alpha
    c = optimize.brentq(lambda c: equicorrelated_coverage(c, m) - (1 - alpha),
                        float(stats.norm.ppf(1 - alpha / 2)) * 0.999, float(stats.norm.ppf(1 - alpha / (2 * m))) + 0.1,
                        xtol=1e-8)
    return float(2 * special.ndtr(-c))


def planning_critical_value(m: int, dof: float, alpha: float = ALPHA) -> float:
    """Dunnett's critical value over ``m`` balanced comparisons, approximated for planning: the t quantile at the
    per-comparison error Dunnett's value has at infinite dof (a Sidak-type scaling: conservative, 1-3% above
    :func:`critical_value` at 8 dof and less beyond, and a thousand times cheaper). Used by :func:`rounds_needed` only;
    decisions use :func:`critical_value`."""
    from scipy import stats

    return float(stats.t.ppf(1 - per_comparison_alpha(int(m), float(alpha)) / 2, dof))


# ----------------------------------------------------------------------------- decisions


@dataclasses.dataclass(frozen=True)
class Decision:
    """One arm against the control (or a pick against its runner-up).

    Attributes:
        arm, control: what is compared (the ratio is ``arm / control``).
        estimate, low, high: the ratio and its simultaneous interval (NaN bounds: none).
        level: the interval's simultaneous confidence (``1 - alpha`` of the look).
        verdict: ``direction`` / ``equivalent`` / ``undecided`` (:func:`verdict`).
        direction: ``higher`` / ``lower`` for a direction (of the ratio), else ``""``.
        margin: the equivalence margin (a ratio > 1).
        rounds: rounds behind the estimate; dof: the residual degrees of freedom.
        method: how the interval was computed, for the evidence.
        p_adjusted: the single-step adjusted p-value of "ratio = 1" (NaN where not computed).
        rounds_needed: for an undecided arm, the rounds that would decide it at the observed spread (None: more
            than :data:`MAX_ROUNDS_NEEDED`, or no spread to judge from); 0 for a decided one.
        reason: why the verdict is undecided when no interval could be formed.
    """

    arm: object
    control: object
    estimate: float
    low: float
    high: float
    level: float
    verdict: str
    direction: str
    margin: float
    rounds: int
    dof: float
    method: str
    p_adjusted: float = float("nan")
    rounds_needed: int | None = 0
    reason: str = ""

    @property
    def decided(self) -> bool:
        """True for ``direction`` or ``equivalent``."""
        return self.verdict in ("direction", "equivalent")

    @property
    def shown(self) -> bool:
        """True when the interval exists (finite bounds)."""
        return math.isfinite(self.low) and math.isfinite(self.high)

    def interval_text(self, invert: bool = False) -> str:
        """``"1.12x, 95% interval 1.04-1.21x"`` (``invert``: of ``control / arm``), ``"1.12x (no interval: ...)"``, or
        ``"no estimate (...)"`` when there is no ratio to show (never ``nanx``)."""
        est, lo, hi = (self.estimate, self.low, self.high) if not invert else (
            _inv(self.estimate), _inv(self.high), _inv(self.low))
        if not math.isfinite(est):
            return f"no estimate ({self.reason or 'too few rounds'})"
        if not self.shown:
            return f"{est:.2f}x (no interval: {self.reason or 'too few rounds'})"
        return f"{est:.2f}x, {level_text(self.level)} interval {lo:.2f}-{hi:.2f}x"

    def describe(self, name: str | None = None, invert: bool = False, words: tuple[str, str] = ("higher", "lower"),
                 seconds_per_round: float | None = None) -> str:
        """The verdict as a clause: ``"<name>: higher, 1.12x, 95% interval 1.04-1.21x (...)"``,
        ``"<name>: equivalent within +-5%: 1.01x, ..."`` or ``"<name>: undecided: ...; about 12 rounds (~340 s)
        would decide it"``. ``words``: the names of a ratio above / below 1 (``("slower", "faster")`` for a time);
        ``invert`` shows ``control / arm`` (a speed-up from times) and swaps the words."""
        name = str(self.arm) if name is None else name
        body = f"{self.interval_text(invert)} ({self.method})" if self.shown else self.interval_text(invert)
        if self.verdict == "direction":
            word = words[0] if self.direction == "higher" else words[1]
            return f"{name}: {word}, {body}"
        if self.verdict == "equivalent":
            return f"{name}: equivalent within +-{self.margin - 1:.0%}: {body}"
        return f"{name}: undecided: {body}; {self.needed_text(seconds_per_round)}"

    def needed_text(self, seconds_per_round: float | None = None) -> str:
        """``"about 12 rounds (~340 s) would decide it at the observed spread"`` or why no estimate exists."""
        if self.decided:
            return "decided"
        if self.rounds_needed == 0:   # a decided comparison's figure carried over (a secondary outcome's row): none
            return "no estimate of the rounds needed (the design planned its rounds for another outcome)"
        if self.rounds_needed is None:
            return (f"more than {MAX_ROUNDS_NEEDED} rounds would be needed at the observed spread"
                    if math.isfinite(self.estimate) and self.shown else "no estimate of the rounds needed (no spread yet)")
        secs = ""
        if seconds_per_round is not None and math.isfinite(seconds_per_round) and seconds_per_round > 0:
            secs = f" (~{max(self.rounds_needed - self.rounds, 0) * seconds_per_round:.0f} s more)"
        return f"about {self.rounds_needed} rounds{secs} would decide it at the observed spread"

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        out = dataclasses.asdict(self)
        out["arm"], out["control"] = str(self.arm), str(self.control)
        return out


def _inv(x: float) -> float:
    return 1.0 / x if x and math.isfinite(x) else float("nan")


def verdict(low: float, high: float, margin: float = MARGIN) -> tuple[str, str]:
    """The verdict an interval of a ratio carries, with its margin band ``[1/margin, margin]``.

    Returns:
        ``("equivalent", "")`` when ``1/margin <= low`` and ``high <= margin``; ``("direction", "higher")`` /
        ``("direction", "lower")`` when the interval excludes 1 (``low > 1`` / ``high < 1``) and is not inside the
        band; else ``("undecided", "")``. An interval of zero width or without finite bounds is undecided.
    """
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return "undecided", ""
    if low >= 1 / margin and high <= margin:
        return "equivalent", ""
    if low > 1:
        return "direction", "higher"
    if high < 1:
        return "direction", "lower"
    return "undecided", ""


def additive_verdict(low: float, high: float, margin: float = 0.0) -> tuple[str, str]:
    """The verdict an interval of a difference carries (a difference of shares or of means, where no ratio fits):
    :func:`verdict`'s rules on the additive scale, with the band ``[-margin, margin]``.

    Returns:
        ``("equivalent", "")`` when ``margin > 0`` and ``-margin <= low`` and ``high <= margin``;
        ``("direction", "higher")`` / ``("direction", "lower")`` when the interval excludes 0 (and is not inside the
        band); else ``("undecided", "")``. An interval of zero width or without finite bounds is undecided (no spread
        decides nothing).
    """
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return "undecided", ""
    if margin > 0 and low >= -margin and high <= margin:
        return "equivalent", ""
    if low > 0:
        return "direction", "higher"
    if high < 0:
        return "direction", "lower"
    return "undecided", ""


def rounds_needed(log_estimate: float, sigma: float, n_arms: int, m: int, margin: float = MARGIN,
                  alpha: float = ALPHA, pooled: bool = True, start: int = 2) -> int | None:
    """The rounds a balanced design needs to decide a comparison at the observed spread: the smallest ``R`` whose
    interval half-width ``c(R) * se(R)`` is below ``|d|`` (a direction) or below ``ln(margin) - |d|`` (equivalent),
    ``d`` the observed log ratio. Pooled: ``se = sigma * sqrt(2 / R)`` with ``(R - 1)(A - 1)`` dof and the
    Dunnett value over ``m`` arms; paired (fallback): ``se = sigma / sqrt(R)``, ``sigma`` the SD of the paired log
    ratios, ``R - 1`` dof, Bonferroni over ``m``.

    Returns:
        The rounds (>= ``start``), or None when ``sigma`` is not a positive finite number or more than
        :data:`MAX_ROUNDS_NEEDED` would be needed.
    """
    from scipy import stats

    if not (math.isfinite(sigma) and sigma > 0 and math.isfinite(log_estimate)):
        return None
    d = abs(log_estimate)
    target = max(d, math.log(margin) - d)
    if target <= 0:
        return None

    def half(r):
        if pooled:
            dof = (r - 1) * max(n_arms - 1, 1)
            return planning_critical_value(m, dof, alpha) * sigma * math.sqrt(2 / r)
        return float(stats.t.ppf(1 - alpha / (2 * m), r - 1)) * sigma / math.sqrt(r)

    r = max(int(start), 2)
    if half(r) < target:
        return r
    hi = r
    while hi <= MAX_ROUNDS_NEEDED and half(hi) >= target:   # doubling, then bisection: few critical values
        r, hi = hi, hi * 2
    if hi > MAX_ROUNDS_NEEDED:
        if half(MAX_ROUNDS_NEEDED) >= target:
            return None
        hi = MAX_ROUNDS_NEEDED
    while hi - r > 1:
        mid = (r + hi) // 2
        r, hi = (r, mid) if half(mid) < target else (mid, hi)
    return hi


@functools.lru_cache(maxsize=256)
def tukey_critical(alpha: float, arms: int, dof: float) -> float:
    """Tukey's two-sided critical value for one difference of two arm means on the log scale: the studentized
    range's ``1 - alpha`` quantile over ``arms`` arms and ``dof`` degrees of freedom, over sqrt(2) (Tukey 1953;
    ``scipy.stats.studentized_range``, an integral of ~0.1-0.3 s a call, so cached).

    Args:
        alpha: the family's error rate (0-1).
        arms: how many arms the pick could have been (>= 2).
        dof: the residual degrees of freedom of the pooled model (> 0).

    Returns:
        the critical value c: an estimate +- c standard errors is the simultaneous interval.
    """
    from scipy import stats

    return float(stats.studentized_range.ppf(1 - alpha, arms, dof)) / math.sqrt(2)


# ----------------------------------------------------------------------------- multiplicity


def paired_log_ratio_pvalue(numerator: Iterable[float], denominator: Iterable[float]) -> float:
    """Two-sided p-value of "the geometric-mean ratio is 1" from matched pairs: the one-sample t test on the
    pairs' log ratios (the test dual to :func:`workbench.stats.evidence.paired_ratio_interval`; what ``scipy.stats.ttest_1samp`` computes,
    without its per-call overhead).

    Returns:
        The p-value in [0, 1]; NaN from fewer than 2 finite pairs; 0 or 1 when the log ratios have no spread
        (all equal: 1 when they are 0, else 0).
    """
    from scipy import stats

    num = np.asarray(list(numerator), dtype=float)
    den = np.asarray(list(denominator), dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(num / den)
    logs = logs[np.isfinite(logs)]
    if logs.size < 2:
        return float("nan")
    if np.ptp(logs) == 0:
        return 1.0 if logs[0] == 0 else 0.0
    t = float(logs.mean() / (logs.std(ddof=1) / math.sqrt(logs.size)))
    return float(2 * stats.t.sf(abs(t), logs.size - 1))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979, "A simple sequentially rejective multiple test
    procedure"): sort ascending, ``p_(i) * (m - i + 1)``, running maximum, capped at 1. Rejecting where the
    adjusted value is below alpha holds the family-wise error at alpha over the ``m`` comparisons.

    Args:
        pvalues: one p-value per comparison; NaN ones are kept NaN and not counted in ``m``.

    Returns:
        Adjusted p-values in the input order.
    """
    p = np.asarray(list(pvalues), dtype=float)
    out = np.full(p.shape, np.nan)
    idx = [i for i in np.argsort(p, kind="stable") if np.isfinite(p[i])]
    m, running = len(idx), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, float(p[i]) * (m - rank)))
        out[i] = running
    return [float(x) for x in out]


def holm_levels(pvalues: Sequence[float], alpha: float = ALPHA) -> list[float]:
    """The confidence level of each comparison's interval so that it agrees with Holm's step-down decisions: the
    comparison ranked ``i`` (0-based, ascending p) at ``1 - alpha / (m - i)`` while every step before it rejected;
    once a step fails to reject, that step and every later one at the failing step's level ``1 - alpha / (m - j)``
    (Holm stops there: a later comparison, whose p is at least the failing one's, cannot reject, and an interval at
    its own step's wider level could exclude the null beside a verdict that refused it: p = [0.03, 0.04] put the
    second at 95%, excluding 1 at p = 0.04, after the first step failed at 0.025). An interval at the returned level
    then excludes the null exactly when Holm rejects. NaN p-values get the plain level ``1 - alpha``."""
    p = np.asarray(list(pvalues), dtype=float)
    out = [1 - alpha] * len(p)
    idx = [i for i in np.argsort(p, kind="stable") if np.isfinite(p[i])]
    m, stop = len(idx), None
    for rank, i in enumerate(idx):
        step = rank if stop is None else stop
        out[i] = 1 - alpha / (m - step)
        if stop is None and not p[i] < alpha / (m - rank):
            stop = rank
    return out
