"""Predictions beside the measurements (workbench.predict.predictions): the residual summary, `workbench plan` /
`--dry-run` without loading weights, the report's residual table, and each row finding its calibration."""
import math
from pathlib import Path

import pandas as pd
import pytest

from tests.predict.test_roofline import TINY
from workbench.predict import predictions, roofline, roofline_calibration


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
    from tests.share.test_report import fake_point, make_run
    from workbench.run import results
    from workbench.share import report

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


def test_the_plan_lists_every_experiments_design_with_its_own_arms_and_rounds(monkeypatch):
    """``workbench plan default``: one line per comparison of the 12 experiments, each with the arms and rounds of
    the design it measures (a new user's trial: the serving load read "20 arms" - its grid - where its comparison has
    3 engines, the streaming reader 8 for 4 paths, the compression rounds ignored its tasks, and streaming anatomy,
    reasoning and scheduling were missing)."""
    from workbench.measure import models
    from workbench.run import design_plan, notebooks

    monkeypatch.setattr(design_plan, "recalled_spread", lambda experiment, suite="": None)   # the default spread
    monkeypatch.setattr(models, "max_context_tokens", lambda spec: 8192)   # SmolLM2's; no model file read here
    lines = predictions.design_lines(notebooks.load_suite("default")["notebooks"])
    by = {line.split(":")[0]: line for line in lines}
    assert set(by) == {"batch_size", "context_length", "temperature", "http", "reasoning", "compression",
                       "long_output", "serving_load", "engine_tuning", "streaming_reader", "scheduling",
                       "speed_techniques"}
    expected = {"batch_size": "5 arms + A/A, 2-3 rounds", "serving_load": "3 arms + A/A, 3-4 rounds",
                "streaming_reader": "4 arms + A/A, 2-3 rounds", "compression": "3 arms + A/A, 4-6 rounds",
                "http": "2 arms + A/A, 2 rounds", "reasoning": "3 arms + A/A, 2-4 rounds",
                "scheduling": "2 arms + A/A, 5 rounds", "engine_tuning": "2 arms + A/A, 4-12 rounds"}
    for name, text in expected.items():
        assert text in by[name], by[name]
    assert all("assumed spread" in line for line in lines)
