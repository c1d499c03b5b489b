"""The command line end to end: papermill execution, typed -p values, errors before model load, resume."""
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from workbench import results

REPO = Path(__file__).resolve().parents[1]


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
    (["sweep", "01_batch_size", "-p", "max_new_tokens", "true"], "error: max_new_tokens:"),
    (["sweep", "01_batch_size", "-p", "max_new_tokens", "100000000"], "error: max_new_tokens:"),
    (["sweep", "01_batch_size", "-p", "ignore_eos", "maybe"], "error: ignore_eos:"),
    (["sweep", "01_batch_size", "-p", "run_dir", "/etc"], "error: run_dir:"),
    (["sweep", "01_batch_size", "-p", "batch_sizes", "[1, 2"], "error: batch_sizes:"),
    pytest.param(["sweep", "01_batch_size", "-p", "device", "cuda"], "error: device:",
                 marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")),
])
def test_bad_parameters_fail_with_one_line_before_anything_runs(args, prefix):
    proc = workbench(*args)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(prefix) and len(proc.stderr.strip().splitlines()) == 1
    root = results.results_root()
    assert not root.exists() or not any(root.iterdir())     # no run folder was created


@pytest.mark.notebook
def test_sweep_with_injected_failure_then_resume(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("batch_sizes: [1, 2]\nprompt_tokens: [48]\nmax_new_tokens: 3\nrepeats: 1\n")
    proc = workbench("sweep", "notebooks/01_batch_size.ipynb", "-f", str(grid), "-p", "warmup", "0",
                     env_extra={"WORKBENCH_INJECT_FAILURE": "batch_size=2"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = Path(next(line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("run folder:")))
    pts = pd.read_parquet(run / "points.parquet").set_index("batch_size")
    assert pts.loc[1, "status"] == "ok" and pts.loc[2, "status"].startswith("failed: RuntimeError: injected")
    assert (run / "notebooks" / "01_batch_size.ipynb").exists() and (run / "report.html").exists()
    proc = workbench("sweep", "notebooks/01_batch_size.ipynb", "-p", "max_new_tokens", "5", "--resume", str(run))
    assert proc.returncode == 2 and proc.stderr.startswith("error: --resume: 01_batch_size parameters differ")
    proc = workbench("sweep", "notebooks/01_batch_size.ipynb", "--resume", str(run))   # reuses the recorded ones
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resuming, 1 of 2 points already done" in proc.stdout + proc.stderr
    pts = pd.read_parquet(run / "points.parquet")
    req = pd.read_parquet(run / "requests.parquet")
    assert (pts["status"] == "ok").all() and len(pts) == 2
    assert req.groupby("batch_size").size().to_dict() == {1: 1, 2: 2}
    assert (req["output_tokens"] == 3).all() and (req["prompt_tokens"] == 48).all()
    figures = {p.stem for p in (run / "figures").glob("*.json")}
    assert {"batch_ttft", "batch_throughput", "batch_pareto", "batch_goodput"} <= figures
    html = (run / "report.html").read_text()
    assert html.count("Plotly.newPlot") >= 4 and "batch_pareto" in html


def test_report_rejects_non_runs(tmp_path):
    proc = workbench("report", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.startswith("error: RUN_DIR:")


def test_env_prints_models():
    proc = workbench("env", "--no-probe")
    assert proc.returncode == 0
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in proc.stdout and '"torch_threads"' in proc.stdout
