"""The command line end to end: papermill execution, typed -p values, errors before model load, resume."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from workbench.run import results

REPO = Path(__file__).resolve().parents[2]


def workbench(*args, env_extra=None, timeout=600):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=timeout)


@pytest.mark.parametrize("args,prefix", [
    (["sweep", "01_batch_size.ipynb", "-p", "batch_sizes", "[0, 1]"], "error: batch_sizes:"),
    (["sweep", "01_batch_size.ipynb", "-p", "max_new_tokens", "0"], "error: max_new_tokens:"),
    (["sweep", "01_batch_size.ipynb", "-p", "prompt_tokens", "[100000]"], "error: prompt_tokens:"),
    (["sweep", "01_batch_size.ipynb", "-p", "temperature", "-1"], "error: temperature:"),
    (["sweep", "01_batch_size.ipynb", "-p", "top_p", "0"], "error: top_p:"),
    (["sweep", "01_batch_size.ipynb", "-p", "model", "/no/such/dir"], "error: model:"),
    (["sweep", "01_batch_size.ipynb", "-p", "batchsize", "[1]"], "error: batchsize: not a parameter"),
    (["sweep", "no_such.ipynb"], "error: notebook:"),
    (["run", "no_such_suite"], "error: suite:"),
    (["run", "README.md"], "error: suite:"),
    (["run", "quick", "--figures", "gif"], "error: --figures: unknown format 'gif'"),
    (["sweep", "01_batch_size", "--figures", "png,gif"], "error: --figures: unknown format 'gif'"),
    (["sweep", "01_batch_size", "-p", "max_new_tokens", "true"], "error: max_new_tokens:"),
    (["sweep", "01_batch_size", "-p", "max_new_tokens", "100000000"], "error: max_new_tokens:"),
    (["sweep", "01_batch_size", "-p", "ignore_eos", "maybe"], "error: ignore_eos:"),
    (["sweep", "01_batch_size", "-p", "run_dir", "/etc"], "error: run_dir:"),
    (["sweep", "01_batch_size", "-p", "batch_sizes", "[1, 2"], "error: batch_sizes:"),
    pytest.param(["sweep", "01_batch_size", "-p", "device", "cuda"], "error: device:",
                 marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")),
])
def test_bad_parameters_fail_with_one_line_before_anything_runs(cli, args, prefix):
    code, out, err = cli(*args)
    assert code == 2
    assert err.strip().startswith(prefix) and len(err.strip().splitlines()) == 1
    root = results.results_root()
    assert not root.exists() or not any(root.iterdir())     # no run folder was created


def test_a_bad_parameter_exits_2_with_one_line_from_the_command():
    """The real ``python -m workbench.cli`` process: exit status 2, one line on stderr, no run folder."""
    proc = workbench("sweep", "01_batch_size.ipynb", "-p", "batch_sizes", "[0, 1]")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: batch_sizes:") and len(proc.stderr.strip().splitlines()) == 1
    root = results.results_root()
    assert not root.exists() or not any(root.iterdir())


def test_report_rejects_non_runs(tmp_path, cli):
    code, _, err = cli("report", str(tmp_path))
    assert code == 2 and err.startswith("error: RUN_DIR:")


def test_env_prints_models():
    proc = workbench("env", "--no-probe")
    assert proc.returncode == 0
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in proc.stdout and '"torch_threads"' in proc.stdout


def _run_folder(root: Path, name: str, manifest: str | None = '{"run_id": "x", "points": {}}') -> Path:
    run = root / name
    run.mkdir(parents=True)
    if manifest is not None:
        (run / "manifest.json").write_text(manifest)
    return run


def _model_folder(tmp: Path, kind: str) -> Path:
    folder = tmp / f"model-{kind}"
    folder.mkdir()
    cfg = {"model_type": "llama", "max_position_embeddings": 2048}
    if kind == "pickle":
        (folder / "pytorch_model.bin").write_bytes(b"\x80\x02")
    else:
        cfg.update(model_type="my_custom_arch", auto_map={"AutoModelForCausalLM": "modeling_custom.MyModel"})
        (folder / "model.safetensors").write_bytes(b"")
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


# Each bad input of issue 12: (id, args built from (tmp_path, results root), expected one-line prefix, also in line)
BAD_INPUTS = [
    ("-f directory", lambda t, r: ["sweep", "01_batch_size", "-f", str(t)], "error: -f:", "a directory"),
    ("-f non-UTF-8", lambda t, r: (t.joinpath("g.yaml").write_bytes(b"batch_sizes: [1]\n\xff\xfe\x00"),
                                   ["sweep", "01_batch_size", "-f", str(t / "g.yaml")])[1], "error: -f:", "UTF-8"),
    ("suite entry without notebook", lambda t, r: (t.joinpath("s.yaml").write_text(
        "notebooks:\n- parameters: {repeats: 1}\n"), ["run", str(t / "s.yaml")])[1], "error: suite:", "notebook"),
    ("suite parameters: null", lambda t, r: (t.joinpath("s.yaml").write_text(
        "notebooks:\n- notebook: notebooks/01_batch_size.ipynb\n  parameters: null\n"),
        ["run", str(t / "s.yaml")])[1], "error: suite:", "mapping"),
    ("a suite's reference_reuse_s out of range", lambda t, r: (t.joinpath("s.yaml").write_text(
        "reference_reuse_s: 0\nnotebooks:\n- notebook: notebooks/01_batch_size.ipynb\n"),
        ["run", str(t / "s.yaml")])[1], "error: reference_reuse_s:", "1"),
    ("a suite's unknown static figure format", lambda t, r: (t.joinpath("s.yaml").write_text(
        "figures: [png, tiff]\nnotebooks:\n- notebook: notebooks/01_batch_size.ipynb\n"),
        ["run", str(t / "s.yaml")])[1], "error: --figures:", "tiff"),
    ("a suite that is not YAML names where", lambda t, r: (t.joinpath("s.yaml").write_text(
        "notebooks:\n- notebook: notebooks/01_batch_size.ipynb\n  parameters:\n    batch_sizes: [1, 2\n    repeats: 2\n"),
        ["run", str(t / "s.yaml")])[1], "error: suite:", "at line 5, column 12 (while parsing a flow sequence from "
                                                         "line 4, column 18)"),
    ("a -f file that is not YAML names where", lambda t, r: (t.joinpath("g.yaml").write_text("a: [1\nb: 2\n"),
                                                             ["sweep", "01_batch_size", "-f", str(t / "g.yaml")])[1],
     "error: -f:", "at line 2, column 2"),
    ("-p NAME=VALUE checked as -p NAME VALUE", lambda t, r: ["sweep", "01_batch_size", "-p", "max_new_tokens=-3"],
     "error: max_new_tokens:", "integer >= 1 (got -3)"),
    ("same notebook twice in a suite", lambda t, r: (t.joinpath("s.yaml").write_text(
        "notebooks:\n- notebook: notebooks/01_batch_size.ipynb\n- notebook: notebooks/01_batch_size.ipynb\n"),
        ["run", str(t / "s.yaml")])[1], "error: suite:", "twice"),
    ("corrupt manifest on report", lambda t, r: ["report", str(_run_folder(r, "bad", "{not json"))],
     "error: RUN_DIR:", "not a valid manifest"),
    ("corrupt manifest on --resume", lambda t, r: ["sweep", "01_batch_size", "--resume",
                                                   str(_run_folder(r, "bad", "\xff{"))],
     "error: run_dir:", "not a valid manifest"),
    ("same run twice in report", lambda t, r: ["report", str(_run_folder(r, "a")), str(r / "a" / ".." / "a")],
     "error: RUN_DIR:", "twice"),
    ("duplicate grid values", lambda t, r: ["sweep", "01_batch_size", "-p", "batch_sizes", "[1, 2, 1]"],
     "error: batch_sizes:", "duplicate"),
    ("NaN float", lambda t, r: ["sweep", "01_batch_size", "-p", "temperature", ".nan"], "error: temperature:",
     "finite"),
    ("infinite float", lambda t, r: ["sweep", "01_batch_size", "-p", "slo_ttft_s", ".inf"], "error: slo_ttft_s:",
     "finite"),
    ("seed above torch's range", lambda t, r: ["sweep", "01_batch_size", "-p", "seed", str(2**64)], "error: seed:",
     "integer"),
    ("negative seed", lambda t, r: ["sweep", "01_batch_size", "-p", "seed", "-1"], "error: seed:", "integer"),
    ("pickle-only model folder", lambda t, r: ["sweep", "01_batch_size", "-p", "model",
                                               str(_model_folder(t, "pickle"))],
     "error: model:", "WORKBENCH_ALLOW_PICKLE=1"),
    ("model needing remote code", lambda t, r: ["sweep", "01_batch_size", "-p", "model",
                                                str(_model_folder(t, "remote"))],
     "error: model:", "WORKBENCH_TRUST_REMOTE_CODE=1"),
]


@pytest.mark.parametrize("build,prefix,needle", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_gives_one_line_exit_2_before_any_work(cli, build, prefix, needle, tmp_path):
    root = results.results_root()
    args = build(tmp_path, root)
    before = sorted(p.name for p in root.iterdir()) if root.exists() else []
    code, out, err = cli(*args)        # a model load, kernel start or new run folder would raise Reached
    lines = err.strip().splitlines()
    assert code == 2, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith(prefix) and needle in lines[0], err
    assert (sorted(p.name for p in root.iterdir()) if root.exists() else []) == before   # no run folder made
    assert "== [" not in out + err                           # no notebook started (the runner's "== [1/1] name")


def test_allow_switches_named_in_the_errors_exist(tmp_path, monkeypatch):
    from workbench.measure import models

    pickle_dir, remote_dir = _model_folder(tmp_path, "pickle"), _model_folder(tmp_path, "remote")
    monkeypatch.setenv("WORKBENCH_ALLOW_PICKLE", "1")
    monkeypatch.setenv("WORKBENCH_TRUST_REMOTE_CODE", "1")
    assert models.resolve_model_path(str(pickle_dir)) == pickle_dir
    assert models.resolve_model_path(str(remote_dir)) == remote_dir


def _fake_execute(fail: set, on_call=lambda: None):
    """A stand-in for :func:`notebooks.execute_notebook`: notebooks named in ``fail`` (read at each call) raise, the
    others record one ok point named after themselves; ``on_call`` runs first."""
    def fake(path, params, run_dir, log_output=True):
        on_call()
        if Path(path).stem in fail:
            raise RuntimeError("boom")
        results.record_point(run_dir, Path(path).stem, pd.DataFrame(), {"point_id": Path(path).stem, "status": "ok"},
                             {"status": "ok"})
        return Path(path)
    return fake


def test_the_notebooks_of_a_run_share_one_kernel_block(monkeypatch):
    """``workbench run`` executes its notebooks inside one :func:`notebooks.one_kernel` block (one kernel, so one
    import of everything, one model load, one probe and one drift reference per run), closed when the run ends,
    and a failed notebook does not stop the others."""
    from workbench.run import notebooks, suite

    blocks = []
    monkeypatch.setattr(notebooks, "execute_notebook",
                        _fake_execute({"b"}, lambda: blocks.append(notebooks._SHARED)))
    run = results.create_run()
    entries = [{"notebook": f"/x/{n}.ipynb", "parameters": {}} for n in ("a", "b", "c")]
    assert suite._execute(entries, run, resume=False) == ["b"]
    assert len(blocks) == 3 and blocks[0] is not None and all(b is blocks[0] for b in blocks)
    assert notebooks._SHARED is None


def test_a_later_session_keeps_each_notebooks_earlier_status_and_time(monkeypatch):
    """A resume or --rerun-invalid executes a notebook again: its manifest entry gets the new status and time, and
    the earlier sessions' go to its ``history`` (oldest first) instead of being overwritten."""
    from workbench.run import notebooks, suite

    fail = {"b"}
    monkeypatch.setattr(notebooks, "execute_notebook", _fake_execute(fail))
    run = results.create_run()
    entries = [{"notebook": f"/x/{n}.ipynb", "parameters": {}} for n in ("a", "b")]
    suite._execute(entries, run, resume=False)
    first = results.read_manifest(run)["notebooks"]
    assert first["b"]["status"].startswith("failed") and "history" not in first["b"]
    fail.clear()
    suite._execute(entries[1:], run, resume=True)
    b = results.read_manifest(run)["notebooks"]["b"]
    assert b["status"] == "ok"
    assert b["history"] == [{"status": first["b"]["status"], "wall_s": first["b"]["wall_s"]}]
    suite._execute(entries[1:], run, resume=True)
    assert [h["status"][:6] for h in results.read_manifest(run)["notebooks"]["b"]["history"]] == ["failed", "ok"]
    assert "history" not in results.read_manifest(run)["notebooks"]["a"]


def test_a_parameter_is_given_as_name_value_or_name_equals_value():
    """``-p NAME=VALUE`` (other tools' spelling) is ``-p NAME VALUE``; a VALUE holding ``=`` is never split."""
    from workbench.cli import _split_param_pairs

    assert _split_param_pairs(["sweep", "01", "-p", "repeats=2", "--param", "batch_sizes=[1, 2]"]) == \
        ["sweep", "01", "-p", "repeats", "2", "--param", "batch_sizes", "[1, 2]"]
    assert _split_param_pairs(["sweep", "01", "-p", "query", "a=b"]) == ["sweep", "01", "-p", "query", "a=b"]
    assert _split_param_pairs(["-p", "query=a=b"]) == ["-p", "query", "a=b"]
    assert _split_param_pairs(["run", "x=y"]) == ["run", "x=y"]                  # only after -p


def test_the_help_of_every_command_is_plain_text():
    """``workbench --help`` and each command's help read as text, not as the docstrings' reStructuredText."""
    import argparse

    from workbench.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for text in [parser.format_help(), *(p.format_help() for p in sub.choices.values())]:
        assert "``" not in text and ":mod:" not in text and ":func:" not in text, text
    assert "COMMAND --help" in parser.format_help()
