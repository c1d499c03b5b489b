"""The point loop: grids, failure handling and resume (fake measurements, no model)."""
import pytest

from workbench import ParameterError, results, sweeps

def test_expand_grid_order():
    assert sweeps.expand_grid(a=[1, 2], b=["x"]) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
    with pytest.raises(ParameterError):
        sweeps.expand_grid(a=[])


def _fake_measure(point):
    n = point["batch_size"]
    reqs = [{"repeat": 0, "request_id": i, "prompt_tokens": 10, "output_tokens": 3, "ttft_s": 0.5, "prefill_s": 0.4,
             "tpot_s": 0.1, "e2e_s": 0.7, "decode_tps": 10.0, "itl_s": [0.1, 0.1]} for i in range(n)]
    return {"requests": reqs, "wall_s": 1.0}


def test_failed_point_is_recorded_and_resume_completes(monkeypatch):
    run = results.create_run()
    points = sweeps.expand_grid(batch_size=[1, 2, 3])
    monkeypatch.setenv("WORKBENCH_INJECT_FAILURE", "batch_size=2")
    pts = sweeps.run_sweep(run, "fake", points, _fake_measure)
    assert pts.set_index("batch_size")["status"].to_dict()[2].startswith("failed: RuntimeError: injected")
    assert sorted(results.read_requests(run)["batch_size"].unique()) == [1, 3]
    monkeypatch.delenv("WORKBENCH_INJECT_FAILURE")
    calls = []
    pts = sweeps.run_sweep(run, "fake", points, lambda p: calls.append(p) or _fake_measure(p), resume=True)
    assert calls == [{"batch_size": 2}]                 # finished points are skipped
    assert (pts["status"] == "ok").all() and len(pts) == 3
    req = results.read_requests(run)
    assert req.groupby("batch_size").size().to_dict() == {1: 1, 2: 2, 3: 3}   # no duplicates


def test_measure_exception_does_not_stop_the_sweep():
    run = results.create_run()

    def measure(p):
        if p["batch_size"] == 1:
            raise MemoryError("out of memory at batch 1")
        return _fake_measure(p)

    pts = sweeps.run_sweep(run, "fake", sweeps.expand_grid(batch_size=[1, 2]), measure)
    assert pts["status"].tolist() == ["failed: MemoryError: out of memory at batch 1", "ok"]
