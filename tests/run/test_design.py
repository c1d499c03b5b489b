"""Tests for workbench.run.design: the A/A arm's own measure function, and the verdict of a finding that rests on
several comparisons."""

import math

import pytest

from workbench.run import design
from workbench.stats import blocks


def _decision(verdict, need=0, direction=""):
    return blocks.Decision("x", "c", 1.0, 0.9, 1.1, 0.95, verdict, direction, 1.05, 4, 6.0, "m", math.nan, need)


def test_the_weakest_decision_sets_a_joint_verdict():
    """One comparison per family / language / batch size: any undecided one leaves the finding undecided (the one
    needing the most rounds, "more than any" first), else a direction, else equivalent."""
    eq, up = _decision("equivalent"), _decision("direction", direction="higher")
    few, many, unknown = _decision("undecided", 6), _decision("undecided", 20), _decision("undecided", None)
    assert design.weakest([eq, few, up, many]) is many
    assert design.weakest([eq, many, unknown]) is unknown
    assert design.weakest([eq, up, None]) is up and design.weakest([eq]) is eq
    assert design.weakest([None]) is None and design.weakest([]) is None


def test_the_aa_arm_is_measured_by_its_own_function_when_given():
    """``measure_aa`` measures the A/A arm (the same timed work, without scoring or saving), ``measure`` every arm;
    the A/A rows are filed under the A/A arm either way."""
    calls = []

    def measure(arm, rnd):
        calls.append(("arm", arm, rnd))
        return design.Measured({"t_s": 1.0 + 0.01 * rnd + (0.1 if arm == "b" else 0.0)})

    def measure_aa(arm, rnd):
        calls.append(("aa", arm, rnd))
        return design.Measured({"t_s": 1.0 + 0.01 * rnd + 0.001})

    d = design.Design("x", ["a", "b"], "a", design.Outcome("t_s", False), min_rounds=2, max_rounds=2)
    got = design.run_design(d, measure, measure_aa=measure_aa, progress=False)
    assert sorted(c for c in calls if c[0] == "aa") == [("aa", "a", 0), ("aa", "a", 1)]
    assert sorted(c[1] for c in calls if c[0] == "arm") == ["a", "a", "b", "b"]
    assert (got.table["arm"] == blocks.AA).sum() == 2
    plain = design.run_design(d, measure, progress=False)               # without it, measure does the A/A arm too
    assert (plain.table["arm"] == blocks.AA).sum() == 2 and len([c for c in calls if c[0] == "arm"]) == 4 + 6


def test_a_secondary_outcome_is_said_without_the_primarys_rounds_needed():
    """A point row's ``rounds_needed`` is the primary outcome's: a secondary's undecided clause names its interval
    only, never that estimate."""
    second = design.Outcome("first_s", False, "first text", "first_vs")
    row = {"point_id": "b", "rounds": 4, "margin": 1.05, "rounds_needed": 0.0, "first_vs": 0.97, "first_vs_low": 0.9,
           "first_vs_high": 1.04, "first_vs_level": 0.95, "first_vs_verdict": "undecided", "first_vs_direction": "",
           "first_vs_method": "pooled block model, 6 dof"}
    said = design.secondary_clause(row, second, "first text")
    assert said == "first text: undecided: 0.97x, 95% interval 0.90-1.04x (pooled block model, 6 dof)"
    decided = design.secondary_clause({**row, "first_vs_verdict": "direction", "first_vs_direction": "lower",
                                       "first_vs_high": 0.99}, second, "first text")
    assert decided.startswith("first text: faster, 0.97x")
    assert design.secondary_clause({"point_id": "c"}, second, "first text") is None


def test_a_budget_stop_spends_the_alpha_the_looks_left():
    """A design planned for 2..8 rounds (looks at 2, 4, 8) whose budget stops it after 3 rounds: no look follows, so
    its last analysis spends what the look at 2 left (union bound over the analyses taken), not the sliver planned up
    to 3 of 8 rounds (where a slow machine would leave every such design)."""
    from workbench.stats import sequential

    now = [0.0]

    def clock():
        return now[0]

    def measure(arm, rnd):
        now[0] += 10.0                                                     # every measurement takes 10 s
        return design.Measured({"t_s": (1.0 + 0.01 * rnd) * (1.02 if arm == "b" else 1.0) * (1 + 0.001 * (rnd % 2))})

    d = design.Design("x", ["a", "b"], "a", design.Outcome("t_s", False), min_rounds=2, max_rounds=8, budget_s=95.0)
    got = design.run_design(d, measure, clock=clock, progress=False)
    assert got.rounds == 3 and got.stopped == "budget"                      # 30 s a round: the 4th would pass 95 s
    first = sequential.look_alpha(2, d.plan)
    assert [k["rounds"] for k in got.looks] == [2, 3]
    assert got.looks[-1]["alpha"] == pytest.approx(blocks.ALPHA - first)
    assert got.looks[-1]["alpha"] > sequential.look_alpha(3, d.plan)
    assert got.analysis.alpha == pytest.approx(blocks.ALPHA - first)
