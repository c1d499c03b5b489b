"""Comparison designs (workbench/stats/comparison.py): A/A trials under injected drift, best-of-m, the schedule.

A fake measurement source drifts by a per-block speed offset of 4-7% (the size seen between back-to-back drift
references on this machine, issue 32): the old blocked design (each arm's repeats back to back, Welch over the
repeats) claims a direction in identical arms far above its nominal 5%; the interleaved design (paired by
round) stays near it.
"""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest

from workbench.errors import ParameterError
from workbench.stats import comparison, evidence


class DriftingSource:
    """Latencies of identical arms: 1 s x a speed offset that changes every ``block_len`` measurements (magnitude
    uniform in 4-7%, random sign) x 2% log-normal noise per measurement."""

    def __init__(self, seed: int, block_len: int = 10, noise_sd: float = 0.02):
        self.rng = random.Random(seed)
        self.block_len, self.noise_sd, self.n, self.offset = block_len, noise_sd, 0, 0.0

    def __call__(self, *_):
        if self.n % self.block_len == 0:
            self.offset = self.rng.choice((-1, 1)) * self.rng.uniform(0.04, 0.07)
        self.n += 1
        return math.exp(self.offset + self.rng.gauss(0, self.noise_sd))


def _interleaved(arms, rounds, seed, adjust=True):
    src = DriftingSource(seed)
    order = comparison.schedule(arms, rounds, seed)
    rows = [{"arm": a, "round": u, "value": v} for u, a, v in comparison.run_schedule(order, src)]
    return comparison.compare(pd.DataFrame(rows), arms[0], adjust=adjust)


def test_blocked_design_claims_drift_interleaved_does_not():
    """600 A/A trials (>= 200) of 10 repeats an arm: blocked > 20% directions, interleaved <= 7%."""
    trials, n = 600, 10  # the interleaved rate is nominal 5% (1,500 trials: 5.1%); 600 keep its sd below 1%
    old = new = 0
    for t in range(trials):
        src = DriftingSource(t)
        a = [src() for _ in range(n)]  # arm A's block, then arm B's: the old configuration-outermost loop
        b = [src() for _ in range(n)]
        old += comparison.claims_direction(comparison.blocked_interval(b, a))
        c = _interleaved(["A", "B"], n, t)
        new += comparison.claims_direction(c.arms["B"].interval)
    assert old / trials > 0.20
    assert new / trials <= 0.07


def test_best_of_eight_equal_configurations_rarely_called_faster():
    """8 equal configurations + the A/A control, interleaved, Holm over the 7 comparisons: the fastest one is
    called faster than the baseline in <= 5% of 200 trials (unadjusted, the same picks do so more often)."""
    arms = [f"c{i}" for i in range(8)] + [comparison.AA]
    trials = 200
    held = unadjusted = 0
    for t in range(trials):
        c = _interleaved(arms, 8, 1000 + t)
        best = min(c.arms.values(), key=lambda r: r.interval.estimate)
        held += best.verdict == "lower" and c.supported(best.arm)
        raw = _interleaved(arms, 8, 1000 + t, adjust=False)
        rbest = min(raw.arms.values(), key=lambda r: r.interval.estimate)
        unadjusted += rbest.verdict == "lower"
    assert held / trials <= 0.05
    assert unadjusted > held  # the adjustment is what holds it down


def test_real_effect_is_found_and_aa_columns():
    """A 20% faster arm is called faster through drift; the A/A control gives the point columns."""
    src = DriftingSource(7)
    order = comparison.schedule(["base", "fast", comparison.AA], 8, seed=3)
    rows = [{"arm": a, "round": u, "value": src() * (0.8 if a == "fast" else 1.0)}
            for u, a in order]
    c = comparison.compare(pd.DataFrame(rows), "base")
    assert c.arms["fast"].verdict == "lower" and c.supported("fast")
    cols = c.columns()
    assert set(cols) == set(comparison.COLUMNS) and cols["design"] == "interleaved" and cols["rounds"] == 8
    assert cols["aa_low"] <= cols["aa_ratio"] <= cols["aa_high"]
    assert "A/A noise floor" in c.describe("fast")


def test_aa_moved_makes_findings_unsupported():
    """An A/A control that differs (a 30% slower second baseline) marks every comparison not supported."""
    rows = [{"arm": a, "round": r, "value": {"base": 1.0, "x": 0.5, comparison.AA: 1.3}[a] * (1 + 0.01 * (r % 3))}
            for r in range(5) for a in ("base", "x", comparison.AA)]
    c = comparison.compare(pd.DataFrame(rows), "base")
    assert c.aa_moved and not c.supported("x")
    assert comparison.AA_MOVED in c.describe("x")


def test_schedule_orders():
    s = comparison.schedule(["A", "B", "C"], 4, seed=1)
    assert len(s) == 12 and all(sorted(a for u, a in s if u == r) == ["A", "B", "C"] for r in range(4))
    assert s == comparison.schedule(["A", "B", "C"], 4, seed=1)
    assert [a for _, a in comparison.schedule(["A", "B"], 2, design="blocks", per_block=2)] == list("AABBBBAA")
    assert [a for _, a in comparison.schedule(["A", "B"], 2, design="blocks")] == ["A", "B", "B", "A"]
    with pytest.raises(ParameterError, match="rounds"):
        comparison.schedule(["A", "B"], 1, design="blocks")
    with pytest.raises(ParameterError, match="design"):
        comparison.schedule(["A"], 2, design="random")


def test_joined_finding_mark_agrees_with_its_headline():
    """Issue 32: a joined finding was supported when any part was ("Scheduling: not supported: ..." joined with
    a supported prefix-sharing part was marked supported); now its mark is its headline's."""
    main = evidence.Finding("Scheduling: not supported: no policy's interactive TTFT interval is below fcfs.",
                            "8 requests", False, ("a",))
    prefix = evidence.Finding("Prefix sharing: 1.4x faster TTFT.", "5 requests", True, ("b",))
    joined = evidence.join([main, prefix])
    assert not joined.supported and joined.point_ids == ("a", "b")
    assert evidence.join([prefix, main]).supported
    # a first sentence that says no difference is never marked supported, whatever the caller passed
    f = evidence.Finding("Accuracy 50% -> 42%: no difference beyond noise. Thinking makes the answer later.",
                         "", True)
    assert not f.supported and not evidence.Finding.from_value({"text": f.text, "supported": True}).supported
    assert evidence.Finding("Budget 0 -> 32: accuracy rises 0.42 -> 0.60. Later answers: not supported.").supported


def test_drift_between_neighbouring_rounds_is_reported():
    """A baseline that jumps 40% from one round to the next is reported beside the ratios it does not bias."""
    rows = [{"arm": a, "round": r, "value": (1.4 if r == 2 else 1.0) * (0.5 if a == "x" else 1.0)}
            for r in range(4) for a in ("base", "x", comparison.AA)]
    c = comparison.compare(pd.DataFrame(rows), "base")
    assert c.columns()["round_drift"] == pytest.approx(0.4) and c.drift_moved
    assert "moved 40% between neighbouring rounds" in comparison.drift_text(c.columns()["round_drift"])
    assert comparison.drift_text(0.05) == ""


def test_compare_within_tasks_pairs_each_task_within_its_round():
    """Three tasks of different lengths (1x, 2x, 4x), each measured by both arms in every round: the pair is the
    (round, task) unit, so the tasks' own spread is no noise; ``rounds`` counts rounds and the drift is the
    baseline's change between neighbouring rounds on one task, not the 4x between tasks."""
    rows = [{"arm": a, "round": r, "task": t, "value": (1, 2, 4)[t] * (1.0, 1.1)[r % 2] * (0.5 if a == "x" else 1.0)
             * (1 + 0.01 * ((r + t) % 3 - 1) * (a == comparison.AA))}
            for r in range(3) for t in range(3) for a in ("base", "x", comparison.AA)]
    c = comparison.compare(pd.DataFrame(rows), "base", task="task")
    assert c.arms["x"].interval.estimate == pytest.approx(0.5) and c.arms["x"].verdict == "lower"
    assert "9 (round, task) units, 8 dof" in c.arms["x"].interval.method
    assert c.rounds == 3 and c.columns()["round_drift"] == pytest.approx(0.1) and not c.aa_moved
    with pytest.raises(ParameterError, match="needs a 'depth' column"):
        comparison.compare(pd.DataFrame(rows), "base", task="depth")
