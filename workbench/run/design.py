"""The design runner: arms measured in interleaved rounds with an A/A control, looked at with an error-controlling
rule, stopped once the primary comparison is decided or the budget is spent, and analysed as the block design it is
(docs/design.md section 11).

An experiment declares its comparison (:class:`Design`: the arms, the control arm, the primary outcome and any
secondary ones, the rounds, the margin, the budget) and gives two functions: ``prepare(arm)`` (warm-up, loading;
once per arm and session) and ``measure(arm, round)`` (one measurement, returning :class:`Measured`). It never writes a
round loop: :func:`run_design` owns the order (every arm once per round, shuffled from the seed; the control a second
time as the A/A arm), the looks (:func:`workbench.stats.sequential.looks`, each at its spent alpha), the stop rule,
the budget, the record of every round (``design/<experiment>.parquet`` and ``design/<experiment>_requests.parquet`` in
the run folder, written after each round, so that a resume continues from the last finished round) and the one
analysis (:func:`workbench.stats.blocks.analyse`) it hands back (:class:`DesignResult`). pyperf's
``Runner.bench_time_func`` is the model: the runner owns the repetition, the benchmark gives only its body.

:func:`workbench.run.sweeps.run_sweep` takes a design (``design=``, :class:`workbench.run.design_sweep.SweepDesign`):
the points are the arms, each point's row carries its arm's decision (:func:`DesignResult.point_columns`), and
``workbench plan`` reads what a design would cost and what it could decide (:func:`plan_text`) from the spread the last
run of the experiment on this machine measured (:func:`remember_spread` / :func:`recalled_spread`).

Here: a design declared, its rounds stored, run and rebuilt (:func:`reanalyse`, :func:`versus_runner_up`). Beside it,
re-exported here: :mod:`workbench.run.design_findings` (a point row's decision said in a finding) and
:mod:`workbench.run.design_plan` (what a design costs and can decide); :mod:`workbench.run.design_sweep` runs a design
over a sweep's points.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import sys
import time
from typing import Callable

import numpy as np
import pandas as pd

from workbench import checks
from workbench.errors import ParameterError
from workbench.run import design_store
from workbench.run.design_findings import (
    decision_from_row,
    evidence_text,
    finding_fields,
    secondary_clause,
    weakest,
)
from workbench.run.design_plan import DEFAULT_SIGMA, plan_text, recalled_spread, remember_spread, smallest_effect
from workbench.stats import blocks, metrics, sequential

AA = blocks.AA
ORDERS = ("interleaved", "blocks")
DEFAULT_MIN_ROUNDS = 3
DEFAULT_MAX_ROUNDS = 8
DEADLINE_ENV = "WORKBENCH_SUITE_DEADLINE"   # the suite's deadline (Unix time): rounds beyond the minimum stop there
STOPPED = ("decided", "max rounds", "budget", "one round")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a comparison judges.

    Attributes:
        name: the key of :attr:`Measured.values` (e.g. ``output_throughput_tps``, ``e2e_s``).
        higher_is_better: the direction of "better" (throughput: True; a time: False).
        label: the outcome in words for a finding (``"output throughput"``).
        prefix: the point columns' prefix (``<prefix>``, ``<prefix>_low``, ...; ``time_ratio`` for times).
    """

    name: str
    higher_is_better: bool
    label: str = ""
    prefix: str = "time_ratio"

    @property
    def words(self) -> tuple[str, str]:
        """The names of a ratio above / below 1: ``("higher", "lower")``, or ``("slower", "faster")`` for a time."""
        if self.prefix.startswith("time") or self.name.endswith("_s"):
            return ("slower", "faster")
        return ("higher", "lower")


@dataclasses.dataclass
class Design:
    """A comparison as an experiment declares it.

    Attributes:
        experiment: the experiment's name (the run folder's ``design/<experiment>.parquet``).
        arms: the arms' keys (point ids), in the grid's order.
        control: the control arm (marked explicitly, never by row order).
        primary: the outcome that sets the finding's verdict; secondary: others, reported with their own verdicts.
        groups: ``{control: [arms]}`` where arms have controls of their own (one per family, language, batch size);
            None: every arm against ``control``.
        aa: measure the control a second time each round as the A/A arm.
        min_rounds, max_rounds: the rounds measured before the first look, and the most the design may take.
        budget_s: the most seconds the measuring may take (0: none); rounds beyond ``min_rounds`` are added only
            while this budget (and the suite's, :data:`DEADLINE_ENV`) has room for one more.
        margin: the equivalence margin as a ratio (> 1).
        seed: seeds the order within each round.
        decide: the arms whose primary comparison must be decided to stop early (None: every arm).
        order: ``interleaved`` (shuffled within each round) or ``blocks`` (alternating forward / reverse: where a
            switch between arms costs, A B B A counterbalances a linear drift).
        spending: the alpha-spending function (:data:`workbench.stats.sequential.SPENDING`).
        judge: ``judge(table, alpha) -> bool``, the stop rule's decision where the comparison a design decides is
            not its arms against their controls (context length's fit over the lengths): called at each look with
            the rounds so far (:attr:`DesignResult.table`'s form) and the look's alpha; None: every arm of
            ``decide`` decided.
        rank: ``rank(table) -> arms``, a best-of finding's order at a look (its pick first, then its runner-up;
            arms it would never pick left out), from the rounds so far as the finding ranks its points (batch size:
            goodput under the SLO): the stop rule is then the finding's own choice decided - the pick against its
            control and against its runner-up (:func:`workbench.stats.blocks.pick_versus`), or with the control as
            the pick every other ranked arm decided - not every arm (issue 49: batch 2 vs 1 kept the batch-size
            design measuring two rounds after its recommendation was decided). Designs of one control group only;
            None: ``decide``.
    Raises:
        ParameterError: fewer than 2 arms, an unknown control, bad rounds, margin or budget.
    """

    experiment: str
    arms: list
    control: object
    primary: Outcome
    secondary: tuple = ()
    groups: dict | None = None
    aa: bool = True
    min_rounds: int = DEFAULT_MIN_ROUNDS
    max_rounds: int = DEFAULT_MAX_ROUNDS
    budget_s: float = 0.0
    margin: float = blocks.MARGIN
    seed: int = 0
    decide: list | None = None
    order: str = "interleaved"
    spending: str = "obrien-fleming"
    judge: Callable | None = None
    rank: Callable | None = None

    def __post_init__(self):
        self.arms = list(self.arms)
        if len(self.arms) < 2:
            raise ParameterError(f"arms: a comparison needs at least 2 arms (got {len(self.arms)})")
        if len(set(map(str, self.arms))) != len(self.arms):
            raise ParameterError(f"arms: duplicate arms in {self.arms!r}")
        if self.control not in self.arms:
            raise ParameterError(f"control: {self.control!r} is not one of the arms")
        if AA in self.arms:
            raise ParameterError(f"arms: {AA!r} is the A/A arm's name, not an arm")
        check_rounds(self.min_rounds, self.max_rounds)
        checks.check_float("budget_s", self.budget_s, lo=0)
        check_margin(self.margin)
        checks.check_choice("order", self.order, ORDERS)
        if self.groups:
            for g, members in self.groups.items():
                if g not in self.arms or any(a not in self.arms for a in members):
                    raise ParameterError(f"groups: {g!r}: every control and member must be an arm")

    @property
    def plan(self) -> list[int]:
        """The rounds after which the design looks (:func:`workbench.stats.sequential.looks`)."""
        return sequential.looks(self.min_rounds, self.max_rounds)

    def measured_arms(self) -> list:
        """The arms of one round: every arm, then the A/A arm."""
        return [*self.arms, *([AA] if self.aa else [])]


@dataclasses.dataclass
class DesignFields:
    """The config fields of an experiment measured as a design (mixed into its ``Config`` after
    :class:`workbench.run.sweeps.SweepConfig`, whose ``repeats`` is then the minimum rounds).

    Attributes:
        max_rounds: the most rounds the design may take (>= ``repeats``); rounds beyond ``repeats`` are added only
            while the comparison is undecided and the budget allows.
        budget_s: the most seconds the design's measuring may take (0: no budget of its own; the suite's
            ``budget_s`` still applies).
        margin: the equivalence margin as a ratio (1.05: arms within +-5% are equivalent).
    """

    max_rounds: int = DEFAULT_MAX_ROUNDS
    budget_s: float = 0.0
    margin: float = blocks.MARGIN

    def check_design(self) -> None:
        """One-line errors for the design fields (call from the config's ``__post_init__``)."""
        checks.check_int("max_rounds", self.max_rounds, max(2, getattr(self, "repeats", 2)), 1000)
        checks.check_float("budget_s", self.budget_s, lo=0)
        check_margin(self.margin)

    def planned_design(self) -> tuple[str, int, int, int] | None:
        """The primary design this config measures, for ``workbench plan``: ``(its experiment name, arms, rounds
        before the first look, max_rounds)``, the arms without the A/A one; None when it measures no design (one
        round, one arm). By default every grid point is an arm of the module's ``EXPERIMENT`` and ``repeats`` the first
        look; an experiment whose design is part of its grid, or whose rounds are counted otherwise, overrides it."""
        import sys

        arms = len(self.grid()) if hasattr(self, "grid") else 0
        rounds = int(getattr(self, "repeats", 1) or 1)
        name = str(getattr(sys.modules[type(self).__module__], "EXPERIMENT", ""))
        return (name, arms, rounds, int(self.max_rounds)) if arms >= 2 and rounds >= 2 else None

    def design_kwargs(self) -> dict:
        """``min_rounds``, ``max_rounds``, ``budget_s``, ``margin`` and ``seed`` for :class:`Design`."""
        return {"min_rounds": int(getattr(self, "repeats", DEFAULT_MIN_ROUNDS)), "max_rounds": int(self.max_rounds),
                "budget_s": float(self.budget_s), "margin": float(self.margin), "seed": int(getattr(self, "seed", 0))}


def check_rounds(min_rounds, max_rounds) -> None:
    """One-line errors for a design's rounds: ``min_rounds`` >= 2 (one round pairs nothing) and ``max_rounds`` >=
    ``min_rounds`` (at most 1000)."""
    checks.check_int("min_rounds", min_rounds, 2, 1000)
    checks.check_int("max_rounds", max_rounds, min_rounds, 1000)


def check_margin(margin) -> None:
    """One-line error for an equivalence margin: a ratio in (1, 2]."""
    checks.check_float("margin", margin, lo=1, hi=2, lo_open=True)


@dataclasses.dataclass
class Measured:
    """One measurement of one arm in one round.

    Attributes:
        values: ``{outcome name: positive value}`` (seconds, tokens/s).
        requests: the request records it produced (``repeat`` is set to the round by the runner).
        wall_s: its timed wall time, seconds.
        extra: anything the experiment wants back per measurement (kept in :attr:`DesignResult.extras`).
    """

    values: dict
    requests: list = dataclasses.field(default_factory=list)
    wall_s: float = 0.0
    extra: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class DesignResult:
    """What :func:`run_design` measured and decided.

    Attributes:
        design: the :class:`Design`.
        table: one row per (round, arm) measured: ``round``, ``arm`` (str; the A/A arm as :data:`AA`), each outcome's
            value, ``wall_s``, ``seconds`` (the measurement's own clock time).
        requests: ``{arm: [records]}`` of the arms (the A/A arm's are kept apart, under :data:`AA`).
        extras: ``{arm: [extra dicts]}`` in round order.
        analysis: the primary outcome's :class:`workbench.stats.blocks.Analysis` at the last look.
        secondary: ``{outcome name: Analysis}`` (each at the last look's alpha over the secondary outcomes).
        rounds: rounds measured; seconds: the measuring's clock time; stopped: why it stopped (:data:`STOPPED`).
        looks: ``[{"rounds", "alpha", "decided"}]`` the looks taken.
        warmup_s: ``{arm: seconds}`` of :func:`run_design`'s ``prepare`` calls.
    """

    design: Design
    table: pd.DataFrame
    requests: dict
    extras: dict
    analysis: blocks.Analysis | None
    secondary: dict
    rounds: int
    seconds: float
    stopped: str
    looks: list
    warmup_s: dict

    @property
    def seconds_per_round(self) -> float:
        """The mean clock time of one round (NaN before any)."""
        return self.seconds / self.rounds if self.rounds else float("nan")

    def decision(self, arm) -> blocks.Decision | None:
        """The primary outcome's decision of ``arm`` (None for the control or an arm not compared)."""
        return self.analysis.arms.get(arm) if self.analysis is not None else None

    def point_columns(self, arm, outcome: Outcome | None = None) -> dict:
        """The point columns of ``arm`` (docs/design.md section 10): ``design``, ``rounds``, ``margin``, the A/A
        control's ``aa_ratio`` / ``aa_low`` / ``aa_high`` / ``aa_verdict``, the outcome's ``<prefix>`` ratio to its
        control with ``_low`` / ``_high`` (the simultaneous interval), ``_level``, ``_method``, ``_verdict``
        (direction / equivalent / undecided), ``_direction`` (higher / lower), ``rounds_needed`` and
        ``seconds_needed`` (an undecided arm's estimate at the observed spread), ``design_seconds``,
        ``seconds_per_round`` and ``design_stopped``. The control itself: ratio 1, no interval."""
        outcome = outcome or self.design.primary
        an = self.analysis if outcome is self.design.primary else self.secondary.get(outcome.name)
        p, nan = outcome.prefix, float("nan")
        aa = an.aa_decision if an is not None else None
        out = {"design": self.design.order, "rounds": int(self.rounds), "margin": float(self.design.margin),
               "aa_ratio": aa.estimate if aa else nan, "aa_low": aa.low if aa else nan,
               "aa_high": aa.high if aa else nan, "aa_verdict": aa.verdict if aa else "",
               "design_seconds": float(self.seconds), "seconds_per_round": float(self.seconds_per_round),
               "design_stopped": self.stopped, "round_drift": self.round_drift(),
               "round_speed_drift": self.speed_drift()}
        d = an.arms.get(arm) if an is not None else None
        if d is None:
            base = {p: 1.0 if an is not None and arm in (an.control, *(self.design.groups or {})) else nan,
                    f"{p}_low": nan, f"{p}_high": nan, f"{p}_level": nan,
                    f"{p}_method": "the control" if an is not None else "not compared", f"{p}_verdict": "",
                    f"{p}_direction": "", "rounds_needed": nan, "seconds_needed": nan}
            return {**out, **base}
        need = d.rounds_needed
        secs = (max(need - self.rounds, 0) * self.seconds_per_round if need else (0.0 if d.decided else nan))
        return {**out, p: d.estimate, f"{p}_low": d.low, f"{p}_high": d.high, f"{p}_level": d.level,
                f"{p}_method": d.method if d.shown else (d.reason or d.method), f"{p}_verdict": d.verdict,
                f"{p}_direction": d.direction, "rounds_needed": float(need) if need is not None else nan,
                "seconds_needed": float(secs)}

    def speed_drift(self) -> float:
        """The machine's speed between neighbouring rounds, read from the control: :func:`_largest_step` of its
        requests' median ``tpot_s`` per round (the decode step, what the sweep's drift reference measures), or, where
        the client cannot time tokens (chunks through a buffering proxy), the server's own TPOT from its
        ``engine_ttft_s`` / ``engine_e2e_s`` (:func:`workbench.stats.metrics.tpot_of`); NaN without either. Where the primary outcome moves with more than the speed (a queue's TTFT: 149% between rounds
        where the TPOT moved 12%, results/LOG.md 2026-12-07), the design's speed reading
        (:func:`workbench.run.drift.absorbed_by_rounds`)."""
        by_round: dict = {}
        for rec in self.requests.get(self.design.control, []):
            v = rec.get("tpot_s")
            if not (isinstance(v, (int, float)) and math.isfinite(v)):
                v = metrics.tpot_of(rec.get("engine_ttft_s"), rec.get("engine_e2e_s"), rec.get("output_tokens"))
            if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 and "repeat" in rec:
                by_round.setdefault(int(rec["repeat"]), []).append(float(v))
        return _largest_step([np.median(by_round[r]) for r in sorted(by_round)])

    def round_drift(self) -> float:
        """:func:`_largest_step` of the control's primary outcome over the rounds."""
        c = self.table[self.table["arm"] == str(self.design.control)].sort_values("round")[self.design.primary.name]
        return _largest_step(c.astype(float))


def _largest_step(values) -> float:
    """The largest change between neighbours of the positive ``values`` (in round order), as a ratio - 1; NaN with
    fewer than 2."""
    v = np.asarray([x for x in values if x > 0], dtype=float)
    return float(math.expm1(np.abs(np.diff(np.log(v))).max())) if len(v) >= 2 else float("nan")


def _order(design: Design, rnd: int) -> list:
    arms = design.measured_arms()
    if design.order == "blocks":
        return arms if rnd % 2 == 0 else arms[::-1]
    order = list(arms)
    random.Random(f"{design.seed}:{rnd}").shuffle(order)
    return order


def reanalyse(run_dir, experiment: str, outcome: str | None = None) -> tuple[Design, blocks.Analysis] | None:
    """A finished design rebuilt from its run folder (``design/<experiment>.json`` and its table): the
    :class:`Design` and the analysis of ``outcome`` (default: the primary) at the alpha of its last look, as
    :func:`run_design` decided it (None when the run holds no design of that experiment)."""
    tpath = design_store.store_paths(run_dir, experiment)[0]
    jpath = tpath.with_suffix(".json")
    if not (tpath.exists() and jpath.exists()):
        return None
    desc = json.loads(jpath.read_text(encoding="utf-8"))
    primary = Outcome(**desc["primary"])
    secondary = tuple(Outcome(**o) for o in desc.get("secondary") or ())
    d = Design(desc["experiment"], desc["arms"], desc["control"], primary, secondary, groups=desc.get("groups"),
               aa=desc.get("aa", True), min_rounds=desc["min_rounds"], max_rounds=desc["max_rounds"],
               margin=desc["margin"], spending=desc.get("spending", "obrien-fleming"), order=desc.get("order",
                                                                                                     "interleaved"))
    table = pd.read_parquet(tpath)
    table = table[table["round"] < desc["rounds"]]
    alpha = desc["looks"][-1]["alpha"] if desc.get("looks") else blocks.ALPHA
    which = primary if outcome in (None, primary.name) else next((o for o in secondary if o.name == outcome), None)
    if which is None:
        raise ParameterError(f"outcome: {outcome!r} is not an outcome of the {experiment} design")
    if which is not primary:
        alpha /= max(len(secondary), 1)
    return d, analyse_outcome(table, d, which, alpha)


def versus_runner_up(run_dir, experiment: str, outcome: str, pick, runner, label: str, versus_control,
                     row, words=None) -> tuple[str, dict | None]:
    """A pick against its runner-up, from the run folder's design (:func:`reanalyse`; Tukey's level:
    :func:`workbench.stats.blocks.pick_versus`), the one rule of every best-of finding (docs/design.md section 11):
    a pick decided against its control but neither better beyond noise than nor equivalent to its runner-up leaves
    the choice open.

    Args:
        run_dir: the run folder (None: no design at hand).
        experiment, outcome: the design's name and the outcome the pick was made on.
        pick, runner: the two arms (the design table's column names).
        label: how the runner-up is named in the sentence ("batch 6", "lanes").
        versus_control: the pick's :class:`workbench.stats.blocks.Decision` against the control.
        row: the pick's point row (its design columns, for :func:`finding_fields`).
        words: the outcome's direction words.

    Returns:
        ``(sentence, fields)``: the sentence to append ("" when the design is not at hand), and the finding's
        fields when the runner-up leaves the pick undecided (the rounds that comparison needs), else None.
    """
    again = reanalyse(run_dir, experiment, outcome) if run_dir is not None and runner is not None else None
    if again is None or str(runner) not in again[1].table.columns or str(pick) not in again[1].table.columns:
        return "", None
    vs = blocks.pick_versus(again[1], str(pick), str(runner))
    text = " " + vs.describe(f"Against the runner-up, {label}", words=words) + "."
    if versus_control is not None and versus_control.decided and not blocks.pick_stands(versus_control, vs):
        return text, finding_fields(row, dataclasses.replace(vs, verdict="undecided"))
    return text, None


def _deadline(design: Design, begun: float) -> float:
    """The Unix time after which no round beyond the minimum starts: the design's budget and the suite's."""
    ends = [math.inf]
    if design.budget_s:
        ends.append(begun + design.budget_s)
    env = os.environ.get(DEADLINE_ENV)
    if env:
        try:
            ends.append(float(env))
        except ValueError:
            pass
    return min(ends)


def analyse_outcome(table: pd.DataFrame, design: Design, outcome: Outcome, alpha: float,
                    nominal_alpha: float = blocks.ALPHA) -> blocks.Analysis | None:
    """One outcome of a design's table analysed as its block design (:func:`workbench.stats.blocks.analyse`)."""
    if table.empty or outcome.name not in table:
        return None
    long = pd.DataFrame({"arm": table["arm"], "round": table["round"], "value": table[outcome.name]})
    keys = {str(a): a for a in design.arms}
    long["arm"] = long["arm"].map(lambda a: keys.get(a, a))
    groups = ({g: list(members) for g, members in design.groups.items()} if design.groups else None)
    try:
        return blocks.analyse(long, design.control, AA if design.aa else None, groups=groups, margin=design.margin,
                              alpha=alpha, nominal_alpha=nominal_alpha)
    except ParameterError:
        return None


def _choice_decided(analysis, ranked: list, higher_is_better: bool = True) -> bool:
    """A best-of choice decided at a look: ``ranked[0]`` (the pick) against the control and against ``ranked[1]``
    (its runner-up; no second comparison when that is the control), the rule of :func:`versus_runner_up`; with the
    control as the pick, the finding's rule (:func:`workbench.stats.blocks.keep_control`: every other ranked arm
    worse beyond noise or equivalent; an arm decided better on the outcome but ranked below the control by the
    design's own order keeps it open, as it keeps the finding undecided). False when nothing is ranked."""
    ranked = [a for a in ranked if a == analysis.control or a in analysis.arms]
    if not ranked:
        return False
    pick, runner = ranked[0], (ranked[1] if len(ranked) > 1 else None)
    if pick == analysis.control:
        return blocks.keep_control([analysis.arms[a] for a in ranked[1:]], higher_is_better)[0] != "undecided"
    if not analysis.arms[pick].decided:
        return False
    vs = None if runner is None or runner == analysis.control else blocks.pick_versus(analysis, pick, runner)
    return blocks.pick_stands(analysis.arms[pick], vs)


def _aa_moved(analysis) -> bool:
    """The A/A control claims a direction at this look: the control measured twice a round differed beyond noise, so
    the machine's speed moved within rounds (or the noise is larger than the model says), and the comparisons of
    this look are not to be trusted yet (:func:`workbench.stats.validity.absorbed_by_rounds` would not keep them)."""
    aa = analysis.arms.get(AA) if analysis is not None else None
    return aa is not None and aa.verdict == "direction"


def _decided(design: Design, table: pd.DataFrame, analysis, alpha: float) -> bool:
    """The stop rule at a look: never while the A/A control claims a direction (:func:`_aa_moved`: another round,
    while the plan has one, gives the rounds' blocks a chance to absorb what moved within one; a group-sequential
    design that does not stop at a crossing keeps its error within the alpha spent, the union bound of its looks);
    else the design's own ``judge`` when it has one, else its best-of choice decided when it ranks its arms
    (:func:`_choice_decided`), else every arm of ``decide`` decided."""
    if _aa_moved(analysis):
        return False
    if design.judge is not None:
        return bool(not table.empty and design.judge(table, alpha))
    if design.rank is not None and len(design.groups or {}) <= 1:
        return analysis is not None and _choice_decided(analysis, [a for a in design.rank(table) if a != AA],
                                                        design.primary.higher_is_better)
    return analysis is not None and analysis.decided(design.decide)


def run_design(design: Design, measure: Callable[[object, int], Measured],
               prepare: Callable[[object], float | None] | None = None, *, run_dir=None,
               clock: Callable[[], float] = time.time, progress: bool = True,
               measure_aa: Callable[[object, int], Measured] | None = None) -> DesignResult:
    """Measure a design round by round until its primary comparison is decided, its rounds run out or its budget
    does; analyse it.

    Rounds: ``min_rounds`` first; then, at each look of the plan, the primary outcome is analysed at the look's
    spent alpha (:func:`workbench.stats.sequential.look_alpha`, O'Brien-Fleming-type by default) and the design stops
    when every arm of ``design.decide`` (default: every arm) has a direction or is equivalent (or, with
    ``design.judge``, when the judge says its own comparison is decided), unless its A/A control claims a direction
    at that look (:func:`_decided`; the look's ``aa_moved``). Between looks it
    measures whole rounds; a round beyond ``min_rounds`` starts only when the budget has room for one more round
    at the mean round time so far. A stop for the budget is analysed at the alpha the looks before it left (no look
    follows it).

    Args:
        design: the :class:`Design`.
        measure: ``measure(arm, round) -> Measured`` (the A/A arm is measured as ``measure(design.control, round)``
            and filed under :data:`AA`).
        prepare: ``prepare(arm) -> warm-up seconds`` once per arm before its first measurement this session
            (warm-up, loading); None: nothing.
        run_dir: the run folder: every finished round is written to ``design/<experiment>.parquet`` (and its
            requests beside it), and a run folder holding finished rounds of the same design continues from them.
        clock: the time source (tests pass a fake one).
        progress: print a line per round to stderr.
        measure_aa: how the A/A arm is measured (``measure_aa(design.control, round)``), where it may skip what only
            a recorded arm needs (scoring, saving texts); its timed work must equal ``measure``'s. None: ``measure``.

    Returns:
        :class:`DesignResult`.
    """
    from tqdm.auto import tqdm

    names = [o.name for o in (design.primary, *design.secondary)]
    table, req = design_store.load_rounds(run_dir, design)
    done = sorted(set(table["round"])) if not table.empty else []
    rows = table.to_dict("records") if not table.empty else []
    req_rows = req.to_dict("records") if not req.empty else []
    if done:
        print(f"{design.experiment}: continuing the design after {len(done)} finished rounds", file=sys.stderr)
    warm = {}
    begun = clock()
    deadline = _deadline(design, begun)
    plan = design.plan
    looks: list[dict] = []
    rnd = len(done)
    seconds = float(table["seconds"].sum()) if not table.empty else 0.0
    stopped = "max rounds"
    analysis = None
    for k in [r for r in plan if r <= rnd]:          # a resumed design replays its looks: decided stays decided
        alpha = sequential.look_alpha(k, plan, blocks.ALPHA, design.spending)
        analysis = analyse_outcome(table[table["round"] < k], design, design.primary, alpha)
        decided = _decided(design, table[table["round"] < k], analysis, alpha)
        looks.append({"rounds": k, "alpha": alpha, "decided": bool(decided), "aa_moved": _aa_moved(analysis)})
        if decided:
            rows = [r for r in rows if r["round"] < k]
            req_rows = [r for r in req_rows if r["repeat"] < k]
            rnd, stopped = k, "decided"
            break
    bar = tqdm(total=design.max_rounds, initial=rnd, desc=f"{design.experiment} rounds", unit="round",
               file=sys.stderr, mininterval=1.0, disable=not progress)
    while rnd < design.max_rounds and stopped != "decided":
        if rnd >= design.min_rounds:
            per_round = seconds / rnd if rnd else 0.0
            if clock() + per_round > deadline:
                stopped = "budget"
                break
        if prepare is not None:
            for a in design.arms:
                if a not in warm:
                    warm[a] = prepare(a) or 0.0
        t0 = clock()
        this, this_req = [], []
        for arm in _order(design, rnd):
            target = design.control if arm == AA else arm
            t1 = clock()
            got = (measure_aa if arm == AA and measure_aa is not None else measure)(target, rnd)
            spent = clock() - t1
            bad = [n for n in names if not (isinstance(got.values.get(n), (int, float))
                                            and math.isfinite(got.values[n]) and got.values[n] > 0)]
            if bad:
                raise ValueError(f"{design.experiment}: arm {arm} round {rnd}: no positive value of {', '.join(bad)} "
                                 f"(got {got.values})")
            this.append({"round": rnd, "arm": str(arm), **{n: float(got.values[n]) for n in names},
                         "wall_s": float(got.wall_s), "seconds": spent,
                         "extra": json.dumps(got.extra, default=str) if got.extra else ""})
            for rec in got.requests:
                this_req.append({**rec, "repeat": rnd, "_arm": str(arm)})
        rows += this
        req_rows += this_req
        seconds += clock() - t0
        rnd += 1
        bar.update(1)
        design_store.save_rounds(run_dir, design, pd.DataFrame(rows), pd.DataFrame(req_rows))
        if rnd in plan:
            alpha = sequential.look_alpha(rnd, plan, blocks.ALPHA, design.spending)
            analysis = analyse_outcome(pd.DataFrame(rows), design, design.primary, alpha)
            decided = _decided(design, pd.DataFrame(rows), analysis, alpha)
            looks.append({"rounds": rnd, "alpha": alpha, "decided": bool(decided), "aa_moved": _aa_moved(analysis)})
            if decided:
                stopped = "decided"
                break
    bar.close()
    table = pd.DataFrame(rows)
    if stopped == "budget" and looks:
        # no look follows a budget stop: its analysis spends the alpha the looks so far left (union bound over every
        # analysis taken, as sequential.py's looks), not only the share planned up to these rounds; a budget that
        # stops a design at its first look would otherwise leave it there, at a few tenths of alpha
        alpha = max(blocks.ALPHA - sum(k["alpha"] for k in looks), 1e-12)
        analysis = analyse_outcome(table, design, design.primary, alpha)
        looks.append({"rounds": rnd, "alpha": alpha, "decided": bool(analysis and analysis.decided(design.decide))})
    elif not looks or looks[-1]["rounds"] != rnd:       # stopped between looks: analysed at what it spent
        alpha = sequential.look_alpha(rnd, plan, blocks.ALPHA, design.spending) if rnd >= 1 else blocks.ALPHA
        analysis = analyse_outcome(table, design, design.primary, alpha)
        looks.append({"rounds": rnd, "alpha": alpha, "decided": bool(_decided(design, table, analysis, alpha))})
    if rnd < 2:
        stopped = "one round"
    final_alpha = looks[-1]["alpha"]
    secondary = {o.name: analyse_outcome(table, design, o, final_alpha / max(len(design.secondary), 1))
                 for o in design.secondary}
    requests, extras = {}, {}
    for rec in req_rows:
        arm = rec.pop("_arm")
        requests.setdefault(arm, []).append(rec)
    for row in rows:
        extras.setdefault(row["arm"], []).append(json.loads(row["extra"]) if row.get("extra") else {})
    keys = {str(a): a for a in design.arms}
    design_store.save_description(run_dir, design, rnd, seconds, stopped, looks)
    requests = {keys.get(k, k): v for k, v in requests.items()}
    extras = {keys.get(k, k): v for k, v in extras.items()}
    return DesignResult(design, table, requests, extras, analysis, secondary, rnd, seconds, stopped, looks, warm)


def design_rows(result: DesignResult, arm) -> list[dict]:
    """The request records of one arm over the design's rounds (``repeat`` = round)."""
    return list(result.requests.get(arm, []))


finished_rounds = design_store.finished_rounds


__all__ = ["AA", "DEFAULT_SIGMA", "Design", "DesignFields", "DesignResult", "Measured", "Outcome", "analyse_outcome",
           "check_margin", "check_rounds", "decision_from_row", "design_rows", "evidence_text", "finding_fields",
           "finished_rounds", "plan_text", "reanalyse", "recalled_spread", "remember_spread", "run_design",
           "secondary_clause", "smallest_effect", "versus_runner_up", "weakest"]
