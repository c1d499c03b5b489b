"""The prefill fits of the context-length experiment (:mod:`workbench.experiments.context_length`, notebook
``02_context_length``): :class:`QuadraticFit` (``a + b*L + c*L^2``), the plain least-squares fit
(:func:`fit_quadratic`, :func:`fits_table`), the fit with the rounds as blocks (:func:`fit_rounds`) and its decision
on the quadratic term at the longest measured length (:func:`curvature_decision`). The method and why: the
experiment's docstring."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from workbench.errors import ParameterError
from workbench.stats import blocks, evidence


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
        levels: the rounds' levels the values were divided by before the fit (:func:`fit_rounds`: rounds - 1
            estimated levels, each a residual dof spent; 0 for a plain fit).
        method: how it was fitted, the intervals' source: ``"OLS"`` (:func:`fit_quadratic`) or ``"relative-error
            fit"`` (:func:`fit_rounds`: a Gamma GLM with the identity link).
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
    levels: int = 0
    method: str = "OLS"

    @property
    def dof(self) -> int:
        """Residual degrees of freedom: observations minus parameters (and minus the rounds' levels estimated)."""
        return self.n - (self.degree + 1) - self.levels

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


def fits_table(fits: dict, quantity: str = "prefill_s"):
    """``pandas.DataFrame``: one row per batch size with a, b, c, r2, n, degree, n_lengths, b_low, b_high, c_low,
    c_high, l_min, l_max (tokens), dof, supported, crossover_tokens."""
    import pandas as pd

    return pd.DataFrame([{"quantity": quantity, "batch_size": bs, **f.to_dict()} for bs, f in sorted(fits.items())])


# ----------------------------------------------------------------------------- the fit with the rounds as blocks


def _round_levels(values: np.ndarray) -> np.ndarray:
    """Each round's level: the geometric mean of its values over the geometric mean of every round's (rounds with a
    value at every length only)."""
    logs = np.log(values)
    return np.exp(logs.mean(axis=1) - logs.mean())


def _design_matrix(values: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """``(X, z, dof)``: the rounds' values over their round's level (:func:`_round_levels`), stacked, with the
    ``[1, L, L^2]`` design matrix and the residual dof ``R*K - 3 - (R - 1)``."""
    r, k = values.shape
    z = (values / _round_levels(values)[:, None]).ravel()
    x = np.tile(lengths, r)
    X = np.column_stack([np.ones_like(x), x, x ** 2])
    return X, z, r * k - 3 - (r - 1)


def _complete(values, lengths) -> tuple[np.ndarray, np.ndarray]:
    """The rounds with a positive finite value at every length, lengths ascending."""
    values = np.asarray(values, dtype=float)
    lengths = np.asarray(lengths, dtype=float)
    order = np.argsort(lengths)
    values, lengths = values[:, order], lengths[order]
    keep = np.isfinite(values).all(axis=1) & (values > 0).all(axis=1)
    return values[keep], lengths


def fit_rounds(values, lengths) -> QuadraticFit:
    """``a + b*L + c*L^2`` over interleaved rounds, the rounds as blocks (the experiment's docstring says why).

    Args:
        values: rounds x lengths of one batch size's prefill seconds (one value per round and length: the rows' median
            of one batch); rounds missing a length are left out.
        lengths: the lengths (tokens), one per column.

    Returns:
        :class:`QuadraticFit` in the average round's seconds (``n``: the values fitted, ``n_lengths`` the distinct
        lengths; intervals of ``b`` and ``c`` from the fit's covariance, t over ``R*K - 3 - (R - 1)`` dof).

    Raises:
        ParameterError: fewer than 3 distinct lengths or no complete round.
    """
    values, lengths = _complete(values, lengths)
    if len(np.unique(lengths)) < 3:
        raise ParameterError(f"context_tokens: the quadratic fit needs at least 3 distinct lengths "
                             f"(got {len(np.unique(lengths))})")
    if values.shape[0] < 1:
        raise ParameterError("measurements: no round measured every length")
    X, z, dof = _design_matrix(values, lengths)
    coef, cov = _relative_fit(X, z, dof)
    f = X @ coef
    ss_res, ss_tot = float(((z - f) ** 2).sum()), float(((z - z.mean()) ** 2).sum())
    b_low = b_high = c_low = c_high = float("nan")
    if dof > 0:
        b_iv = evidence.estimate_interval(float(coef[1]), math.sqrt(max(cov[1, 1], 0.0)), dof, "relative-error fit")
        c_iv = evidence.estimate_interval(float(coef[2]), math.sqrt(max(cov[2, 2], 0.0)), dof, "relative-error fit")
        b_low, b_high, c_low, c_high = b_iv.low, b_iv.high, c_iv.low, c_iv.high
    return QuadraticFit(float(coef[0]), float(coef[1]), float(coef[2]),
                        1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"), int(z.size), 2, int(lengths.size),
                        b_low, b_high, c_low, c_high, float(lengths.min()), float(lengths.max()),
                        int(values.shape[0]) - 1, "relative-error fit")


def _relative_fit(X: np.ndarray, z: np.ndarray, dof: int) -> tuple[np.ndarray, np.ndarray]:
    """``(coef, cov)`` of ``z ~ X @ coef`` with errors proportional to the mean (a constant coefficient of variation:
    a prefill of 7 s varies by seconds where one of 0.4 s varies by tens of ms), fitted as a Gamma GLM with the
    identity link (iteratively reweighted least squares, weights ``1 / fitted^2``: McCullagh and Nelder 1989, ch. 8;
    statsmodels' ``GLM``), ``cov`` scaled by the Pearson chi^2 over ``dof`` (the round levels' dof taken too).
    Ordinary least squares when the GLM cannot fit (a fitted value at or below 0) or nothing is left for the noise."""
    scale = np.array([1.0, 1e3, 1e6])[: X.shape[1]]         # lengths in thousands of tokens: a conditioned system
    Xs = X / scale
    ols, *_ = np.linalg.lstsq(Xs, z, rcond=None)
    coef = ols
    if dof > 0:
        import warnings

        import statsmodels.api as sm

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fam = sm.families.Gamma(sm.families.links.Identity())
                res = sm.GLM(z, Xs, family=fam).fit(start_params=ols, maxiter=100)
            if res.converged and (Xs @ res.params > 0).all():
                mu = Xs @ res.params
                s2 = float((((z - mu) / mu) ** 2).sum()) / dof
                cov = s2 * np.linalg.pinv((Xs.T / mu ** 2) @ Xs)
                return res.params / scale, cov / np.outer(scale, scale)
        except (ValueError, np.linalg.LinAlgError, FloatingPointError):
            pass
    s2 = float(((z - Xs @ coef) ** 2).sum()) / dof if dof > 0 else float("nan")
    return coef / scale, s2 * np.linalg.pinv(Xs.T @ Xs) / np.outer(scale, scale)


def curvature_decision(values, lengths, alpha: float = blocks.ALPHA, margin: float = blocks.MARGIN,
                       name: str = "") -> blocks.Decision:
    """The quadratic term's weight at the longest measured length, decided (the experiment's docstring says why).

    The ratio ``q / l`` of the fit's prediction at ``L_max`` (:func:`fit_rounds`) over its straight part ``a + b
    L_max``; its interval ``exp(log(q / l) +- t * se)``, ``se`` from the fit's covariance by the delta method, t over
    the residual dof at ``1 - alpha / 2``; the verdict from :func:`workbench.stats.blocks.verdict` with ``margin``.

    Args:
        values, lengths: as :func:`fit_rounds`.
        alpha: the look's alpha (:func:`workbench.stats.sequential.look_alpha` under the design's looks).
        margin: the equivalence margin (a ratio > 1).
        name: the decision's ``arm`` (e.g. ``"batch 1"``).

    Returns:
        :class:`workbench.stats.blocks.Decision` of ``q / l`` (``control`` "the straight part"); undecided with the
        reason when the lengths cannot carry the fit (fewer than 5 distinct: 3 parameters + 2) or nothing is left
        to estimate the noise from.
    """
    nan = float("nan")
    values, lengths = _complete(values, lengths)
    r = int(values.shape[0])
    ok, why = evidence.fit_support(len(np.unique(lengths)), 3)

    def undecided(reason, est=nan):
        return blocks.Decision(name, "the straight part", est, nan, nan, 1 - alpha, "undecided", "", margin, r, nan,
                               "", nan, None, reason)

    if not ok:
        return undecided(why)
    if r < 1:
        return undecided("no round measured every length")
    X, z, dof = _design_matrix(values, lengths)
    coef, cov = _relative_fit(X, z, dof)
    lm = float(lengths.max())
    q, lin = coef[0] + coef[1] * lm + coef[2] * lm ** 2, coef[0] + coef[1] * lm
    if not (q > 0 and lin > 0):
        return undecided("the fitted prefill at the longest length is not positive")
    est = q / lin
    grad = np.array([1 / q - 1 / lin, lm / q - lm / lin, lm ** 2 / q])
    se = math.sqrt(max(float(grad @ cov @ grad), 0.0))
    if not se > 0:
        return undecided("no spread: an interval of zero width decides nothing", est)
    g = math.log(est)
    iv = evidence.estimate_interval(g, se, dof, "delta method", confidence=1 - alpha)
    lo, hi = math.exp(iv.low), math.exp(iv.high)
    v, direction = blocks.verdict(lo, hi, margin)
    method = (f"quadratic fit over {r} round{'s' if r != 1 else ''} x {lengths.size} lengths"
              f"{', rounds as blocks' if r > 1 else ''}, relative errors, {dof} dof, delta method")
    need = 0 if v != "undecided" else blocks.rounds_needed(g, se * math.sqrt(r), lengths.size, 1, margin, alpha,
                                                           pooled=False, start=r + 1)
    return blocks.Decision(name, "the straight part", est, lo, hi, 1 - alpha, v, direction, margin, r, float(dof),
                           method, nan, need)
