"""The run as the unit (workbench/stats/replicates.py) and the queue A/A designs on the real scheduling code
(workbench/load/aa_sim.py): identical arms, paired by seed, claim a direction at about the nominal rate."""
import math

import numpy as np
import pytest
from scipy import stats

from workbench import ParameterError
from workbench.load import aa_sim
from workbench.stats import replicates


def test_paired_log_ratio_by_hand():
    a, b = [2.0, 3.0, 4.5], [1.0, 2.0, 3.0]
    logs = np.log(np.array(a) / np.array(b))
    half = stats.t.ppf(0.975, 2) * logs.std(ddof=1) / math.sqrt(3)
    ratio, low, high = replicates.paired_log_ratio(a, b)
    assert ratio == pytest.approx(math.exp(logs.mean()))
    assert (low, high) == pytest.approx((math.exp(logs.mean() - half), math.exp(logs.mean() + half)))
    assert replicates.verdict(low, high) == "slower"  # a latency 1.6x higher


def test_one_run_supports_no_interval():
    ratio, low, high = replicates.paired_log_ratio([2.0], [1.0])
    assert ratio == pytest.approx(2.0) and math.isnan(low) and math.isnan(high)
    assert replicates.verdict(low, high) == "one run: not supported"
    assert replicates.describe(ratio, low, high) == "2.00x (one run: no interval)"
    with pytest.raises(ParameterError, match="^a, b:"):
        replicates.paired_log_ratio([1.0, 2.0], [1.0])


def test_aa_columns_and_moved():
    cols = replicates.aa_columns([1.0, 1.1, 0.9, 1.05], [1.02, 1.08, 0.93, 1.0])
    assert set(cols) == {"aa_ratio", "aa_low", "aa_high", "design", "rounds"} and cols["rounds"] == 4
    assert cols["aa_low"] < 1 < cols["aa_high"] and not replicates.aa_moved(cols)
    assert replicates.aa_moved({"aa_low": 1.05, "aa_high": 1.2})


def test_fake_engine_runs_the_real_policy_queue():
    """The virtual-clock engine serves in the policy's order: under sjf the short (interactive) requests of a queued
    burst wait less than under fcfs."""
    w = aa_sim.Workload(requests=30, load_factor=1.2, jitter=0.0, drift=0.0)
    trace = w.trace(4)
    fcfs, sjf = aa_sim.run(trace, "fcfs", w, 0), aa_sim.run(trace, "sjf", w, 0)
    assert len(fcfs) == len(sjf) == 30
    assert aa_sim.statistic(sjf) < aa_sim.statistic(fcfs)
    assert aa_sim.run(trace, "fcfs", w, 0) == fcfs  # deterministic per seed


@pytest.mark.parametrize("policy,workload", [
    ("fcfs", aa_sim.Workload()),                                                # scheduling: the mixed trace
    ("fcfs", aa_sim.Workload(short_share=1.0, requests=40, load_factor=0.8)),   # serving: one class near the knee
])
def test_queue_aa_paired_by_seed_stays_near_nominal_while_request_pairing_does_not(policy, workload):
    """Same trace twice under the same policy: the run-level design (5 seeds, paired by seed) claims a direction in
    <= 10% of 50 designs; the old within-run request pairing claims one in more than 20% (and more than twice as
    often)."""
    share = aa_sim.aa_share(workload, policy, trials=50, rounds=5, seed=100)
    assert share["new"] <= 0.10, share
    assert share["old"] > 0.20 and share["old"] > 2 * share["new"], share
