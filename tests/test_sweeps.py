"""Sweep configs, the point loop's failure handling and resume, notebook parameter checks."""
import json
from pathlib import Path

import pytest

from workbench import ParameterError, results, sweeps

NB = Path(__file__).resolve().parents[1] / "notebooks" / "01_batch_size.ipynb"


@pytest.mark.parametrize("kwargs,name", [
    ({"batch_sizes": [0]}, "batch_sizes"),
    ({"batch_sizes": []}, "batch_sizes"),
    ({"batch_sizes": "[1, 2]"}, "batch_sizes"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"prompt_tokens": [9000]}, "prompt_tokens"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"model": "/no/such/model"}, "model"),
    ({"device": "tpu"}, "device"),
    ({"repeats": 0}, "repeats"),
    ({"slo_ttft_s": 0}, "slo_ttft_s"),
])
def test_invalid_batch_config_one_line(kwargs, name):
    with pytest.raises(ParameterError) as err:
        sweeps.BatchSizeConfig(**kwargs)
    assert str(err.value).startswith(name + ":") and "\n" not in str(err.value)


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


def test_notebook_parameters_are_literals_and_unknown_names_rejected():
    params = sweeps.notebook_parameters(NB)
    assert params["batch_sizes"] == [1, 2, 4, 8] and params["run_dir"] == ""
    with pytest.raises(ParameterError, match="^batch_size: not a parameter"):
        sweeps.validate_parameters(NB, {"batch_size": [1]})
    with pytest.raises(ParameterError, match="^batch_sizes:"):
        sweeps.validate_parameters(NB, {"batch_sizes": [0]})
    merged = sweeps.validate_parameters(NB, {"batch_sizes": [2]})
    assert merged["batch_sizes"] == [2] and merged["max_new_tokens"] == params["max_new_tokens"]


def test_notebooks_are_committed_clean():
    for nb in sorted(NB.parent.glob("[0-9]*.ipynb")):
        data = json.loads(nb.read_text())
        assert {"kernelspec", "language_info"} <= set(data["metadata"]), nb.name
        code = [c for c in data["cells"] if c["cell_type"] == "code"]
        assert "parameters" in code[0]["metadata"].get("tags", []), nb.name
        assert all(not c.get("outputs") for c in code), nb.name


def test_suites_validate():
    for name in ("default", "quick"):
        suite = sweeps.load_suite(name)
        for e in suite["notebooks"]:
            sweeps.validate_parameters(e["notebook"], e["parameters"])
    with pytest.raises(ParameterError, match="^suite:"):
        sweeps.load_suite("nope")


def test_papermill_parses_every_parameter_line():
    """papermill drops a parameter whose comment it cannot parse (e.g. one holding '='): keep them all documented."""
    import papermill as pm

    for nb in sorted(NB.parent.glob("[0-9]*.ipynb")):
        ours = sweeps.notebook_parameters(nb)
        theirs = pm.inspect_notebook(str(nb))
        assert set(theirs) == set(ours), nb.name
        assert all(p["help"] for p in theirs.values()), nb.name
