"""The ground floor: the device probe, peak memory and the environment facts (CPU)."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.conftest import resident_bytes
from workbench.measure import device


def test_probe_device_cpu_is_positive():
    p = device.probe_device("cpu", "float32")
    assert p["bandwidth_bytes_per_s"] > 1e8 and p["flops_per_s"] > 1e8
    assert np.isfinite(p["bandwidth_bytes_per_s"])
    assert p["probe_trials"] >= 5 and p["bandwidth_spread"] >= 0 and p["flops_spread"] >= 0
    assert isinstance(p["probe_noisy"], bool)


def test_a_quiet_probe_is_shared_with_the_next_process_and_a_noisy_one_is_not(monkeypatch, tmp_path):
    """The next kernel of a run reads the probe the previous one measured (within the reuse window, same device,
    dtype, trials and threads; its age recorded); a noisy probe is never shared, and a window of 0 always probes.
    A cleared per-process cache stands for the next process; the measurement is stood in (its spreads set here)."""
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    monkeypatch.setenv(device.PROBE_REUSE_ENV, "900")
    spread = {"value": 0.05}
    probes = []

    def measure(dev, dtype, trials):
        probes.append((dev, dtype, trials))
        return {"bandwidth_bytes_per_s": 1e10, "flops_per_s": 1e11, "bandwidth_spread": spread["value"],
                "flops_spread": 0.01, "probe_trials": trials, "device": dev, "dtype": dtype}

    monkeypatch.setattr(device, "_measure_probe", measure)

    def fresh(*args):
        device.probe_device.cache_clear()
        return device.probe_device(*args)

    try:
        first = fresh("cpu", "float32")
        assert first["probe_age_s"] == 0.0 and not first["probe_noisy"] and len(probes) == 1
        second = fresh("cpu", "float32")
        assert len(probes) == 1 and second["probe_age_s"] >= 0                           # read, not measured
        assert {k: second[k] for k in device.PROBE_KEYS[:-1]} == {k: first[k] for k in device.PROBE_KEYS[:-1]}
        fresh("cpu", "float32", 5)
        assert len(probes) == 2                                                          # other trials: measured
        monkeypatch.setenv(device.PROBE_REUSE_ENV, "0")
        fresh("cpu", "float32")
        assert len(probes) == 3                                                          # no window: measured
        monkeypatch.setenv(device.PROBE_REUSE_ENV, "900")
        spread["value"] = device.PROBE_SPREAD_LIMIT * 2                                  # noisy
        assert fresh("cpu", "bfloat16")["probe_noisy"]
        fresh("cpu", "bfloat16")
        assert len(probes) == 5                                                          # not shared: measured
    finally:
        device.probe_device.cache_clear()


def _window_sees_and_resets():
    device.reset_peak_memory("cpu")
    with resident_bytes(300_000_000):
        high, method = device.peak_memory_bytes("cpu")
    device.reset_peak_memory("cpu")
    low, method_after = device.peak_memory_bytes("cpu")
    return high, low, method, method_after


def test_peak_memory_window_sees_a_large_allocation_and_resets():
    """The window's peak after touching 300 MB is above the next window's (whichever method this kernel allows)."""
    high, low, method, method_after = _window_sees_and_resets()
    assert method == method_after and method in ("vmhwm", "rss_sampled")
    assert high - low > 200e6


def test_a_reset_that_does_not_take_falls_back_to_sampling(monkeypatch, tmp_path):
    """A kernel that accepts the clear_refs write and keeps VmHWM (as some sandboxed kernels do) gets the sampled resident
    size, named ``rss_sampled``, never the lifetime high-water mark as the window's peak."""
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc/self/status to read the lifetime high-water mark")
    monkeypatch.setattr(device, "CLEAR_REFS", str(tmp_path / "clear_refs"))   # the write lands, nothing resets
    with resident_bytes(200_000_000):
        pass                                          # the lifetime VmHWM now sits >= 200 MB above VmRSS
    high, low, method, method_after = _window_sees_and_resets()
    assert method == method_after == "rss_sampled"
    assert high - low > 200e6
    rss = device._rss_bytes()
    assert low < rss + 100e6                          # the second window's peak is about today's size


def test_facts_take_a_prior_probe_instead_of_probing(monkeypatch):
    """A probe already recorded for this device and dtype is reused; without one the device is probed once."""
    calls = []
    monkeypatch.setattr(device, "probe_device", lambda dev, dtype: calls.append((dev, dtype)) or {
        k: 1.0 for k in device.PROBE_KEYS})
    info = SimpleNamespace(name="m", path="/m", weights_sha256="x", num_params=1, weight_bytes=4, dtype="float32",
                           device="cpu", device_name="cpu")
    prior = {k: 2.0 for k in device.PROBE_KEYS}
    env = device.facts(info, seed=3, prior=prior)
    assert calls == [] and env["bandwidth_bytes_per_s"] == 2.0 and env["seed"] == 3 and env["device"] == "cpu"
    env = device.facts(info)
    assert calls == [("cpu", "float32")] and env["flops_per_s"] == 1.0
    assert "bandwidth_bytes_per_s" not in device.facts(info, probe=False)
    assert "device" not in device.facts(None) and device.facts(None)["torch_threads"] >= 1
