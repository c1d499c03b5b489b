"""Experiment 01 (batch size): config validation, the recommendation, and a real sweep on the default model."""
import pandas as pd
import pytest

from workbench import ParameterError, results
from workbench.experiments import batch_size


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
        batch_size.Config(**kwargs)
    assert str(err.value).startswith(name + ":") and "\n" not in str(err.value)


def test_recommend_batch_size_prefers_goodput_then_smaller_batch():
    pts = pd.DataFrame({"batch_size": [1, 2, 4, 8], "goodput_rps": [1.0, 2.0, 2.0, 0.0],
                        "output_throughput_tps": [5, 9, 12, 20], "status": ["ok"] * 4})
    assert batch_size.recommend(pts)["batch_size"] == 2
    pts["status"] = "failed: x"
    assert batch_size.recommend(pts) is None


@pytest.mark.model
def test_batch_sweep_on_the_real_model_keeps_the_invariants(loaded):
    """Two points on the real model: token counts, left padding equals batch-1 output, figures build."""
    cfg = batch_size.Config(batch_sizes=[1, 2], prompt_tokens=[48], max_new_tokens=3, repeats=1, warmup=0)
    run = results.create_run()
    points = batch_size.run(cfg, run, loaded)
    assert (points["status"] == "ok").all() and len(points) == 2
    req = results.read_requests(run, experiment="batch_size")
    assert (req["output_tokens"] == 3).all() and (req["max_new_tokens"] == 3).all()
    assert all(len(itl) == n - 1 for itl, n in zip(req["itl_s"], req["output_tokens"]))
    assert (req["ttft_s"] <= req["e2e_s"]).all()
    assert set(batch_size.figures(points, req)) == {"batch_ttft", "batch_throughput", "batch_pareto",
                                                    "batch_decode_speed", "batch_goodput"}
    assert isinstance(batch_size.headline(points), str)
