"""The roofline's calibration (workbench.predict.roofline_calibration): the fit recovers known overheads and
quotes its error out of sample, each dtype has its own cached calibration, and a cached calibration off today's
probe is rescaled or refitted, once per process."""
import math

import pandas as pd
import pytest

from tests.predict.test_roofline import TINY
from workbench.predict import predictions, roofline, roofline_calibration


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
    import dataclasses
    import json

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


def test_a_machine_that_swings_between_two_speeds_finds_the_calibration_of_todays(tmp_path, monkeypatch):
    """A cache file keeps the newest calibrations with their probes; the check starts from the one whose probe is
    nearest today's, so a VM that swings between a slow and a fast state refits once per state, not at each swing."""
    import json

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    roofline_calibration._CHECKED.clear()
    threads = roofline_calibration.torch_threads()
    path = roofline_calibration.cache_path(str(tmp_path), "cpu", "float32", threads)
    path.parent.mkdir(parents=True)
    slow = roofline.Device(1e9, 5e10, threads, name="cpu")
    fast = roofline.Device(1.6e9, 8e10, threads, name="cpu")
    for i, dev in enumerate([slow, fast] + [fast] * roofline_calibration.KEPT_CALIBRATIONS):
        roofline_calibration.save_calibration(path, dev, roofline.Calibration(step_overhead_s=float(i), calibrated=True))
    kept = json.loads(path.read_text())
    assert len(kept["earlier"]) == roofline_calibration.KEPT_CALIBRATIONS - 1   # the oldest (slow) dropped
    # the newest first; with a slow fit kept as well, a slow probe finds it
    roofline_calibration.save_calibration(path, slow, roofline.Calibration(step_overhead_s=9.0, calibrated=True))
    roofline_calibration.save_calibration(path, fast, roofline.Calibration(step_overhead_s=10.0, calibrated=True))
    newest = roofline_calibration.load_cached(str(tmp_path), "cpu", "float32", threads)
    assert newest[1].step_overhead_s == 10.0
    today = roofline.Device(1.05e9, 5.1e10, threads, name="cpu")
    nearest = roofline_calibration.load_cached(str(tmp_path), "cpu", "float32", threads, nearest_to=today)
    assert nearest[1].step_overhead_s == 9.0 and nearest[0].bandwidth_bytes_per_s == 1e9

    def refit(*a, **k):
        raise AssertionError("refitted although a calibration of today's state was kept")

    monkeypatch.setattr(roofline.Device, "probe", classmethod(lambda cls, *a, **k: today))
    monkeypatch.setattr(roofline_calibration, "calibrate", refit)
    dev, calib = roofline_calibration.checked_cached(str(tmp_path), "cpu", "float32", threads, loaded=object())
    assert calib.step_overhead_s == 9.0 and calib.check.startswith("kept")
    assert roofline_calibration.probe_distance(slow, fast) == pytest.approx(math.log(1.6))
