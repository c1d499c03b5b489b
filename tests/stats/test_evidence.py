"""The rules of what a finding may claim (workbench/stats/evidence.py), and the coverage of the intervals shown."""

import math

import numpy as np
import pandas as pd
import pytest

from workbench.stats import evidence, metrics

# the repeat counts the suites use (suites/*.yaml: 1 gives no interval, 2 default, 3 and 5 on GPU)
SUITE_REPEATS = (2, 3, 5)


def _simulated_requests(rng, repeats: int, per_repeat: int = 8) -> pd.DataFrame:
    """Skewed latencies (log-normal per request) with a machine-state shift per repeat."""
    shift = rng.normal(0.0, 0.05, size=repeats)
    ttft = np.exp(np.log(0.2) + shift[:, None] + rng.normal(0.0, 0.3, size=(repeats, per_repeat)))
    return pd.DataFrame({"repeat": np.repeat(np.arange(repeats), per_repeat), "ttft_s": ttft.ravel()})


@pytest.mark.parametrize("repeats", SUITE_REPEATS)
def test_repeat_interval_covers_at_least_90_percent_at_the_suites_repeat_counts(repeats):
    rng = np.random.default_rng(21)
    # the value the interval estimates: a repeat's median, averaged over very many repeats
    big = np.exp(np.log(0.2) + rng.normal(0, 0.05, size=(100_000, 1)) + rng.normal(0, 0.3, size=(100_000, 8)))
    truth = float(np.median(big, axis=1).mean())
    trials, covered = 600, 0
    for _ in range(trials):
        lo, hi = metrics.repeat_ci(_simulated_requests(rng, repeats), "ttft_s")
        covered += lo <= truth <= hi
    assert covered / trials >= 0.90, f"nominal 95% covered {covered / trials:.0%} at {repeats} repeats"


@pytest.mark.parametrize("repeats", SUITE_REPEATS)
def test_ratio_interval_covers_at_least_90_percent(repeats):
    rng = np.random.default_rng(7)
    true_ratio, covered, trials = 1.1, 0, 2000
    for _ in range(trials):
        a = np.exp(np.log(1.1) + rng.normal(0, 0.08, repeats))
        b = np.exp(rng.normal(0, 0.08, repeats))
        iv = evidence.ratio_interval(a, b)
        covered += iv.low <= true_ratio <= iv.high
    assert covered / trials >= 0.90


def test_t_interval_by_hand_and_no_interval_from_one_value():
    from scipy import stats

    iv = evidence.t_interval([1.0, 2.0, 3.0], unit="repeat medians")
    half = stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    assert (iv.estimate, iv.low, iv.high, iv.n) == pytest.approx((2.0, 2.0 - half, 2.0 + half, 3))
    assert "t over 3 repeat medians, 2 dof" in iv.method
    one = evidence.t_interval([1.0, float("nan"), None])
    assert not one.shown and one.estimate == 1.0 and "at least 2" in one.reason
    assert "no interval" in one.describe()


def test_ratio_verdict_needs_the_interval_to_exclude_one():
    noisy = evidence.ratio_interval([1.00, 1.10], [1.05, 0.98])
    assert evidence.ratio_verdict(noisy) == "no difference beyond noise"
    text = evidence.describe_ratio(noisy, "speed-up")
    assert text.startswith("speed-up: no difference beyond noise: ") and "95% interval" in text
    faster = evidence.ratio_interval([2.0, 2.02, 1.98], [1.0, 1.01, 0.99])
    assert evidence.ratio_verdict(faster) == "higher" and faster.low > 1
    assert evidence.effect_word("higher", higher_is_better=True) == "helps"
    assert evidence.effect_word("higher", higher_is_better=False) == "hurts"
    assert evidence.effect_word("no difference beyond noise", True) == "no difference beyond noise"
    single = evidence.ratio_interval([2.0], [1.0, 1.1])
    assert evidence.ratio_verdict(single) == "not supported" and single.estimate == pytest.approx(2 / math.sqrt(1.1))


def test_wilson_and_difference_of_shares():
    w = evidence.wilson_interval(0, 10)
    assert w.low == 0 and 0.25 < w.high < 0.35  # Wilson upper bound for 0/10 is 0.278
    d = evidence.difference_interval(9, 10, 1, 10)
    assert evidence.difference_verdict(d) == "higher" and d.estimate == pytest.approx(0.8)
    d = evidence.difference_interval(9, 10, 8, 10)
    assert evidence.difference_verdict(d) == "no difference beyond noise"


def test_fit_support_needs_two_more_points_than_parameters():
    assert evidence.fit_support(4, 3) == (False, "not supported: 4 lengths for 3 parameters (needs 5)")
    assert evidence.fit_support(5, 3) == (True, "")
    assert evidence.fit_support(1, 3)[1] == "not supported: 1 length for 3 parameters (needs 5)"
    assert evidence.fit_support(4, 2)[0]


def test_none_valid_names_the_reason_and_the_way_on():
    pts = pd.DataFrame({"point_id": ["a", "b"], "valid": [False, False],
                        "invalid_reason": ["", "other processes used 1.2 CPU cores"]})
    assert evidence.none_valid(pts, "results/r1") == ("0 of 2 valid (other processes used 1.2 CPU cores); measure "
                                                     "them again with `workbench run --rerun-invalid results/r1`")
    assert evidence.none_valid(pts[["point_id"]]) == ("0 of 2 valid; measure them again with "
                                                      "`workbench run --rerun-invalid RUN_DIR`")


def test_nothing_valid_says_why_only_when_there_were_points():
    pts = pd.DataFrame({"point_id": ["a"], "status": ["ok"], "valid": [False],
                        "invalid_reason": ["reference TPOT drifted 55%"]})
    f = evidence.nothing_valid("reasoning point finished", pts, "results/r1")
    assert f.text == ("No valid reasoning point finished: 0 of 1 valid (reference TPOT drifted 55%); measure them "
                      "again with `workbench run --rerun-invalid results/r1`.")
    assert f.verdict == "undecided" and not f.supported
    assert evidence.nothing_valid("reasoning point finished").text == "No valid reasoning point finished."
    assert evidence.nothing_valid("x", pts.assign(valid=True)).text == "No valid x."   # usable points: no reason


def test_usable_points_keeps_valid_ok_points_and_for_serving_open_loop_unstopped_ones():
    pts = pd.DataFrame({
        "point_id": list("abcdefg"),
        "status": ["ok", "failed: oom", "ok", "ok", "ok", "ok", "ok"],
        "valid": [True, True, False, None, True, True, True],
        "profile": ["poisson", "poisson", "poisson", "poisson", "throughput", "synchronous", "constant"],
        "stopped_early": [False, False, False, False, False, False, True],
    })
    assert list(evidence.usable_points(pts)["point_id"]) == ["a", "e", "f", "g"]
    assert list(evidence.usable_points(pts, serving=True)["point_id"]) == ["a"]
    assert list(evidence.usable_points(pts.drop(columns=["valid"]))["point_id"]) == list("acdefg")


def test_finding_round_trips_and_reads_old_plain_strings():
    f = evidence.Finding("Prefill grows.", "4 lengths", True, ("p1", "p2"))
    assert evidence.Finding.from_value(f.to_dict()) == f
    old = evidence.Finding.from_value("A plain sentence from an old manifest.")
    assert old.text == "A plain sentence from an old manifest." and old.evidence == "" and old.point_ids == ()
    both = evidence.join([f, evidence.Finding("Not this.", "1 sample", False, ("p2", "p3"))])
    assert both.supported and both.point_ids == ("p1", "p2", "p3") and both.evidence == "4 lengths; 1 sample"


def test_paired_ratio_difference_and_coefficient_intervals_by_hand():
    from scipy import stats

    iv = evidence.paired_ratio_interval([2.0, 4.0, 8.0], [1.0, 2.0, 2.0])
    logs = np.log([2.0, 2.0, 4.0])
    half = stats.t.ppf(0.975, 2) * logs.std(ddof=1) / math.sqrt(3)
    assert (iv.estimate, iv.low, iv.high) == pytest.approx(tuple(np.exp([logs.mean(), logs.mean() - half,
                                                                         logs.mean() + half])))
    assert "t over the log ratios of 3 pairs, 2 dof" == iv.method
    d = evidence.mean_difference_interval([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])
    assert d.estimate == 2.0 and d.low == pytest.approx(2.0 - stats.t.ppf(0.975, 2) / math.sqrt(3))
    c = evidence.estimate_interval(1.0, 0.1, 4, "OLS")
    assert (c.low, c.high) == pytest.approx((1 - 0.1 * stats.t.ppf(0.975, 4), 1 + 0.1 * stats.t.ppf(0.975, 4)))
    assert not evidence.estimate_interval(1.0, 0.1, 0, "OLS").shown
    assert evidence.mean_interval([1, 0, 1]).method.startswith("Wilson")
    assert evidence.mean_interval([1.5, 0.5]).method.startswith("t over 2")


def _pts():
    return pd.DataFrame({"status": ["ok", "ok", "ok", "failed: x", "ok"], "valid": [True, False, True, None, True],
                         "profile": ["poisson", "poisson", "throughput", "poisson", "poisson"],
                         "stopped_early": [False, False, False, False, True], "goodput_rps": [1.0, 9.0, 8.0, 7.0, 6.0],
                         "batch_size": [1, 2, 4, 8, 16], "output_throughput_tps": [1.0] * 5})


def test_usable_points_is_one_rule_for_fits_and_recommendations():
    """Valid points only; for serving also open-loop and not stopped early (a missing column does not filter)."""
    assert evidence.usable_points(_pts())["goodput_rps"].tolist() == [1.0, 8.0, 6.0]
    assert evidence.usable_points(_pts(), serving=True)["goodput_rps"].tolist() == [1.0]
    assert len(evidence.usable_points(_pts().drop(columns=["valid", "profile", "stopped_early"]), serving=True)) == 4


def test_batch_size_recommendation_uses_the_same_rule():
    """The batch-size experiment recommends from usable points only: never the invalid point, even when the
    invalid one has the best goodput, and nothing when every point is invalid."""
    from workbench.experiments import batch_size

    pts = _pts()
    assert batch_size.recommend(pts)["batch_size"] == 4
    assert batch_size.recommend(pts.assign(valid=False)) is None


def test_a_finding_carries_its_verdict_and_the_counts_add_up():
    d = evidence.Finding("Batch 8 is faster.", "rounds", True, ("p",), "direction", 1.05, 3, 40.0)
    e = evidence.Finding("Prompt lookup is equivalent.", "rounds", False, (), "equivalent", 1.05, 8, 90.0)
    u = evidence.Finding("Undecided.", "rounds", True, (), "undecided", 1.05, 8, 90.0, 20, 300.0)
    m = evidence.Finding("A measurement.", "x", True)
    assert d.supported and e.supported and not u.supported and m.supported      # the verdict sets the mark
    for f in (d, e, u, m):
        assert evidence.Finding.from_value(f.to_dict()) == f
    assert u.to_dict()["rounds_needed"] == 20 and "rounds_needed" not in d.to_dict()
    counts = evidence.verdict_counts([d.to_dict(), e.to_dict(), u.to_dict(), m.to_dict()])
    assert counts == {"decided": 2, "direction": 1, "equivalent": 1, "undecided": 1, "measurements": 1}
    assert evidence.verdict_summary(counts) == ("2 decided: 1 direction, 1 equivalent; 1 undecided "
                                                "(1 measurement without a comparison)")
    with pytest.raises(ValueError, match="verdict"):
        evidence.Finding("x", verdict="supported")
    assert evidence.join([u, d]).verdict == "undecided"


def test_a_missing_estimate_reads_no_estimate_never_nan():
    """A comparison or an interval without an estimate (a fit with as many parameters as lengths, a side with no
    value) says so in words: the quick run's context-length finding read "undecided: nanx (no interval: ...)"."""
    from workbench.stats import blocks

    nan = float("nan")
    iv = evidence.Interval(nan, nan, nan, 0, "t", reason="no values")
    assert iv.describe() == "no estimate (no values)"
    d = blocks.Decision("at 256 tokens", "", nan, nan, nan, 0.95, "undecided", "", blocks.MARGIN, 0, nan, "", nan,
                        None, "3 lengths for 3 parameters")
    for text in (d.interval_text(), d.interval_text(invert=True), d.describe()):
        assert "nan" not in text.lower() and "no estimate (3 lengths for 3 parameters)" in text, text
    shown = evidence.Interval(1.25, 1.1, 1.4, 4, "t")
    assert shown.describe(suffix="x").startswith("1.25x, 95% interval 1.1x-1.4x")
