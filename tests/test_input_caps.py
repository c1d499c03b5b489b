"""Inputs that cannot exhaust the machine (issue 51): wherever input comes from a file people share (calibration
files, traces, suites, parameter files) or from ``workbench simulate``'s options, sizes are capped at stated limits
(:mod:`workbench.checks`: ``MAX_REQUEST_TOKENS``, ``MAX_BATCH_SIZE``, ``MAX_REQUESTS``, ``MAX_INPUT_BYTES``,
``MAX_DATA_NODES``) and refused in one line naming the field and the limit, before anything is allocated.

Before: a residual table naming batch size 10**9 was a 7.45 GiB allocation traceback, a trace request of 2e10 prompt
tokens ran on past 90 s on the continuous engine, 2e9 output tokens a 14.9 GiB allocation, and a YAML alias bomb
expanded when the endpoint's extra_body was serialised."""

import json

import pytest

from workbench import checks, cli
from workbench.errors import ParameterError
from workbench.predict import twin, twin_cost
from workbench.run import notebooks

COST = {"version": twin_cost.VERSION, "a0": 0.01, "a1": 1e-5, "b0": 0.02, "b1": 0.001, "b2": 1e-7}


def _simulate(capsys, *argv) -> str:
    """Run ``workbench simulate`` expecting a one-line refusal (exit 2); the line."""
    code = cli.main(["simulate", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return err[0]


def _calibration(tmp_path, **extra) -> str:
    p = tmp_path / "twin_calibration.json"
    p.write_text(json.dumps({**COST, **extra}))
    return str(p)


def test_a_residual_table_naming_a_huge_batch_size_is_one_line(tmp_path, capsys):
    line = _simulate(capsys, "--calibration", _calibration(tmp_path, batch_residual_s=[[1, 0.0], [10**9, 0.01]]),
                     "--engines", "fifo", "--requests", "4")
    assert "batch_residual_s" in line and str(checks.MAX_BATCH_SIZE) in line
    rows = [[b, 0.0] for b in range(1, checks.MAX_BATCH_SIZE + 2)]
    with pytest.raises(ParameterError, match=f"batch_residual_s: at most {checks.MAX_BATCH_SIZE} rows"):
        twin_cost.StepCost.from_dict({**COST, "batch_residual_s": rows})


@pytest.mark.parametrize("field,value", [("prompt_tokens", 2 * 10**10), ("output_tokens", 2 * 10**9)])
def test_a_trace_request_past_the_token_cap_is_one_line(tmp_path, capsys, field, value):
    trace = tmp_path / "trace.jsonl"
    row = {"offset_s": 0.0, "prompt_tokens": 16, "output_tokens": 4, field: value}
    trace.write_text(json.dumps(row) + "\n")
    line = _simulate(capsys, "--calibration", _calibration(tmp_path), "--engines", "continuous", "--trace", str(trace))
    assert f"trace: line 1: {field}" in line and str(checks.MAX_REQUEST_TOKENS) in line


@pytest.mark.parametrize("option,value,field,limit", [
    ("--prompt-tokens", 2 * 10**10, "prompt_tokens", checks.MAX_REQUEST_TOKENS),
    ("--max-new-tokens", 2 * 10**9, "max_new_tokens", checks.MAX_REQUEST_TOKENS),
    ("--max-batch-size", 10**9, "max_batch_size", checks.MAX_BATCH_SIZE),
    ("--requests", 10**9, "requests", checks.MAX_REQUESTS),
])
def test_simulate_sizes_are_capped(tmp_path, capsys, option, value, field, limit):
    line = _simulate(capsys, "--calibration", _calibration(tmp_path), "--engines", "fifo", option, str(value))
    assert line.startswith(f"error: {field}:") and str(limit) in line


def test_the_twin_itself_refuses_sizes_past_the_caps():
    """Every path into the twin (notebooks, the validation, the CLI) meets the same caps."""
    cost = twin_cost.StepCost.from_dict(COST)
    with pytest.raises(ParameterError, match="output_tokens"):
        twin.simulate(cost, [twin.TwinSpec(0.0, 16, checks.MAX_REQUEST_TOKENS + 1)], twin.TwinConfig())
    with pytest.raises(ParameterError, match="max_batch_size"):
        twin.TwinConfig(max_batch_size=checks.MAX_BATCH_SIZE + 1)


def test_an_oversized_input_file_is_refused_before_it_is_read(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(checks, "MAX_INPUT_BYTES", 1000)
    trace = tmp_path / "trace.jsonl"
    trace.write_text((json.dumps({"offset_s": 0.0, "prompt_tokens": 16, "output_tokens": 4}) + "\n") * 100)
    line = _simulate(capsys, "--calibration", _calibration(tmp_path), "--engines", "fifo", "--trace", str(trace))
    assert line.startswith("error: trace:") and "1000 bytes" in line
    big = tmp_path / "big_calibration.json"
    big.write_text(json.dumps({**COST, "source": "x" * 2000}))
    line = _simulate(capsys, "--calibration", str(big), "--engines", "fifo")
    assert line.startswith("error: calibration:") and "1000 bytes" in line


def _bomb(levels: int = 9) -> str:
    """A "billion laughs" YAML mapping: 10 ** levels strings once its aliases are expanded, a few hundred bytes."""
    lines = ["    l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]")
    return "\n".join(lines)


def test_a_yaml_alias_bomb_is_refused_naming_the_limit(tmp_path, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text("engines: [endpoint]\nendpoint:\n  url: https://h.example\n  model: m\n  extra_body:\n"
                    + _bomb() + "\n")
    code = cli.main(["sweep", str(notebooks.NOTEBOOKS_DIR / "08_serving_load.ipynb"), "-f", str(grid)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: -f:"), err
    assert str(checks.MAX_DATA_NODES) in err[0]
    with pytest.raises(ParameterError, match="refers to itself"):
        notebooks.load_yaml("a: &a [1, *a]")
    assert notebooks.load_yaml("a: &a [1, 2]\nb: *a") == {"a": [1, 2], "b": [1, 2]}   # a plain alias is fine


def test_expanded_size_counts_shared_values_without_expanding_them():
    leaf = ["x"] * 10
    doc = leaf
    for _ in range(12):            # 10 ** 13 values expanded: counted in microseconds, capped at the limit
        doc = [doc] * 10
    assert checks.expanded_size(doc, limit=10**6) == 10**6 + 1
    assert checks.expanded_size({"a": [1, 2], "b": {"c": 3}}) == 6
