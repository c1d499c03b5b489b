"""A resume that cannot mix (issue 36): a resumed session whose notebook defaults, model, device, dtype or package
versions differ from the run's is refused in one line naming each difference (exit 2), unless --allow-changed, when
the changed points are measured again under new ids and the manifest keeps both configs."""

import dataclasses
import json
import os
from pathlib import Path

import pytest

from workbench import cli
from workbench.errors import ParameterError
from workbench.run import results, resume_check, sweeps
from workbench.run.point_result import PointResult

REPO = Path(__file__).resolve().parents[2]


def _notebook_with_default(tmp_path, max_new_tokens: int) -> Path:
    """A copy of 01_batch_size whose max_new_tokens default is changed (what a git pull may do)."""
    folder = tmp_path / f"v{max_new_tokens}"
    folder.mkdir()
    nb = json.loads((REPO / "notebooks" / "01_batch_size.ipynb").read_text())
    for cell in nb["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            src = "".join(cell["source"]).replace("max_new_tokens: int = 32", f"max_new_tokens: int = {max_new_tokens}")
            assert f"max_new_tokens: int = {max_new_tokens}" in src
            cell["source"] = src
    out = folder / "01_batch_size.ipynb"
    out.write_text(json.dumps(nb))
    return out


def test_a_resume_after_a_notebook_default_changed_is_exit_2_naming_it(tmp_path, capsys):
    run = results.create_run()
    old = _notebook_with_default(tmp_path, 32)
    resume_check.record(run, [{"notebook": str(old), "parameters": {}}], resume=False)
    new = _notebook_with_default(tmp_path, 8)
    code = cli.main(["sweep", str(new), "--resume", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "01_batch_size: max_new_tokens 32 -> 8" in err[0] and "--allow-changed" in err[0]
    # the same settings resume (no difference); a changed package version is named too
    assert resume_check.check_resume(run, [{"notebook": str(old), "parameters": {}}]) == []


def test_package_model_device_and_dtype_differences_are_named(tmp_path, monkeypatch):
    nb = _notebook_with_default(tmp_path, 32)
    entries = [{"notebook": str(nb), "parameters": {}}]
    before = resume_check.run_identity(entries)
    assert before["models"]["01_batch_size"]["weights_sha256"]  # the embedded model resolved and hashed
    after = json.loads(json.dumps(before))
    after["packages"]["torch"] = "9.9.9"
    after["models"]["01_batch_size"].update(weights_sha256="feedface", dtype="bfloat16", device="cuda")
    diff = resume_check.differences(before, after)
    assert f"torch {before['packages']['torch']} -> 9.9.9" in diff
    assert any(d.startswith("01_batch_size: weights_sha256 ") and d.endswith("-> feedface") for d in diff)
    assert any(d.endswith("dtype float32 -> bfloat16") for d in diff) and any("device cpu -> cuda" in d for d in diff)
    # "auto" vs the resolved device is no difference
    same = resume_check.run_identity([{"notebook": str(nb), "parameters": {"device": "cpu"}}])
    assert resume_check.differences(before, same) == []


@dataclasses.dataclass
class Cfg:
    max_new_tokens: int = 32
    resume: bool = False


def _measure(p):
    return PointResult(requests=[{"repeat": 0, "request_id": 0, "prompt_tokens": 10, "output_tokens": 3,
                                  "ttft_s": 0.5, "prefill_s": 0.4, "tpot_s": 0.1, "e2e_s": 0.7, "decode_tps": 10.0,
                                  "itl_s": [0.1, 0.1]}], wall_s=1.0)


def test_a_sweep_resumed_with_another_config_is_refused_then_remeasured_under_new_ids(monkeypatch):
    run = results.create_run()
    points = sweeps.expand_grid(batch_size=[1, 2])
    sweeps.run_sweep(run, "fake", points, _measure, config=Cfg(32))
    with pytest.raises(ParameterError) as err:
        sweeps.run_sweep(run, "fake", points, _measure, config=Cfg(8, resume=True), resume=True)
    assert "max_new_tokens 32 -> 8" in str(err.value) and "\n" not in str(err.value)
    calls = []
    pts = sweeps.run_sweep(run, "fake", points, lambda p: calls.append(p) or _measure(p), config=Cfg(32), resume=True)
    assert calls == []  # the same config: every point finished
    monkeypatch.setenv(resume_check.ALLOW_ENV, "1")
    pts = sweeps.run_sweep(run, "fake", points, lambda p: calls.append(p) or _measure(p), config=Cfg(8), resume=True)
    assert len(calls) == 2 and sum("@cfg-" in pid for pid in pts["point_id"]) == 2
    exp = results.read_manifest(run)["experiments"]["fake"]
    assert exp["config"]["max_new_tokens"] == 32 and not any("@" in p for p in exp["points"])
    assert [c["config"]["max_new_tokens"] for c in exp["changed_configs"]] == [8]
    ids = set(results.read_requests(run)["point_id"])
    assert len(ids) == 4  # both configs' points kept, under different ids
    calls.clear()
    sweeps.run_sweep(run, "fake", points, lambda p: calls.append(p) or _measure(p), config=Cfg(8), resume=True)
    assert calls == []  # resuming the changed config again skips what it finished


def test_the_cli_records_the_identity_and_allow_changed_is_a_flag(tmp_path, monkeypatch, capsys):
    """``workbench sweep`` records the session's identity in the new run's manifest before any notebook runs; a
    resume with a changed default and ``--allow-changed`` (a flag of ``run`` and ``sweep``) says what it measures
    again, tells the kernels, and appends its identity to the history while the first record stays."""
    from workbench.run import suite

    seen = []   # the notebooks' kernels stand-in: what each session would execute, and what the kernels would see
    monkeypatch.setattr(suite, "_execute", lambda entries, run_dir, resume:
                        seen.append((run_dir, resume, os.environ.get(resume_check.ALLOW_ENV))) or [])
    monkeypatch.setenv(resume_check.ALLOW_ENV, "0")   # restored after the test: the CLI sets it for its kernels
    monkeypatch.delenv(resume_check.ALLOW_ENV)
    old, new = _notebook_with_default(tmp_path, 32), _notebook_with_default(tmp_path, 8)
    assert cli.main(["sweep", str(old)]) == 0
    run, resumed, allowed = seen[-1]
    first = results.read_manifest(run)["resume_identity"]
    assert not resumed and allowed is None
    assert first == json.loads(json.dumps(resume_check.run_identity([{"notebook": str(old), "parameters": {}}])))
    assert first["notebooks"]["01_batch_size"]["max_new_tokens"] == 32
    assert first["models"]["01_batch_size"]["weights_sha256"] and first["packages"]["torch"]
    capsys.readouterr()
    assert cli.main(["sweep", str(new), "--resume", str(run), "--allow-changed"]) == 0
    assert "--allow-changed: measuring again under new ids what changed: 01_batch_size: max_new_tokens 32 -> 8" \
        in capsys.readouterr().out
    assert seen[-1] == (run, True, "1")
    manifest = results.read_manifest(run)
    assert manifest["resume_identity"] == first
    assert [h["notebooks"]["01_batch_size"]["max_new_tokens"] for h in manifest["resume_identity_history"]] == [8]
    p = cli.build_parser()
    assert p.parse_args(["run", "--resume", "x", "--allow-changed"]).allow_changed
    assert not p.parse_args(["run", "--resume", "x"]).allow_changed


def test_validating_a_suite_and_its_identity_imports_no_torch_once_resolved():
    """What the command does before its first kernel starts - every notebook's parameters validated, the run's
    identity with its resolved device and dtype - needs no torch once this machine resolved ``auto``
    (models.resolve_names; its first resolution: tests/measure/test_models.py): ~2 s a command that the kernel,
    which imports torch anyway, does not wait for."""
    import subprocess
    import sys

    from workbench.measure import models

    resolved = models.resolve_names()               # this machine's answer, kept in the tests' cache
    code = ("import sys\nfrom workbench.run import notebooks, resume_check\n"
            "entries = [{'notebook': str(notebooks.REPO / e['notebook']), 'parameters': e.get('parameters') or {}}\n"
            "           for e in notebooks.load_suite('quick')['notebooks']]\n"
            "for e in entries:\n"
            "    notebooks.validate_parameters(e['notebook'], e['parameters'])\n"
            "ident = resume_check.run_identity(entries)\n"
            "print('torch' in sys.modules, *sorted({(m['device'], m['dtype']) for m in ident['models'].values()}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split(None, 1)[0] == "False", out.stdout
    assert str(resolved) in out.stdout                  # auto resolved as pick_device / pick_dtype resolve it
