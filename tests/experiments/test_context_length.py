"""Context length: the quadratic fit, config validation, one measured point, the notebook.

KV-cache bytes and the memory tracker are tested in ``tests/measure/test_memory.py``."""
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

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


def test_fit_by_batch_and_table():
    rows = [{"batch_size": bs, "prompt_tokens": L, "prefill_s": bs * (0.01 + 1e-4 * L + 1e-8 * L * L)}
            for bs in (1, 4) for L in (100, 200, 400, 800, 1600)] + [{"batch_size": 8, "prompt_tokens": 100, "prefill_s": 1}]
    fits = context_length.fit_by_batch(pd.DataFrame(rows))
    assert set(fits) == {1, 4} and fits[4].b == pytest.approx(4e-4) and fits[4].degree == 2
    table = context_length.fits_table(fits)
    assert list(table["batch_size"]) == [1, 4] and {"crossover_tokens", "dof", "supported"} <= set(table)


def _points_and_requests(lengths, bad=None, seconds_per_token=1e-3):
    """One point per length (2 rows each, batch 2, one shared stamp); the point at ``bad`` is invalid and slow."""
    pts, reqs = [], []
    for L in lengths:
        pid = f"L{L}"
        pts.append({"point_id": pid, "status": "ok", "valid": L != bad, "batch_size": 2, "context_tokens": L})
        y = 0.02 + seconds_per_token * L + (1.0 if L == bad else 0.0)  # other load added a second
        reqs += [{"point_id": pid, "repeat": 0, "batch_size": 2, "prompt_tokens": L, "prefill_s": y}] * 2
    return pd.DataFrame(pts), pd.DataFrame(reqs)


def test_fit_over_points_that_include_an_invalid_one_excludes_it():
    points, requests = _points_and_requests([128, 256, 512, 1024, 1536, 2048], bad=128)
    fit = context_length.fit_by_batch(requests, points=points)[2]
    assert fit.n_lengths == 5 and fit.n == 5   # the invalid length is gone; a batch's 2 rows are one observation
    assert fit.a == pytest.approx(0.02, abs=1e-9) and fit.b == pytest.approx(1e-3) and fit.r2 == pytest.approx(1)
    polluted = context_length.fit_by_batch(requests)[2]  # without the points table nothing is excluded
    assert polluted.a > 0.1


def test_finding_says_not_supported_with_too_few_lengths_and_states_r2_and_dof():
    points, requests = _points_and_requests([128, 512, 1024, 2048])  # the default suite's four lengths
    rng = np.random.default_rng(1)
    requests["prefill_s"] *= 1 + 0.01 * rng.standard_normal(len(requests))
    fits = context_length.fit_by_batch(requests, points=points)
    assert fits[2].degree == 1  # 4 lengths carry a straight line (2 parameters), not a quadratic
    f = context_length.finding(fits, 2048, points)
    assert "quadratic (attention) term is not supported: 4 lengths for 3 parameters" in f.text
    assert f.supported and "R^2" in f.evidence and "2 dof" in f.evidence and f.point_ids == tuple(points["point_id"])
    points3, requests3 = _points_and_requests([128, 512, 1024])
    f3 = context_length.finding(context_length.fit_by_batch(requests3, points=points3), 1024, points3)
    assert not f3.supported and "not supported: 3 lengths for 3 parameters" in f3.text
    none_valid = context_length.finding(context_length.fit_by_batch(requests3, points=points3.assign(valid=False)),
                                        1024, points3.assign(valid=False))
    assert not none_valid.supported and "(0 of 3 points valid)" in none_valid.text


def test_fit_is_over_per_point_medians_and_states_no_crossover_when_the_quadratic_interval_includes_0():
    """5 lengths x 3 repeats, linear truth plus noise: one observation per point (n = 5, not 15), the quadratic term's
    interval includes 0, so the straight line carries the per-token cost (a run's quadratic said "prefill per token:
    no difference from 0" while TTFT grew 15x from 128 to 2048 tokens: the two collinear terms shared the growth),
    and the finding states no crossover (the old fit over 15 repeats named one)."""
    rng = np.random.default_rng(3)
    lengths = [128, 512, 1024, 1536, 2048]
    pts = pd.DataFrame([{"point_id": f"L{L}", "status": "ok", "valid": True, "batch_size": 1, "context_tokens": L}
                        for L in lengths])
    shift = {L: 1 + 0.03 * rng.standard_normal() for L in lengths}  # one disturbance per point, shared by repeats
    reqs = pd.DataFrame([{"point_id": f"L{L}", "repeat": r, "batch_size": 1, "prompt_tokens": L,
                          "prefill_s": (0.02 + 1e-4 * L) * shift[L] * (1 + 0.002 * rng.standard_normal())}
                         for L in lengths for r in range(3)])
    fit = context_length.fit_by_batch(reqs, points=pts)[1]
    # the quadratic's c interval includes 0, so the straight line is kept (backward elimination), carrying that interval
    assert fit.n == 5 and fit.degree == 1 and fit.dof == 3 and fit.c == 0
    assert fit.c_low < 0 < fit.c_high and not fit.crossover_shown
    assert fit.b_low > 0 and fit.b == pytest.approx(1e-4, rel=0.1)    # the per-token cost, shown
    f = context_length.finding({1: fit}, 2048, pts)
    assert f.supported and f.text.startswith("batch 1: prefill ") and "us/token" in f.text
    assert "overtakes the linear one at" not in f.text and "interval includes 0" in f.text
    assert "quadratic (not kept): its quadratic term 95% interval" in f.evidence
    quad = context_length.fit_quadratic(reqs.groupby("point_id")["prompt_tokens"].median(),
                                        reqs.groupby("point_id")["prefill_s"].median())
    assert quad.degree == 2 and not quad.crossover_shown   # the quadratic alone says neither term is shown
    exact = context_length.fit_quadratic(np.array(lengths), 0.02 + 1e-4 * np.array(lengths) + 1e-7 * np.array(lengths) ** 2
                                         * (1 + 0.001 * rng.standard_normal(5)))
    assert exact.crossover_shown and "overtakes the linear one at" in context_length.finding({1: exact}, 2048).text


def test_a_negative_intercept_is_not_stated_as_a_fixed_prefill_cost():
    """Growth that steepens at the long end, fitted by the straight line (4 lengths: the quadratic is not supported),
    puts the line's intercept below 0 (a run's finding read "prefill -216.6 ms + ... us/token"). The finding then
    states the per-token cost over the measured lengths and the fitted value at the shortest, names the intercept
    as an extrapolation, and never prints a negative fixed cost as "prefill -N ms +"."""
    lengths = np.array([256.0, 1024, 2048, 4096])
    fit = context_length.fit_quadratic(lengths, 0.01 + 2e-5 * lengths + 2e-8 * lengths**2, degree=1)
    assert fit.a < 0 and fit.l_min == 256 and fit.l_max == 4096
    text = context_length.finding({1: fit}, 4096).text
    assert text.startswith(f"batch 1: prefill {fit.b * 1e6:.1f} us/token over 256-4,096 tokens")
    assert f"{float(fit.predict(256)) * 1e3:.0f} ms at 256" in text and "below 0" in text
    assert " ms + " not in text
    positive = context_length.fit_quadratic(lengths, 0.05 + 1e-4 * lengths, degree=1)
    assert positive.a > 0 and context_length.finding({1: positive}, 4096).text.startswith(
        f"batch 1: prefill {positive.a * 1e3:.1f} ms + ")


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
    # 3 lengths carry no curve (and on a busy machine the points may be invalid: then there is no fit at all)
    assert not finding["supported"] and "not supported: " in finding["text"]
    assert set(finding["point_ids"]) <= set(points["point_id"])
