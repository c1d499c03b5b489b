"""Tests for ``workbench serve``'s errors before any model loads, and the package's offline setting."""

import os
import subprocess
import sys

import pytest


def _run(args, env=None, timeout=120):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


class Reached(BaseException):
    """Raised by the stand-ins below: the model load (or the server start) was reached before the error."""


@pytest.mark.parametrize("args,word", [
    (["--model", "/nonexistent/model"], "model"),
    (["--device", "cuda"], "device"),
    (["--host", "0.0.0.0"], "API key"),
])
def test_serve_errors_in_one_line_before_loading(args, word, monkeypatch, capsys):
    """In process (``workbench.cli.main``) with the model load and uvicorn made to raise; the real command's
    exit status is checked by :func:`test_serve_error_exits_2_from_the_command`."""
    import torch
    import uvicorn

    from workbench import cli
    from workbench.measure import models

    if "cuda" in args and torch.cuda.is_available():
        args = ["--device", "mps"] if not torch.backends.mps.is_available() else pytest.skip("every device exists")
        word = "device"

    def boom(*a, **k):
        raise Reached("the model load or the server start was reached")

    monkeypatch.setattr(models, "load_model", boom)
    monkeypatch.setattr(uvicorn, "run", boom)
    monkeypatch.setenv("WORKBENCH_API_KEY", "")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and word in lines[0] and "Traceback" not in err


def test_a_port_in_use_is_one_line_before_loading(monkeypatch, capsys):
    """A fresh user's ``workbench serve --port <in use>`` loaded the model for 13 s, then printed uvicorn's
    multi-line "[Errno 98] address already in use" and exited 3: now one line naming the port, exit 2, nothing
    loaded."""
    import socket

    from workbench import cli
    from workbench.measure import models

    def boom(*a, **k):
        raise Reached("the model load was reached")

    monkeypatch.setattr(models, "load_model", boom)
    monkeypatch.setenv("WORKBENCH_API_KEY", "")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            cli.main(["serve", "--port", str(port)])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exc.value.code == 2 and len(lines) == 1, err
    assert f"port: {port} on 127.0.0.1 is in use" in lines[0] and "--port 0" in lines[0]


def test_serve_error_exits_2_from_the_command():
    """The real ``python -m workbench.cli serve`` process: exit status 2, one line, nothing loaded."""
    r = _run(["-m", "workbench.cli", "serve", "--model", "/nonexistent/model"], env={"WORKBENCH_API_KEY": ""})
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "model" in lines[0] and "Traceback" not in r.stderr
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


def test_a_second_server_on_an_owned_job_store_is_one_line_before_loading(tmp_path, monkeypatch, capsys):
    """``workbench serve --jobs-db PATH`` while another server owns PATH: exit 2, one line naming the owner's
    pid, before the model loads; flag values out of range likewise."""
    import uvicorn

    from workbench import cli
    from workbench.measure import models
    from workbench.run import locks
    from workbench.serving import job_store

    def boom(*a, **k):
        raise Reached("the model load or the server start was reached")

    monkeypatch.setattr(models, "load_model", boom)
    monkeypatch.setattr(uvicorn, "run", boom)
    monkeypatch.setenv("WORKBENCH_API_KEY", "")
    db = tmp_path / "jobs.sqlite3"
    fd = job_store.lock_store(db)  # "another server" owns it
    try:
        for args, word in ((["--jobs-db", str(db)], f"pid {os.getpid()}"), (["--limit-concurrency", "0"],
                           "limit_concurrency"), (["--engine", "fifo", "--prefix-sharing"], "prefix_sharing")):
            capsys.readouterr()
            with pytest.raises(SystemExit) as exc:
                cli.main(["serve", *args])
            err = capsys.readouterr().err
            lines = [ln for ln in err.splitlines() if ln.strip()]
            assert exc.value.code == 2 and len(lines) == 1 and word in lines[0], err
    finally:
        locks.release_owner_lock(fd)
