"""The suite runner behind ``workbench run`` and ``workbench sweep``: validate every notebook's parameters, open
(or resume) one run folder under its lock, execute the notebooks in one kernel, record each notebook's status,
hand the finished run to ``report`` (the command line passes :func:`workbench.share.report.build_report`: the
report sits above the run folder's bookkeeping, which stays here in run/).

``run_entries(entries, resume_dir, label, suite, report=...) -> exit status`` and
``rerun_invalid_entries(run_dir) -> entries`` are the two entry points; an entry is ``{"notebook": path, "parameters": {name: value}}``. Errors: a bad parameter,
a foreign run folder or a locked run is :class:`~workbench.errors.ParameterError` (one line, exit 2); a run folder
that cannot be written is :class:`~workbench.run.results.RunWriteError` (exit 1, finished points kept).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from workbench.errors import ParameterError


def _execute(entries: list[dict], run_dir: Path, resume: bool) -> list[str]:
    """Execute validated notebook entries into the run, all in one kernel (:func:`workbench.run.notebooks.one_kernel`);
    return the names that failed."""
    from workbench.run import notebooks

    failed = []
    with notebooks.one_kernel():  # one kernel for the run: imports, model, probe and drift reference paid once
        for i, e in enumerate(entries, 1):
            _execute_one(i, e, entries, run_dir, resume, failed)
    return failed


def _execute_one(i: int, e: dict, entries: list[dict], run_dir: Path, resume: bool, failed: list[str]) -> None:
    """Execute the ``i``-th notebook entry into the run, recording its status; a failure is appended to ``failed``."""
    from workbench.checks import mask_secrets
    from workbench.run import notebooks, results

    name = Path(e["notebook"]).stem
    print(f"== [{i}/{len(entries)}] {name}", flush=True)
    t0 = time.perf_counter()
    params = dict(e["parameters"])
    if resume:
        params["resume"] = True
    # parameters are on disk before any point runs: an interrupted notebook resumes with the same ones; an earlier
    # session's status and time go to its ``history`` (a resume or --rerun-invalid keeps the first run's times)
    prev = results.read_manifest(run_dir).get("notebooks", {}).get(name) or {}
    past = list(prev.get("history") or []) + ([{k: prev[k] for k in ("status", "wall_s") if k in prev}]
                                              if "wall_s" in prev else [])
    kept = {"history": past} if past else {}
    shown = mask_secrets(e["parameters"])   # what a run folder holds of them: secrets masked (none pass validation)
    results.update_manifest(run_dir, notebooks={name: {"status": "running", "parameters": shown, **kept}})
    before = len(results.read_manifest(run_dir).get("points", {}))
    try:
        notebooks.execute_notebook(e["notebook"], params, run_dir)
        status = "ok"
        recorded = len(results.read_manifest(run_dir).get("points", {})) - before
        if recorded == 0 and not resume and not name.startswith("9"):  # 9x notebooks analyse, never measure
            status = "failed: the notebook was asked to measure and recorded no point"
            failed.append(name)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: this notebook's record says so too, then the run stops
        why = "terminated" if isinstance(exc, Terminated) else "interrupted"
        try:
            results.update_manifest(run_dir, notebooks={name: {"status": why, "wall_s": round(
                time.perf_counter() - t0, 1), "parameters": shown, **kept}})
        except (OSError, ParameterError):
            pass
        raise
    except Exception as exc:  # noqa: BLE001 - one failed notebook must not stop the suite
        if isinstance(exc, results.RunWriteError) or getattr(exc, "ename", None) in ("RunWriteError",
                                                                                     "RunLockedError"):
            # the run folder cannot be written (disk full) or was taken over: stop, keep what is on disk
            raise results.RunWriteError(str(getattr(exc, "evalue", None) or exc)) from exc
        status = f"failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"[:400]
        failed.append(name)
    wall = time.perf_counter() - t0
    results.update_manifest(run_dir, notebooks={name: {"status": status, "wall_s": round(wall, 1),
                                                        "parameters": shown, **kept}})
    print(f"== {name}: {status} ({wall:.0f} s)", flush=True)


def _resume_parameters(entries: list[dict], resume_dir: str) -> None:
    """On ``--resume``, reuse the parameters the run recorded; refuse different ones.

    A resumed point must be measured with the settings of the points already
    on disk, so a notebook given no parameters takes the recorded ones and a
    notebook given others is an error.
    """
    from workbench.run import results

    if not (Path(resume_dir) / "manifest.json").exists():
        raise ParameterError(f"--resume: {resume_dir!r} is not a run folder (no manifest.json)")
    recorded = results.read_manifest(resume_dir).get("notebooks", {})
    for e in entries:
        name = Path(e["notebook"]).stem
        if name not in recorded:
            continue
        before = recorded[name].get("parameters", {})
        if not e["parameters"]:
            e["parameters"] = dict(before)
        elif e["parameters"] != before:
            raise ParameterError(f"--resume: {name} parameters differ from the run's {before}; "
                                 "give the same ones (or none) to resume")


def run_entries(entries: list[dict], resume_dir: str | None, label: str, suite: str | None = None,
                price_per_hour: float | None = None, allow_changed: bool = False,
                report: Callable[[Path], object] | None = None, budget_s: float | None = None,
                reference_reuse_s: float | None = None) -> int:
    """Validate, open (or resume) the run folder under its lock, execute ``entries``, then call ``report(run_dir)``
    (still under the lock; its return value, the report's path, is printed); the exit status. A resume whose model,
    device, dtype, packages or effective notebook configs differ from the run's is a one-line
    :class:`~workbench.errors.ParameterError` unless ``allow_changed`` (:mod:`workbench.run.resume_check`).
    ``budget_s`` (a suite's ``budget_s:``): the seconds after which no design adds a round beyond its minimum
    (:data:`workbench.run.design.DEADLINE_ENV`, inherited by the kernel). ``reference_reuse_s`` (a suite's
    ``reference_reuse_s:``): how long a drift reference stands for the machine's speed in this run
    (:data:`workbench.run.drift.REFERENCE_REUSE_S`, 15 s by default; :data:`~workbench.run.drift.REUSE_ENV`)."""
    import os

    from workbench.run import locks, notebooks, results, resume_check

    if resume_dir:
        _resume_parameters(entries, resume_dir)
    for e in entries:  # every notebook validated before any runs
        e["parameters"] = {k: v for k, v in notebooks.validate_parameters(e["notebook"], e["parameters"]).items()
                           if k in e["parameters"]}
    if resume_dir:  # model, device, dtype, packages, every notebook's effective config: the same, or exit 2
        changed = resume_check.check_resume(resume_dir, entries, allow_changed)
        if changed:
            print(f"--allow-changed: measuring again under new ids what changed: {'; '.join(changed)}", flush=True)
    if allow_changed:
        os.environ[resume_check.ALLOW_ENV] = "1"  # inherited by the kernels (workbench.run.sweeps.run_sweep)
    if budget_s:
        from workbench.run.design import DEADLINE_ENV

        os.environ[DEADLINE_ENV] = str(time.time() + float(budget_s))   # the kernel inherits it at its start
    if reference_reuse_s:
        from workbench.run.drift import REUSE_ENV

        os.environ[REUSE_ENV] = str(float(reference_reuse_s))   # the kernel inherits it at its start
    try:
        run_dir = results.open_run(resume_dir) if resume_dir else results.create_run(label)
        owner = locks.lock_run(run_dir)   # one writer per run folder; a second resume is refused here
    except locks.RunLockedError as exc:
        raise ParameterError(f"--resume: {exc}") from None
    try:
        with sigterm_interrupts():  # SIGTERM ends the run as Ctrl-C does (Terminated), lock released below
            if price_per_hour is not None:
                results.update_manifest(run_dir, price_per_hour_usd=price_per_hour)
            return _run_locked(entries, run_dir, bool(resume_dir), suite, owner, report)
    finally:
        locks.unlock_run(run_dir)


def _run_locked(entries: list[dict], run_dir: Path, resume: bool, suite: str | None, owner: dict,
                report: Callable[[Path], object] | None) -> int:
    from workbench.run import results, resume_check

    recorded_suite = results.read_manifest(run_dir).get("suite") if resume else None
    if resume and suite and recorded_suite and Path(recorded_suite).resolve() != Path(suite).resolve():
        raise ParameterError(f"--resume: the run was started with suite {recorded_suite}, not {suite}; "
                             "give the same suite to resume")
    if owner.get("stale"):
        print(f"run folder: took over the lock left by pid {owner['stale'].get('pid')} (no longer running)",
              file=sys.stderr)
    results.begin_session(run_dir, resume=resume)
    resume_check.record(run_dir, entries, resume)
    results.update_manifest(run_dir, status="running", suite=suite or recorded_suite)
    print(f"run folder: {run_dir}", flush=True)
    t0 = time.perf_counter()
    try:
        failed = _execute(entries, run_dir, resume=resume)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM from a job system (Terminated)
        _mark_interrupted(run_dir)
        why = "terminated" if isinstance(exc, Terminated) else "interrupted"
        # the kernel was shut down under nbclient's pending reads: asyncio would print their DeadKernelError
        # ("Task exception was never retrieved", a traceback) as the command exits
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        print(f"\n{why}: finished points are on disk; continue with --resume {run_dir}", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    except results.RunWriteError as exc:
        _mark_interrupted(run_dir)
        print(f"error: {str(exc).strip().splitlines()[-1]}; finished points are kept: free the space, then "
              f"--resume {run_dir}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - t0
    status = "ok" if not failed else f"failed: {', '.join(failed)}"
    results.update_manifest(run_dir, status=status, wall_s=round(wall, 1))
    out = report(run_dir) if report is not None else None
    print(f"done in {wall:.0f} s: {status}" + (f"\nreport: {out}" if out is not None else ""), flush=True)
    return 0 if not failed else 1


class Terminated(KeyboardInterrupt):
    """SIGTERM (a job system's stop: Slurm, Kubernetes, ``kill PID``) raised where Ctrl-C's KeyboardInterrupt is:
    the run ends as an interrupted one (manifest ``interrupted``, the kernel shut down, exit 143), not killed
    mid-write with its manifest left ``running`` and its kernel measuring on until it notices its parent is gone."""


def _raise_terminated(signum, frame):
    raise Terminated(f"signal {signum}")


@contextlib.contextmanager
def sigterm_interrupts():
    """Within this block SIGTERM raises :class:`Terminated` in the main thread (the previous handler is restored
    after); outside the main thread it does nothing (Python delivers signals to the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _mark_interrupted(run_dir: Path) -> None:
    """Best effort: the manifest says ``interrupted`` (it may itself be unwritable when the disk is full)."""
    from workbench.run import results

    try:
        results.update_manifest(run_dir, status="interrupted")
    except (OSError, ParameterError):
        pass


def rerun_invalid_entries(run_dir: str) -> list[dict]:
    """The notebooks a run recorded, with their recorded parameters (``--rerun-invalid``): the kernels re-measure
    the points marked invalid and the points of a comparison whose A/A control moved
    (:func:`workbench.run.results.aa_moved_points`).

    Raises:
        ParameterError: ``run_dir`` is not a run folder, or it has nothing to re-measure.
    """
    import os

    from workbench.run import notebooks, results

    if not (Path(run_dir) / "manifest.json").exists():
        raise ParameterError(f"--rerun-invalid: {run_dir!r} is not a run folder (no manifest.json)")
    bad = results.invalid_points(run_dir)
    moved = {pid: why for pid, why in results.aa_moved_points(run_dir).items() if pid not in bad}
    if not bad and not moved:
        raise ParameterError(f"--rerun-invalid: {run_dir!r} has no point marked invalid and no comparison whose "
                             f"A/A control moved")
    if bad:
        print(f"re-measuring {len(bad)} invalid point(s): " + ", ".join(sorted(bad)), flush=True)
    if moved:
        print(f"re-measuring {len(moved)} point(s) whose comparison's A/A control moved: "
              + "; ".join(sorted(set(moved.values()))), flush=True)
    os.environ["WORKBENCH_RERUN_INVALID"] = "1"  # inherited by the kernels: invalid points count as unfinished
    recorded = results.read_manifest(run_dir).get("notebooks", {})
    return [{"notebook": str(notebooks.NOTEBOOKS_DIR / f"{name}.ipynb"), "parameters": dict(rec.get("parameters", {}))}
            for name, rec in recorded.items()]
