"""Engine, policy and server options travel as typed objects: one list of engines and policies, flags written from
the fields, one-line errors naming the field, the engine/policy rules in one place."""

import argparse
import dataclasses

import pytest

from workbench import ParameterError
from workbench.serving import engines, options, scheduling
from workbench.serving.options import EngineOptions, PolicyOptions, ServerOptions


def _parser(*classes):
    p = argparse.ArgumentParser(prog="t")
    for cls in classes:
        options.add_arguments(p, cls)
    return p


def test_every_flag_comes_from_a_field_and_reads_back_into_the_same_object():
    p = _parser(EngineOptions, PolicyOptions, ServerOptions)
    a = p.parse_args(["--engine", "static", "--max-batch-size", "3", "--batch-window", "0.2", "--policy", "lanes",
                      "--lane-threshold", "7", "--sjf-predictor", "fitted", "--max-queue", "0",
                      "--model-alias", "a", "--model-alias", "b"])
    assert options.from_args(EngineOptions, a) == EngineOptions(engine="static", max_batch_size=3, batch_window_s=0.2)
    assert options.from_args(PolicyOptions, a) == PolicyOptions(policy="lanes", lane_threshold_tokens=7,
                                                                predictor="fitted")
    srv = options.from_args(ServerOptions, a)
    assert srv.max_queue == 0 and srv.model_aliases == ("a", "b")
    # defaults: the objects' own
    b = p.parse_args([])
    assert options.from_args(EngineOptions, b) == EngineOptions() and options.from_args(PolicyOptions, b) == PolicyOptions()


def test_a_new_field_is_a_flag_and_a_mapping_key_without_touching_the_builders():
    @dataclasses.dataclass(frozen=True)
    class More(EngineOptions):
        kv_fraction: float = options.option(0.5, "share of free memory for the KV cache", lo=0, hi=1, lo_open=True)

        def __post_init__(self):
            super().__post_init__()

    a = _parser(More).parse_args(["--kv-fraction", "0.25"])
    assert options.from_args(More, a).kv_fraction == 0.25
    assert options.from_mapping(More, {"kv_fraction": 0.75}).kv_fraction == 0.75
    with pytest.raises(ParameterError, match=r"^kv_fraction:"):
        More(kv_fraction=2.0)


@pytest.mark.parametrize("build,field", [
    (lambda: EngineOptions(engine="vllm"), "engine"),
    (lambda: EngineOptions(max_batch_size=0), "max_batch_size"),
    (lambda: EngineOptions(engine="fifo", prefix_sharing=True), "prefix_sharing"),
    (lambda: EngineOptions(prefix_sharing="yes"), "prefix_sharing"),
    (lambda: PolicyOptions(long_cap=0), "long_cap"),
    (lambda: ServerOptions(max_queue=-1), "max_queue"),
    (lambda: options.from_mapping(EngineOptions, {"batch_size": 4}, "engine_options"), "engine_options"),
    (lambda: options.from_mapping(EngineOptions, [1], "engine_options"), "engine_options"),
    (lambda: options.split(engine="continuous", policy="sjf"), "policy"),
])
def test_bad_options_are_one_line_naming_the_field(build, field):
    with pytest.raises(ParameterError) as err:
        build()
    assert str(err.value).startswith(f"{field}:") and "\n" not in str(err.value)


def test_one_list_of_engines_and_policies_and_the_rule_between_them_in_one_place():
    assert engines.ENGINES is options.ENGINES and options.POLICIES is scheduling.POLICIES
    assert options.engines_taking("fcfs") == options.ENGINES
    assert options.engines_taking("sjf") == ("fifo", "static")     # continuous: transformers' FIFO admission
    from workbench.experiments import scheduling as sched_exp
    assert sched_exp.ENGINES == options.engines_taking("sjf")


def test_split_routes_flat_keywords_to_their_objects():
    eng, pol, srv, rest = options.split(engine="static", max_batch_size=2, policy="priority", max_queue=3, jobs={})
    assert eng == EngineOptions(engine="static", max_batch_size=2) and pol.policy == "priority"
    assert srv.max_queue == 3 and rest == {"jobs": {}}


def test_notebook_configs_take_other_options_as_a_mapping():
    from workbench.experiments import scheduling as sched_exp
    from workbench.experiments import serving_load

    cfg = sched_exp.Config(engine="static", max_batch_size=2, engine_options={"max_seq_tokens": 300},
                           sjf_predictor="fitted")
    assert cfg.engine_options_for("static").max_seq_tokens == 300 and cfg.engine_options_for("static").max_batch_size == 2
    assert cfg.queue("sjf").predictor == "fitted"
    with pytest.raises(ParameterError, match="^policy_options: predictor is a parameter of its own here"):
        sched_exp.Config(policy_options={"predictor": "fitted"})
    with pytest.raises(ParameterError, match="^engine_options: unknown"):
        sched_exp.Config(engine_options={"nope": 1})
    with pytest.raises(ParameterError, match="^engine_options: unknown"):
        serving_load.Config(engines=["static"], engine_options={"nope": 1})


@pytest.mark.model
def test_the_continuous_engines_step_budget_travels_from_the_flag_to_the_engine(loaded):
    """``--max-batch-tokens`` (an EngineOptions field: the continuous engine's tokens per forward step, the chunk
    a long prompt is prefilled in) reaches the engine the server builds."""
    from workbench.serving import server

    a = _parser(EngineOptions).parse_args(["--engine", "continuous", "--max-batch-tokens", "64"])
    opts = options.from_args(EngineOptions, a)
    eng = server.make_server_engine(loaded, dataclasses.replace(opts, max_seq_tokens=128))
    try:
        assert eng.options.max_batch_tokens == 64 and eng.max_batch_tokens == 64
    finally:
        eng.stop()


def test_the_fitted_predictors_window_travels_from_the_flag_and_the_notebook_to_the_queue():
    """``--fit-window`` (a PolicyOptions field: the finished requests sjf's fitted predictor fits on) reaches the
    queue, from the command line and from notebook 11's ``policy_options``."""
    from workbench.experiments import scheduling as sched_exp

    a = _parser(PolicyOptions).parse_args(["--policy", "sjf", "--sjf-predictor", "fitted", "--fit-window", "16"])
    assert options.from_args(PolicyOptions, a).make_queue("fifo").fit.window == 16
    cfg = sched_exp.Config(sjf_predictor="fitted", policy_options={"fit_window": 12})
    assert cfg.queue("sjf").fit.window == 12
    with pytest.raises(ParameterError, match="^fit_window:"):
        PolicyOptions(fit_window=0)
