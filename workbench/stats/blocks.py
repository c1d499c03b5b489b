"""The analysis of a comparison as the design it is: rounds as blocks, one residual variance pooled over the arms,
many-to-one intervals that agree with their decisions, and three verdicts (docs/design.md section 11).

A comparison measures every arm once per round (interleaved, order shuffled; :mod:`workbench.run.design`), the
control arm a second time as the A/A arm. That is a randomised complete block design (Montgomery, *Design and
Analysis of Experiments*, ch. 4): on the log scale, ``y[r, a] = mu + round[r] + arm[a] + e``, with one error
variance for every arm. Its analysis:

- :func:`analyse`: the block model fitted by least squares (closed form for a complete table, ``statsmodels``
  OLS with round and arm dummies for an incomplete one; a test pins the closed form to OLS). Each arm's ratio to
  the control is ``exp`` of its arm effect's contrast; its standard error comes from the pooled residual
  variance with ``(R - 1)(A - 1)`` degrees of freedom (R rounds, A arms, the A/A arm included), where a
  per-comparison paired t has only ``R - 1``.
- Many-to-one: the intervals are simultaneous over the compared arms at the family's level, Dunnett's method
  (Dunnett 1955; the max-|t| critical value of the contrasts' multivariate t, :func:`critical_value`, pinned in
  a test to ``scipy.stats.dunnett``). A single-step procedure: an arm's decision is read off its own interval,
  so an interval excluding 1 and a direction always agree.
- Spreads: before pooling, Bartlett's test over the arms' deviations from the other arms' median in each round
  (:func:`spread_check`, from 3 rounds and 4 arms on); when it rejects at 5% the spreads are not compatible and each arm is analysed on its own paired log
  ratios to the control (t with ``R - 1`` dof) at a Bonferroni level over the compared arms, said in the
  evidence (:attr:`Analysis.method`).
- Three verdicts (:func:`verdict`): **equivalent** when the whole interval lies inside the margin band
  ``[1/margin, margin]`` (two one-sided tests, each at ``alpha / 2``, simultaneous over the arms: a test pins it
  to ``statsmodels.stats.weightstats.ttost_paired``); a **direction** when it excludes 1 and is not inside the
  band; **undecided** otherwise, with :func:`rounds_needed`, the rounds at which the observed spread would
  decide it. An interval of zero width (no spread) decides nothing: undecided.
- :func:`pick_versus`: a best-of pick against its runner-up, at Tukey's all-pairs level (the pick is chosen
  after looking; ``scipy.stats.studentized_range``). :func:`best_of`: the best-of rule every finding that picks
  uses: the pick against the control and the runner-up; the control as the pick only when every other arm is worse
  beyond noise or equivalent (:func:`keep_control`, the rule's one home, which the findings that rank by their own
  order and the design runner's stop rule call too).
- :func:`paired_binary`: a binary outcome of the same tasks under two arms (accuracy at two budgets): McNemar's
  exact test (``statsmodels.stats.contingency_tables.mcnemar``) with the exact conditional (Clopper-Pearson on the
  discordant tasks) interval of the difference.

Sequential looks (adding rounds until decided) pass each look's alpha from :mod:`workbench.stats.sequential`.

Parts: the critical values, :class:`Decision` and the verdicts are :mod:`workbench.stats.decisions`'s,
:func:`paired_binary` is :mod:`workbench.stats.paired`'s; both re-exported here (``blocks.<name>``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
import pandas as pd

from workbench.errors import ParameterError
from workbench.stats.decisions import (
    ALPHA,
    MARGIN,
    MAX_ROUNDS_NEEDED,
    VERDICTS,
    Decision,
    additive_verdict,
    balanced_corr,
    critical_value,
    equicorrelated_coverage,
    equicorrelated_t_coverage,
    per_comparison_alpha,
    planning_critical_value,
    rounds_needed,
    tukey_critical,
    verdict,
)
from workbench.stats.paired import paired_binary

AA = "A/A"                 # the A/A arm: the control measured a second time, interleaved like any arm
SPREAD_CHECK_MIN_ROUNDS = 3
ZERO_SPREAD = 1e-9        # a log-scale SD below this is rounding, not spread: an interval of zero width
SPREAD_CHECK_ALPHA = 0.01   # a strict pre-test: at 5% its choice of analysis lifted an A/A design's false-direction rate from 4.9% to 5.4%


# ----------------------------------------------------------------------------- the block model


@dataclasses.dataclass(frozen=True)
class Analysis:
    """A comparison analysed as one block design.

    Attributes:
        control: the control arm; aa: the A/A arm's name (None without one).
        arms: ``{arm: Decision}`` for every compared arm, the A/A arm included (it is analysed like any arm).
        method: ``"pooled block model"`` or the fallback's name with the reason.
        pooled: True when one residual variance was pooled over the arms.
        sigma: the residual SD on the log scale (pooled), or the largest paired SD (fallback); NaN: none.
        dof: residual degrees of freedom of the pooled model (NaN in the fallback).
        rounds: rounds (blocks) with the control measured.
        alpha: the family-wise error this look used; margin: the equivalence margin.
        spread_p: :func:`spread_check`'s p-value (NaN: not checked).
        table: rounds x arms of the (geometric-mean) values analysed.
    """

    control: object
    aa: object
    arms: dict
    method: str
    pooled: bool
    sigma: float
    dof: float
    rounds: int
    alpha: float
    margin: float
    spread_p: float
    table: pd.DataFrame

    @property
    def aa_decision(self) -> Decision | None:
        """The A/A arm's decision (None without one)."""
        return self.arms.get(self.aa) if self.aa is not None else None

    @property
    def aa_moved(self) -> bool:
        """True when the A/A arm shows a direction: the design cannot tell an effect from drift."""
        d = self.aa_decision
        return d is not None and d.verdict == "direction"

    def compared(self) -> dict:
        """The compared arms without the A/A arm."""
        return {k: v for k, v in self.arms.items() if k != self.aa}

    def decided(self, arms: Sequence | None = None) -> bool:
        """True when every one of ``arms`` (default: every compared arm but the A/A one) is decided."""
        keys = list(self.compared()) if arms is None else list(arms)
        return bool(keys) and all(self.arms[k].decided for k in keys if k in self.arms)

    def counts(self) -> dict:
        """``{"direction": n, "equivalent": n, "undecided": n}`` over the compared arms (A/A left out)."""
        out = {v: 0 for v in VERDICTS}
        for d in self.compared().values():
            out[d.verdict] += 1
        return out

    def evidence(self) -> str:
        """The method as a clause for a finding's evidence: rounds, the model (or the fallback and why), the
        multiplicity method, the family level and the margin."""
        what = (f"block model on the log scale, rounds as blocks, one residual variance pooled over "
                f"{self.table.shape[1]} arms ({self.method})" if self.pooled else self.method)
        return (f"{self.rounds} interleaved rounds; {what}; family level {1 - self.alpha:.3g}; "
                f"equivalence margin +-{self.margin - 1:.0%}")


def wide_table(measurements: pd.DataFrame, arm: str = "arm", unit: str = "round", value: str = "value") -> pd.DataFrame:
    """Rounds x arms of the geometric mean of each arm's positive values in a round (NaN where not measured).

    Args:
        measurements: long table, one row per measurement, with ``arm``, ``unit`` and a positive ``value``.

    Raises:
        ParameterError: a missing column.
    """
    for col in (arm, unit, value):
        if col not in measurements:
            raise ParameterError(f"measurements: needs a {col!r} column (has {', '.join(map(str, measurements))})")
    v = pd.to_numeric(measurements[value], errors="coerce").astype(float)
    ok = measurements[np.isfinite(v) & (v > 0)]
    if ok.empty:
        return pd.DataFrame()
    logs = np.log(pd.to_numeric(ok[value]).astype(float))
    return np.exp(logs.groupby([ok[unit], ok[arm]]).mean().unstack(arm))


def fit_block_model(y: np.ndarray) -> dict:
    """The block model ``y[r, a] = round[r] + arm[a] + e`` on a rounds x arms array of log values, the control in
    column 0 (NaN cells allowed).

    A complete array is fitted in closed form (the two-way additive model's residuals ``y - row mean - column mean
    + grand mean``, ``(R - 1)(A - 1)`` dof); an incomplete one by ``statsmodels`` OLS with round and arm dummies,
    treatment coding against column 0 (a test pins the closed form to OLS).

    Returns:
        ``{"coef": log ratios of columns 1.. to column 0 (array), "cov": their covariance (array), "sigma2": the
        residual variance, "dof": its dof, "resid": residuals (array, NaN where not measured)}``.

    Raises:
        ParameterError: no residual degree of freedom.
    """
    y = np.asarray(y, dtype=float)
    r, a = y.shape
    m = a - 1
    if np.isfinite(y).all():
        resid = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
        dof = (r - 1) * (a - 1)
        if dof < 1:
            raise ParameterError("measurements: no residual degree of freedom (two rounds and two arms at least)")
        s2 = float((resid ** 2).sum() / dof)
        coef = y[:, 1:].mean(axis=0) - y[:, 0].mean()
        cov = (np.ones((m, m)) + np.eye(m)) * s2 / r
        return {"coef": coef, "cov": cov, "sigma2": s2, "dof": float(dof), "resid": resid}
    import statsmodels.api as sm

    rows, cols = np.nonzero(np.isfinite(y))
    X = np.zeros((rows.size, a + r - 1))
    X[:, 0] = 1.0
    X[np.arange(rows.size), cols] = np.where(cols > 0, 1.0, 0.0)     # arm dummies 1..m (the control: none)
    X[:, 0] = 1.0
    for i in range(1, r):
        X[rows == i, a + i - 1] = 1.0
    fit = sm.OLS(y[rows, cols], X).fit()
    if fit.df_resid < 1:
        raise ParameterError("measurements: no residual degree of freedom (every arm needs rounds shared with the control)")
    resid = np.full(y.shape, np.nan)
    resid[rows, cols] = fit.resid
    cov = np.asarray(fit.cov_params())[1:a, 1:a]
    return {"coef": np.asarray(fit.params)[1:a], "cov": cov, "sigma2": float(fit.scale), "dof": float(fit.df_resid),
            "resid": resid}


def spread_check(y: np.ndarray) -> float:
    """Whether every arm's error shares one variance: Bartlett's test (``scipy.stats.bartlett``) over each arm's
    deviations from the median of the other arms in the same round (the round's drift cancels; the median keeps a
    wild arm's noise out of the other arms' deviations, where a test on the model's residuals sees little: an arm's
    own noise spreads into every residual of its rounds). Simulated here: with 4 arms and 8 rounds it flags one arm
    of 5x the others' SD in ~85% of tables and identical arms in ~1% (at :data:`SPREAD_CHECK_ALPHA`); with 3 arms the
    median of two is their mean and the check has no power: those tables are pooled.

    Args:
        y: rounds x arms log values (complete rows only are used).

    Returns:
        Bartlett's p-value; NaN when it cannot be run (fewer than :data:`SPREAD_CHECK_MIN_ROUNDS` complete rounds,
        fewer than 4 arms, or no spread).
    """
    from scipy import stats

    y = np.asarray(y, dtype=float)
    y = y[np.isfinite(y).all(axis=1)]
    r, a = y.shape
    if r < SPREAD_CHECK_MIN_ROUNDS or a < 4:
        return float("nan")
    groups = [y[:, j] - np.median(np.delete(y, j, axis=1), axis=1) for j in range(a)]
    if not all(np.ptp(g) > ZERO_SPREAD for g in groups):
        return float("nan")
    # scipy's own bartlett without its nan/axis argument wrapper (functools' __wrapped__; the groups are finite 1-D
    # arrays already): the same result in ~half the time, and every decision runs this check
    bartlett = getattr(stats.bartlett, "__wrapped__", stats.bartlett)
    return float(bartlett(*groups).pvalue)


def decide(y: np.ndarray, alpha: float = ALPHA, margin: float = MARGIN, check_spreads: bool = True,
           contrasts: Sequence[tuple[int, int]] | None = None) -> dict:
    """The decisions of a rounds x arms array of log values: the core of :func:`analyse` (which names the arms and
    rounds), on arrays so that a simulation can run it thousands of times.

    Args:
        y: rounds x arms log values (NaN: not measured).
        alpha: the family-wise error over the contrasts (simultaneous intervals at ``1 - alpha``).
        margin: the equivalence margin (a ratio > 1).
        check_spreads: Bartlett's check before pooling (:func:`spread_check`).
        contrasts: ``[(arm column, control column), ...]``: the ratios judged (default: every column against
            column 0, Dunnett's many-to-one family; with several controls the same max-|t| method over the
            contrasts' own correlation).

    Returns:
        ``{"estimate", "low", "high": arrays, per contrast, of the ratio and its simultaneous interval,
        "verdict", "direction": lists, "pooled": bool, "sigma", "dof", "spread_p", "method",
        "n": rounds each contrast's two arms share, "critical": the critical value (NaN in the fallback)}``.
        Fewer than 2 rounds, or no spread: every contrast undecided, NaN bounds.
    """
    from scipy import stats

    y = np.asarray(y, dtype=float)
    n_arms = y.shape[1]
    contrasts = [(int(i), int(j)) for i, j in (contrasts if contrasts is not None else
                                               [(k, 0) for k in range(1, n_arms)])]
    y = y[np.isfinite(y).sum(axis=1) >= 2]                       # a round with one arm pairs nothing
    r = y.shape[0]
    K = len(contrasts)
    nan = float("nan")
    fin = np.isfinite(y)
    n = np.array([int((fin[:, i] & fin[:, j]).sum()) for i, j in contrasts], dtype=int)
    est = np.full(K, nan)
    for k, (i, j) in enumerate(contrasts):
        both = fin[:, i] & fin[:, j]
        if both.any():
            est[k] = math.exp(float((y[both, i] - y[both, j]).mean()))
    out = {"estimate": est, "low": np.full(K, nan), "high": np.full(K, nan), "verdict": ["undecided"] * K,
           "direction": [""] * K, "pooled": False, "sigma": nan, "dof": nan, "spread_p": nan, "n": n,
           "critical": nan, "method": "one round pairs nothing: no spread to judge from"}
    if K == 0 or r < 2:
        return out
    present = fin.any(axis=0)
    if not present.all() or not (n > 0).all():                    # contrasts with an arm never measured: left out
        keep_k = [k for k, (i, j) in enumerate(contrasts) if present[i] and present[j] and n[k] > 0]
        cols = np.flatnonzero(present)
        remap = {int(c): q for q, c in enumerate(cols)}
        sub = decide(y[:, cols], alpha, margin, check_spreads, [(remap[contrasts[k][0]], remap[contrasts[k][1]])
                                                                for k in keep_k]) if keep_k else None
        if sub is None:
            return out
        for q, k in enumerate(keep_k):
            for key in ("estimate", "low", "high"):
                out[key][k] = sub[key][q]
            for key in ("verdict", "direction"):
                out[key][k] = sub[key][q]
        out.update({key: sub[key] for key in ("pooled", "sigma", "dof", "spread_p", "critical", "method")})
        return out
    try:
        fit = fit_block_model(y)
    except ParameterError as exc:
        out["method"] = str(exc).split(": ", 1)[-1]
        return out
    spread_p = spread_check(y) if check_spreads else nan
    out.update(spread_p=spread_p)
    if math.isfinite(spread_p) and spread_p < SPREAD_CHECK_ALPHA:   # spreads not compatible: each pair on its own
        out["method"] = (f"paired t per comparison, Bonferroni over {K} (spreads not compatible: Bartlett "
                         f"p = {spread_p:.2g}, so no pooled variance)")
        sds = []
        for k, (i, j) in enumerate(contrasts):
            both = fin[:, i] & fin[:, j]
            logs = y[both, i] - y[both, j]
            if logs.size < 2 or not np.ptp(logs) > ZERO_SPREAD:
                continue
            sd = float(logs.std(ddof=1))
            sds.append(sd)
            half = float(stats.t.ppf(1 - alpha / (2 * K), logs.size - 1)) * sd / math.sqrt(logs.size)
            d = float(logs.mean())
            out["low"][k], out["high"][k] = math.exp(d - half), math.exp(d + half)
            out["verdict"][k], out["direction"][k] = verdict(out["low"][k], out["high"][k], margin)
        out["sigma"] = max(sds) if sds else nan
        return out
    s2, dof = fit["sigma2"], fit["dof"]
    many = "Dunnett" if all(j == contrasts[0][1] for _, j in contrasts) else "max-|t|"
    out.update(pooled=True, dof=dof, sigma=math.sqrt(s2) if s2 >= 0 else nan,
               method=f"pooled block model, {dof:g} dof" + (f", {many} over {K}" if K > 1 else ""))
    b = np.r_[0.0, fit["coef"]]
    V = np.zeros((n_arms, n_arms))
    V[1:, 1:] = fit["cov"]
    C = np.zeros((K, n_arms))
    for k, (i, j) in enumerate(contrasts):
        C[k, i] += 1.0
        C[k, j] -= 1.0
    d = C @ b
    cov = C @ V @ C.T
    se = np.sqrt(np.clip(np.diag(cov), 0, None))
    if not (s2 > ZERO_SPREAD ** 2) or not (se > ZERO_SPREAD).all():
        out["method"] += " (no spread: an interval of zero width decides nothing)"
        out["sigma"] = nan          # no spread to plan rounds from either (rounds_needed: None, not "about 2")
        return out
    c = critical_value(cov / np.outer(se, se), dof, alpha)
    out["critical"] = c
    out["estimate"] = np.exp(d)
    out["low"], out["high"] = np.exp(d - c * se), np.exp(d + c * se)
    for k in range(K):
        out["verdict"][k], out["direction"][k] = verdict(out["low"][k], out["high"][k], margin)
    return out


def _adjusted_p(t_abs: float, corr: np.ndarray, dof: float) -> float:
    """Single-step adjusted p of ``|T_i| = t_abs``: ``P(max |T| >= t_abs)`` (m = 1: the plain two-sided p)."""
    from scipy import stats

    m = corr.shape[0]
    if not math.isfinite(t_abs):
        return 0.0 if t_abs > 0 else float("nan")
    if m == 1:
        return float(2 * stats.t.sf(t_abs, dof))
    dist = stats.multivariate_t(loc=np.zeros(m), shape=corr, df=dof, allow_singular=True)
    cov = float(dist.cdf(t_abs * np.ones(m), lower_limit=-t_abs * np.ones(m), random_state=np.random.default_rng(0),
                         maxpts=10_000 * m))
    return float(min(1.0, max(0.0, 1 - cov)))


def analyse(measurements: pd.DataFrame, control, aa=AA, *, groups: dict | None = None, arm: str = "arm",
            unit: str = "round", value: str = "value", margin: float = MARGIN, alpha: float = ALPHA,
            nominal_alpha: float | None = None, check_spreads: bool = True) -> Analysis:
    """Analyse interleaved rounds as one block design: every arm (the A/A arm too) against its control.

    Args:
        measurements: long table, one row per measurement: ``arm``, ``unit`` (the round) and a positive ``value``
            (seconds, tokens/s: the ratio is of this value). Several rows of an arm in one round are combined by
            their geometric mean.
        control: the control arm (ratios are ``arm / control``); with ``groups``, the first group's control.
        aa: the A/A arm's name (None: no A/A arm); it is compared with ``control``.
        groups: ``{control: [arms]}`` where arms have controls of their own (one per prompt family, batch size,
            language): each arm against its group's control, all in one fit and one family of simultaneous
            intervals. None: every arm against ``control``.
        margin: the equivalence margin as a ratio (> 1).
        alpha: the family-wise error of this look (:func:`workbench.stats.sequential.look_alpha` under repeated
            looks); the intervals are simultaneous at ``1 - alpha``.
        nominal_alpha: the error :func:`rounds_needed` plans a fixed design at (default ``alpha``).
        check_spreads: run the spread check before pooling (False: always pool).

    Returns:
        :class:`Analysis` (:func:`decide` on the rounds x arms table). With one round (no residual) every arm is
        undecided with the reason.

    Raises:
        ParameterError: a missing column, a margin not above 1, an alpha outside (0, 1), or a control that was
            not measured.
    """
    if not (isinstance(margin, (int, float)) and not isinstance(margin, bool) and margin > 1
            and math.isfinite(margin)):
        raise ParameterError(f"margin: must be a ratio > 1, e.g. 1.05 for +-5% (got {margin!r})")
    if not 0 < alpha < 1:
        raise ParameterError(f"alpha: must be in (0, 1) (got {alpha})")
    nominal = alpha if nominal_alpha is None else nominal_alpha
    table = wide_table(measurements, arm, unit, value)
    if table.empty or control not in table.columns:
        raise ParameterError(f"control: {control!r} was not measured "
                             f"(arms: {', '.join(map(str, pd.unique(measurements[arm]))) or 'none'})")
    groups = dict(groups) if groups else {control: [c for c in table.columns if c != control]}
    for g in groups:
        if g not in table.columns:
            raise ParameterError(f"groups: control {g!r} was not measured")
    ctrl_of = {a: g for g, members in groups.items() for a in members if a != g}
    if aa is not None and aa in table.columns:
        ctrl_of[aa] = control
    others = [c for c in table.columns if c in ctrl_of]
    cols = list(dict.fromkeys([control, *groups, *others]))
    table = table[[c for c in cols if c in table.columns]]
    table = table[table.notna().sum(axis=1) >= 2]
    index = {c: q for q, c in enumerate(table.columns)}
    contrasts = [(index[a], index[ctrl_of[a]]) for a in others]
    got = decide(np.log(table.to_numpy(dtype=float)), alpha, margin, check_spreads, contrasts)
    m = len(others)
    arms = {}
    for k, a in enumerate(others):
        v = got["verdict"][k]
        shown = math.isfinite(got["low"][k])
        need = 0
        if v == "undecided":
            need = rounds_needed(math.log(got["estimate"][k]) if got["estimate"][k] > 0 else float("nan"),
                                 got["sigma"], table.shape[1], m, margin, nominal, got["pooled"], int(got["n"][k]) + 1)
        method = got["method"] if got["pooled"] or not shown else (
            f"paired t over {int(got['n'][k])} rounds, {int(got['n'][k]) - 1} dof, Bonferroni over {m}")
        reason = "" if shown else got["method"]
        arms[a] = Decision(a, ctrl_of[a], float(got["estimate"][k]), float(got["low"][k]), float(got["high"][k]),
                           1 - alpha, v, got["direction"][k], margin, int(got["n"][k]), got["dof"], method,
                           float("nan"), need, reason)
    return Analysis(control, aa if aa in table.columns else None, arms, got["method"], got["pooled"], got["sigma"],
                    got["dof"], int(table[control].notna().sum()), alpha, margin, got["spread_p"], table)


def pick_versus(analysis: Analysis, pick, runner_up, *, candidates: int | None = None) -> Decision:
    """A best-of pick against its runner-up, from the same fit: the ratio ``pick / runner_up`` with an interval at
    Tukey's all-pairs level over ``candidates`` arms (the pick was chosen after looking at the data, so every pair
    could have been the one compared; ``scipy.stats.studentized_range``). In the fallback (no pooled variance) the
    pair's own paired t at a Bonferroni level over all pairs.

    Args:
        analysis: :func:`analyse`'s result.
        pick, runner_up: two arms of it (either may be the control).
        candidates: arms the pick was chosen from (default: every arm but the A/A one).

    Returns:
        :class:`Decision` of ``pick`` against ``runner_up`` (``control`` = the runner-up).

    Raises:
        ParameterError: an arm that is not in the analysis.
    """
    from scipy import stats

    t = analysis.table
    for a in (pick, runner_up):
        if a not in t.columns:
            raise ParameterError(f"arm: {a!r} is not in the comparison (arms: {', '.join(map(str, t.columns))})")
    k = candidates or max(2, t.shape[1] - (1 if analysis.aa in t.columns else 0))
    alpha, margin = analysis.alpha, analysis.margin
    both = t[[pick, runner_up]].dropna()
    n = int(len(both))
    logs = np.log((both[pick] / both[runner_up]).to_numpy(dtype=float))
    d = float(logs.mean()) if n else float("nan")
    nan = float("nan")
    if analysis.pooled and analysis.sigma > 0 and n >= 2:
        cols = [analysis.control] + [c for c in t.columns if c != analysis.control]
        fit = fit_block_model(np.log(t[cols].to_numpy(dtype=float)))
        coef = np.r_[0.0, fit["coef"]]
        cov = np.zeros((len(cols), len(cols)))
        cov[1:, 1:] = fit["cov"]
        i, j = cols.index(pick), cols.index(runner_up)
        d = float(coef[i] - coef[j])
        se = math.sqrt(max(cov[i, i] + cov[j, j] - 2 * cov[i, j], 0.0))
        c = tukey_critical(alpha, k, analysis.dof)
        method = f"pooled block model, Tukey over {k} arms"
        dof = analysis.dof
    elif n >= 2 and np.ptp(logs) > ZERO_SPREAD:
        pairs = k * (k - 1) / 2
        se = float(np.std(logs, ddof=1) / math.sqrt(n))
        c = float(stats.t.ppf(1 - alpha / (2 * pairs), n - 1))
        method = f"paired t over {n} rounds, Bonferroni over {pairs:g} pairs"
        dof = float(n - 1)
    else:
        return Decision(pick, runner_up, math.exp(d) if n else nan, nan, nan, 1 - alpha, "undecided", "", margin, n,
                        nan, "", nan, None, "fewer than 2 rounds or no spread")
    if not se > 0:
        return Decision(pick, runner_up, math.exp(d), nan, nan, 1 - alpha, "undecided", "", margin, n, dof, method,
                        nan, None, "no spread: an interval of zero width decides nothing")
    lo, hi = math.exp(d - c * se), math.exp(d + c * se)
    v, direction = verdict(lo, hi, margin)
    need = 0
    if v == "undecided":
        sigma = se * math.sqrt(n / 2) if analysis.pooled else se * math.sqrt(n)
        need = rounds_needed(d, sigma, t.shape[1], k, margin, alpha, analysis.pooled, n + 1)
    return Decision(pick, runner_up, math.exp(d), lo, hi, 1 - alpha, v, direction, margin, n, dof, method, nan, need)


@dataclasses.dataclass(frozen=True)
class Pick:
    """A best-of choice among a design's arms and the decisions behind it (:func:`best_of`).

    Attributes:
        pick: the chosen arm (the control itself when no candidate's estimate beats it).
        control: the control (the baseline).
        runner_up: the next best candidate (None with a single candidate).
        versus_control: the pick's :class:`Decision` against the control (None when the pick is the control).
        versus_runner_up: the pick against the runner-up (:func:`pick_versus`, Tukey's level; None without one, and
            when the runner-up is the control: that comparison is ``versus_control``).
        verdict, direction: the choice's verdict. A pick other than the control: its comparison with the control,
            undecided while its comparison with the runner-up is (neither better beyond noise nor equivalent). The
            control as the pick ("keep the baseline"): ``direction`` when every other candidate is worse beyond noise
            or equivalent (some worse), ``equivalent`` when every other is equivalent, else ``undecided``.
        rounds_needed: an undecided choice's rounds (the most any open comparison needs; None: no estimate).
        open: the candidates that keep a control pick undecided (neither worse beyond noise nor equivalent).
    """

    pick: object
    control: object
    runner_up: object
    versus_control: Decision | None
    versus_runner_up: Decision | None
    verdict: str
    direction: str
    rounds_needed: int | None
    open: tuple = ()

    @property
    def decided(self) -> bool:
        """True for a ``direction`` or ``equivalent`` verdict."""
        return self.verdict in ("direction", "equivalent")

    @property
    def keeps_control(self) -> bool:
        """True when the control is the pick."""
        return self.pick == self.control


def pick_stands(versus_control: Decision, versus_runner_up: Decision | None) -> bool:
    """Whether a best-of pick other than the control is a verdict, the one home of that rule (docs/design.md
    section 11): its comparison with the control is decided and so is its comparison with the runner-up (issue 49:
    batch 16 "recommended" for beating batch 1 though 16 vs 8 was never decided).

    Args:
        versus_control: the pick against the control.
        versus_runner_up: the pick against its runner-up (:func:`pick_versus`); None when the runner-up is the
            control (that comparison is ``versus_control``) or there is none.

    Returns:
        True when both are decided (a direction or equivalent).
    """
    return versus_control.decided and (versus_runner_up is None or versus_runner_up.decided)


def keep_control(others: Sequence[Decision | None], higher_is_better: bool = True) -> tuple[str, tuple]:
    """The verdict of keeping the control as a best-of pick ("keep the baseline: none shown better"), the one
    home of that rule (docs/design.md section 11): an estimate that happens to favour the control is not evidence
    (3 equal configurations and a baseline: the baseline is the best estimate in ~1 of 4 null runs).

    Args:
        others: every other candidate's :class:`Decision` against the control (None entries are left out).
        higher_is_better: the ratio's good direction (throughput: True; a time: False), so that "worse" is a
            ratio below 1 (True) or above 1 (False).

    Returns:
        ``(verdict, open)``: ``equivalent`` when every other candidate is equivalent, ``direction`` when each is
        worse beyond noise or equivalent (some worse), else ``undecided`` (also with no other candidate); ``open``
        the decisions that keep it undecided (neither worse beyond noise nor equivalent).
    """
    got = [d for d in others if d is not None]
    worse = "lower" if higher_is_better else "higher"
    open_ = tuple(d for d in got if not (d.verdict == "equivalent" or (d.verdict == "direction" and d.direction == worse)))
    if not got or open_:
        return "undecided", open_
    return ("equivalent" if all(d.verdict == "equivalent" for d in got) else "direction"), ()


def best_of(analysis: Analysis, candidates: Sequence | None = None, higher_is_better: bool = True, *,
            versus_runner_up: bool = True) -> Pick:
    """Pick the best of a design's arms by their ratio to the control, with the decisions that back the choice
    (docs/design.md section 11; the one home of the rule every best-of finding uses).

    The pick is the candidate with the best estimate (the control counts at 1.0); the runner-up the next. A pick
    other than the control carries its comparison with the control (its simultaneous interval) and with the
    runner-up (:func:`pick_versus`). The control as the pick is a verdict only when every other candidate is worse
    beyond noise or equivalent ("keep the baseline: none shown better"): an estimate that happens to sit below 1 is
    not evidence (3 equal configurations and a baseline: the baseline is the best estimate in ~1 of 4 null runs).

    Args:
        analysis: :func:`analyse`'s result (every candidate against ``analysis.control``).
        candidates: the arms eligible to be picked (a quality guard, an SLO), the control among them or not
            (default: every compared arm but the A/A one, and the control).
        higher_is_better: the ratio's good direction (throughput: True; a time: False).
        versus_runner_up: compare the pick with the runner-up (False: skip the Tukey interval, e.g. in a simulation).

    Returns:
        :class:`Pick`.

    Raises:
        ParameterError: no candidate, or a candidate the analysis does not compare with its control.
    """
    control = analysis.control
    cands = list(dict.fromkeys(candidates if candidates is not None else [control, *analysis.compared()]))
    if not cands:
        raise ParameterError("candidates: at least one arm to pick from")
    for a in cands:
        if a != control and a not in analysis.arms:
            raise ParameterError(f"candidates: {a!r} is not compared with the control {control!r}")
    est = {a: 1.0 if a == control else analysis.arms[a].estimate for a in cands}
    sign = 1.0 if higher_is_better else -1.0
    key = (lambda a: sign * math.log(est[a]) if est[a] > 0 and math.isfinite(est[a]) else -math.inf)
    ranked = sorted(cands, key=key, reverse=True)            # stable: ties keep the candidates' order
    pick = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    vs_runner = None      # a runner-up that is the control: the pick's comparison with the control is that one
    if (versus_runner_up and runner is not None and runner != control and pick in analysis.table
            and runner in analysis.table):
        vs_runner = pick_versus(analysis, pick, runner, candidates=len(cands))
    if pick != control:
        d = analysis.arms[pick]
        if d.decided and not pick_stands(d, vs_runner):
            # better than the control, but not shown better than (or equivalent to) the runner-up: the choice is
            # open (issue 49: batch 16 "recommended" for beating batch 1 though 16 vs 8 was never decided)
            return Pick(pick, control, runner, d, vs_runner, "undecided", "", vs_runner.rounds_needed)
        return Pick(pick, control, runner, d, vs_runner, d.verdict, d.direction,
                    d.rounds_needed if d.verdict == "undecided" else 0)
    kept, open_ = keep_control([analysis.arms[a] for a in cands if a != control], higher_is_better)
    if kept == "undecided":
        needs = [d.rounds_needed for d in open_]
        need = None if not open_ or any(n is None for n in needs) else max(needs)
        return Pick(pick, control, runner, None, vs_runner, "undecided", "", need, tuple(d.arm for d in open_))
    direction = ("higher" if higher_is_better else "lower") if kept == "direction" else ""
    return Pick(pick, control, runner, None, vs_runner, kept, direction, 0)


#: the analysis's names, those of its parts (:mod:`workbench.stats.decisions`, :mod:`workbench.stats.paired`) included
__all__ = ["AA", "ALPHA", "MARGIN", "VERDICTS", "MAX_ROUNDS_NEEDED", "SPREAD_CHECK_MIN_ROUNDS", "ZERO_SPREAD",
           "SPREAD_CHECK_ALPHA", "critical_value", "balanced_corr", "planning_critical_value", "per_comparison_alpha",
           "equicorrelated_coverage", "equicorrelated_t_coverage", "Decision", "verdict",
           "additive_verdict", "rounds_needed", "Analysis", "wide_table", "fit_block_model", "spread_check", "decide",
           "analyse", "tukey_critical", "pick_versus", "Pick", "pick_stands", "keep_control", "best_of", "paired_binary"]
