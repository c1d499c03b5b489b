"""Context length: the quadratic fit, config validation, one measured point, the notebook.

KV-cache bytes and the memory tracker are tested in ``tests/test_memory.py``."""
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


def test_fit_by_batch_and_table():
    rows = [{"batch_size": bs, "prompt_tokens": L, "prefill_s": bs * (0.01 + 1e-4 * L + 1e-8 * L * L)}
            for bs in (1, 4) for L in (100, 200, 400, 800)] + [{"batch_size": 8, "prompt_tokens": 100, "prefill_s": 1}]
    fits = context_length.fit_by_batch(pd.DataFrame(rows))
    assert set(fits) == {1, 4} and fits[4].b == pytest.approx(4e-4)
    table = context_length.fits_table(fits)
    assert list(table["batch_size"]) == [1, 4] and "crossover_tokens" in table


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
    cfg = context_length.Config(context_tokens=[96], batch_sizes=[2], max_new_tokens=3, source="random", warmup=1)
    out = context_length.measure_point(loaded, cfg, {"batch_size": 2, "context_tokens": 96}, {})
    assert [r["prompt_tokens"] for r in out.requests] == [96, 96]
    assert all(r["output_tokens"] == 3 and r["context_tokens"] == 96 for r in out.requests)
    assert out.extra["kv_bytes_computed"] == loaded.info.kv_cache_bytes_per_token() * 96 * 2
    assert out.warmup_s > 0 and out.extra["memory_kind"] == "rss"


@pytest.mark.notebook
def test_notebook_runs_and_writes_points_and_figures(tmp_path):
    from workbench import notebooks, results

    params = {"context_tokens": [64, 128, 256], "batch_sizes": [1, 2], "max_new_tokens": 2, "repeats": 1}
    notebooks.validate_parameters(NB, params)
    run = results.open_run()
    notebooks.execute_notebook(NB, params, run, log_output=False)
    points = results.read_points(run, "context_length")
    assert len(points) == 6 and set(points["status"]) == {"ok"}
    assert (points["kv_bytes_computed"] > 0).all()
    req = results.read_requests(run, "context_length")
    assert sorted(req["prompt_tokens"].unique()) == [64, 128, 256]
    figs = json.loads((run / "manifest.json").read_text())["figures"]
    assert {"context_ttft_prefill_fit", "context_tpot", "context_kv_bytes", "context_heatmap_ttft",
            "context_heatmap_throughput"} <= set(figs)
    assert (run / "context_fit.json").exists()
