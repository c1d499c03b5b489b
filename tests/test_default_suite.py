"""The default suite (``suites/default.yaml``) can show each effect it is meant to show on the embedded model.

Each test reads the suite's own parameters through the notebook's typed config (as ``workbench run`` does),
so lowering a count below what its evidence needs fails here:

- context length: enough distinct lengths for the quadratic fit (two more than its three parameters) and
  repeats for a stable median;
- serving: enough requests per point that the Wilson 95% interval of an attainment near the target is within
  +/-0.15 of it (``scipy.stats.binomtest``);
- engine tuning: enough repeats that a t-interval of a speed ratio tells 1.1x from 1.0x at this CPU's
  run-to-run spread (seeded simulation);
- temperature (real model): under half of the greedy answers are cut by ``max_new_tokens``.

The reasoning tasks' budget-0 accuracy on the real model is tested with the tasks
(``tests/tasks/test_reasoning.py``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from workbench.run import notebooks


def suite_config(stem: str):
    """The typed config of the default suite's entry for notebook ``stem`` (e.g. ``08_serving_load``)."""
    for e in notebooks.load_suite("default")["notebooks"]:
        if e["notebook"].endswith(f"{stem}.ipynb"):
            merged = notebooks.validate_parameters(e["notebook"], e["parameters"])
            return notebooks.notebook_config_class(e["notebook"]).from_namespace(merged)
    raise AssertionError(f"{stem} is not in the default suite")


def test_context_length_points_support_a_quadratic_fit():
    cfg = suite_config("02_context_length")
    assert len(set(cfg.context_tokens)) >= 3 + 2  # a + b L + c L^2: two more points than parameters
    assert cfg.repeats >= 3  # the median of 3 outlasts one disturbed run; of 2 it is their mean


def test_notebook_02_default_lengths_support_a_quadratic_fit():
    from workbench.experiments import context_length

    nb = notebooks.NOTEBOOKS_DIR / "02_context_length.ipynb"
    params = notebooks.notebook_parameters(nb)
    assert len(set(params["context_tokens"])) >= 5 and params["repeats"] >= 3
    assert len(set(context_length.Config().context_tokens)) >= 5


@pytest.mark.parametrize("attainment", [0.8, 0.9, 1.0])
def test_serving_points_carry_a_narrow_attainment_interval(attainment):
    """At attainments from 0.8 to 1 (the target is 0.9) the Wilson 95% interval lies within +/-0.15 of the
    measured share, both sides (5 requests per point gave [0.38, 0.96] at 0.8)."""
    cfg = suite_config("08_serving_load")
    n = cfg.requests_per_point
    k = round(attainment * n)
    ci = stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
    assert k / n - ci.low < 0.15 and ci.high - k / n < 0.15


def test_engine_tuning_repeats_tell_1_1x_from_1x():
    """Two configurations, the second 1.1x slower, each run ``repeats`` times with a 9% run-to-run spread
    (lognormal; results/LOG.md: fastest-of-3 drift references spread 24% over 15, sd ~7%): the 95%
    t-interval of the ratio of geometric means (Welch) is narrower than +/-ln(1.1) in most simulated runs,
    and it excludes 1 at least half the time, while at a true 1.0x it covers 1 about 95% of the time."""
    n = suite_config("09_engine_tuning").repeats
    rng = np.random.default_rng(0)
    sd = 0.09

    def interval(ratio):
        a = rng.normal(0.0, sd, n)
        b = rng.normal(math.log(ratio), sd, n)
        res = stats.ttest_ind(b, a, equal_var=False)
        return res.confidence_interval(0.95)

    sims = 2000
    slower = [interval(1.1) for _ in range(sims)]
    half = np.array([(c.high - c.low) / 2 for c in slower])
    assert np.median(half) < math.log(1.1)
    assert np.mean([c.low > 0 for c in slower]) >= 0.5
    same = [interval(1.0) for _ in range(sims)]
    assert np.mean([c.low <= 0 <= c.high for c in same]) >= 0.93


@pytest.mark.model
def test_temperature_greedy_answers_mostly_end_before_the_cap(loaded):
    """The suite's temperature prompts, greedy (temperature 0) in one batch: under half are cut by
    ``max_new_tokens`` (reports and Chinese questions at 12-24 tokens were cut 88-94% of the time)."""
    from workbench.measure.generation import generate_measured

    cfg = suite_config("03_temperature")
    greedy = [p for p in cfg.grid() if p["temperature"] == 0]
    assert greedy, "the suite has no greedy point"
    for point in greedy:
        prompts = cfg.prompts(point["family"])
        recs = generate_measured(loaded, [p["prompt"] for p in prompts], cfg.settings(point)).records
        truncated = sum(r["finish_reason"] == "length" for r in recs) / len(recs)
        assert truncated < 0.5, (point, [r["output_tokens"] for r in recs])


def test_scheduling_runs_where_a_policy_shows_and_measures_prefix_sharing_both_ways():
    """Notebook 11: the fifo engine (a static engine's batches absorb the queue at this load, so every policy
    looked the same: experiments/scheduling.py); prefix sharing off and on, with enough request pairs per prefix
    workload for a t interval with two degrees of freedom, and a shared document of at least two cache pages."""
    cfg = suite_config("11_scheduling")
    assert cfg.engine == "fifo" and {"fcfs", "sjf"} <= set(cfg.policies)
    assert set(cfg.multiturn_prefix_sharing) == {False, True}
    assert cfg.turns * cfg.conversations >= 3 and cfg.prefix_group_requests >= 3
    assert cfg.shared_prefix_tokens >= 2 * 32  # the continuous engine's page: 32 tokens
