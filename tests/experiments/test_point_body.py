"""One point body: every experiment's ``measure_point(loaded, cfg, point, state) -> PointResult``, and one function
(:func:`workbench.run.point_result.point_rows`) turning a result into rows for local sweeps, Ray workers and the explorer."""
import importlib
import inspect
import pkgutil
import sys
import types
import typing

import pandas as pd
import pytest

import workbench.experiments
from workbench.run import distributed, point_result, results, sweeps
from workbench.run.point_result import PointResult
from workbench.stats import metrics

MODULES = sorted(m.name for m in pkgutil.iter_modules(workbench.experiments.__path__))

#: Tiny points measured on the real default model: (config fields, point, state).
ON_THE_MODEL = {
    "batch_size": (dict(batch_sizes=[2], prompt_tokens=[32], max_new_tokens=2, warmup=0),
                   {"prompt_tokens": 32, "batch_size": 2}, {}),
    "context_length": (dict(context_tokens=[64], batch_sizes=[1], max_new_tokens=2, warmup=0),
                       {"batch_size": 1, "context_tokens": 64}, {}),
    "temperature": (dict(families=["factual"], languages=["en"], n_factual_prompts=1, factual_max_new_tokens=2,
                         warmup=0, perplexity=False), {"family": "factual", "temperature": 0.0, "top_p": 1.0}, {}),
    "streaming_anatomy": (dict(output_tokens=[2], warmup=0, http=False), {"max_new_tokens": 2}, {}),
    "explorer": (dict(device="cpu", dtype="float32", prompt_tokens=48, max_new_tokens=2, ignore_eos=True, warmup=0),
                 {}, {}),
    "long_output": (dict(budget_tokens=32, n_sections=2, outline_tokens=8, languages=["en"], strategies=["one_shot"],
                         warmup=0), {"language": "en", "strategy": "one_shot"}, {}),
}
#: Measured elsewhere (their own test files): a second model load per dtype, servers, nginx or task sets.
ELSEWHERE = {
    "context_compression": "tests/experiments/test_context_compression.py (references, compressors)",
    "engine_tuning": "tests/experiments/test_engine_tuning.py (loads the model per dtype and kernel)",
    "reasoning_budget": "tests/experiments/test_reasoning_budget.py (fake generation)",
    "serving_load": "tests/experiments/test_serving_load.py (engines and servers)",
    "streaming_reader": "tests/experiments/test_streaming_reader.py (servers and proxies)",
    "scheduling": "tests/experiments/test_scheduling.py (engines, traces and policies)",
    "speed_techniques": "tests/experiments/test_speed_techniques.py (draft models and quantized copies)",
}


def test_every_experiment_is_covered_here():
    assert set(MODULES) == set(ON_THE_MODEL) | set(ELSEWHERE), "a new experiment: add its tiny point above"


@pytest.mark.parametrize("name", MODULES)
def test_measure_point_has_the_one_signature(name):
    mod = importlib.import_module(f"workbench.experiments.{name}")
    params = list(inspect.signature(mod.measure_point).parameters.values())
    assert [p.name for p in params] == ["loaded", "cfg", "point", "state"]
    assert all(p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD for p in params)
    assert typing.get_type_hints(mod.measure_point)["return"] is PointResult
    assert issubclass(mod.Config, sweeps.SweepConfig)   # what a Ray worker rebuilds the config from


@pytest.mark.model
@pytest.mark.parametrize("name", sorted(ON_THE_MODEL))
def test_measure_point_returns_a_point_result_on_the_model(name, loaded):
    mod = importlib.import_module(f"workbench.experiments.{name}")
    fields, point, state = ON_THE_MODEL[name]
    cfg = mod.Config(**fields)
    out = mod.measure_point(loaded, cfg, point, state)
    assert isinstance(out, PointResult)
    assert out.requests and all(isinstance(r, dict) for r in out.requests) and out.wall_s > 0
    req, row = point_result.point_rows(out, {"run_id": "r", "experiment": name, "point_id": "p", **point})
    assert row["status"] == "ok" and row["valid"] in (True, False) and len(req) == len(out.requests)
    assert set(point_result.REQUEST_COLUMNS) <= set(req.columns) and row["output_throughput_tps"] > 0


def test_point_result_of_takes_a_result_or_a_dict_of_its_fields_only():
    r = PointResult(requests=[], wall_s=1.0)
    assert PointResult.of(r) is r
    assert PointResult.of({"requests": [], "wall_s": 2.0, "extra": {"a": 1}}).extra == {"a": 1}
    with pytest.raises(TypeError, match="no field walls"):
        PointResult.of({"requests": [], "walls": 2.0})
    with pytest.raises(TypeError, match="must return a PointResult"):
        PointResult.of([{"ttft_s": 1.0}])


def _result(n=2, **kw):
    reqs = [{"repeat": 0, "request_id": i, "batch_size": n, "prompt_tokens": 10, "output_tokens": 3, "ttft_s": 0.5,
             "prefill_s": 0.4, "tpot_s": 0.1, "e2e_s": 0.7, "decode_tps": 10.0, "itl_s": [0.1, 0.1]} for i in range(n)]
    return PointResult(requests=reqs, wall_s=1.0, **kw)


def test_point_rows_fills_the_run_columns_and_judges_contamination():
    base = {"run_id": "r1", "experiment": "x", "point_id": "x/a=1", "a": 1, "batch_size": 99, "model": "m"}
    quiet = _result(warmup_s=0.3, extra={"q": 7}, contamination={"others_cpu_load": 0.0, "steal_frac": 0.0},
                    device={"peak_memory_bytes": 123, "peak_memory_method": "vmhwm"})
    req, row = point_result.point_rows(quiet, base)
    assert (req["run_id"] == "r1").all() and (req["point_id"] == "x/a=1").all() and (req["a"] == 1).all()
    assert (req["batch_size"] == 2).all()                # a measured value wins over the point's parameter
    assert req["thinking_tokens"].isna().all()           # every request column, None where missing
    assert row["q"] == 7 and row["warmup_s"] == 0.3 and row["peak_memory_bytes"] == 123
    assert row["requests"] == 2 and row["status"] == "ok" and row["valid"] is True
    busy = _result(contamination={"others_cpu_load": 3.0, "steal_frac": 0.0})
    _, row = point_result.point_rows(busy, base)
    assert row["valid"] is False and "other processes used" in row["invalid_reason"]
    assert row["peak_memory_method"] == "unavailable" and row["peak_memory_bytes"] is None


def test_load_over_an_interleaved_design_is_a_block_effect_its_rounds_absorb():
    """Issue 49: CPU steal of 6% over a whole run (a busy host) marked all 15 points of the scheduling design and all
    of the serving comparison invalid, their findings "undecided: 0 of 15 valid", though the load is measured over
    the whole design (one figure for every arm) and its rounds, shuffled, are blocks. An arm of an interleaved
    design whose control moved at most the drift limit between neighbouring rounds and whose A/A control did not
    move stays valid, saying why (``contention_note``); a steep control, an A/A control that moved, one round and
    a point on its own stay invalid."""
    base = {"run_id": "r1", "experiment": "x", "point_id": "x/a=1"}
    stolen = {"others_cpu_load": 0.0, "steal_frac": 0.06}

    def row(**extra):
        return point_result.point_rows(_result(contamination=stolen, extra=extra), base)[1]

    calm = row(design="interleaved", rounds=5, round_drift=0.40, round_speed_drift=0.08, aa_verdict="undecided")
    assert calm["valid"] is True and calm["invalid_reason"] == ""
    assert calm["contention_note"].startswith("hypervisor stole 6% of CPU time (limit 5%) over the whole design")
    assert "moved at most 8.0% between neighbouring rounds" in calm["contention_note"]
    for bad in (dict(design="interleaved", rounds=5, round_drift=0.40, round_speed_drift=0.30, aa_verdict=""),
                dict(design="interleaved", rounds=5, round_drift=0.05, aa_verdict="direction"),
                dict(design="interleaved", rounds=1, round_drift=float("nan")),
                {}):
        got = row(**bad)
        assert got["valid"] is False and "hypervisor stole 6%" in got["invalid_reason"], bad
        assert not got.get("contention_note")


def test_point_rows_take_mbu_from_the_measuring_devices_peaks():
    info = types.SimpleNamespace(weight_bytes=10**8, num_non_embedding_params=10**8, num_layers=30, attn_dim=576,
                                 kv_cache_bytes_per_token=lambda: 46080)
    run_env = {"bandwidth_bytes_per_s": 1e10, "flops_per_s": 1e11}
    _, here = point_result.point_rows(_result(), {}, info=info, env=run_env)
    _, there = point_result.point_rows(_result(device={"bandwidth_bytes_per_s": 2e10, "flops_per_s": 1e11}), {},
                                  info=info, env=run_env)
    assert here["peak_bandwidth_bytes_per_s"] == 1e10 and there["peak_bandwidth_bytes_per_s"] == 2e10
    assert there["mbu"] == pytest.approx(here["mbu"] / 2)
    _, none = point_result.point_rows(_result(), {}, info=None, env=run_env)
    assert "mbu" not in none


def test_local_sweeps_ray_workers_and_the_explorer_all_make_rows_with_point_rows(monkeypatch):
    """The one point body: each of the three writers goes through point_result.point_rows (the run_sweep loop on the
    driver, for local and Ray points alike; explorer.save_points for explored points)."""
    from workbench.experiments import explorer

    calls = []
    real = point_result.point_rows

    def spy(result, base, *a, **k):
        calls.append(base["experiment"])
        return real(result, base, *a, **k)

    monkeypatch.setattr(point_result, "point_rows", spy)
    run = results.create_run()
    sweeps.run_sweep(run, "local", sweeps.expand_grid(batch_size=[1, 2]), lambda p: _result(p["batch_size"]))

    class Executor:   # what run_sweep sees of a RayExecutor
        measure_drift, references = False, {}

        def completed(self, todo):
            yield from todo

        def measure(self, p):
            return _result(p["batch_size"], device={"node": "n2", "device_name": "GPU", "device_index": 1})

    pts = sweeps.run_sweep(run, "ray", sweeps.expand_grid(batch_size=[3]), None, executor=Executor())
    assert pts["node"].tolist() == ["n2"] and pts["device_index"].tolist() == [1]
    cfg = explorer.Config(prompt_tokens=48, max_new_tokens=2)
    r = _result()
    summary = metrics.summarize_point(pd.DataFrame(r.requests), r.wall_s, 2.0, 0.25)
    point = explorer.ExploredPoint(cfg.params(), r.requests, r.wall_s, summary,
                                   {"model": "m", "device": "cpu", "dtype": "float32"})
    explorer.save_points(run, [point], finish=False)
    assert calls == ["local", "local", "ray", "explorer"]
    ex = results.read_points(run, "explorer")
    assert bool(ex["valid"].iloc[0]) is True and ex["goodput_rps"].iloc[0] >= 0


def test_the_worker_measure_is_the_one_signature_for_every_ray_experiment():
    """A Ray worker calls measure_point(loaded, cfg, point, state) of the module it is given: every experiment
    on Ray has that module and a Config (no per-experiment branch in distributed)."""
    assert "_call_measure_point" not in vars(distributed)
    for module in distributed.SUPPORTED:
        mod = importlib.import_module(module)
        assert module in sys.modules and callable(mod.measure_point) and mod.Config
