"""The roofline's formulas (workbench.predict.roofline) against hand-computed values on a tiny config."""
import pytest

from workbench.predict import roofline

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
    # prefill: bytes 5088 + 64x4 = 5344 -> 5.344 s; FLOPs 2x1192x4 + (4x2x4^2x8) / 2 (causal) + 2x80 = 10208
    assert p["predicted_prefill_s"] == pytest.approx(5.344 + 1.0208)
    # decode at context 4 + 3/2 = 5.5: bytes 5088 + 64x5.5 = 5440 -> 5.44 s; FLOPs 2x1272 + 4x2x5.5x8 = 2896
    assert p["predicted_tpot_s"] == pytest.approx(5.44 + 0.2896)
    assert p["predicted_ttft_s"] == pytest.approx(6.3648)
    assert p["predicted_e2e_s"] == pytest.approx(6.3648 + 2 * 5.7296)
    assert p["predicted_output_throughput_tps"] == pytest.approx(3 / (6.3648 + 2 * 5.7296))
    assert p["predicted_kv_cache_bytes"] == 64 * 7
    assert p["bound"] == "memory" and p["decode_bound"] == "memory"
    # overlapped device (GPU): a phase takes the larger term only
    q = roofline.predict(s, dev.__class__(1000.0, 1e4, 1, overlap=True), roofline.Calibration(), 1, 4, 3)
    assert q["predicted_prefill_s"] == pytest.approx(5.344)
    # a big fixed per-step overhead makes the point overhead-bound; efficiency 0.5 doubles compute
    c = roofline.Calibration(step_overhead_s=100.0, prefill_efficiency=0.5, ttft_overhead_s=1.0)
    r = roofline.predict(s, dev, c, 1, 4, 3)
    assert r["predicted_prefill_s"] == pytest.approx(5.344 + 2 * 1.0208)
    assert r["predicted_ttft_s"] == pytest.approx(1.0 + 5.344 + 2 * 1.0208)
    assert r["bound"] == "overhead" and r["prefill_bound"] == "memory"
    # compute-bound prefill: a long prompt on a slow-FLOP device
    slow = roofline.Device(1e9, 1e3, 1)
    assert roofline.predict(s, slow, roofline.Calibration(), 1, 512, 2)["prefill_bound"] == "compute"
    # threads scale FLOP/s on CPU
    two = roofline.Device(1000.0, 1e4, threads=2)
    assert roofline.predict(s, two, roofline.Calibration(), 1, 4, 3, threads=1)["predicted_prefill_s"] == \
        pytest.approx(5.344 + 2 * 1.0208)


def test_per_row_cost_and_kv_traffic_match_hand_computed_values():
    s = roofline.ModelShape.from_config(TINY)
    dev = roofline.Device(bandwidth_bytes_per_s=1000.0, flops_per_s=1e4, threads=1, overlap=False)
    c = roofline.Calibration(step_overhead_s=0.5, step_row_overhead_s=0.25, kv_traffic=3.0)
    p = roofline.predict(s, dev, c, batch_size=2, prompt_tokens=4, output_tokens=3)
    # decode at context 5.5: bytes 5088 + 3 x 64 x 2 x 5.5 = 7200 -> 7.2 s; FLOPs 2 x 2896 = 5792 -> 0.5792 s;
    # overheads 0.5 + 2 x 0.25 = 1.0 s
    assert p["predicted_tpot_s"] == pytest.approx(7.2 + 0.5792 + 1.0)
    assert roofline.decode_terms(s, 2, 5.5, kv_traffic=3.0) == (7200.0, 5792.0)
