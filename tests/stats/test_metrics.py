"""Metric aggregation computed by hand."""
import math

import numpy as np
import pandas as pd
import pytest

from workbench.measure import contention
from workbench.stats import columns, metrics


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
    """The zero-token row carries zero (not NaN) timings: if it were counted, the median would move to 1.0."""
    req = _requests()
    req.loc[2, ["ttft_s", "prefill_s", "tpot_s", "e2e_s", "decode_tps"]] = 0.0
    row = metrics.summarize_point(req, wall_s=5.0)
    assert row["ttft_s_p50"] == pytest.approx(2.0)          # median of 1 and 3; the empty request is ignored
    assert row["itl_s_p50"] == pytest.approx(0.1)           # pooled gaps 0.1,0.1,0.1,0.2,0.4
    assert row["completed"] == 2 and row["requests"] == 3 and row["n_samples"] == 2


def test_percentiles_need_enough_independent_samples():
    """No p90 from 2 samples, no p99 from fewer than 100; rows of one batch are one sample."""
    row = metrics.summarize_point(_requests(), wall_s=5.0)
    assert math.isnan(row["ttft_s_p90"]) and math.isnan(row["ttft_s_p99"]) and "ttft_s_p99" in row["percentile_note"]
    many = pd.DataFrame({"output_tokens": [3] * 120, "ttft_s": np.linspace(1, 2, 120), "batch_size": [1] * 120,
                         "itl_s": [[0.1, 0.2]] * 120})
    row = metrics.summarize_point(many, wall_s=5.0)
    assert row["n_samples"] == 120 and row["ttft_s_p99"] == pytest.approx(np.percentile(np.linspace(1, 2, 120), 99))
    batched = many.assign(batch_size=8)
    row = metrics.summarize_point(batched, wall_s=5.0)
    assert row["n_samples"] == 15 and math.isnan(row["ttft_s_p99"]) and row["ttft_s_p90"] == row["ttft_s_p90"]


def test_repeat_ci_is_a_t_interval_over_repeat_medians_and_needs_two_repeats():
    from scipy import stats

    req = pd.DataFrame({"repeat": [0] * 5 + [1] * 5 + [2] * 5, "ttft_s": [1.0] * 5 + [1.2] * 5 + [1.4] * 5})
    lo, hi = metrics.repeat_ci(req, "ttft_s")
    logs = np.log([1.0, 1.2, 1.4])   # by hand, on the log scale: a latency's noise scales it
    half = stats.t.ppf(0.975, 2) * np.std(logs, ddof=1) / np.sqrt(3)
    assert (lo, hi) == pytest.approx((np.exp(logs.mean() - half), np.exp(logs.mean() + half)))
    assert lo < 1.0 and hi > 1.4  # wider than the range of the medians, which the bootstrap returned
    assert all(math.isnan(v) for v in metrics.repeat_ci(req[req["repeat"] == 0], "ttft_s"))
    # two far-apart medians (one repeat in a slow moment): the arithmetic t interval ran below 0 s
    two = pd.DataFrame({"repeat": [0] * 3 + [1] * 3, "ttft_s": [0.02] * 3 + [0.12] * 3})
    lo, hi = metrics.repeat_ci(two, "ttft_s")
    assert 0 < lo < 0.02 and hi > 0.12


def test_verdict_marks_loaded_points_invalid():
    assert contention.verdict({"others_cpu_load": 0.02, "steal_frac": 0.0}) == {"valid": True, "invalid_reason": ""}
    bad = contention.verdict({"others_cpu_load": 0.9, "steal_frac": 0.0})
    assert bad["valid"] is False and "0.90 CPU cores" in bad["invalid_reason"]


def test_a_window_too_short_for_the_tick_counts_draws_no_verdict(monkeypatch):
    """/proc/stat counts 10 ms ticks: five ticks of somebody's work in a window of microseconds would read as
    thousands of cores (seen: a fake point of a few ms marked invalid for "82 CPU cores"); no figure is read
    below MIN_LOAD_WINDOW_S, and over a window long enough the same kind of count is read as load."""
    import time

    ticks = iter([(100, 0), (105, 0)])
    monkeypatch.setattr(contention, "_cpu_jiffies", lambda: next(ticks))
    short = contention.LoadMonitor().stop()
    assert math.isnan(short["others_cpu_load"]) and math.isnan(short["steal_frac"])
    assert contention.verdict(short)["valid"]
    ticks = iter([(100, 0), (160, 0)])
    monitor = contention.LoadMonitor()
    time.sleep(contention.MIN_LOAD_WINDOW_S)
    loaded = monitor.stop()
    assert loaded["others_cpu_load"] > contention.OTHERS_LOAD_LIMIT and not contention.verdict(loaded)["valid"]


def test_throughput_and_goodput_by_hand():
    row = metrics.summarize_point(_requests(), wall_s=5.0, slo_ttft_s=2.0, slo_tpot_s=0.2)
    assert row["output_throughput_tps"] == pytest.approx(7 / 5.0)
    assert row["request_throughput_rps"] == pytest.approx(2 / 5.0)
    assert row["goodput_rps"] == pytest.approx(1 / 5.0)     # only the first meets both SLOs


def test_a_point_row_carries_the_ignore_eos_its_requests_share():
    """The point row says how its requests generated (comparability across runs and the exports read it there):
    the requests' one value, None when they disagree or do not record it."""
    req = _requests()
    assert metrics.summarize_point(req, wall_s=5.0)["ignore_eos"] is None                 # not recorded
    assert metrics.summarize_point(req.assign(ignore_eos=True), wall_s=5.0)["ignore_eos"] is True
    assert metrics.summarize_point(req.assign(ignore_eos=[True, False, True]), wall_s=5.0)["ignore_eos"] is None
    pts = pd.DataFrame({"point_id": ["a", "b", "c"], "ignore_eos": [None, False, None]})
    reqs = pd.DataFrame({"point_id": ["a", "a", "b", "c", "c"], "ignore_eos": [True, True, True, True, False]})
    lifted = metrics.with_request_settings(pts, reqs)
    assert lifted["ignore_eos"].tolist() == [True, False, None]      # a point's own value wins; mixed stays None
    assert pts["ignore_eos"].tolist() == [None, False, None]         # a copy


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


def test_mbu_and_mfu_formulas():
    # 1e9 weight bytes + 1000 B/token * 2 rows * 500 tokens = 1.001e9 B/step; 0.01 s/step; peak 2e11 B/s
    assert metrics.mbu(10**9, 1000, 2, 500, 0.01, 2e11) == pytest.approx(1.001e9 / 0.01 / 2e11)
    flops = metrics.prefill_flops(num_params=100, num_layers=2, attn_dim=8, prompt_tokens=10, batch_size=3)
    assert flops == 3 * (2 * 100 * 10 + 4 * 2 * 100 * 8)
    assert metrics.mfu(flops, 2.0, flops) == pytest.approx(0.5)
    assert math.isnan(metrics.mbu(1, 1, 1, 1, float("nan"), 1.0))


def test_request_timing_by_hand():
    t = metrics.request_timing([10.5, 10.7, 11.0, 11.1], t_submit=10.0)
    assert t["output_tokens"] == 4
    assert t["ttft_s"] == pytest.approx(0.5) and t["e2e_s"] == pytest.approx(1.1)
    assert t["itl_s"] == pytest.approx([0.2, 0.3, 0.1])
    assert t["tpot_s"] == pytest.approx(0.6 / 3) and t["decode_tps"] == pytest.approx(3 / 0.6)
    one = metrics.request_timing([2.0], t_submit=1.5)
    assert one["ttft_s"] == one["e2e_s"] == pytest.approx(0.5) and one["itl_s"] == []
    assert math.isnan(one["tpot_s"]) and math.isnan(one["decode_tps"])
    none = metrics.request_timing([], t_submit=0.0)
    assert none["output_tokens"] == 0 and math.isnan(none["ttft_s"])


def test_labels_come_from_the_column_table():
    assert columns.label("ttft_s_p50") == "TTFT p50 (s)"
    assert columns.label("output_throughput_tps") == "output throughput (tokens/s)"
    assert columns.base_column("itl_s_p99") == ("itl_s", "p99")
    assert columns.label("unknown_thing") == "unknown thing"


def test_prefill_flops_match_an_independent_count_when_heads_times_head_dim_differs_from_hidden():
    """torch's FLOP counter on a one-layer Llama whose heads x head_dim (4 x 32 = 128) is twice its hidden size."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, vocab_size=100, attn_implementation="eager")
    model = LlamaForCausalLM(cfg).eval()
    L, B = 24, 2
    non_embedding = sum(p.numel() for n, p in model.model.named_parameters() if "embed" not in n)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model.model(input_ids=torch.randint(0, 100, (B, L)))   # the base model: no LM head, as in prefill
    ours = metrics.prefill_flops(non_embedding, 1, cfg.num_attention_heads * cfg.head_dim, L, B)
    assert ours == pytest.approx(counter.get_total_flops(), rel=0.02)   # norms' weights are the only slack
    wrong = metrics.prefill_flops(non_embedding, 1, cfg.hidden_size, L, B)
    assert abs(wrong / counter.get_total_flops() - 1) > 0.05               # the old hidden-size count is off


def test_utilisation_uses_the_recorded_batch_not_rows_per_repeat():
    """8 requests run one at a time (batch_size 1) in one repeat: MFU and MBU of batch 1, not 8."""
    from types import SimpleNamespace

    info = SimpleNamespace(weight_bytes=10**8, num_non_embedding_params=10**8, num_layers=30, attn_dim=576,
                           kv_cache_bytes_per_token=lambda: 46080)
    env = {"bandwidth_bytes_per_s": 2e10, "flops_per_s": 1e11}
    req = pd.DataFrame({"repeat": [0] * 8, "batch_size": [1] * 8, "prompt_tokens": [100] * 8,
                        "output_tokens": [10] * 8})
    summary = {"tpot_s_p50": 0.05, "prefill_s_p50": 0.2}
    got = metrics.utilisation(req, summary, info, env)
    want_mfu = metrics.mfu(metrics.prefill_flops(10**8, 30, 576, 100, 1), 0.2, 1e11)
    assert got["mfu"] == pytest.approx(want_mfu)
    assert got["mbu"] == pytest.approx(metrics.mbu(10**8, 46080, 1, 105, 0.05, 2e10))
    batched = metrics.utilisation(req.assign(batch_size=8), summary, info, env)
    assert batched["mfu"] == pytest.approx(8 * want_mfu)
    assert metrics.utilisation(req.drop(columns="batch_size"), summary, info, env) == {}   # never guessed


def test_tpot_of_is_the_one_tpot_formula_and_nan_where_undefined():
    assert metrics.tpot_of(0.2, 1.0, 5) == pytest.approx(0.2)
    t = metrics.request_timing([1.0, 1.1, 1.3, 1.6], 0.5)
    assert t["tpot_s"] == pytest.approx(metrics.tpot_of(t["ttft_s"], t["e2e_s"], t["output_tokens"]))
    for bad in ((0.2, 1.0, 1), (None, 1.0, 5), (0.2, float("nan"), 5), (1.0, 0.2, 5), ("x", 1, 3)):
        assert math.isnan(metrics.tpot_of(*bad)), bad
