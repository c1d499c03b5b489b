"""Comparison designs: the order arms are measured in, the A/A control's columns, and the per-comparison paired
analysis the block design replaced.

Every experiment's comparison is now a design (:mod:`workbench.run.design`) analysed as one randomised complete block
design (:mod:`workbench.stats.blocks`, docs/design.md section 11). What stays here:

- :func:`schedule`: the order of measurement. ``interleaved``: every round measures every arm once (A B C ...,
  then again), the order within a round shuffled from the seed; the round is the block. ``blocks``: where arms
  cannot all be kept loaded, each arm is measured in separated blocks, counterbalanced (A B, B A, A B, ...: the
  A B B A design); the block is the unit.
- :func:`compare`: the analysis before issue 49, one ratio per arm against the baseline from its own paired
  within-round log ratios (a t interval over rounds, Holm over the arms). ``benchmarks/aa.py --old`` measures its
  A/A false-direction rate beside the block design's; no experiment decides with it.
- The A/A columns of a point (:func:`aa_moved_columns`, :data:`AA_MOVED`), the drift sentence (:func:`drift_text`)
  and :func:`add_noise_band`, the A/A interval as a shaded band on a figure (the design figure itself is
  :func:`workbench.share.figures_design.ratio_figure`).

The formulas (paired t on log ratios, Holm) live in :mod:`workbench.stats.evidence`; this module decides which
values are paired with which.
"""
from __future__ import annotations

import dataclasses
import math
import random
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from workbench.errors import ParameterError
from workbench.stats import decisions, evidence

DESIGNS = ("interleaved", "blocks")
AA = "A/A"  # the A/A control arm: the baseline measured a second time, interleaved like the other arms
AA_MOVED = "not supported: the A/A control moved"
COLUMNS = ("aa_ratio", "aa_low", "aa_high", "design", "rounds", "round_drift")


# ----------------------------------------------------------------------------- scheduling


def schedule(arms: Sequence, rounds: int, seed: int = 0, design: str = "interleaved",
             per_block: int = 1) -> list[tuple[int, object]]:
    """The order to measure arms in.

    Args:
        arms: the arms (any hashable: names, configuration keys); the first is the baseline.
        rounds: rounds (``interleaved``) or blocks per arm (``blocks``, >= 2: one block of an arm cannot be told
            from the drift around it).
        seed: seeds the order within each round (``interleaved``); the same seed gives the same schedule.
        design: ``interleaved`` or ``blocks``.
        per_block: measurements of an arm per block (``blocks`` only; ``interleaved`` measures once per round).

    Returns:
        ``[(unit, arm), ...]`` in measuring order; ``unit`` is the round or block index that pairs the arms.

    Raises:
        ParameterError: an unknown design, fewer than 1 round (2 blocks), no arms or duplicate arms.
    """
    if design not in DESIGNS:
        raise ParameterError(f"design: must be one of {', '.join(DESIGNS)} (got {design!r})")
    arms = list(arms)
    if not arms:
        raise ParameterError("arms: at least one arm to measure (got none)")
    if len(set(map(repr, arms))) != len(arms):
        raise ParameterError(f"arms: duplicate arms in {arms!r}")
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < (2 if design == "blocks" else 1):
        raise ParameterError(f"rounds: an integer >= {2 if design == 'blocks' else 1} for the {design} design "
                             f"(got {rounds!r})")
    if not isinstance(per_block, int) or per_block < 1:
        raise ParameterError(f"per_block: an integer >= 1 (got {per_block!r})")
    out: list[tuple[int, object]] = []
    if design == "interleaved":
        for r in range(rounds):
            order = list(arms)
            random.Random(f"{seed}:{r}").shuffle(order)
            out += [(r, a) for a in order]
    else:  # A B | B A | A B ...: each block pair is counterbalanced, so a linear drift cancels within it
        for b in range(rounds):
            order = arms if b % 2 == 0 else arms[::-1]
            out += [(b, a) for a in order for _ in range(per_block)]
    return out


def run_schedule(order: Sequence[tuple[int, object]], measure: Callable[[object, int], object]) -> list[tuple[int, object, object]]:
    """Measure in ``order`` (:func:`schedule`): ``measure(arm, unit)`` for each entry.

    Returns:
        ``[(unit, arm, what measure returned), ...]`` in measuring order.
    """
    return [(unit, arm, measure(arm, unit)) for unit, arm in order]


# ----------------------------------------------------------------------------- judging


@dataclasses.dataclass(frozen=True)
class ArmResult:
    """One arm against the baseline.

    Attributes:
        arm: the arm.
        interval: ratio ``arm / baseline`` of the value (geometric mean of the paired within-unit ratios) with
            its interval at ``interval.confidence`` (the arm's Holm level when adjusted).
        p: unadjusted two-sided p-value of the paired t test on log ratios.
        p_adjusted: Holm-adjusted over the compared arms (equal to ``p`` with one arm).
        verdict: ``higher`` / ``lower`` (the ratio, when the adjusted p is below 0.05), ``no difference beyond
            noise`` or ``not supported`` (no interval).
    """

    arm: object
    interval: evidence.Interval
    p: float
    p_adjusted: float
    verdict: str


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The arms of one experiment judged against its baseline, with the A/A control and the design.

    Attributes:
        baseline: the baseline arm.
        design: ``interleaved`` or ``blocks``.
        rounds: units (rounds or blocks) the baseline was measured in (with tasks: its rounds).
        arms: per non-baseline, non-A/A arm, its :class:`ArmResult` (in the order given).
        aa: the A/A control's ratio interval (95%, unadjusted: the noise floor), None without a control.
        neighbour_drift: largest ``|ln|`` change of the baseline from one unit to the next (NaN with < 2 units).
        m: comparisons the adjustment counted.
    """

    baseline: object
    design: str
    rounds: int
    arms: dict
    aa: evidence.Interval | None
    neighbour_drift: float
    m: int

    @property
    def aa_moved(self) -> bool:
        """True when the A/A interval excludes 1: the design cannot separate an effect from drift."""
        return self.aa is not None and self.aa.shown and (self.aa.low > 1 or self.aa.high < 1)

    @property
    def drift_moved(self) -> bool:
        """True when the baseline moved by more than :data:`workbench.stats.evidence.DRIFT_LIMIT` between neighbours."""
        return math.isfinite(self.neighbour_drift) and self.neighbour_drift > math.log1p(evidence.DRIFT_LIMIT)

    def columns(self) -> dict:
        """The point columns of docs/design.md section 10: ``aa_ratio``, ``aa_low``, ``aa_high``, ``design``, ``rounds``;
        and ``round_drift``, the baseline's largest change between neighbouring rounds (a ratio - 1)."""
        nan = float("nan")
        aa = self.aa
        return {"aa_ratio": aa.estimate if aa is not None else nan, "aa_low": aa.low if aa is not None else nan,
                "aa_high": aa.high if aa is not None else nan, "design": self.design, "rounds": int(self.rounds),
                "round_drift": math.expm1(self.neighbour_drift) if math.isfinite(self.neighbour_drift) else nan}

    def supported(self, arm) -> bool:
        """Whether a comparative claim about ``arm`` stands: a direction after adjustment, the A/A control not
        moved."""
        r = self.arms.get(arm)
        return r is not None and r.verdict in ("higher", "lower") and not self.aa_moved

    def noise_floor(self) -> str:
        """``"A/A noise floor 0.97-1.03x (8 interleaved rounds)"``, or why there is none."""
        return noise_floor_text(self.aa, self.design, self.rounds)

    def describe(self, arm, name: str | None = None, invert: bool = False) -> str:
        """``"<name>: 1.12x, 97.5% interval 1.04-1.21x (...) [A/A noise floor ...]"`` with the verdict;
        ``invert``: show ``baseline / arm`` (a speed-up from latencies)."""
        r = self.arms[arm]
        iv = invert_interval(r.interval) if invert else r.interval
        name = str(arm) if name is None else name
        body = iv.describe("{:.2f}", "x")
        if self.aa_moved:
            head = f"{name}: {AA_MOVED}: {body}"
        elif r.verdict in ("higher", "lower"):
            head = f"{name}: {body}"
        else:
            head = f"{name}: {r.verdict}: {body}"
        if self.m > 1:
            head += f" (Holm over {self.m} comparisons, adjusted p {r.p_adjusted:.3g})"
        return f"{head}; {self.noise_floor()}"


def invert_interval(iv: evidence.Interval) -> evidence.Interval:
    """The interval of ``1 / ratio`` (bounds swapped)."""
    f = (lambda x: 1.0 / x if x and math.isfinite(x) else float("nan"))
    return dataclasses.replace(iv, estimate=f(iv.estimate), low=f(iv.high), high=f(iv.low))


def drift_text(round_drift: float) -> str:
    """A caveat when the baseline moved between neighbouring rounds by more than
    :data:`workbench.stats.evidence.DRIFT_LIMIT` (empty otherwise): the paired ratios absorb a drift shared by a round,
    the absolute figures (latencies, throughputs) do not."""
    if round_drift is None or not math.isfinite(round_drift) or round_drift <= evidence.DRIFT_LIMIT:
        return ""
    return (f"The baseline moved {round_drift:.0%} between neighbouring rounds (limit {evidence.DRIFT_LIMIT:.0%}): "
            f"ratios are paired within rounds, absolute figures are not.")


def noise_floor_text(aa: evidence.Interval | None, design: str = "interleaved", rounds: int | None = None) -> str:
    """The A/A noise floor as a phrase for a finding."""
    if aa is None:
        return "no A/A control"
    what = f"{rounds} {design} {'rounds' if design == 'interleaved' else 'blocks'}" if rounds else design
    if not aa.shown:
        return f"A/A noise floor: none ({aa.reason or 'too few rounds'})"
    moved = " (moved: excludes 1)" if (aa.low > 1 or aa.high < 1) else ""
    return f"A/A noise floor {aa.low:.2f}-{aa.high:.2f}x{moved} ({what})"


def _unit_table(df: pd.DataFrame) -> pd.DataFrame:
    """Unit x arm table of the geometric mean of each arm's positive values in a unit (NaN where not measured)."""
    ok = df[np.isfinite(df["value"]) & (df["value"] > 0)]
    return np.exp(np.log(ok["value"]).groupby([ok["unit"], ok["_arm"]]).mean().unstack("_arm"))


def compare(measurements: pd.DataFrame, baseline, aa=AA, *, arm: str = "arm", unit: str = "round",
            value: str = "value", design: str = "interleaved", adjust: bool = True,
            confidence: float = evidence.CONFIDENCE, task: str | None = None) -> Comparison:
    """Judge every arm against the baseline from paired within-unit log ratios.

    Args:
        measurements: long table, one row per measurement: ``arm``, ``unit`` (round or block index) and a
            positive ``value`` (seconds, tokens/s: the ratio is of this value). Several rows of an arm in one
            unit (workloads, repeats in a block) are combined by their geometric mean.
        baseline: the baseline arm (ratios are ``arm / baseline``).
        aa: the A/A control's arm name (None: no control).
        arm, unit, value: column names.
        design: ``interleaved`` or ``blocks`` (recorded; the analysis is the same with the unit as the pair).
        adjust: Holm over the compared arms (the best of ``m`` is ``m`` comparisons); False: each at ``confidence``.
        confidence: family-wise confidence.
        task: a column naming the task of each row where a round measures every arm on several tasks (the
            context compression's depths): the pair is then a (round, task) unit, each task's arms paired within a
            round, the intervals over those units; ``rounds`` still counts rounds, and the drift is the
            baseline's largest change between neighbouring rounds on one task. None: the unit is the round.

    Returns:
        :class:`Comparison`.

    Raises:
        ParameterError: a missing column, an unknown design, or a baseline that was not measured.
    """
    for col in (arm, unit, value):
        if col not in measurements:
            raise ParameterError(f"measurements: needs a {col!r} column (has {', '.join(map(str, measurements))})")
    if design not in DESIGNS:
        raise ParameterError(f"design: must be one of {', '.join(DESIGNS)} (got {design!r})")
    df = pd.DataFrame({"_arm": measurements[arm].map(repr), "unit": measurements[unit],
                       "value": pd.to_numeric(measurements[value], errors="coerce").astype(float)})
    if task is not None:  # a (round, task) pair is the unit
        if task not in measurements:
            raise ParameterError(f"measurements: needs a {task!r} column (has {', '.join(map(str, measurements))})")
        df = df.assign(_task=measurements[task].map(repr), _round=df["unit"])
        df["unit"] = df["_round"].map(repr) + "|" + df["_task"]
    names = {repr(a): a for a in measurements[arm]}
    if repr(baseline) not in names:
        raise ParameterError(f"baseline: {baseline!r} was not measured (arms: {', '.join(map(str, names.values()))})")
    table = _unit_table(df)
    base = table[repr(baseline)].dropna()
    others = [k for k in names if k not in (repr(baseline), repr(aa))]

    what = "(round, task) units" if task is not None else ("rounds" if design == "interleaved" else "blocks")

    values, cols = table.to_numpy(dtype=float), list(table.columns)
    b = values[:, cols.index(repr(baseline))]

    def pairs(key):
        if key not in cols:
            return np.array([]), np.array([])
        v = values[:, cols.index(key)]
        ok = np.isfinite(v) & np.isfinite(b)
        return v[ok], b[ok]

    aa_iv = (evidence.paired_ratio_interval(*pairs(repr(aa)), confidence, what)
             if aa is not None and repr(aa) in names else None)
    ps = [decisions.paired_log_ratio_pvalue(*pairs(k)) for k in others]
    alpha = 1 - confidence
    adjusted = decisions.holm(ps) if adjust else list(ps)
    levels = decisions.holm_levels(ps, alpha) if adjust else [confidence] * len(ps)
    arms = {}
    for k, p, pa, level in zip(others, ps, adjusted, levels):
        iv = evidence.paired_ratio_interval(*pairs(k), level, what)
        if not iv.shown:
            verdict = "not supported"
        elif math.isfinite(pa) and pa < alpha:
            verdict = "higher" if iv.estimate > 1 else "lower"
        else:
            verdict = "no difference beyond noise"
        arms[names[k]] = ArmResult(names[k], iv, p, pa, verdict)
    if task is None:
        units = sorted(base.index)
        steps = np.abs(np.diff(np.log(base.loc[units].to_numpy()))) if len(units) > 1 else np.array([])
        n_units = len(units)
    else:  # the drift between neighbouring rounds on one task (between tasks the baseline differs by design)
        bt = df[(df["_arm"] == repr(baseline)) & np.isfinite(df["value"]) & (df["value"] > 0)]
        logs = np.log(bt["value"]).groupby([bt["_task"], bt["_round"]]).mean()
        steps = np.concatenate([np.abs(np.diff(g.to_numpy())) for _, g in logs.groupby(level=0)] or [np.array([])])
        n_units = bt["_round"].nunique()
    return Comparison(baseline, design, int(n_units), arms, aa_iv,
                      float(steps.max()) if steps.size else float("nan"), len(others) if adjust else 1)


def blocked_interval(a: Sequence[float], b: Sequence[float], confidence: float = evidence.CONFIDENCE) -> evidence.Interval:
    """The old blocked design's ratio ``a / b``: each arm's repeats back to back, Welch's t over the repeats as
    independent samples (:func:`workbench.stats.evidence.ratio_interval`). Kept for the A/A benchmark and the tests
    that show why it is replaced: its interval sees only the noise inside a block."""
    return evidence.ratio_interval(a, b, confidence)


def claims_direction(iv: evidence.Interval) -> bool:
    """True when an interval of a ratio excludes 1 (what an A/A trial must not do more than its nominal share)."""
    return evidence.ratio_verdict(iv) in ("higher", "lower")


# ----------------------------------------------------------------------------- figures


def add_noise_band(fig, aa: evidence.Interval | None = None, low: float | None = None, high: float | None = None,
                   axis: str = "y", invert: bool = False, label: str = "A/A noise floor"):
    """Shade the A/A control's interval on a ratio figure (a horizontal band on ``y``, vertical on ``x``).

    Args:
        fig: a plotly figure whose ``axis`` is a ratio scale (1 = no difference).
        aa: the A/A interval; or give ``low`` / ``high`` (e.g. a point's ``aa_low`` / ``aa_high``).
        invert: draw ``1 / interval`` (a figure of ``baseline / arm`` speed-ups).

    Returns:
        ``fig`` (unchanged when the interval is missing).
    """
    if aa is not None:
        low, high = aa.low, aa.high
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)) or low <= 0:
        return fig
    import plotly.graph_objects as go

    if invert:
        low, high = 1.0 / high, 1.0 / low
    kw = dict(fillcolor="#888888", opacity=0.18, line_width=0)
    if axis == "y":
        fig.add_hrect(y0=low, y1=high, **kw)
    else:
        fig.add_vrect(x0=low, x1=high, **kw)
    # named in the legend, not written on the plot (a label on the band sat on the baseline's marker and the "1" tick)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", hoverinfo="skip", name=f"{label} {low:.2f}-{high:.2f}x",
                             marker=dict(symbol="square", size=14, color="#888888", opacity=0.35)))
    return fig


# ----------------------------------------------------------------------------- an arm's ratio as point columns


#: the point columns of :func:`arm_columns` with its default prefix (an arm's time over its baseline's)
TIME_RATIO_COLUMNS = ("time_ratio", "time_ratio_low", "time_ratio_high", "time_ratio_level", "time_ratio_p_holm",
                      "time_ratio_method")


def arm_columns(comp: Comparison, arm, prefix: str = "time_ratio") -> dict:
    """One arm's ratio over the baseline as point columns, so that a finding and a figure read it back from the
    points (:func:`interval_from_columns`): ``<prefix>`` (the ratio), ``<prefix>_low`` / ``_high`` (its interval at
    the arm's Holm level), ``<prefix>_level`` (that level), ``<prefix>_p_holm`` and ``<prefix>_method``. The baseline
    itself: ratio 1, no interval; an arm the comparison does not hold: NaN."""
    nan = float("nan")
    if arm == comp.baseline:
        return {prefix: 1.0, f"{prefix}_low": nan, f"{prefix}_high": nan, f"{prefix}_level": nan,
                f"{prefix}_p_holm": nan, f"{prefix}_method": "the baseline"}
    r = comp.arms.get(arm)
    if r is None:
        return {prefix: nan, f"{prefix}_low": nan, f"{prefix}_high": nan, f"{prefix}_level": nan,
                f"{prefix}_p_holm": nan, f"{prefix}_method": "not compared"}
    iv = r.interval
    how = iv.method if iv.shown else (iv.reason or "too few rounds")
    if comp.m > 1:
        how += f"; Holm over {comp.m} comparisons"
    return {prefix: iv.estimate, f"{prefix}_low": iv.low, f"{prefix}_high": iv.high, f"{prefix}_level": iv.confidence,
            f"{prefix}_p_holm": r.p_adjusted, f"{prefix}_method": how}


def _num(row, key) -> float:
    try:
        v = float(row.get(key, float("nan")))
    except (TypeError, ValueError):
        return float("nan")
    return v


def interval_from_columns(row, prefix: str = "time_ratio") -> evidence.Interval:
    """The ratio interval a point row carries (:func:`arm_columns`)."""
    level = _num(row, f"{prefix}_level")
    rounds = _num(row, "rounds")
    iv = evidence.Interval(_num(row, prefix), _num(row, f"{prefix}_low"), _num(row, f"{prefix}_high"),
                           int(rounds) if math.isfinite(rounds) else 0, "", level if math.isfinite(level)
                           else evidence.CONFIDENCE)
    method = str(row.get(f"{prefix}_method") or "")
    return dataclasses.replace(iv, method=method) if iv.shown else dataclasses.replace(iv, reason=method or "too few rounds")


def aa_from_columns(row) -> evidence.Interval | None:
    """The A/A control's interval a point row carries (:data:`COLUMNS`), None where the point has no control."""
    if not isinstance(row.get("design"), str) or not math.isfinite(_num(row, "aa_ratio")):
        return None
    rounds = _num(row, "rounds")
    n = int(rounds) if math.isfinite(rounds) else 0
    return evidence.Interval(_num(row, "aa_ratio"), _num(row, "aa_low"), _num(row, "aa_high"), n,
                             f"t over the log ratios of {n} rounds", reason="too few rounds")


def aa_moved_columns(row) -> bool:
    """True when a point row's A/A interval excludes 1."""
    aa = aa_from_columns(row)
    return aa is not None and aa.shown and (aa.low > 1 or aa.high < 1)

