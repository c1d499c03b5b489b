"""The calibrated roofline: formulas against hand-computed values on a tiny config, the calibration fit,
the residual summary, and `workbench plan` / `--dry-run` without loading weights."""
import math
from pathlib import Path

import pandas as pd
import pytest

from workbench.predict import predictions, roofline, roofline_calibration

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


def _runs(s, dev, truth, noise=0.0):
    import random

    rng = random.Random(0)
    rows = []
    for B, L in roofline_calibration.CALIBRATION_RUNS:
        for _ in range(2):
            p = roofline.predict(s, dev, truth, B, L, 8)
            jit = 1 + rng.uniform(-noise, noise)
            rows.append({"batch_size": B, "prompt_tokens": L, "output_tokens": 8,
                         "prefill_s": p["predicted_prefill_s"] * jit, "ttft_s": p["predicted_ttft_s"] * jit,
                         "tpot_s": p["predicted_tpot_s"] * jit})
    return pd.DataFrame(rows)


def test_calibration_fit_recovers_known_overheads():
    s = roofline.ModelShape.from_config(TINY)
    dev = roofline.Device(1000.0, 1e4, 1)
    truth = roofline.Calibration(prefill_overhead_s=0.5, prefill_efficiency=0.4, step_overhead_s=0.2,
                                 decode_efficiency=0.4, ttft_overhead_s=0.05, calibrated=True,
                                 step_row_overhead_s=0.03, kv_traffic=3.0)
    fit = roofline_calibration.fit_calibration(s, dev, _runs(s, dev, truth))
    assert fit.calibrated and fit.version == roofline.CALIBRATION_VERSION
    assert fit.prefill_overhead_s == pytest.approx(0.5, rel=0.05)
    assert fit.prefill_efficiency == pytest.approx(0.4, rel=0.03)
    assert fit.step_overhead_s == pytest.approx(0.2, rel=0.05)
    assert fit.decode_efficiency == pytest.approx(0.4, rel=0.03)  # decode matmuls at the prefill's efficiency
    assert fit.step_row_overhead_s == pytest.approx(0.03, rel=0.05)
    assert fit.kv_traffic == pytest.approx(3.0, rel=0.05)
    assert fit.ttft_overhead_s == pytest.approx(0.05)


def test_calibrated_model_predicts_unseen_batches_and_contexts():
    """Fitted on the three calibration workloads (with 3% noise), the model predicts the default CPU suite's
    batch sizes and contexts of a machine that follows it within a few percent."""
    s = roofline.ModelShape.from_config(TINY)
    dev = roofline.Device(1e5, 1e7, 1)
    truth = roofline.Calibration(0.1, 0.6, 0.05, 0.6, 0.01, True, step_row_overhead_s=0.004, kv_traffic=6.0,
                                 batched_step_overhead_s=0.04)
    fit = roofline_calibration.fit_calibration(s, dev, _runs(s, dev, truth, noise=0.03))
    assert fit.batched_step_overhead_s == pytest.approx(0.04, rel=0.3)  # the GEMV -> GEMM switch is recovered
    for B in (1, 2, 4, 8, 16):
        for L in (128, 512, 2048):
            want, got = (roofline.predict(s, dev, c, B, L, 32) for c in (truth, fit))
            for k in ("predicted_ttft_s", "predicted_tpot_s"):
                assert got[k] == pytest.approx(want[k], rel=0.1), (B, L, k)


def test_each_dtype_uses_its_own_cached_calibration(tmp_path, monkeypatch):
    import json
    import dataclasses

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    s = roofline.ModelShape.from_config(TINY)
    f32 = roofline.Device(1000.0, 1e4, 1)
    base = roofline.Calibration(step_overhead_s=1.0, calibrated=True)
    bf16_dev = roofline.Device(1000.0, 5e3, 1, dtype="bfloat16")
    bf16 = roofline.Calibration(step_overhead_s=2.0, calibrated=True)
    path = roofline_calibration.cache_path(str(tmp_path), "cpu", "bfloat16", roofline_calibration.torch_threads())
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"device": dataclasses.asdict(bf16_dev), "calibration": dataclasses.asdict(bf16)}))
    pred = roofline_calibration.Predictor(s, f32, base, probe=False, model_path=str(tmp_path))
    shape, dev, calib = pred.for_dtype("bfloat16")
    assert shape.weight_bytes == 1272 * 2 and dev.flops_per_s == 5e3 and calib.step_overhead_s == 2.0
    assert pred.calibrated_dtype("bfloat16") == "bfloat16" and pred.calibrated_dtype("float32") == "float32"
    assert pred.predict(1, 4, 3, dtype="bfloat16") == roofline.predict(shape, bf16_dev, bf16, 1, 4, 3)
    # float16 has no calibration of its own: its probed FLOP/s with the float32 overheads
    shape, dev, calib = pred.for_dtype("float16")
    assert calib is base and dev.dtype == "float16" and pred.calibrated_dtype("float16") == "float32"
    # a stale calibration (older fitted model) is not used
    path.write_text(json.dumps({"device": dataclasses.asdict(bf16_dev),
                                "calibration": {**dataclasses.asdict(bf16), "version": 1}}))
    assert roofline_calibration.load_cached(str(tmp_path), "cpu", "bfloat16", roofline_calibration.torch_threads()) is None


def test_residual_summary_names_points_outside_the_limit():
    table = pd.DataFrame({"point_id": ["a", "b"], "ttft_ratio": [1.1, 2.0], "tpot_ratio": [0.95, 1.0],
                          "bound": ["memory", "overhead"]})
    text = predictions.residual_summary(table)
    assert "TTFT median |measured/predicted - 1| = 55.0%" in text
    assert "b ratio 2.00 (model says prefill is overhead-bound)" in text and "TPOT median" in text


def test_workload_of_reads_points_and_config_fields():
    class Cfg:
        max_new_tokens = 16
        batch_sizes = [1, 4]

    assert predictions.workload_of(Cfg(), {"prompt_tokens": 64, "batch_size": 2}) == \
        {"batch_size": 2, "prompt_tokens": 64, "output_tokens": 16, "exact": True}
    assert predictions.workload_of(Cfg(), {})["batch_size"] == 4


@pytest.fixture
def no_weights(monkeypatch):
    """Any attempt to load weights fails the test."""
    import transformers

    from workbench.measure import models

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
    from workbench import cli
    from workbench.predict import roofline_calibration as rl

    real = rl.Predictor.for_model
    monkeypatch.setattr(rl.Predictor, "for_model", classmethod(lambda cls, *a, **k: real(*a, **{**k, "probe": False})))
    assert cli.main(["sweep", "01_batch_size", "-p", "batch_sizes", "[1, 2, 4]", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("batch_size/prompt_tokens=") == 6 and "estimated wall time" in out


def test_plan_entries_estimate_wall_time_from_predictions():
    s = roofline.ModelShape.from_config(TINY)
    pred = roofline_calibration.Predictor(s, roofline.Device(1e9, 1e10, 1), roofline.Calibration(step_overhead_s=0.01))
    from workbench.run import notebooks

    plan = predictions.plan_entries([{"notebook": str(notebooks.NOTEBOOKS_DIR / "01_batch_size.ipynb"),
                                      "parameters": {"batch_sizes": [1, 2], "prompt_tokens": [64], "repeats": 2}}],
                                    pred, load_s=0.0)
    assert len(plan) == 2 and (plan["estimated_wall_s"] > 0).all()
    runs = 1 + 2  # warm-up + repeats
    assert plan["estimated_wall_s"].iloc[0] == pytest.approx(runs * plan["predicted_e2e_s"].iloc[0])
    assert math.isfinite(plan["predicted_tpot_s"].iloc[1])


def test_report_shows_the_residual_table_of_a_run_with_predictions():
    import sys
    from pathlib import Path

    from workbench.share import report
    from workbench.run import results

    sys.path.insert(0, str(Path(__file__).parent))
    from test_report import fake_point, make_run

    run = make_run([fake_point()])
    exp = next(iter(results.read_manifest(run)["experiments"]))
    points = results.read_points(run, exp).assign(predicted_ttft_s=0.1, predicted_tpot_s=0.2, prefill_bound="compute",
                                                  decode_bound="overhead", bound="overhead")
    points["ttft_ratio"] = points["ttft_s_p50"] / points["predicted_ttft_s"]
    points["tpot_ratio"] = points["tpot_s_p50"] / points["predicted_tpot_s"]
    predictions.save_residuals(run, exp, points)
    html = report.build_report(run).read_text()
    assert "Measured / predicted (calibrated roofline): TTFT median |measured/predicted - 1| = 100.0%" in html
    assert "tpot_ratio" in html and "<td>0.5</td>" in html and "(model says prefill is compute-bound)" in html


def _private_cache(monkeypatch, tmp_path):
    """Calibrations under tmp_path (the model cache itself stays: the default model is not converted again)."""
    monkeypatch.setattr(roofline_calibration, "cache_path", lambda model, device, dtype, threads:
                        tmp_path / f"{abs(hash(str(model)))}-{device}-{dtype}-{threads}.json")


def test_predict_rows_uses_the_cached_calibration_or_nothing(tmp_path, monkeypatch):
    import dataclasses
    import json

    _private_cache(monkeypatch, tmp_path)
    rows = pd.DataFrame({"model": ["default"] * 2, "device": ["cpu"] * 2, "dtype": ["float32"] * 2,
                         "batch_size": [1, 4], "prompt_tokens": [64, 64], "output_tokens": [16, 16]})
    assert predictions.predict_rows(rows)["predicted_tpot_s"].isna().all()  # no calibration: no prediction
    from workbench.measure import models

    path = roofline_calibration.cache_path(str(models.resolve_model_path("default")), "cpu", "float32",
                                           roofline_calibration.torch_threads())
    dev, cal = roofline.Device(1e10, 1e11, 2), roofline.Calibration(step_overhead_s=0.01, calibrated=True)
    path.write_text(json.dumps({"device": dataclasses.asdict(dev), "calibration": dataclasses.asdict(cal)}))
    out = predictions.predict_rows(rows)
    shape = roofline.ModelShape.from_model("default")
    assert out["predicted_tpot_s"].tolist() == pytest.approx(
        [roofline.predict(shape, dev, cal, B, 64, 16)["predicted_tpot_s"] for B in (1, 4)])
    assert out["predicted_output_throughput_tps"].iloc[1] > out["predicted_output_throughput_tps"].iloc[0]


@pytest.fixture
def calibrated(tmp_path, monkeypatch):
    """A cached calibration of the default model (float32, CPU) in a private cache folder."""
    import dataclasses
    import json

    from workbench.measure import models

    _private_cache(monkeypatch, tmp_path)
    path = roofline_calibration.cache_path(str(models.resolve_model_path("default")), "cpu", "float32",
                                           roofline_calibration.torch_threads())
    dev, cal = roofline.Device(1e10, 1e11, 2), roofline.Calibration(step_overhead_s=0.01, calibrated=True)
    path.write_text(json.dumps({"device": dataclasses.asdict(dev), "calibration": dataclasses.asdict(cal)}))


def test_experiment_figures_show_the_prediction_beside_the_measurement(calibrated):
    from workbench.experiments import long_output, reasoning_budget, streaming_anatomy, temperature

    run = {"model": "default", "device": "cpu", "dtype": "float32", "prompt_tokens": 64, "status": "ok"}
    req = pd.DataFrame([{**run, "batch_size": 1, "max_new_tokens": n, "output_tokens": n, "ttft_s": 0.1,
                         "first_display_s": 0.12, "e2e_s": 0.1 + 0.05 * n} for n in (8, 32)])
    fig = streaming_anatomy.perceived_latency_figure(req)
    assert {"predicted TTFT", "predicted whole answer"} <= {t.name for t in fig.data}
    pts = pd.DataFrame([{**run, "reasoning_budget": b, "batch_size": 2, "ttft_s_p50": 0.1, "ttfat_s_p50": 0.2,
                         "e2e_s_p50": 1.0, "output_throughput_tps": 10.0, "output_tokens_mean": 16 + b} for b in (0, 8)])
    assert any(t.name.startswith("predicted") for t in reasoning_budget.fig_throughput_vs_budget(pts).data)
    assert {"predicted TTFT, 2", "predicted e2e, 2"} <= {t.name for t in reasoning_budget.fig_latency_vs_budget(pts).data}
    tp = pd.DataFrame([{**run, "family": "report", "temperature": t, "top_p": 1.0, "tpot_s_p50": 0.05, "e2e_s_p50": 1.0,
                        "output_throughput_tps": 20.0, "output_tokens_mean": 20.0, "batch_size": 1} for t in (0.0, 0.7)])
    assert any("(predicted)" in t.name for t in temperature.fig_speed_vs_temperature(tp).data)
    lo = pd.DataFrame([{**run, "experiment": "long_output", "strategy": s, "language": "en", "first_text_s": 0.1,
                        "first_section_s": 0.2, "wall_s": 1.0, "coverage": 1.0, "repetition": 0.0, "output_tokens": 40,
                        "batch_size": 1} for s in ("one_shot", "outline_batch")])
    names = {t.name for t in long_output.figures(lo)["long_output"].data}
    assert "wall time, predicted (roofline, one generate)" in names


def test_rows_recording_the_default_models_display_name_find_its_folder():
    """Rows record ``info.name`` (e.g. SmolLM2-135M-Instruct), not a path: predictions beside the measured
    points of every experiment depend on finding the model folder from it."""
    from pathlib import Path

    from workbench.measure import models

    folder = models.resolve_model_path("default")
    name = "-".join(Path(folder).name.split("-")[:-1])
    assert predictions._model_path(name) == str(folder)
    assert predictions._model_path("not-a-model-anywhere") is None


def test_rows_with_a_model_path_find_their_calibration_whatever_the_display_name(calibrated):
    """New rows record ``model_path`` beside the display name; the path wins, so a model whose display name
    resolves to nothing (any model not the embedded default) still gets its prediction."""
    from workbench.measure import models

    row = {"model": "renamed-model", "device": "cpu", "dtype": "float32", "batch_size": 1, "prompt_tokens": 64,
           "output_tokens": 16}
    assert predictions.predict_rows(pd.DataFrame([row]))["predicted_tpot_s"].isna().all()
    row["model_path"] = str(models.resolve_model_path("default"))
    assert predictions.predict_rows(pd.DataFrame([row]))["predicted_tpot_s"].notna().all()



# ----------------------------------------------------------------------------- out-of-sample error, cached calibration


def _perturbed_runs(s, dev, truth, workloads, wobble):
    """Noise-free runs of ``truth`` on ``workloads``, each workload's TPOT off the model by its own ``wobble``."""
    rows = []
    for (B, L), w in zip(workloads, wobble):
        p = roofline.predict(s, dev, truth, B, L, 8)
        for _ in range(2):
            rows.append({"batch_size": B, "prompt_tokens": L, "output_tokens": 8, "prefill_s": p["predicted_prefill_s"],
                         "ttft_s": p["predicted_ttft_s"], "tpot_s": p["predicted_tpot_s"] * (1 + w)})
    return pd.DataFrame(rows)


def test_calibration_quotes_its_error_out_of_sample():
    """Issue 21: 4 decode coefficients fitted to 4 workloads is an exact fit, so its in-sample error is ~0 and says
    nothing; the leave-one-workload-out error does not vanish, and the calibration has two spare workloads."""
    s = roofline.ModelShape.from_config(TINY)
    dev = roofline.Device(1e5, 1e7, 1)
    truth = roofline.Calibration(0.1, 0.6, 0.05, 0.6, 0.01, True, step_row_overhead_s=0.004, kv_traffic=6.0,
                                 batched_step_overhead_s=0.04)
    four = ((1, 32), (1, 384), (2, 32), (8, 96))
    exact = roofline_calibration.fit_calibration(s, dev, _perturbed_runs(s, dev, truth, four,
                                                                          (0.04, -0.03, 0.05, -0.02)))
    assert exact.workloads == 4 and exact.in_sample_tpot_error < 1e-3
    assert exact.loo_tpot_error > 10 * max(exact.in_sample_tpot_error, 1e-4)
    assert len(set(roofline_calibration.CALIBRATION_RUNS)) >= roofline.DECODE_PARAMETERS + 2
    assert len(set(roofline_calibration.CALIBRATION_RUNS_SMALL)) >= roofline.DECODE_PARAMETERS + 2
    six = roofline_calibration.fit_calibration(s, dev, _perturbed_runs(
        s, dev, truth, roofline_calibration.CALIBRATION_RUNS, (0.04, -0.03, 0.05, -0.02, 0.03, -0.04)))
    assert six.workloads == 6 and six.loo_tpot_error > six.in_sample_tpot_error > 0
    assert math.isfinite(six.loo_ttft_error)


def _days():
    """A calibration fitted on a slow day, and the same machine on a fast day (1.6x the FLOP/s, 1.5x the
    bandwidth, overheads 1.6x shorter)."""
    s = roofline.ModelShape.from_config(TINY)
    slow_dev = roofline.Device(1e5, 1e7, 1)
    slow = roofline.Calibration(0.1, 0.6, 0.05, 0.6, 0.01, True, step_row_overhead_s=0.004, kv_traffic=6.0,
                                batched_step_overhead_s=0.04)
    fast_dev = roofline.Device(1.5e5, 1.6e7, 1)
    k = 1 / 1.6
    fast = roofline.Calibration(0.1 * k, 0.6, 0.05 * k, 0.6, 0.01 * k, True, step_row_overhead_s=0.004 * k,
                                kv_traffic=6.0, batched_step_overhead_s=0.04 * k)
    return s, (slow_dev, slow), (fast_dev, fast)


def test_a_cached_calibration_off_todays_probe_is_rescaled():
    s, (slow_dev, slow), (fast_dev, fast) = _days()
    want = roofline.predict(s, fast_dev, fast, 4, 256, 32)["predicted_e2e_s"]
    stale = roofline.predict(s, slow_dev, slow, 4, 256, 32)["predicted_e2e_s"]
    assert stale > 1.3 * want  # the slow day's calibration over-predicts the fast day
    dev, calib = roofline_calibration.check_calibration((slow_dev, slow), fast_dev)
    assert calib.check.startswith("rescaled") and dev.flops_per_s == fast_dev.flops_per_s
    assert roofline.predict(s, dev, calib, 4, 256, 32)["predicted_e2e_s"] == pytest.approx(want, rel=0.15)
    # within 15%: kept as cached
    near = roofline.Device(1.05e5, 1.1e7, 1)
    dev, calib = roofline_calibration.check_calibration((slow_dev, slow), near)
    assert dev is slow_dev and calib.check.startswith("kept") and calib.step_overhead_s == slow.step_overhead_s


def test_a_cached_calibration_off_todays_probe_is_refit_when_the_model_is_loaded(tmp_path, monkeypatch):
    import dataclasses
    import json
    from types import SimpleNamespace

    s, (slow_dev, slow), (fast_dev, fast) = _days()
    monkeypatch.setattr(roofline_calibration, "cache_path", lambda *a: tmp_path / "calib.json")
    (tmp_path / "calib.json").write_text(json.dumps({"device": dataclasses.asdict(slow_dev),
                                                     "calibration": dataclasses.asdict(slow)}))
    monkeypatch.setattr(roofline.Device, "probe", classmethod(lambda cls, *a, **k: fast_dev))
    refits = []
    monkeypatch.setattr(roofline_calibration, "calibrate", lambda loaded, **k: refits.append(k) or (fast_dev, fast))
    monkeypatch.setattr(roofline_calibration, "shape_of", lambda info: s)
    loaded = SimpleNamespace(info=SimpleNamespace(path=str(tmp_path), device="cpu", dtype="float32"))
    pred = predictions.calibrated_predictor(loaded)
    assert refits and pred.calib.check.startswith("refit") and pred.device is fast_dev


def test_plan_predictor_rescales_a_stale_cached_calibration(tmp_path, monkeypatch):
    """The config-only predictor (``workbench plan``) probes today's device and rescales a calibration cached on
    a slower day instead of over-predicting by its ratio."""
    import dataclasses
    import json

    _, (slow_dev, slow), (fast_dev, fast) = _days()
    monkeypatch.setattr(roofline_calibration, "cache_path", lambda *a: tmp_path / "calib.json")
    (tmp_path / "calib.json").write_text(json.dumps({"device": dataclasses.asdict(slow_dev),
                                                     "calibration": dataclasses.asdict(slow)}))
    monkeypatch.setattr(roofline.Device, "probe", classmethod(lambda cls, *a, **k: fast_dev))
    pred = roofline_calibration.Predictor.for_model("default", "cpu", "float32", probe=True)
    want = roofline.predict(pred.shape, fast_dev, fast, 4, 256, 32)["predicted_e2e_s"]
    assert pred.predict(4, 256, 32)["predicted_e2e_s"] == pytest.approx(want, rel=0.15)
    assert pred.calib.check.startswith("rescaled")


def _stale_cache(tmp_path, monkeypatch, today):
    """A slow day's calibration cached in ``tmp_path``; every probe of today answers ``today``; counts probes and
    refits."""
    import dataclasses
    import json

    s, (slow_dev, slow), _ = _days()
    monkeypatch.setattr(roofline_calibration, "cache_path", lambda *a: tmp_path / "calib.json")
    (tmp_path / "calib.json").write_text(json.dumps({"device": dataclasses.asdict(slow_dev),
                                                     "calibration": dataclasses.asdict(slow)}))
    calls = {"probe": 0, "refit": 0}

    def probe(cls, *a, **k):
        calls["probe"] += 1
        return today

    monkeypatch.setattr(roofline.Device, "probe", classmethod(probe))
    monkeypatch.setattr(roofline_calibration, "calibrate",
                        lambda loaded, **k: calls.__setitem__("refit", calls["refit"] + 1)
                        or (today, dataclasses.replace(slow, check="")))
    return calls


def test_a_cached_calibration_is_checked_once_per_process_until_its_file_changes(tmp_path, monkeypatch):
    """The notebooks of one run share a kernel: the second check reuses the first (no second probe, no second
    refit); a calibration file written since is checked afresh."""
    import os
    from types import SimpleNamespace

    _, _, (fast_dev, _) = _days()
    calls = _stale_cache(tmp_path, monkeypatch, fast_dev)
    loaded = SimpleNamespace()
    first = roofline_calibration.checked_cached(str(tmp_path), "cpu", "float32", 1, loaded)
    again = roofline_calibration.checked_cached(str(tmp_path), "cpu", "float32", 1, loaded)
    assert again is first and calls == {"probe": 1, "refit": 1}
    st = (tmp_path / "calib.json").stat()
    os.utime(tmp_path / "calib.json", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))   # rewritten since
    roofline_calibration.checked_cached(str(tmp_path), "cpu", "float32", 1, loaded)
    assert calls == {"probe": 2, "refit": 2}


def test_a_noisy_probe_rescales_instead_of_refitting(tmp_path, monkeypatch):
    """Today's probe spread beyond its limit (other load): the moved machine is rescaled, not refitted under load,
    and the check says why."""
    import dataclasses
    from types import SimpleNamespace

    _, _, (fast_dev, _) = _days()
    calls = _stale_cache(tmp_path, monkeypatch, dataclasses.replace(fast_dev, noisy=True))
    dev, calib = roofline_calibration.checked_cached(str(tmp_path), "cpu", "float32", 1, SimpleNamespace())
    assert calls["refit"] == 0 and calib.check.startswith("rescaled") and "noisy: not refitted" in calib.check
    assert dev.flops_per_s == fast_dev.flops_per_s


def test_a_moderate_move_is_rescaled_even_with_the_model_loaded(tmp_path, monkeypatch):
    """Today's FLOP/s 1.3x the cached probe's (within REFIT_LIMIT, beyond RECALIBRATE_LIMIT): rescaled without a
    refit; the 1.6x day of the test above still refits."""
    from types import SimpleNamespace

    today = roofline.Device(1.05e5, 1.3e7, 1)
    calls = _stale_cache(tmp_path, monkeypatch, today)
    dev, calib = roofline_calibration.checked_cached(str(tmp_path), "cpu", "float32", 1, SimpleNamespace())
    assert calls["refit"] == 0 and calib.check.startswith("rescaled") and dev.flops_per_s == today.flops_per_s


def test_the_plan_counts_every_sweep_a_notebook_runs():
    """``workbench plan default`` said 58 points where the run measured 73: streaming anatomy's three sweeps, the
    compression notebook's chat sweep and long output's grid were one "(single)" row or missing."""
    s = roofline.ModelShape.from_config(TINY)
    pred = roofline_calibration.Predictor(s, roofline.Device(1e9, 1e10, 1), roofline.Calibration(step_overhead_s=0.01))
    from workbench.run import notebooks

    suite = {Path(e["notebook"]).stem: e for e in notebooks.load_suite("default")["notebooks"]}
    plan = predictions.plan_entries([suite[k] for k in ("04_streaming_anatomy", "06_context_compression",
                                                        "07_long_output")], pred, load_s=0.0)
    by = plan.groupby("notebook")["point_id"].apply(list)
    p04 = suite["04_streaming_anatomy"]["parameters"]
    sweeps = [pid.split("/")[0] for pid in by["04_streaming_anatomy"]]
    assert sweeps.count("http") == len(p04["http_concurrency"])
    assert sweeps.count("streaming") == len(p04["output_tokens"]) and "granularity" in sweeps
    assert any(pid.startswith("compression_chat/") for pid in by["06_context_compression"])
    e07 = suite["07_long_output"]
    p07 = notebooks.validate_parameters(e07["notebook"], e07["parameters"])   # notebook defaults, then the suite's
    assert len(by["07_long_output"]) == len(p07["languages"]) * len(p07["strategies"]) > 1
    assert not any("(single)" in pid for pid in plan["point_id"])
