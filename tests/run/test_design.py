"""The design runner (workbench/run/design.py) on fake measurements and a fake clock: the order of a round, the
looks and the stop rule, the budget, resume by round after an interrupt, the sweep's points and their columns,
and what ``workbench plan`` prints. No model."""

import math

import numpy as np
import pandas as pd
import pytest

from workbench.errors import ParameterError
from workbench.run import design, design_plan, design_sweep, results, sweeps
from workbench.stats import blocks


class Fake:
    """Arms with log effects, a round drift shared by every arm, a clock that advances one second a measurement."""

    def __init__(self, effects, sigma=0.03, seed=0, fail_at=None):
        self.effects, self.sigma, self.rng = effects, sigma, np.random.default_rng(seed)
        self.now, self.calls, self.fail_at = 1000.0, [], fail_at
        self.drift = {}

    def clock(self):
        return self.now

    def measure(self, arm, rnd):
        if self.fail_at is not None and (rnd, len([c for c in self.calls if c[1] == rnd])) == self.fail_at:
            raise KeyboardInterrupt
        self.calls.append((arm, rnd))
        self.now += 1.0
        d = self.drift.setdefault(rnd, self.rng.normal(0, 0.2))
        v = math.exp(self.effects[arm] + d + self.rng.normal(0, self.sigma))
        return design.Measured({"tps": v}, [{"e2e_s": 1 / v, "output_tokens": 4}], wall_s=1 / v)


TPS = design.Outcome("tps", True, "throughput", "throughput_ratio")


def test_a_large_effect_stops_at_the_first_look():
    fake = Fake({"a": 0.0, "b": 1.0, "c": 1.5})
    d = design.Design("x", ["a", "b", "c"], "a", TPS, min_rounds=3, max_rounds=12)
    r = design.run_design(d, fake.measure, clock=fake.clock, progress=False)
    assert r.stopped == "decided" and r.rounds == 3 and [lk["rounds"] for lk in r.looks] == [3]
    # every round measures every arm once and the control again as the A/A arm, in a shuffled order
    assert len(fake.calls) == 3 * 4 and [c[0] for c in fake.calls].count("a") == 6
    orders = [[c[0] for c in fake.calls if c[1] == k] for k in range(3)]
    assert len({tuple(o) for o in orders}) > 1
    assert r.decision("b").verdict == "direction" and r.decision("b").direction == "higher"
    assert set(r.requests) == {"a", "b", "c", design.AA} and len(r.requests["b"]) == 3


def test_a_best_of_design_stops_once_its_choice_is_decided_not_every_arm():
    """With ``rank`` the stop rule is the finding's choice (issue 49): the pick ("c", 4.5x) is decided against
    the control and against its runner-up ("b", 2.7x) at the first look while "small" (2% over the control) is
    still open, so the design stops there; without it the open arm keeps it measuring to its last look. An arm the
    finding would never pick (here "d", the fastest: an SLO it misses) is left out of the ranking; when the ranking
    puts the control first, every other ranked arm must be decided."""
    effects = {"a": 0.0, "small": 0.02, "b": 1.0, "c": 1.5, "d": 2.0}
    arms = list(effects)
    plain = design.Design("x", arms, "a", TPS, min_rounds=3, max_rounds=9)
    fake = Fake(effects, seed=0)
    r = design.run_design(plain, fake.measure, clock=fake.clock, progress=False)
    assert r.rounds == 9 and not r.looks[0]["decided"] and not r.decision("small").decided
    seen = []

    def rank(table):   # the finding's order: fastest first, "d" never picked
        seen.append(sorted(set(table["arm"])))
        mean = table[table["arm"] != design.AA].groupby("arm")["tps"].mean()
        return [a for a in mean.sort_values(ascending=False).index if a != "d"]

    best = design.Design("x", arms, "a", TPS, min_rounds=3, max_rounds=9, rank=rank)
    fake = Fake(effects, seed=0)
    r = design.run_design(best, fake.measure, clock=fake.clock, progress=False)
    assert r.stopped == "decided" and r.rounds == 3 and not r.decision("small").decided
    assert seen and design.AA in seen[0]                      # the rounds so far, A/A rows included
    assert rank(r.table)[:2] == ["c", "b"] and blocks.pick_versus(r.analysis, "c", "b").decided
    # the control first (every other arm slower): the baseline is kept only once each ranked arm is decided
    slower = {"a": 0.0, "small": -0.02, "b": -1.0}
    keep = design.Design("x", list(slower), "a", TPS, min_rounds=3, max_rounds=9,
                         rank=lambda t: ["a", "b", "small"])
    fake = Fake(slower, seed=0)
    r = design.run_design(keep, fake.measure, clock=fake.clock, progress=False)
    assert r.rounds > 3 or r.decision("small").decided


def test_a_kept_control_stops_only_when_every_ranked_arm_is_worse_or_equivalent():
    """The stop rule with the control ranked first by the design's own order (batch size: goodput under the SLO)
    is the finding's (blocks.keep_control): an arm decided *better* on the outcome but ranked below the control
    keeps the design measuring, as it keeps the finding undecided ("none shown faster, but not every larger batch
    is decided slower"); before, any decided arm stopped it and the finding was left open at its first look."""
    effects = {"a": 0.0, "b": 1.0}                     # b 2.7x the control's throughput, ranked below it
    d = design.Design("x", list(effects), "a", TPS, min_rounds=3, max_rounds=9, rank=lambda t: ["a", "b"])
    fake = Fake(effects, seed=0)
    r = design.run_design(d, fake.measure, clock=fake.clock, progress=False)
    assert r.looks[0]["rounds"] == 3 and r.decision("b").direction == "higher"
    assert not r.looks[0]["decided"] and r.rounds == 9
    assert not design._choice_decided(r.analysis, ["a", "b"], higher_is_better=True)
    assert design._choice_decided(r.analysis, ["a", "b"], higher_is_better=False)   # a time: b is slower


def test_an_open_comparison_gets_rounds_until_its_last_look():
    fake = Fake({"a": 0.0, "b": 0.02})                   # 2%: inside the margin band, too small to call early
    d = design.Design("x", ["a", "b"], "a", TPS, min_rounds=3, max_rounds=8)
    r = design.run_design(d, fake.measure, clock=fake.clock, progress=False)
    assert [lk["rounds"] for lk in r.looks][:2] == [3, 6] and r.rounds in (6, 8)
    assert sum(lk["alpha"] for lk in r.looks) <= 0.05 + 1e-12


def test_the_budget_stops_rounds_beyond_the_minimum():
    fake = Fake({"a": 0.0, "b": 0.02})
    d = design.Design("x", ["a", "b"], "a", TPS, min_rounds=3, max_rounds=8, budget_s=10.0)   # 3 s a round
    r = design.run_design(d, fake.measure, clock=fake.clock, progress=False)
    assert r.stopped == "budget" and r.rounds == 3      # the minimum is always measured; a 4th would pass 10 s
    assert r.analysis is not None and r.looks[-1]["rounds"] == 3


def test_the_suite_deadline_stops_it_too(monkeypatch):
    fake = Fake({"a": 0.0, "b": 0.02})
    monkeypatch.setenv(design.DEADLINE_ENV, str(fake.now + 12.0))
    r = design.run_design(design.Design("x", ["a", "b"], "a", TPS, min_rounds=2, max_rounds=8), fake.measure,
                          clock=fake.clock, progress=False)
    assert r.stopped == "budget" and r.rounds == 4        # 3 s a round: the 5th would end past the deadline


def test_an_interrupted_design_resumes_from_its_last_finished_round():
    run = results.create_run()
    d = design.Design("x", ["a", "b"], "a", TPS, min_rounds=4, max_rounds=4)
    first = Fake({"a": 0.0, "b": 0.3}, fail_at=(2, 1))   # Ctrl-C in the middle of round 2
    with pytest.raises(KeyboardInterrupt):
        design.run_design(d, first.measure, clock=first.clock, run_dir=run, progress=False)
    stored = pd.read_parquet(run / "design" / "x.parquet")
    assert sorted(stored["round"].unique()) == [0, 1]    # the finished rounds only
    second = Fake({"a": 0.0, "b": 0.3}, seed=1)
    r = design.run_design(d, second.measure, clock=second.clock, run_dir=run, progress=False)
    assert {c[1] for c in second.calls} == {2, 3}         # nothing measured twice
    assert r.rounds == 4 and sorted(r.table["round"].unique()) == [0, 1, 2, 3]
    assert sorted(rec["repeat"] for rec in r.requests["b"]) == [0, 1, 2, 3]
    again = design.run_design(d, Fake({"a": 0.0, "b": 0.3}).measure, run_dir=run, progress=False)
    assert again.rounds == 4                              # a finished design is not measured again
    d2, an = design.reanalyse(run, "x")
    assert an.arms["b"].estimate == pytest.approx(r.decision("b").estimate)


def test_a_design_is_a_sweeps_points_with_their_decisions():
    fake = Fake({"b=1": 0.0, "b=2": 0.7, "b=4": 1.2})
    points = [{"batch_size": 1}, {"batch_size": 2}, {"batch_size": 4}]
    ids = [f"toy/batch_size={b}" for b in (1, 2, 4)]
    d = design.Design("toy", ids, ids[0], TPS, min_rounds=3, max_rounds=3)
    sd = design_sweep.SweepDesign(d, lambda p, rnd: fake.measure(f"b={p['batch_size']}", rnd), prepare=lambda p: 0.5,
                            extra=lambda pid, res: {"exact_match": 1.0})
    run = results.create_run()
    pts = sweeps.run_sweep(run, "toy", points, lambda p: pytest.fail("the design measures"), design=sd)
    assert list(pts["status"]) == ["ok"] * 3 and (pts["rounds"] == 3).all()
    two = pts[pts["batch_size"] == 2].iloc[0]
    assert two["throughput_ratio_verdict"] == "direction" and two["throughput_ratio_low"] > 1
    assert pts.loc[pts["batch_size"] == 1, "throughput_ratio"].iloc[0] == 1.0 and two["exact_match"] == 1.0
    assert two["warmup_s"] == 0.5 and isinstance(two["aa_verdict"], str)
    req = results.read_requests(run, "toy")
    assert sorted(req[req["batch_size"] == 2]["repeat"]) == [0, 1, 2]
    row = two.to_dict()
    dec = design.decision_from_row(row, TPS)
    assert dec.verdict == "direction" and dec.low == pytest.approx(two["throughput_ratio_low"])
    fields = design.finding_fields(row, dec)
    assert fields["verdict"] == "direction" and fields["rounds"] == 3 and fields["margin"] == 1.05


def test_bad_designs_are_one_line_errors():
    with pytest.raises(ParameterError, match="control"):
        design.Design("x", ["a", "b"], "z", TPS)
    with pytest.raises(ParameterError, match="arms"):
        design.Design("x", ["a"], "a", TPS)
    with pytest.raises(ParameterError, match="max_rounds"):
        design.Design("x", ["a", "b"], "a", TPS, min_rounds=4, max_rounds=3)
    with pytest.raises(ParameterError, match="margin"):
        design.Design("x", ["a", "b"], "a", TPS, margin=0.9)
    fake = Fake({"a": 0.0, "b": 0.0})
    bad = (lambda arm, rnd: design.Measured({"tps": 0.0}))
    with pytest.raises(ValueError, match="no positive value of tps"):
        design.run_design(design.Design("x", ["a", "b"], "a", TPS), bad, clock=fake.clock, progress=False)


def test_plan_text_names_the_smallest_decidable_effect(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    text = design_plan.plan_text("toy", 3, 3, 8, seconds_per_measurement=2.0)
    assert "smallest decidable effect" in text and "assumed spread" in text and "~24-64 s" in text
    r = design.run_design(design.Design("toy", ["a", "b"], "a", TPS, min_rounds=3, max_rounds=3),
                          Fake({"a": 0.0, "b": 0.5}).measure, progress=False)
    design_plan.remember_spread(r, "RUN1")
    assert "run RUN1 measured on this machine" in design_plan.plan_text("toy", 2, 3, 8)
    # a quick run's seconds are not a default run's (a new user's trial: the default plan said "3-6 rounds ~3-6 s" for
    # temperature from a quick run): its spread is lent to another suite's plan, its seconds are not
    quick = results.create_run("quick")
    results.update_manifest(quick, suite="/x/suites/quick.yaml")
    r2 = design.run_design(design.Design("toy2", ["a", "b"], "a", TPS, min_rounds=3, max_rounds=3),
                           Fake({"a": 0.0, "b": 0.5}).measure, progress=False)
    design_plan.remember_spread(r2, quick)
    assert design_plan.recalled_spread("toy2", "quick")["suite"] == "quick"
    in_quick = design_plan.plan_text("toy2", 2, 3, 3, seconds_per_measurement=100.0, suite="quick")
    in_default = design_plan.plan_text("toy2", 2, 3, 3, seconds_per_measurement=100.0, suite="default")
    assert f"run {quick.name} measured on this machine" in in_quick and "~900 s" not in in_quick
    assert f"run {quick.name} measured on this machine, in a run of suite quick" in in_default and "~900 s" in in_default
    # the record is the machine's, shared by every clone: a run of another checkout, or one deleted since, says so
    other = tmp_path / "other_clone" / "results" / quick.name
    other.mkdir(parents=True)
    design_plan.remember_spread(r2, other)
    assert f"run {quick.name} (in {other.parent}) measured" in design_plan.plan_text("toy2", 2, 3, 3)
    other.rmdir()
    assert f"run {quick.name} (no longer on disk) measured" in design_plan.plan_text("toy2", 2, 3, 3)
    monkeypatch.setattr(design_plan, "recalled_spread", lambda exp, suite="": {"sigma": 0.5, "run_id": "NOISY"})
    assert "cannot decide an effect below 2x" in design_plan.plan_text("noisy", 2, 2, 2)
    assert "cannot decide" not in design_plan.plan_text("noisy", 2, 3, 200)


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


def test_a_look_whose_aa_control_moved_takes_another_round():
    """A look where the A/A control claims a direction does not stop the design (issue 49, 2026-12-07: the default
    run T2's batch-size design stopped "decided" at 2 rounds with its A/A control at 1.19x, 1.03-1.38x, and its points
    were then voided by the sweep's drift pair): the machine moved within a round, and another round while the plan
    has one lets the blocks absorb it. Here the A/A arm reads 50% fast in the first three rounds only."""
    fake = Fake({"a": 0.0, "b": 1.0})

    def measure_aa(arm, rnd):
        got = fake.measure(arm, rnd)
        return design.Measured({"tps": got.values["tps"] * (1.5 if rnd < 3 else 1.0)}, got.requests, got.wall_s)

    d = design.Design("x", ["a", "b"], "a", TPS, min_rounds=3, max_rounds=6)
    r = design.run_design(d, fake.measure, clock=fake.clock, progress=False, measure_aa=measure_aa)
    first = r.looks[0]
    assert first["rounds"] == 3 and first["aa_moved"] and not first["decided"]
    three = design.analyse_outcome(r.table[r.table["round"] < 3], d, TPS, first["alpha"])
    assert three.arms["b"].verdict == "direction"          # what stopped it before: b against a decided at 3 rounds
    assert r.rounds == 6 and len(r.looks) == 2 and r.looks[-1]["rounds"] == 6
    steady = Fake({"a": 0.0, "b": 1.0})                   # the same design with a steady A/A arm stops at 3
    r2 = design.run_design(d, steady.measure, clock=steady.clock, progress=False)
    assert r2.stopped == "decided" and r2.rounds == 3 and not r2.looks[0]["aa_moved"]


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


def test_the_controls_tpot_between_rounds_is_the_designs_speed_reading():
    """``round_speed_drift``: the largest change of the control's median request TPOT from one round to the next
    (the machine's speed, what the sweep's drift reference measures), while ``round_drift`` follows the primary
    outcome - here a queue statistic that jumps 3x from round to round with the speed steady. The A/A arm's requests
    are not the control's; NaN where the requests carry no TPOT."""
    speed = {0: 0.100, 1: 0.110, 2: 0.105}          # the control's TPOT per round: at most +10% between neighbours
    queue = {0: 0.5, 1: 1.5, 2: 0.5}                 # its primary outcome: 3x between rounds

    def measure(arm, rnd):
        tpot = speed[rnd] * (1.3 if arm == "b" else 1.0)
        return design.Measured({"ttft_s": queue[rnd] * (1.2 if arm == "b" else 1.0)},
                               [{"tpot_s": tpot * f, "ttft_s": queue[rnd]} for f in (0.9, 1.0, 1.1)] +
                               [{"tpot_s": float("nan")}])

    def measure_aa(arm, rnd):
        return design.Measured({"ttft_s": queue[rnd]}, [{"tpot_s": 10.0}])   # never the control's reading

    d = design.Design("x", ["a", "b"], "a", design.Outcome("ttft_s", False), min_rounds=3, max_rounds=3)
    got = design.run_design(d, measure, measure_aa=measure_aa, progress=False)
    assert got.speed_drift() == pytest.approx(0.1)
    cols = got.point_columns("b")
    assert cols["round_speed_drift"] == pytest.approx(0.1) and cols["round_drift"] == pytest.approx(2.0)
    bare = design.run_design(d, lambda arm, rnd: design.Measured({"ttft_s": queue[rnd]}), progress=False)
    assert math.isnan(bare.speed_drift()) and math.isnan(bare.point_columns("b")["round_speed_drift"])

    # a client that cannot time tokens (streamed through a buffering proxy: no tpot_s), with the server's own first-
    # and last-token times: the speed reading is the engine's TPOT (the streaming reader's nginx design had none, so
    # 11% CPU steal over it voided every path while its decode speed held)
    def proxied(arm, rnd):
        ttft = queue[rnd]
        return design.Measured({"ttft_s": ttft}, [{"tpot_s": float("nan"), "engine_ttft_s": 0.2, "output_tokens": 41,
                                                   "engine_e2e_s": 0.2 + 40 * speed[rnd]}])
    via_proxy = design.run_design(d, proxied, progress=False)
    assert via_proxy.speed_drift() == pytest.approx(0.1) and via_proxy.point_columns("b")["round_speed_drift"] == \
        pytest.approx(0.1)
