"""Repeated looks (workbench/stats/sequential.py): the spending functions, and a simulation that the looks keep
the error rates (no model; seconds)."""

import math

import numpy as np
import pytest

from workbench.errors import ParameterError
from workbench.stats import blocks, sequential


def test_looks_double_from_the_first_to_the_last():
    assert sequential.looks(3, 12) == [3, 6, 12]
    assert sequential.looks(3, 5) == [3, 5]
    assert sequential.looks(4, 4) == [4]
    with pytest.raises(ParameterError, match="max_rounds"):
        sequential.looks(4, 3)


def test_spending_adds_up_to_alpha():
    for kind in sequential.SPENDING:
        plan = sequential.looks(2, 16)
        total = sum(sequential.look_alpha(r, plan, 0.05, kind) for r in plan)
        assert total == pytest.approx(0.05)
        assert sequential.spent(1.0, 0.05, kind) == pytest.approx(0.05)
    # O'Brien-Fleming spends almost nothing early: the last look keeps most of alpha
    plan = [3, 6, 12]
    assert sequential.look_alpha(3, plan) < 1e-3 < sequential.look_alpha(12, plan)
    with pytest.raises(ParameterError, match="beyond"):
        sequential.look_alpha(13, plan)


def _sequential_trial(rng, effects, plan=(3, 6, 8), sigma=0.05, margin=1.05):
    """One design: arms with log effects (column 0 the control, the last the A/A arm), a round drift shared by
    every arm, looks at ``plan``; stops when every arm but the A/A one is decided."""
    y = np.asarray(effects)[None, :] + rng.normal(0, 0.2, (plan[-1], 1)) + rng.normal(0, sigma, (plan[-1], len(effects)))
    for k in plan:
        got = blocks.decide(y[:k], sequential.look_alpha(k, list(plan)), margin)
        if all(v != "undecided" for v in got["verdict"][:-1]):
            break
    return got


@pytest.mark.simulation
def test_the_looks_keep_the_error_rates():
    """>= 2,000 designs of identical arms (3 arms and the A/A one): the share in which any comparison claims a
    direction stays at or below 5% (with its binomial 95% upper bound); a true 10% difference is called
    equivalent within +-5% in at most 5% of 2,000 designs."""
    rng = np.random.default_rng(2026)
    n = 2000
    false_direction = sum(any(v == "direction" for v in _sequential_trial(rng, [0, 0, 0, 0])["verdict"])
                          for _ in range(n))
    assert false_direction / n <= 0.05, false_direction
    false_equivalent = sum(_sequential_trial(rng, [0, math.log(1.10), 0])["verdict"][0] == "equivalent"
                           for _ in range(n))
    assert false_equivalent / n <= 0.05, false_equivalent
