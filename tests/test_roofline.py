"""The calibrated roofline: formulas against hand-computed values on a tiny config, the calibration fit,
the residual summary, and `workbench plan` / `--dry-run` without loading weights."""
import math

import pandas as pd
import pytest

from workbench import roofline

TINY = {"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 4, "num_hidden_layers": 2, "intermediate_size": 16, "vocab_size": 10,
        "tie_word_embeddings": True}


def test_shape_counts_parameters_from_the_config():
    s = roofline.ModelShape.from_config(TINY)
    # per layer: q,o 8x(2x4) each = 128; k,v 8x(1x4) each = 64; gated MLP 3x8x16 = 384; 2 norms 16 -> 592
    assert s.num_non_embedding_params == 2 * 592 + 8 == 1192
    assert s.num_params == 1192 + 10 * 8 == 1272
    assert s.weight_bytes == 1272 * 4
    assert s.kv_cache_bytes_per_token() == 2 * 2 * 1 * 4 * 4 == 64
    assert s.attn_dim == 8 and s.head_params == 80
    assert s.with_dtype("bfloat16").weight_bytes == 1272 * 2
    untied = roofline.ModelShape.from_config({**TINY, "tie_word_embeddings": False})
    assert untied.num_params == 1272 + 80 and untied.num_non_embedding_params == 1192


def test_smollm2_config_gives_its_known_parameter_count():
    cfg = {"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
           "head_dim": 64, "num_hidden_layers": 30, "intermediate_size": 1536, "vocab_size": 49152,
           "tie_word_embeddings": True}
    s = roofline.ModelShape.from_config(cfg)
    assert s.num_params == 134_515_008 and s.num_non_embedding_params == 106_203_456


def test_predict_matches_hand_computed_values():
    s = roofline.ModelShape.from_config(TINY)
    dev = roofline.Device(bandwidth_bytes_per_s=1000.0, flops_per_s=1e4, threads=1, overlap=False)
    p = roofline.predict(s, dev, roofline.Calibration(), batch_size=1, prompt_tokens=4, output_tokens=3)
    # prefill: bytes 5088 + 64x4 = 5344 -> 5.344 s; FLOPs 2x1192x4 + 4x2x4^2x8 + 2x80 = 10720 -> 1.072 s
    assert p["predicted_prefill_s"] == pytest.approx(5.344 + 1.072)
    # decode at context 4 + 3/2 = 5.5: bytes 5088 + 64x5.5 = 5440 -> 5.44 s; FLOPs 2x1272 + 4x2x5.5x8 = 2896
    assert p["predicted_tpot_s"] == pytest.approx(5.44 + 0.2896)
    assert p["predicted_ttft_s"] == pytest.approx(6.416)
    assert p["predicted_e2e_s"] == pytest.approx(6.416 + 2 * 5.7296)
    assert p["predicted_output_throughput_tps"] == pytest.approx(3 / (6.416 + 2 * 5.7296))
    assert p["predicted_kv_cache_bytes"] == 64 * 7
    assert p["bound"] == "memory" and p["decode_bound"] == "memory"
    # overlapped device (GPU): a phase takes the larger term only
    q = roofline.predict(s, dev.__class__(1000.0, 1e4, 1, overlap=True), roofline.Calibration(), 1, 4, 3)
    assert q["predicted_prefill_s"] == pytest.approx(5.344)
    # a big fixed per-step overhead makes the point overhead-bound; efficiency 0.5 doubles compute
    c = roofline.Calibration(step_overhead_s=100.0, prefill_efficiency=0.5, ttft_overhead_s=1.0)
    r = roofline.predict(s, dev, c, 1, 4, 3)
    assert r["predicted_prefill_s"] == pytest.approx(5.344 + 2 * 1.072)
    assert r["predicted_ttft_s"] == pytest.approx(1.0 + 5.344 + 2.144)
    assert r["bound"] == "overhead" and r["prefill_bound"] == "memory"
    # compute-bound prefill: a long prompt on a slow-FLOP device
    slow = roofline.Device(1e9, 1e3, 1)
    assert roofline.predict(s, slow, roofline.Calibration(), 1, 512, 2)["prefill_bound"] == "compute"
    # threads scale FLOP/s on CPU
    two = roofline.Device(1000.0, 1e4, threads=2)
    assert roofline.predict(s, two, roofline.Calibration(), 1, 4, 3, threads=1)["predicted_prefill_s"] == \
        pytest.approx(5.344 + 2 * 1.072)


def test_calibration_fit_recovers_known_overheads():
    s = roofline.ModelShape.from_config(TINY)
    dev = roofline.Device(1000.0, 1e4, 1)
    truth = roofline.Calibration(prefill_overhead_s=0.5, prefill_efficiency=0.4, step_overhead_s=0.2,
                                 decode_efficiency=0.25, ttft_overhead_s=0.05, calibrated=True)
    rows = []
    for B, L in ((1, 32), (1, 256), (8, 64)):
        p = roofline.predict(s, dev, truth, B, L, 8)
        rows.append({"batch_size": B, "prompt_tokens": L, "output_tokens": 8, "prefill_s": p["predicted_prefill_s"],
                     "ttft_s": p["predicted_ttft_s"], "tpot_s": p["predicted_tpot_s"]})
    fit = roofline.fit_calibration(s, dev, pd.DataFrame(rows))
    assert fit.calibrated
    assert fit.prefill_overhead_s == pytest.approx(0.5, rel=0.05)
    assert fit.prefill_efficiency == pytest.approx(0.4, rel=0.03)
    assert fit.step_overhead_s == pytest.approx(0.2, rel=0.05)
    assert fit.decode_efficiency == pytest.approx(0.25, rel=0.03)
    assert fit.ttft_overhead_s == pytest.approx(0.05)


def test_residual_summary_names_points_outside_the_limit():
    table = pd.DataFrame({"point_id": ["a", "b"], "ttft_ratio": [1.1, 2.0], "tpot_ratio": [0.95, 1.0],
                          "bound": ["memory", "overhead"]})
    text = roofline.residual_summary(table)
    assert "TTFT median |measured/predicted - 1| = 55.0%" in text
    assert "b ratio 2.00 (model says prefill is overhead-bound)" in text and "TPOT median" in text


def test_workload_of_reads_points_and_config_fields():
    class Cfg:
        max_new_tokens = 16
        batch_sizes = [1, 4]

    assert roofline.workload_of(Cfg(), {"prompt_tokens": 64, "batch_size": 2}) == \
        {"batch_size": 2, "prompt_tokens": 64, "output_tokens": 16, "exact": True}
    assert roofline.workload_of(Cfg(), {})["batch_size"] == 4


@pytest.fixture
def no_weights(monkeypatch):
    """Any attempt to load weights fails the test."""
    import transformers

    from workbench import models

    def boom(*a, **k):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(models, "load_model", boom)
    monkeypatch.setattr(models, "_load_cached", boom)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)


def test_plan_runs_without_loading_weights(no_weights, capsys, monkeypatch, tmp_path):
    from workbench import cli

    monkeypatch.setenv("WORKBENCH_CACHE_UNUSED", "1")
    assert cli.main(["plan", "quick", "--no-probe"]) == 0
    out = capsys.readouterr().out
    assert "batch_size/prompt_tokens=64,batch_size=1" in out and "engine_tuning/" in out
    assert "estimated wall time" in out and "predicted_ttft_s" in out


def test_dry_run_on_sweep_measures_nothing(no_weights, capsys, monkeypatch):
    from workbench import cli, roofline as rl

    real = rl.Predictor.for_model
    monkeypatch.setattr(rl.Predictor, "for_model", classmethod(lambda cls, *a, **k: real(*a, **{**k, "probe": False})))
    assert cli.main(["sweep", "01_batch_size", "-p", "batch_sizes", "[1, 2, 4]", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("batch_size/prompt_tokens=") == 6 and "estimated wall time" in out


def test_plan_entries_estimate_wall_time_from_predictions():
    s = roofline.ModelShape.from_config(TINY)
    pred = roofline.Predictor(s, roofline.Device(1e9, 1e10, 1), roofline.Calibration(step_overhead_s=0.01))
    from workbench import notebooks

    plan = roofline.plan_entries([{"notebook": str(notebooks.NOTEBOOKS_DIR / "01_batch_size.ipynb"),
                                   "parameters": {"batch_sizes": [1, 2], "prompt_tokens": [64], "repeats": 2}}], pred,
                                 load_s=0.0)
    assert len(plan) == 2 and (plan["estimated_wall_s"] > 0).all()
    runs = 1 + 2  # warm-up + repeats
    assert plan["estimated_wall_s"].iloc[0] == pytest.approx(runs * plan["predicted_e2e_s"].iloc[0])
    assert math.isfinite(plan["predicted_tpot_s"].iloc[1])
