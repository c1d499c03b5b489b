"""Metric aggregation computed by hand."""
import math

import numpy as np
import pandas as pd
import pytest

from workbench import metrics


def _requests():
    return pd.DataFrame({
        "output_tokens": [4, 3, 0],
        "ttft_s": [1.0, 3.0, float("nan")],
        "prefill_s": [0.5, 0.5, 0.5],
        "tpot_s": [0.1, 0.3, float("nan")],
        "e2e_s": [1.3, 3.6, float("nan")],
        "decode_tps": [10.0, 1 / 0.3, float("nan")],
        "itl_s": [[0.1, 0.1, 0.1], [0.2, 0.4], []],
    })


def test_percentiles_ignore_requests_without_tokens():
    row = metrics.summarize_point(_requests(), wall_s=5.0)
    assert row["ttft_s_p50"] == pytest.approx(2.0)          # median of 1 and 3; the empty request is ignored
    assert row["ttft_s_p90"] == pytest.approx(1.0 + 0.9 * 2.0)
    assert row["itl_s_p50"] == pytest.approx(0.1)           # pooled gaps 0.1,0.1,0.1,0.2,0.4
    assert row["completed"] == 2 and row["requests"] == 3


def test_throughput_and_goodput_by_hand():
    row = metrics.summarize_point(_requests(), wall_s=5.0, slo_ttft_s=2.0, slo_tpot_s=0.2)
    assert row["output_throughput_tps"] == pytest.approx(7 / 5.0)
    assert row["request_throughput_rps"] == pytest.approx(2 / 5.0)
    assert row["goodput_rps"] == pytest.approx(1 / 5.0)     # only the first meets both SLOs


def test_goodput_is_undefined_without_an_slo():
    assert math.isnan(metrics.summarize_point(_requests(), wall_s=5.0)["goodput_rps"])


def test_single_token_request_meets_tpot_slo():
    df = pd.DataFrame({"output_tokens": [1], "ttft_s": [0.5], "tpot_s": [float("nan")]})
    assert metrics.meets_slo(df, 1.0, 0.01).tolist() == [True]


def test_percentiles_empty_is_nan():
    assert all(math.isnan(v) for v in metrics.percentiles([]).values())


def test_pareto_front():
    pts = pd.DataFrame({"output_throughput_tps": [10, 20, 15, 30], "ttft_s_p50": [1.0, 2.0, 3.0, 5.0],
                        "point_id": list("abcd")})
    assert metrics.pareto_front(pts)["point_id"].tolist() == ["a", "b", "d"]   # c is dominated by b


def test_recommend_batch_size_prefers_goodput_then_smaller_batch():
    pts = pd.DataFrame({"batch_size": [1, 2, 4, 8], "goodput_rps": [1.0, 2.0, 2.0, 0.0],
                        "output_throughput_tps": [5, 9, 12, 20], "status": ["ok"] * 4})
    assert metrics.recommend_batch_size(pts)["batch_size"] == 2
    pts["status"] = "failed: x"
    assert metrics.recommend_batch_size(pts) is None


def test_mbu_and_mfu_formulas():
    # 1e9 weight bytes + 1000 B/token * 2 rows * 500 tokens = 1.001e9 B/step; 0.01 s/step; peak 2e11 B/s
    assert metrics.mbu(10**9, 1000, 2, 500, 0.01, 2e11) == pytest.approx(1.001e9 / 0.01 / 2e11)
    flops = metrics.prefill_flops(num_params=100, num_layers=2, hidden_size=8, prompt_tokens=10, batch_size=3)
    assert flops == 3 * (2 * 100 * 10 + 2 * 2 * 100 * 8)
    assert metrics.mfu(flops, 2.0, flops) == pytest.approx(0.5)
    assert math.isnan(metrics.mbu(1, 1, 1, 1, float("nan"), 1.0))


def test_probe_device_cpu_is_positive():
    p = metrics.probe_device("cpu", "float32")
    assert p["bandwidth_bytes_per_s"] > 1e8 and p["flops_per_s"] > 1e8
    assert np.isfinite(p["bandwidth_bytes_per_s"])
