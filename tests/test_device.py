"""The ground floor: the device probe, peak memory and the environment facts (CPU)."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from workbench import device


def test_probe_device_cpu_is_positive():
    p = device.probe_device("cpu", "float32")
    assert p["bandwidth_bytes_per_s"] > 1e8 and p["flops_per_s"] > 1e8
    assert np.isfinite(p["bandwidth_bytes_per_s"])
    assert p["probe_trials"] >= 5 and p["bandwidth_spread"] >= 0 and p["flops_spread"] >= 0
    assert isinstance(p["probe_noisy"], bool)


def test_peak_memory_window_sees_a_large_allocation_and_resets():
    """VmHWM after touching 300 MB is above its value after a reset (Linux); the method is named."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux /proc/self/clear_refs to reset the high-water mark")
    device.reset_peak_memory("cpu")
    big = np.ones(300_000_000 // 8)
    big.sum()
    high, method = device.peak_memory_bytes("cpu")
    del big
    device.reset_peak_memory("cpu")
    low, _ = device.peak_memory_bytes("cpu")
    assert method == "vmhwm" and high - low > 200e6


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
