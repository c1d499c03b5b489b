"""Energy from NVML: empty (NaN, with a reason) without it; over the timed repeats only with it (fake counters)."""
import math
import sys
import types

import pandas as pd
import pytest

from workbench.measure import energy


class FakeNVML:
    """A total-energy counter (mJ) that advances by a set amount on every read."""

    def __init__(self, steps):
        self.steps = list(steps)
        self.total = 0
        self.reads = 0

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return "h"

    def nvmlDeviceGetHandleByIndex(self, i):
        return "h"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self.total += self.steps.pop(0) if self.steps else 0
        self.reads += 1
        return self.total


def test_cpu_has_no_energy_and_says_why():
    m = energy.EnergyMeter("cpu")
    assert not m.available and "NVIDIA" in m.reason
    m.begin()
    m.end(1.0)
    out = m.result()
    assert math.isnan(out["energy_j"]) and out["reason"]
    cols = energy.point_columns(out, pd.DataFrame({"output_tokens": [4, 4]}))
    assert all(math.isnan(v) for v in cols.values())            # empty, never zero
    assert all(math.isnan(v) for v in energy.point_columns(None, None).values())


def test_missing_nvml_library_gives_reason(monkeypatch):
    fake = types.ModuleType("pynvml")

    def init():
        raise OSError("NVML Shared Library Not Found")

    fake.nvmlInit = init
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    m = energy.EnergyMeter("cuda:0")
    assert not m.available and "NVML unavailable" in m.reason
    st = energy.status("cuda:0")
    assert st["available"] is False and st["reason"]


def test_energy_per_token_over_timed_repeats_only(monkeypatch):
    monkeypatch.setattr("workbench.measure.device.synchronize", lambda device_type: None)
    # reads: probe at construction (+999 J, ignored), then per timed repeat begin/end pairs;
    # warm-up energy happens between repeats (not read) and must not count.
    nvml = FakeNVML([999_000, 0, 2_000, 50_000, 3_000])
    m = energy.EnergyMeter("cuda:0", nvml=nvml)
    assert m.available
    m.begin()
    m.end(0.5)           # +2 J during repeat 0
    # (the counter jumps +50 J "between" repeats: warm-up, scoring)
    m.begin()
    m.end(0.5)           # +3 J during repeat 1
    out = m.result()
    assert out["energy_j"] == pytest.approx(5.0) and out["repeats"] == 2 and out["reason"] is None
    req = pd.DataFrame({"output_tokens": [5, 5, 5, 5]})   # the timed requests: 20 tokens
    cols = energy.point_columns(out, req)
    assert cols["energy_j"] == pytest.approx(5.0)
    assert cols["energy_j_per_token"] == pytest.approx(0.25)
    assert cols["power_w_mean"] == pytest.approx(5.0)


@pytest.mark.model
def test_measure_generation_reads_energy_around_timed_repeats(loaded, monkeypatch):
    """Warm-up runs are outside the meter: with 2 warm-ups and 2 timed repeats, 2 begin/end pairs are read."""
    from workbench.inputs.prompts import build_batch
    from workbench.measure.generation import GenerationSettings
    from workbench.run import sweeps

    calls = []

    class Meter:
        def __init__(self, device):
            pass

        def begin(self):
            calls.append("begin")

        def end(self, wall_s):
            calls.append("end")

        def result(self):
            return {"energy_j": 4.0, "timed_s": 1.0, "repeats": 2, "reason": None}

    monkeypatch.setattr(energy, "EnergyMeter", Meter)
    prompts = build_batch(loaded.tokenizer, 1, 32)
    out = sweeps.measure_generation(loaded, prompts, GenerationSettings(max_new_tokens=2, ignore_eos=True),
                                    repeats=2, warmup=2)
    assert calls == ["begin", "end", "begin", "end"]
    cols = energy.point_columns(out.energy, pd.DataFrame(out.requests))
    assert cols["energy_j_per_token"] == pytest.approx(4.0 / 4)   # 2 repeats x 2 tokens


@pytest.mark.model
def test_sweep_rows_have_empty_energy_and_manifest_reason_on_cpu(loaded, tmp_path):
    from workbench.experiments import batch_size
    from workbench.run import results, sweeps

    cfg = batch_size.Config(batch_sizes=[1], prompt_tokens=[32], max_new_tokens=2, repeats=1, warmup=0,
                            device="cpu", dtype="float32")
    run = results.create_run("energy")
    pts = sweeps.run_sweep(run, "batch_size", cfg.grid(), lambda p: batch_size.measure_point(loaded, cfg, p, {}),
                           info=loaded.info, config=cfg)
    assert pts["energy_j"].isna().all() and pts["energy_j_per_token"].isna().all()
    assert {"node", "device_name", "device_index"} <= set(pts.columns)
    assert {"node", "device_name", "device_index"} <= set(results.read_requests(run).columns)
    man = results.read_manifest(run)
    assert man["energy"]["batch_size"]["available"] is False and man["energy"]["batch_size"]["reason"]
