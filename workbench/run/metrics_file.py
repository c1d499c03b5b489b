"""``metrics.json`` at a run folder's root: read it, and merge keys into it (the run folder's bookkeeping, below every
writer: the report's summary in :mod:`workbench.share.run_summary`, the twin's errors in
:mod:`workbench.predict.twin_validation`, a user's script).

Values are plain JSON (NaN becomes null). Writes are atomic and serialised by a lock file beside ``metrics.json``,
so two writers never lose each other's keys.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

from workbench.errors import ParameterError
from workbench.run import results

METRICS_FILE = "metrics.json"


def plain(value):
    """``value`` as plain JSON: NaN / inf -> None, numpy scalars -> Python, containers recursively."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@contextlib.contextmanager
def _locked(run: Path):
    """Serialise read-modify-write of ``metrics.json`` between processes (``fcntl.flock``; no-op elsewhere)."""
    lock = run / ".metrics.json.lock"
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    results.check_write_target(lock)
    with open(lock, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_metrics(run_dir) -> dict:
    """The run's ``metrics.json`` as a dict (``{}`` when it has none yet).

    Raises:
        ParameterError: the file exists but is not a JSON object.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ParameterError(f"metrics.json: {path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ParameterError(f"metrics.json: {path} must hold a JSON object")
    return data


def _deep_merge(old: dict, new: dict) -> dict:
    out = dict(old)
    for k, v in new.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def merge_metrics(run_dir, keys: dict, deep: bool = True) -> Path:
    """Add or replace keys of a run's ``metrics.json``, keeping every other key (for any writer: the report,
    the twin's validation, a user's script).

    Args:
        run_dir: the run folder (must hold ``manifest.json``).
        keys: JSON-ready mapping; NaN becomes null. E.g. ``{"mape_e2e_p50": 0.12, "mape_ttft_p50": 0.2}``.
        deep: merge nested dicts key by key (True), or replace each given top-level key whole (False).

    Returns:
        The path of ``metrics.json``.

    Raises:
        ParameterError: not a run folder, ``keys`` not a mapping, or a value JSON cannot hold.
    """
    run = Path(run_dir)
    if not (run / "manifest.json").is_file():
        raise ParameterError(f"run_dir: {str(run)!r} is not a run folder (no manifest.json)")
    if not isinstance(keys, dict):
        raise ParameterError(f"keys: must be a mapping of names to JSON values (got {type(keys).__name__})")
    new = plain(keys)
    try:
        json.dumps(new, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"keys: not JSON-serialisable ({exc})") from None
    path = results.check_write_target(run / METRICS_FILE)
    with _locked(run):
        old = read_metrics(run)
        data = _deep_merge(old, new) if deep else {**old, **new}
        text = json.dumps(data, indent=2, allow_nan=False)
        results.atomic_write(path, lambda f: f.write(text), text=True)
    return path
