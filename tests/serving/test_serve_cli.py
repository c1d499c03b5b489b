"""Tests for ``workbench serve``'s errors before any model loads, and the package's offline setting."""

import os
import subprocess
import sys

import pytest


def _run(args, env=None, timeout=120):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args,word", [
    (["--model", "/nonexistent/model"], "model"),
    (["--device", "cuda"], "device"),
    (["--host", "0.0.0.0"], "API key"),
])
def test_serve_errors_in_one_line_before_loading(args, word):
    import torch

    if "cuda" in args and torch.cuda.is_available():
        args = ["--device", "mps"] if not torch.backends.mps.is_available() else pytest.skip("every device exists")
        word = "device"
    r = _run(["-m", "workbench.cli", "serve", *args], env={"WORKBENCH_API_KEY": ""})
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and word in lines[0] and "Traceback" not in r.stderr
    assert "Loading weights" not in r.stderr


def test_offline_is_set_by_the_package_whatever_the_import_order():
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    code = ("import huggingface_hub.constants as c; import workbench, os; "
            "print(os.environ['HF_HUB_OFFLINE'], c.HF_HUB_OFFLINE)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "True"]
    code = "import workbench.serving.server, huggingface_hub.constants as c; print(c.HF_HUB_OFFLINE)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.stdout.strip() == "True", r.stderr
