"""The design runner (workbench/run/design.py) on fake measurements and a fake clock: the order of a round, the
looks and the stop rule, the budget, resume by round after an interrupt, the sweep's points and their columns,
and what ``workbench plan`` prints. No model."""

import math

import numpy as np
import pandas as pd
import pytest

from workbench.errors import ParameterError
from workbench.run import design, results, sweeps


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
    sd = design.SweepDesign(d, lambda p, rnd: fake.measure(f"b={p['batch_size']}", rnd), prepare=lambda p: 0.5,
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
    text = design.plan_text("toy", 3, 3, 8, seconds_per_measurement=2.0)
    assert "smallest decidable effect" in text and "assumed spread" in text and "~24-64 s" in text
    r = design.run_design(design.Design("toy", ["a", "b"], "a", TPS, min_rounds=3, max_rounds=3),
                          Fake({"a": 0.0, "b": 0.5}).measure, progress=False)
    design.remember_spread(r, "RUN1")
    assert "run RUN1 measured here" in design.plan_text("toy", 2, 3, 8)
    monkeypatch.setattr(design, "recalled_spread", lambda exp: {"sigma": 0.5, "run_id": "NOISY"})
    assert "cannot decide an effect below 2x" in design.plan_text("noisy", 2, 2, 2)
    assert "cannot decide" not in design.plan_text("noisy", 2, 3, 200)
