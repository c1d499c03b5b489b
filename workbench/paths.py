"""Where the repository's files are: the one home of the repository root, of the ``data/`` folder's location and of
the workbench cache (its folder, its atomic writes, the entries a machine's processes share) (ground floor).

``REPO`` is the repository root (the folder holding ``pyproject.toml``, ``notebooks/``, ``suites/``, ``results/``);
every module that needs it imports it from here. ``data_dir()`` is ``$WORKBENCH_DATA`` when set, else the
repository's ``data/`` (prompts' source text, the haystacks, the guard's held-out text, shipped model configs, tasks).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent   # the workbench package's own folder (its sources: a run's code identity)
REPO = PACKAGE.parent


def data_dir() -> Path:
    """The repository's ``data/`` folder (``$WORKBENCH_DATA`` overrides it)."""
    env = os.environ.get("WORKBENCH_DATA")
    return Path(env) if env else REPO / "data"


def cache_root() -> Path:
    """The workbench cache folder: ``$WORKBENCH_CACHE`` or ``~/.cache/workbench``."""
    return Path(os.environ.get("WORKBENCH_CACHE", Path.home() / ".cache" / "workbench"))


def write_cache_text(path: Path, text: str) -> Path:
    """Write a cache file so that a concurrent reader (another process starting at the same moment: a second
    sweep, a Ray worker, a parallel test worker) sees no file or the whole file, never a torn or empty one:
    a unique temporary file beside it, then ``os.replace``. Creates the folder. Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


#: Entries of a machine-shared file (:func:`write_machine_entry`) older than this (seconds) are dropped on a write.
MACHINE_ENTRY_KEEP_S = 3600.0


def machine_id() -> str:
    """This machine as it runs now: its host name and, on Linux, the boot id (a reboot is another machine for a
    measurement shared between processes)."""
    import socket

    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}|{boot}"


def _machine_file(name: str) -> dict:
    try:
        data = json.loads((cache_root() / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_machine_entry(name: str, key: str, max_age_s: float) -> tuple[float, dict] | None:
    """``(age in seconds, entry)`` of ``key`` in the machine-shared file ``$WORKBENCH_CACHE/<name>`` when it was
    written on this machine (:func:`machine_id`) at most ``max_age_s`` ago, else None. The home of a measurement
    that stands for the machine for a while and that the processes of one run share (the drift reference, the
    device probe) instead of each measuring it again."""
    entry = _machine_file(name).get(f"{machine_id()}|{key}")
    try:
        age_s = time.time() - float(entry["measured_at"])
    except (TypeError, KeyError, ValueError):
        return None
    return (age_s, entry) if 0 <= age_s <= max_age_s else None


def write_machine_entry(name: str, key: str, entry: dict) -> None:
    """Put ``entry`` (JSON-able) under ``key`` in the machine-shared file ``name``, stamped ``measured_at`` (now)
    and ``pid``, atomically (:func:`write_cache_text`); entries older than :data:`MACHINE_ENTRY_KEEP_S` are dropped.
    A cache: a file that cannot be written is skipped (the next process measures its own)."""
    now = time.time()
    data = {k: v for k, v in _machine_file(name).items()
            if isinstance(v, dict) and isinstance(v.get("measured_at"), (int, float))
            and now - v["measured_at"] <= MACHINE_ENTRY_KEEP_S}
    data[f"{machine_id()}|{key}"] = {**entry, "measured_at": now, "pid": os.getpid()}
    try:
        write_cache_text(cache_root() / name, json.dumps(data, indent=1))
    except OSError:
        pass
