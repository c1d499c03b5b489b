"""Writers into run folders pass one check (issue 51): the results root itself is refused as a run, and
``workbench simulate --validate`` writes through the same checked writer as the rest (inside the results root, its
lock not held by another process), before anything is simulated."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import cli
from workbench.errors import ParameterError
from workbench.predict import twin
from workbench.run import results

REPO = Path(__file__).resolve().parents[2]


def _one_line(capsys, code):
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return err[0]


def test_the_results_root_is_refused_as_a_run(capsys):
    root = results.results_root()
    root.mkdir(parents=True, exist_ok=True)
    with pytest.raises(ParameterError) as exc:
        results.open_run(root)
    assert str(exc.value).startswith("run_dir:") and "results folder itself" in str(exc.value)
    line = _one_line(capsys, cli.main(["simulate", "--device-profile", "bandwidth=1e11,flops=1e12", "--model-config",
                                       str(REPO / "tests" / "data" / "missing.json"), "--out", str(root)]))
    assert "results folder itself" in line
    assert not (root / "manifest.json").exists() and not (root / "points.parquet").exists()
    assert results.open_run(root / "a-run").name == "a-run"   # a folder inside it is a run


@pytest.fixture
def measured_run(tmp_path):
    from tests.predict.test_twin import COST, _measured_run

    run = _measured_run(tmp_path, COST)
    cal = tmp_path / "twin_calibration.json"
    cal.write_text(__import__("json").dumps(COST.to_dict()))
    return run, str(cal)


def test_simulate_validate_refuses_a_run_another_process_writes(measured_run, capsys):
    run, cal = measured_run
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom workbench.run import locks\nlocks.lock_run(sys.argv[1])\n"
                               "print('locked', flush=True)\ntime.sleep(120)", str(run)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        line = _one_line(capsys, cli.main(["simulate", "--validate", str(run), "--calibration", cal]))
        assert f"pid {holder.pid}" in line
        assert not (run / twin.VALIDATION_FILE).exists()
    finally:
        holder.kill()
        holder.wait(30)
    assert cli.main(["simulate", "--validate", str(run), "--calibration", cal]) == 0   # free again: it writes
    assert (run / twin.VALIDATION_FILE).exists()


def test_simulate_validate_refuses_a_folder_outside_the_results_root(measured_run, tmp_path, capsys):
    run, cal = measured_run
    outside = tmp_path / "elsewhere" / run.name
    shutil.copytree(run, outside)
    line = _one_line(capsys, cli.main(["simulate", "--validate", str(outside), "--calibration", cal]))
    assert "inside the results folder" in line
    assert not (outside / twin.VALIDATION_FILE).exists() and not (outside / "metrics.json").exists()
