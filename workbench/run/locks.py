"""One writer per run folder: :func:`take_owner_lock` is the one lock of the project, an OS advisory lock (``flock``)
on a file naming its owner (pid, host, start time), released by the kernel when the owner dies; run folders
(:func:`lock_run`, :func:`unlock_run`, and :func:`check_writer`, which :mod:`workbench.run.results` calls before every
write) and the serving job store (:mod:`workbench.serving.jobs`) both take it. Kernels started by a run's owner
inherit ``$WORKBENCH_RUN_LOCK`` and may write its folder; any other process is refused with :class:`RunLockedError`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import secrets
import socket
from pathlib import Path

from workbench.errors import ParameterError

LOCK_NAME = ".lock"
_LOCK_ENV = "WORKBENCH_RUN_LOCK"
_HELD: dict[Path, list] = {}     # resolved run folder -> [open lock file, token, depth]


class RunLockedError(ParameterError):
    """Another live process is writing this run folder."""


def _read_lock(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}


def _owner_text(owner: dict) -> str:
    return (f"pid {owner.get('pid', '?')}" + (f" on {owner['host']}" if owner.get("host") else "")
            + (f", since {owner['since_utc']}" if owner.get("since_utc") else ""))


def take_owner_lock(path, refuse) -> tuple[int, dict, dict]:
    """Take the exclusive owner lock ``path`` (a file naming its owner: pid, host, start time) for this process.

    An OS advisory lock (``flock``) on an open file: the kernel releases it when the owner dies, so a lock left
    by a killed process is stale and simply taken over; a second holder, even in this process, is refused.
    Release by closing the returned descriptor (:func:`release_owner_lock`). The one lock of the project: run
    folders (:func:`lock_run`) and the serving job store (:mod:`workbench.serving.jobs`) both take it.

    Args:
        path: the lock file (created).
        refuse: ``callable(owner_text) -> Exception`` raised when another holder has it (``owner_text`` names
            its pid, host and start time).

    Returns:
        ``(fd, me, previous)``: the open descriptor (-1 without ``flock``: Windows), this owner's record
        ``{"pid", "host", "since_utc", "token"}`` and the previous owner's (``{}`` when released cleanly).
    """
    me = {"pid": os.getpid(), "host": socket.gethostname(), "since_utc": _dt.datetime.now(_dt.timezone.utc)
          .isoformat(timespec="seconds"), "token": secrets.token_hex(8)}
    try:
        import fcntl
    except ImportError:  # no flock (Windows): one owner is the user's responsibility
        return -1, me, {}
    path = Path(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise refuse(_owner_text(_read_lock(path))) from None
    previous = _read_lock(path)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    os.fsync(fd)
    return fd, me, previous


def release_owner_lock(fd: int) -> None:
    """Release a lock of :func:`take_owner_lock` (the file is emptied: released cleanly; a killed owner's
    file keeps its name)."""
    if fd < 0:
        return
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    os.close(fd)  # closing the descriptor releases the flock


def lock_run(run_dir) -> dict:
    """Become the one writer of a run folder until :func:`unlock_run` (or this process ends).

    The lock is ``<run>/.lock``: an OS advisory lock (``flock``, released by the kernel when the owner
    dies, so a lock left by a killed process is stale and simply taken over) on a file naming the owner
    (pid, host, start time). Kernels started by the owner inherit ``$WORKBENCH_RUN_LOCK`` and may write;
    any other process is refused. Re-entrant within one process.

    Returns:
        ``{"pid", "host", "since_utc", "token", "stale": previous owner dict or None}``.

    Raises:
        RunLockedError: another live process holds the lock (the message names its pid).
    """
    run = Path(run_dir).resolve()
    if run in _HELD:
        _HELD[run][2] += 1
        return _read_lock(run / LOCK_NAME)
    try:
        import fcntl  # noqa: F401 - only whether it exists
    except ImportError:  # no flock (Windows): one writer is the user's responsibility
        return {}
    fd, me, previous = take_owner_lock(run / LOCK_NAME, lambda owner: RunLockedError(
        f"run folder {run} is in use by {owner}; wait for it to finish or stop it, then --resume"))
    _HELD[run] = [fd, me["token"], 1]
    os.environ[_LOCK_ENV] = me["token"]
    for stale in run.glob(".*.tmp"):   # temporary files of a writer that was killed mid-write
        with contextlib.suppress(OSError):
            stale.unlink()
    return {**me, "stale": previous or None}


def unlock_run(run_dir) -> None:
    """Release this process's lock on a run folder (the lock file stays, naming its last owner)."""
    run = Path(run_dir).resolve()
    held = _HELD.get(run)
    if held is None:
        return
    held[2] -= 1
    if held[2] > 0:
        return
    del _HELD[run]
    release_owner_lock(held[0])
    if os.environ.get(_LOCK_ENV) == held[1]:
        os.environ.pop(_LOCK_ENV, None)


def check_writer(run_dir) -> None:
    """Refuse to write a run folder whose lock another live process holds (kernels of the owner may).

    Raises:
        RunLockedError: naming the owner's pid.
    """
    run = Path(run_dir).resolve()
    path = run / LOCK_NAME
    if run in _HELD or not path.exists():
        return
    try:
        import fcntl
    except ImportError:
        return
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)   # succeeds: nobody holds it
        return
    except OSError:
        owner = _read_lock(path)
        if owner.get("token") and owner.get("token") == os.environ.get(_LOCK_ENV):
            return
        raise RunLockedError(f"run folder {run} is in use by {_owner_text(owner)}; "
                             "wait for it to finish or stop it, then --resume") from None
    finally:
        os.close(fd)

