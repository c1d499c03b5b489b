"""Context length: the quadratic fit, config validation, one measured point, the notebook.

KV-cache bytes and the memory tracker are tested in ``tests/measure/test_memory.py``."""
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from workbench import ParameterError
from workbench.experiments import context_length

NB = Path(__file__).resolve().parents[2] / "notebooks" / "02_context_length.ipynb"


def test_fit_recovers_known_coefficients_exactly():
    L = np.array([128, 512, 1024, 2048, 4096])
    a, b, c = 0.05, 2e-3, 1e-7
    fit = context_length.fit_quadratic(L, a + b * L + c * L**2)
    assert (fit.a, fit.b, fit.c) == pytest.approx((a, b, c), rel=1e-6)
    assert fit.r2 == pytest.approx(1.0) and fit.n == 5
    assert fit.crossover_tokens == pytest.approx(b / c)  # 20000 tokens
    assert fit.predict([1000]) == pytest.approx([a + b * 1000 + c * 1e6])


def test_fit_with_noise_and_repeats():
    rng = np.random.default_rng(0)
    L = np.repeat([256, 1024, 2048, 4096, 8192], 4)
    y = 0.1 + 1e-3 * L + 5e-8 * L**2
    fit = context_length.fit_quadratic(L, y * (1 + 0.01 * rng.standard_normal(len(L))))
    assert fit.b == pytest.approx(1e-3, rel=0.1) and fit.c == pytest.approx(5e-8, rel=0.2)
    assert 0.99 < fit.r2 <= 1.0


def test_fit_edge_cases():
    with pytest.raises(ParameterError, match="^context_tokens:"):
        context_length.fit_quadratic([128, 128, 512], [1, 1, 2])
    linear = context_length.fit_quadratic([1, 2, 3, 4], [1, 2, 3, 4])
    assert linear.c == pytest.approx(0, abs=1e-9)
    assert math.isinf(context_length.QuadraticFit(0, 1, -1e-9, 1, 3).crossover_tokens)
    assert context_length.QuadraticFit(0, -1, 1e-3, 1, 3).crossover_tokens == 0.0
    nan_dropped = context_length.fit_quadratic([1, 2, 3, 4], [1, 4, 9, float("nan")])
    assert nan_dropped.n == 3 and nan_dropped.c == pytest.approx(1)
    assert nan_dropped.dof == 0 and not nan_dropped.support[0] and math.isnan(nan_dropped.b_low)


LENGTHS = np.array([128.0, 512, 1024, 1536, 2048])


def _rounds(a, b, c, rounds, noise, seed=0, drift=0.1, lengths=LENGTHS):
    """Rounds x lengths of prefill seconds: the curve, times a drift shared by a round, times each value's noise."""
    rng = np.random.default_rng(seed)
    return ((a + b * lengths + c * lengths ** 2) * np.exp(rng.normal(0, drift, (rounds, 1)))
            * np.exp(rng.normal(0, noise, (rounds, len(lengths)))))


def test_fit_with_the_rounds_as_blocks_cancels_a_slow_round():
    """Exact curves, one round 30% slower throughout: the round's level cancels (rounds as blocks) and the fit
    recovers a, b, c of the average round exactly; pooled without the blocks the slow round's curve bends the fit."""
    a, b, c = 0.05, 1.3e-3, 2.6e-7
    curve = a + b * LENGTHS + c * LENGTHS ** 2
    values = np.vstack([curve, curve * 1.3, curve])
    fit = context_length.fit_rounds(values, LENGTHS)
    level = np.exp(np.log([1.0, 1.3, 1.0]).mean())
    assert (fit.a, fit.b, fit.c) == pytest.approx((a * level, b * level, c * level), rel=1e-9)
    assert fit.n == 15 and fit.n_lengths == 5 and fit.dof == 15 - 3 - 2  # 3 parameters, 2 rounds' levels
    assert fit.method == "relative-error fit" and context_length.fit_quadratic(LENGTHS, curve).method == "OLS"
    # one round's value per length missing: that round is left out
    holed = values.copy()
    holed[1, 2] = np.nan
    assert context_length.fit_rounds(holed, LENGTHS).n == 10


def test_the_quadratic_term_at_the_longest_length_three_verdicts():
    """Curved data (run 2's fit: 124 ms + 1328 us/token, the terms equal at 5,059 tokens: the term carries 28% at
    2,048) is a direction in 3 rounds; a straight line measured tightly over many rounds is equivalent within +-5%;
    a straight line in 2 noisy rounds is undecided with the rounds it needs; 4 lengths cannot carry the fit."""
    curved = _rounds(0.124, 1.328e-3, 1.328e-3 / 5059, 3, 0.02)
    d = context_length.curvature_decision(curved, LENGTHS, name="batch 1")
    assert d.verdict == "direction" and d.direction == "higher" and d.low > 1 and d.rounds == 3
    assert d.estimate == pytest.approx(1.387, rel=0.1) and d.dof == 10
    line = context_length.curvature_decision(_rounds(0.03, 2.4e-3, 0.0, 40, 0.01, seed=1), LENGTHS)
    assert line.verdict == "equivalent" and 1 / 1.05 <= line.low and line.high <= 1.05
    short = context_length.curvature_decision(_rounds(0.03, 2.4e-3, 0.0, 2, 0.05, seed=2), LENGTHS)
    assert short.verdict == "undecided" and short.rounds_needed is not None and short.rounds_needed > 2
    assert "rounds" in short.needed_text(10.0) and "s more" in short.needed_text(10.0)
    four = context_length.curvature_decision(_rounds(0.03, 2.4e-3, 0.0, 3, 0.01)[:, :4], LENGTHS[:4])
    assert four.verdict == "undecided" and "4 lengths for 3 parameters" in four.reason


def test_the_fit_decision_keeps_its_error_rate_on_a_straight_line():
    """Simulation: a straight line (no quadratic term), 3 rounds, 4% noise on 10% round drift: the fit claims a
    direction in at most ~5% of 400 trials (the interval's level), where the crossover rule of the older code named a
    crossover whenever c's interval happened to exclude 0."""
    wrong = sum(context_length.curvature_decision(_rounds(0.03, 2.4e-3, 0.0, 3, 0.04, seed=s), LENGTHS).verdict
                == "direction" for s in range(400))
    assert wrong / 400 <= 0.08


def test_the_fit_weighs_each_prefill_by_its_relative_error():
    """The machine's noise is a share of each prefill (~10% at 128 tokens and at 2,048 alike): the fit weights
    each value by it (a Gamma GLM, identity link). Over 300 simulated 3-round designs with 10% noise a value, its
    interval on the term's weight covers the true ratio at about its level, and is narrower than the unweighted
    least-squares fit's (the form before, where 2,048's seconds of noise swamped 128's tens of ms) in most
    designs: a decision on the same data comes sooner."""
    a, b, c = 0.12, 2.2e-3, 4.8e-7
    lengths = np.array([128.0, 512, 1024, 2048, 3072])
    truth = (a + b * 3072 + c * 3072 ** 2) / (a + b * 3072)
    covered, narrower = 0, 0
    for s in range(300):
        v = _rounds(a, b, c, 3, 0.1, seed=s, drift=0.08, lengths=lengths)
        d = context_length.curvature_decision(v, lengths)
        covered += d.low <= truth <= d.high
        # the unweighted fit of the same rounds (levels as blocks), its delta-method interval at the same t
        lv = np.exp(np.log(v).mean(axis=1) - np.log(v).mean())
        z = (v / lv[:, None]).ravel()
        x = np.tile(lengths, 3)
        X = np.column_stack([np.ones_like(x), x, x ** 2])
        coef, *_ = np.linalg.lstsq(X, z, rcond=None)
        s2 = float(((z - X @ coef) ** 2).sum()) / d.dof
        q, lin = coef @ [1, 3072, 3072 ** 2], coef[0] + coef[1] * 3072
        g = np.array([1 / q - 1 / lin, 3072 / q - 3072 / lin, 3072 ** 2 / q])
        se_ols = math.sqrt(g @ (s2 * np.linalg.pinv(X.T @ X)) @ g)
        narrower += math.log(d.high / d.low) < 2 * stats.t.ppf(0.975, d.dof) * se_ols
    assert covered / 300 >= 0.92
    assert narrower / 300 >= 0.7


def test_a_negative_intercept_is_not_stated_as_a_fixed_prefill_cost():
    """Growth that steepens at the long end puts a fit's intercept below 0 (a run's finding read "prefill -216.6 ms
    + ... us/token"): the text states the per-token cost over the measured lengths and the fitted value at the
    shortest, names the intercept as an extrapolation, and never prints "prefill -N ms +"."""
    lengths = np.array([256.0, 1024, 2048, 4096])
    fit = context_length.fit_quadratic(lengths, 0.01 + 2e-5 * lengths + 2e-8 * lengths**2, degree=1)
    assert fit.a < 0 and fit.l_min == 256 and fit.l_max == 4096
    text = context_length._fit_text(1, fit)
    assert text.startswith(f"batch 1: prefill {fit.b * 1e6:,.0f} us/token") and "over 256-4,096 tokens" in text
    assert f"{float(fit.predict(256)) * 1e3:.0f} ms at 256" in text and "below 0" in text and " ms + " not in text
    positive = context_length.fit_quadratic(lengths, 0.05 + 1e-4 * lengths, degree=1)
    assert context_length._fit_text(1, positive).startswith(f"batch 1: prefill {positive.a * 1e3:.1f} ms + ")


def _designed_points(verdict, est, lo, hi, need=0, batch=1):
    pts = pd.DataFrame([{"point_id": f"L{int(L)}", "status": "ok", "valid": True, "batch_size": batch,
                         "context_tokens": int(L)} for L in LENGTHS])
    return pts.assign(design="interleaved", rounds=3, margin=1.05, design_seconds=45.0, seconds_per_round=15.0,
                      design_stopped="max rounds", aa_ratio=1.0, aa_low=0.96, aa_high=1.04, aa_verdict="equivalent",
                      quadratic_share=est, quadratic_share_low=lo, quadratic_share_high=hi, quadratic_share_level=0.95,
                      quadratic_share_method="quadratic fit over 3 rounds x 5 lengths, rounds as blocks, 10 dof, "
                                             "delta method",
                      quadratic_share_verdict=verdict, quadratic_share_direction="higher" if lo > 1 else "",
                      rounds_needed=float(need), seconds_needed=float(need - 3) * 15.0 if need else 0.0)


def _design_run(tmp_path, values):
    """A run folder holding a context-length design table of ``values`` (rounds x LENGTHS)."""
    rows = [{"round": r, "arm": f"L{int(L)}", "prefill_s": float(values[r, k]), "ttft_s": float(values[r, k]) * 1.1}
            for r in range(values.shape[0]) for k, L in enumerate(LENGTHS)]
    (tmp_path / "design").mkdir()
    pd.DataFrame(rows).to_parquet(tmp_path / "design" / "context_length.parquet")
    return tmp_path


def test_finding_reads_the_design_decision_and_never_extrapolates_a_crossover(tmp_path):
    """Run 2's curve: the terms are equal at 5,059 tokens, beyond the 2,048 measured; the finding states the term's
    share at 2,048 (a direction) and no crossover (the older finding said "overtakes the linear one at 5,059 tokens")."""
    run = _design_run(tmp_path, _rounds(0.124, 1.328e-3, 1.328e-3 / 5059, 3, 0.002))
    f = context_length.finding(_designed_points("direction", 1.39, 1.30, 1.48), run_dir=run)
    assert f.verdict == "direction" and f.supported and f.rounds == 3 and f.margin == 1.05
    assert f.text.startswith("batch 1: prefill ") and "us/token" in f.text and "over 128-2,048 tokens" in f.text
    assert "at 2,048 tokens, the fit over its straight part (a + bL): higher, 1.39x, 95% interval 1.30-1.48x" in f.text
    assert "quadratic term carries 28% of prefill" in f.text
    assert "5,059" not in f.text and "overtakes" not in f.text and "equals the linear term" not in f.text
    assert "3 interleaved rounds" in f.evidence and "rounds as blocks" in f.evidence


def test_finding_equivalent_and_undecided(tmp_path):
    run = _design_run(tmp_path, _rounds(0.03, 2.4e-3, 0.0, 3, 0.002))
    eq = context_length.finding(_designed_points("equivalent", 1.01, 0.98, 1.04), run_dir=run)
    assert eq.verdict == "equivalent" and eq.supported
    assert "equivalent within +-5%" in eq.text and "a straight line describes prefill" in eq.text
    open_ = context_length.finding(_designed_points("undecided", 1.06, 0.93, 1.21, need=9), run_dir=run)
    assert open_.verdict == "undecided" and not open_.supported and open_.rounds_needed == 9
    assert open_.seconds_needed == pytest.approx(90.0) and "about 9 rounds (~90 s more) would decide it" in open_.text
    moved = context_length.finding(_designed_points("direction", 1.39, 1.30, 1.48).assign(aa_verdict="direction"),
                                   run_dir=run)
    assert moved.verdict == "undecided" and "A/A control moved" in moved.text
    drifted = context_length.finding(_designed_points("direction", 1.39, 1.30, 1.48).assign(
        valid=False, invalid_reason="reference TPOT drifted 55% during the sweep"), run_dir=run)
    assert drifted.verdict == "undecided" and "no valid length: 0 of" in drifted.text
    assert "(reference TPOT drifted 55%" in drifted.text and f"--rerun-invalid {run}`" in drifted.text


def test_finding_point_by_point_and_with_too_few_lengths():
    """One repeat (no design): the same fit over each point's median, said so; 3 lengths carry no decision."""
    pts = pd.DataFrame([{"point_id": f"L{int(L)}", "status": "ok", "valid": True, "batch_size": 1,
                         "context_tokens": int(L)} for L in LENGTHS])
    req = pd.DataFrame([{"point_id": f"L{int(L)}", "batch_size": 1, "prompt_tokens": int(L),
                         "prefill_s": 0.124 + 1.328e-3 * L + 2.6e-7 * L * L} for L in LENGTHS for _ in range(2)])
    f = context_length.finding(pts, req)
    assert "one round" in f.text and f.rounds == 1 and f.verdict in ("direction", "undecided")
    few = context_length.finding(pts.iloc[:3], req[req["point_id"].isin(pts["point_id"].iloc[:3])])
    assert few.verdict == "undecided" and "3 lengths for 3 parameters" in few.text
    said = f"{few.text} {few.evidence}".lower()   # the quick suite's case: no "nanx", no "nan to nan us"
    assert "no estimate" in said and "no intervals (no residual degrees of freedom)" in said and "nan" not in said
    none_valid = context_length.finding(pts.assign(valid=False), req)
    assert none_valid.verdict == "undecided" and "no valid length: 0 of 5 valid" in none_valid.text
    assert "--rerun-invalid RUN_DIR" in none_valid.text


@pytest.mark.parametrize("kwargs,name", [
    ({"context_tokens": []}, "context_tokens"),
    ({"context_tokens": [100000]}, "context_tokens"),
    ({"context_tokens": [8190]}, "context_tokens"),  # + max_new_tokens exceeds the 8192 maximum
    ({"context_tokens": [16]}, "context_tokens"),
    ({"batch_sizes": [0]}, "batch_sizes"),
    ({"batch_sizes": []}, "batch_sizes"),
    ({"max_new_tokens": 1}, "max_new_tokens"),
    ({"source": "fr"}, "source"),
    ({"repeats": 0}, "repeats"),
])
def test_invalid_context_config_one_line(kwargs, name):
    with pytest.raises(ParameterError) as err:
        context_length.Config(**kwargs)
    assert str(err.value).startswith(name + ":") and "\n" not in str(err.value)


def test_grid_order():
    cfg = context_length.Config(context_tokens=[512, 128], batch_sizes=[2, 1])
    assert cfg.grid() == [{"batch_size": 2, "context_tokens": 128}, {"batch_size": 2, "context_tokens": 512},
                          {"batch_size": 1, "context_tokens": 128}, {"batch_size": 1, "context_tokens": 512}]


@pytest.mark.model
def test_measure_point_random_ids(loaded):
    cfg = context_length.Config(context_tokens=[96], batch_sizes=[2], max_new_tokens=3, source="random", warmup=1,
                                repeats=1)
    out = context_length.measure_point(loaded, cfg, {"batch_size": 2, "context_tokens": 96}, {})
    assert [r["prompt_tokens"] for r in out.requests] == [96, 96]
    assert all(r["output_tokens"] == 3 and r["context_tokens"] == 96 for r in out.requests)
    assert out.extra["kv_bytes_computed"] == loaded.info.kv_cache_bytes_per_token() * 96 * 2
    assert out.warmup_s > 0 and out.extra["memory_kind"] == "rss"


@pytest.mark.model
def test_lengths_measured_as_one_design_on_the_real_model(loaded):
    """5 lengths, 2 rounds: the design's table holds every round of every length and the A/A arm, each point carries
    its length's ratio to the shortest and the batch's fit decision, and the finding and figures read them."""
    from workbench.run import results

    cfg = context_length.Config(context_tokens=[64, 96, 128, 160, 192], batch_sizes=[1], max_new_tokens=2, repeats=2,
                                max_rounds=2, warmup=0)
    run = results.create_run()
    points = context_length.run(cfg, run, loaded)
    assert (points["status"] == "ok").all() and len(points) == 5 and (points["rounds"] == 2).all()
    table = pd.read_parquet(run / "design" / "context_length.parquet")
    assert len(table) == 2 * 6 and set(table["arm"]) == {*points["point_id"], "A/A"}
    shortest = points.sort_values("context_tokens").iloc[0]
    assert shortest["prefill_vs_shortest"] == 1.0 and (points["kv_bytes_computed"] > 0).all()
    assert points["quadratic_share_verdict"].isin(["direction", "equivalent", "undecided"]).all()
    assert points["quadratic_share_verdict"].nunique() == 1       # one decision per batch size
    req = results.read_requests(run, experiment="context_length")
    assert sorted(req["repeat"].unique()) == [0, 1] and len(req) == 2 * 5
    valid = points.assign(valid=True)      # on a busy machine the points may be invalid: the reading is tested here
    f = context_length.finding(valid, req, run)
    assert f.verdict == points["quadratic_share_verdict"].iloc[0] and f.rounds == 2
    assert f.text.startswith("batch 1: ") and "over 64-192 tokens" in f.text
    fits = context_length.fits(valid, req, run)
    assert fits[1].n == 10 and fits[1].levels == 1
    figs = context_length.figures(points, req, fits, run)
    assert "context_prefill_ratio" in figs and "each round" in figs["context_prefill_ratio"].to_json()


@pytest.mark.notebook
def test_notebook_runs_and_writes_points_and_figures(tmp_path, run_notebook):
    from workbench.run import notebooks, results

    params = {"context_tokens": [64, 128, 256], "batch_sizes": [1, 2], "max_new_tokens": 2, "repeats": 1}
    notebooks.validate_parameters(NB, params)
    run = results.open_run()
    run_notebook(NB, params, run)
    points = results.read_points(run, "context_length")
    assert len(points) == 6 and set(points["status"]) == {"ok"}
    assert (points["kv_bytes_computed"] > 0).all()
    req = results.read_requests(run, "context_length")
    assert sorted(req["prompt_tokens"].unique()) == [64, 128, 256]
    figs = json.loads((run / "manifest.json").read_text())["figures"]
    assert {"context_ttft_prefill_fit", "context_tpot", "context_kv_bytes", "context_heatmap_ttft",
            "context_heatmap_throughput"} <= set(figs)
    assert (run / "context_fit.json").exists()
    finding = json.loads((run / "manifest.json").read_text())["findings"]["context_length"]
    # 3 lengths carry no curve (and on a busy machine some or all points may be invalid: fewer lengths, or no fit)
    assert not finding["supported"] and finding["verdict"] == "undecided"
    assert re.search(r"\b[0-3] lengths? for 3 parameters", finding["text"]) or "no valid length" in finding["text"]
    assert set(finding["point_ids"]) <= set(points["point_id"])
