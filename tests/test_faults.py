"""Fault injection on run folders: kills at a random point then resume, kills mid-write, two writers,
a full disk. Nothing finished may be lost, duplicated or measured with other settings."""
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from workbench import ParameterError
from workbench.run import locks, results, sweeps

REPO = Path(__file__).resolve().parents[1]
SIZES = (1, 2, 3, 4, 8)   # the faulted sweep's points: one a stage, with batch 8 last (stage 5 fails it on purpose)
# --figures none: the sessions' reports without their static PNG / SVG copies (Kaleido, a browser start and ~0.3 s an
# image each time); what is checked here is what a fault leaves on disk (static figures: tests/share/test_static_figures.py)
SWEEP = ["sweep", "01_batch_size", "-p", "batch_sizes", str(list(SIZES)), "-p", "prompt_tokens", "[64]",
         "-p", "max_new_tokens", "6", "-p", "repeats", "1", "-p", "warmup", "0", "--figures", "none"]


def workbench(*args, env_extra=None, timeout=600, **kw):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=timeout, **kw)


def _ok_points(run: Path) -> int:
    try:
        return sum(m.get("status") == "ok" for m in json.loads((run / "manifest.json").read_text())["points"].values())
    except (OSError, ValueError, KeyError):
        return 0


def _assert_clean_run(run: Path, sizes=SIZES, new_tokens=6, prompt=64):
    pts = pd.read_parquet(run / "points.parquet")
    req = pd.read_parquet(run / "requests.parquet")
    assert sorted(pts["batch_size"]) == list(sizes), pts[["point_id", "status"]]     # each size exactly once
    assert (pts["status"] == "ok").all()
    assert req.groupby("batch_size").size().to_dict() == {b: b for b in sizes}        # nothing lost or doubled
    assert not req.duplicated(["point_id", "repeat", "request_id"]).any()
    assert (req["max_new_tokens"] == new_tokens).all() and (req["output_tokens"] == new_tokens).all()
    assert (req["prompt_tokens"] == prompt).all()
    manifest = results.read_manifest(run)
    assert set(manifest["points"]) == set(pts["point_id"])
    return manifest


# A child inherits an ignored SIGINT, and Python then never turns Ctrl-C into KeyboardInterrupt: an earlier test in
# this process (in a full run, not alone) leaves SIGINT ignored, so the command is started the way a terminal starts
# it, with Python's Ctrl-C handler (its own children then get the default disposition).
_LAUNCH = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
           "sys.argv = ['workbench'] + sys.argv[1:]; runpy.run_module('workbench.cli', run_name='__main__')")


def _kill_after(args, env, real: Path, at_least: int, sig, extra_s: float, group: bool = True):
    """Start ``workbench ARGS`` as a terminal would, wait until the run under ``real`` has ``at_least`` finished
    points, wait ``extra_s`` more (anywhere inside the next point), then send ``sig`` to its process group (like
    Ctrl-C or kill -9 in a terminal), or with ``group=False`` to the command's process alone (like ``kill PID`` or a
    job system's stop). Returns ``(run folder, return code, output)``."""
    proc = subprocess.Popen([sys.executable, "-c", _LAUNCH, *args], cwd=REPO, stdout=subprocess.PIPE, env=env,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        run = None
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None:
            runs = list(real.glob("2*"))
            run = runs[0] if runs else None
            if run is not None and _ok_points(run) >= at_least:
                break
            time.sleep(0.2)
        assert run is not None and proc.poll() is None, "the sweep ended before it could be interrupted"
        time.sleep(extra_s)
        (os.killpg if group else os.kill)(proc.pid, sig)
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return run, proc.returncode, out


def _stage(run: Path, **seen) -> dict:
    """What a stage left on disk: finished points, the manifest, the points table (read whatever the kill
    interrupted), plus ``seen``."""
    manifest = results.read_manifest(run)
    return {"ok": _ok_points(run), "manifest": manifest, "points": pd.read_parquet(run / "points.parquet"),
            "records": {pid: m for pid, m in manifest["points"].items() if m.get("status") == "ok"}, **seen}


@pytest.fixture(scope="module")
def faulted_sweep(tmp_path_factory):
    """One sweep of 5 points taken through every fault in turn, so the kernels, model loads and drift references
    are paid once for the SIGINT, SIGTERM, SIGKILL and full-disk cases instead of once per case:

    1. started fresh; SIGINT after its first point (plus a random fraction of the next);
    "term". bare ``--resume``; SIGTERM to the command alone (not its kernel, as ``kill PID`` or a job system) 0.2 s
       after one more point; what it left is read at once (its kernel's processes) and 2 s later (its points);
    2. bare ``--resume``; SIGKILL (the whole process group, kernel included) after one more point;
    3. bare ``--resume`` with a full disk: the write of the requests table of its second point (its first when only
       one is left) fails with ENOSPC (so batch 8 is never done before stage 4);
    4. bare ``--resume`` with an injected failure in the batch-8 point (``WORKBENCH_INJECT_FAILURE``): it is recorded
       as failed, the command still ends 0 with figures and a report;
    5. bare ``--resume`` to the end: the failed point is measured again.

    The results root is a relative ``WORKBENCH_RESULTS`` reached through a symlink: the kernel's working folder is
    the notebook's, so the command must resolve the path once, and the kernel and the command must agree on it.
    Returns ``{"run": the real run folder, "link": it through the symlink, stage number: what it left}``.
    """
    tmp = tmp_path_factory.mktemp("faults")
    real = tmp / "real-results"
    real.mkdir()
    (tmp / "linked").symlink_to(real, target_is_directory=True)
    # a drift reference stands for the whole test (what a fault leaves is checked here, not drift): the sessions read
    # the latest one from the workbench cache (drift.SHARED_FILE; another test's process may have written it)
    # instead of measuring ~2.4 s each
    env = {**os.environ, "WORKBENCH_RESULTS": os.path.relpath(tmp / "linked", REPO),
           "WORKBENCH_REFERENCE_REUSE_S": "3600"}
    env.pop("WORKBENCH_INJECT_WRITE_ERROR", None)
    rng = random.Random(1200)
    out = {}
    run, code, text = _kill_after(SWEEP, env, real, 1, signal.SIGINT, rng.uniform(0.0, 0.3))
    link = tmp / "linked" / run.name
    out.update(run=run, link=link)
    out[1] = _stage(run, returncode=code, output=text)
    resume = ["sweep", "01_batch_size", "--resume", str(link), "--figures", "none"]
    _, code, text = _kill_after(resume, env, real, out[1]["ok"] + 1, signal.SIGTERM, 0.2, group=False)
    kernels = _processes_with_env(f"WORKBENCH_RESULTS={real.resolve()}")   # its kernel went with it, not after
    done = _ok_points(run)
    time.sleep(2)
    out["term"] = _stage(run, returncode=code, output=text, kernels_left=kernels, ok_at_exit=done)
    _, code, text = _kill_after(resume, env, real, out["term"]["ok"] + 1, signal.SIGKILL, rng.uniform(0.0, 0.3))
    out[2] = _stage(run, returncode=code, output=text)
    nth = 2 if len(SIZES) - out[2]["ok"] >= 2 else 1
    proc = workbench(*resume, env_extra={**env, "WORKBENCH_INJECT_WRITE_ERROR": f"requests.parquet:{nth}"})
    out[3] = _stage(run, returncode=proc.returncode, output=proc.stdout + proc.stderr, stderr=proc.stderr, nth=nth)
    proc = workbench(*resume, env_extra={**env, "WORKBENCH_INJECT_FAILURE": "batch_size=8"})
    out[4] = _stage(run, returncode=proc.returncode, output=proc.stdout + proc.stderr, stderr=proc.stderr)
    proc = workbench(*resume, env_extra=env)
    out[5] = _stage(run, returncode=proc.returncode, output=proc.stdout + proc.stderr, stderr=proc.stderr)
    return out


def _kept(before: dict, after: dict) -> None:
    """Every point finished before is still there, with its first record (not measured again)."""
    for pid, record in before["records"].items():
        assert after["records"].get(pid) == record, pid


@pytest.mark.notebook
def test_sigint_at_a_random_point_then_resume(faulted_sweep, cli):
    """The issue's reproduction (smaller): Ctrl-C after the first points, then the suggested bare --resume."""
    first, last, run = faulted_sweep[1], faulted_sweep[5], faulted_sweep["run"]
    assert first["returncode"] == 130 and "--resume" in first["output"], first["output"][-2000:]
    assert first["manifest"]["status"] == "interrupted"
    assert first["manifest"]["notebooks"]["01_batch_size"]["status"] == "interrupted"
    assert 1 <= first["ok"] < len(SIZES)
    assert len(first["points"]) >= first["ok"]                  # the table was readable after the interrupt
    assert last["returncode"] == 0, last["stderr"][-3000:]
    manifest = _assert_clean_run(run)
    for later in ("term", 2, 3, 4, 5):
        _kept(first, faulted_sweep[later])
    assert manifest["notebooks"]["01_batch_size"]["parameters"]["max_new_tokens"] == 6
    sessions = manifest["sessions"]
    assert [s["resume"] for s in sessions] == [False] + [True] * 5      # the first session's record is kept
    entry = manifest["experiments"]["batch_size"]
    starts = [h["reference_tpot_s"][0] for h in entry["drift_history"]] + [entry["reference_tpot_s"][0]]
    assert len(starts) >= 2 and all(0 < t < 10 for t in starts), starts   # the sessions that reached their end
    assert "environment" in sessions[0] and manifest["environment"]["torch"]
    assert not list(run.glob(".*.tmp"))

    # a different setting on resume is refused before anything runs
    code, _, err = cli("sweep", "01_batch_size", "-p", "max_new_tokens", "7", "--resume", str(faulted_sweep["link"]))
    assert code == 2 and err.startswith("error: --resume: 01_batch_size parameters differ")


@pytest.mark.notebook
def test_sigkill_at_a_random_point_then_resume(faulted_sweep):
    """kill -9 of the command and its kernel in the middle of a resumed sweep: the finished points stay, the table
    stays readable, the dead owner's lock is taken over, and the next --resume finishes the run cleanly."""
    before, killed, run = faulted_sweep["term"], faulted_sweep[2], faulted_sweep["run"]
    assert killed["returncode"] == -signal.SIGKILL
    assert before["ok"] < killed["ok"] < len(SIZES), "the resumed sweep should be killed mid-sweep, after a point of its own"
    assert len(killed["points"]) >= killed["ok"]                 # readable whatever the kill interrupted
    _kept(before, killed)
    for later in (3, 4, 5):
        _kept(killed, faulted_sweep[later])
    assert faulted_sweep[5]["returncode"] == 0, faulted_sweep[5]["stderr"][-3000:]
    _assert_clean_run(run)
    assert f"resuming, {faulted_sweep[3]['ok']} of {len(SIZES)} points already done" in faulted_sweep[4]["output"]
    assert not list(run.glob(".*.tmp"))


@pytest.mark.notebook
def test_a_full_disk_in_a_sweep_gives_one_line_and_a_resumable_run(faulted_sweep):
    """Through the command line and a real kernel: ENOSPC on a requests write ends the sweep with one error line
    suggesting --resume; the points finished before it stay, the failed one is not marked done, and the
    suggested --resume completes the run."""
    before, full, run = faulted_sweep[2], faulted_sweep[3], faulted_sweep["run"]
    assert full["returncode"] == 1, full["stderr"][-3000:]
    assert f"resuming, {before['ok']} of {len(SIZES)} points already done" in full["output"]
    errors = [line for line in full["stderr"].splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "requests.parquet: No space left on device" in errors[0], full["stderr"][-3000:]
    assert f"--resume {run}" in errors[0]
    assert full["manifest"]["status"] == "interrupted"
    assert full["ok"] == before["ok"] + full["nth"] - 1         # the point before the failed write is kept
    assert sorted(full["points"]["batch_size"]) == list(SIZES[:full["ok"]])
    _kept(before, full)
    assert faulted_sweep[5]["returncode"] == 0, faulted_sweep[5]["stderr"][-3000:]
    _assert_clean_run(run)


@pytest.mark.notebook
def test_an_injected_point_failure_is_recorded_and_the_next_resume_measures_it(faulted_sweep):
    """Through the command line: a point that raises is recorded as failed while the sweep goes on and ends 0 with its
    figures and report; the next bare --resume measures only that point again (the others keep their records)."""
    failed, last, run = faulted_sweep[4], faulted_sweep[5], faulted_sweep["run"]
    assert failed["returncode"] == 0, failed["stderr"][-3000:]
    status = failed["points"].set_index("batch_size")["status"]
    assert status.loc[8].startswith("failed: RuntimeError: injected") and (status.drop(8) == "ok").all()
    assert failed["ok"] == len(SIZES) - 1 and failed["manifest"]["status"] == "ok"   # a point failed, not the notebook
    assert (run / "notebooks" / "01_batch_size.ipynb").exists()
    assert f"resuming, {len(SIZES) - 1} of {len(SIZES)} points already done" in last["output"]
    _kept(failed, last)
    _assert_clean_run(run)
    figures = {p.stem for p in (run / "figures").glob("*.json")}
    assert {"batch_ttft", "batch_throughput", "batch_pareto", "batch_goodput"} <= figures
    html = (run / "report.html").read_text()
    assert html.count("Plotly.newPlot") >= 4 and "batch_pareto" in html


_WRITER = r"""
import sys, pandas as pd
from workbench import results
big = pd.DataFrame({"point_id": ["p"] * 200_000, "x": range(200_000), "s": ["abcdefgh" * 4] * 200_000})
print("ready", flush=True)
i = 0
while True:
    i += 1
    results.write_table(sys.argv[1], big.assign(x=i))
"""


@pytest.mark.notebook
def test_sigterm_to_the_command_alone_ends_the_run_as_interrupted(faulted_sweep):
    """``kill PID`` (SIGTERM to the command, not its kernel: what Slurm or Kubernetes send) inside a point: the run
    ends as Ctrl-C ends it - exit 143, the manifest ``interrupted``, the lock released, the kernel shut down and the
    way on printed. (Before: Python's default SIGTERM killed the command mid-run, the manifest said ``running``
    and the orphaned kernel measured on until it noticed its parent had gone.) The faulted sweep's second session,
    a resumed one: the points of the first are kept, and the next ``--resume`` takes the lock and goes on."""
    before, term = faulted_sweep[1], faulted_sweep["term"]
    assert term["returncode"] == 143, term["output"][-2000:]
    assert "terminated: finished points are on disk; continue with --resume" in term["output"]
    assert term["manifest"]["status"] == "interrupted"
    assert term["manifest"]["notebooks"]["01_batch_size"]["status"] == "terminated"   # not left "running"
    assert "never retrieved" not in term["output"]     # no asyncio traceback of the kernel it shut down
    assert before["ok"] < term["ok"] < len(SIZES)
    assert not term["kernels_left"]                               # its kernel went with it, not after
    assert term["ok"] == term["ok_at_exit"]                       # nothing left measuring (2 s later)
    _kept(before, term)
    assert faulted_sweep[2]["returncode"] == -signal.SIGKILL      # the next session ran: the lock was released
    assert faulted_sweep[2]["ok"] > term["ok"]


def _processes_with_env(entry: str) -> list[int]:
    """Pids of this user's live processes whose environment holds ``entry`` (``NAME=value``), from /proc."""
    pids = []
    for env_file in Path("/proc").glob("[0-9]*/environ"):
        try:
            if entry.encode() in env_file.read_bytes().split(b"\0"):
                stat = (env_file.parent / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":      # a zombie is gone already
                    pids.append(int(env_file.parent.name))
        except OSError:
            continue
    return pids


def test_a_kill_during_a_table_write_leaves_a_readable_table(tmp_path):
    run = results.create_run()
    table = run / "requests.parquet"
    results.write_table(table, pd.DataFrame({"point_id": ["p"], "x": [0]}))
    rng = random.Random(7)
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(table)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 1.0))                     # somewhere inside a write
        proc.kill()
        proc.wait()
        df = pd.read_parquet(table)                            # the old table or a new one, never torn
        assert list(df.columns) == ["point_id", "x"] or list(df.columns) == ["point_id", "x", "s"]
        assert df["x"].nunique() == 1
    locks.lock_run(run)                                        # the next writer clears temporary leftovers
    locks.unlock_run(run)
    assert not list(run.glob(".*.tmp"))


def test_an_error_between_write_and_rename_keeps_the_old_table(monkeypatch):
    run = results.create_run()
    old = pd.DataFrame({"point_id": ["p1"], "ttft_s": [1.0]})
    results.record_point(run, "p1", old, {"point_id": "p1", "status": "ok"}, {"status": "ok"})
    monkeypatch.setenv("WORKBENCH_INJECT_WRITE_ERROR", "requests.parquet")
    results._INJECTED_WRITES.clear()
    with pytest.raises(results.RunWriteError, match=r"cannot write .*requests\.parquet: No space left on device"):
        results.record_point(run, "p2", old.assign(point_id="p2"), {"point_id": "p2", "status": "ok"}, {"status": "ok"})
    assert results.read_requests(run)["point_id"].tolist() == ["p1"]
    assert results.finished_points(run) == {"p1"}                # p2 is not marked done: resume re-measures it
    assert not list(run.glob(".*.tmp"))


def test_a_second_writer_is_refused_with_the_owners_pid(tmp_path, cli):
    run = results.create_run()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom workbench.run import locks\n"
                               "locks.lock_run(sys.argv[1]); print('locked', flush=True); time.sleep(120)", str(run)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, _, err = cli(*SWEEP[:2], "--resume", str(run))    # in this process: refused before any work
        assert code == 2, err
        line = err.strip()
        assert len(line.splitlines()) == 1 and line.startswith("error: --resume: run folder")
        assert f"in use by pid {holder.pid}" in line
        with pytest.raises(locks.RunLockedError, match=f"pid {holder.pid}"):
            locks.lock_run(run)
        with pytest.raises(locks.RunLockedError):                # a kernel of another owner may not write
            results.record_point(run, "p", pd.DataFrame(), {"point_id": "p", "status": "ok"}, {"status": "ok"})
    finally:
        holder.kill()
        holder.wait()
    owner = locks.lock_run(run)                                 # the dead owner's lock is stale: taken over
    try:
        assert owner["pid"] == os.getpid() and owner["stale"]["pid"] == holder.pid
        assert locks.lock_run(run)["pid"] == os.getpid()         # re-entrant in the owner
        locks.unlock_run(run)
    finally:
        locks.unlock_run(run)
    assert locks.lock_run(run)["stale"] is None                 # released cleanly: nothing stale
    locks.unlock_run(run)


def test_a_full_disk_stops_the_sweep_with_earlier_points_intact(monkeypatch):
    """In process: the writer raises ENOSPC on the third point; the first two stay, the run resumes."""
    run = results.create_run()
    calls = {"n": 0}
    real = pd.DataFrame.to_parquet

    def full_disk(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 5:                                    # 2 tables per point: the 3rd point's requests
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, *a, **kw)

    def measure(p):
        return {"requests": [{"request_id": 0, "ttft_s": 0.1, "e2e_s": 0.2, "tpot_s": 0.01, "output_tokens": 5,
                              "prompt_tokens": 8, "itl_s": [0.01] * 4}], "wall_s": 0.2}

    points = sweeps.expand_grid(seed=[1, 2, 3, 4])
    monkeypatch.setattr(pd.DataFrame, "to_parquet", full_disk)
    with pytest.raises(results.RunWriteError) as info:
        sweeps.run_sweep(run, "fake", points, measure)
    assert str(info.value).startswith(f"cannot write {run / 'requests.parquet'}: No space left on device")
    assert len(str(info.value).splitlines()) == 1
    monkeypatch.setattr(pd.DataFrame, "to_parquet", real)
    assert sorted(results.read_points(run)["seed"]) == [1, 2] and len(results.finished_points(run)) == 2
    sweeps.run_sweep(run, "fake", points, measure, resume=True)
    assert sorted(results.read_points(run)["seed"]) == [1, 2, 3, 4] and len(results.read_requests(run)) == 4


def test_paths_resolve_once_symlinked_and_relative(tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path / "link"))
    assert results.results_root() == real
    run = results.create_run()
    assert results.open_run(tmp_path / "link" / run.name) == run     # via the link or not: the same folder
    assert results.open_run(str(run)) == run
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORKBENCH_RESULTS", "link")
    assert results.results_root() == real
    assert os.environ["WORKBENCH_RESULTS"] == str(real)             # pinned: kernels elsewhere see the same
    monkeypatch.chdir(REPO)
    assert results.results_root() == real and results.open_run(str(run)) == run
    with pytest.raises(ParameterError):
        results.open_run(tmp_path / "elsewhere")
