"""``metrics.json``: a run's machine-readable summary, so Make, DVC or CI can depend on a run.

Written at the run folder's root (docs/design.md section 10) every time the run's report is built
(:func:`workbench.share.report.build_report` calls :func:`write_metrics`). It holds the headline figures of each
experiment (over its valid points) and every finding, supported or not, with its evidence. Other parts of the
workbench add their own keys with :func:`merge_metrics` (e.g. the twin's ``mape_e2e_p50`` / ``mape_ttft_p50``):
a rebuild of the report replaces only the keys the report owns (:data:`REPORT_KEYS`) and keeps the rest.

Shape (``schema`` ``workbench.stats.metrics/1``)::

    {"schema", "run_id", "status", "created_utc", "built_utc",
     "points": {"total", "ok", "failed", "valid", "invalid"},
     "findings": {"total", "supported"},
     "experiments": {EXP: {"points", "valid_points",
                           "finding": {"text", "supported", "evidence", "points"} | null,
                           "headline": {METRIC: {"best", "best_point_id", "median", "n", "unit",
                                                 "higher_is_better"}}}},
     ...keys merged in by others}

Values are plain JSON (NaN becomes null). Writes are atomic and serialised by a lock file beside
``metrics.json``, so two writers never lose each other's keys.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
from pathlib import Path

import pandas as pd

from workbench.stats import columns, evidence
from workbench.run import results
from workbench.errors import ParameterError

METRICS_FILE = "metrics.json"
SCHEMA = "workbench.stats.metrics/1"
#: The point columns summarised per experiment (those a run has).
HEADLINE_METRICS = ["ttft_s_p50", "ttft_s_p99", "tpot_s_p50", "e2e_s_p50", "output_throughput_tps",
                    "request_throughput_rps", "goodput_rps", "usd_per_mtok_output", "usd_per_mtok_input"]
#: Top-level keys the report writes (replaced whole on every build); any other key is kept.
REPORT_KEYS = ("schema", "run_id", "status", "created_utc", "built_utc", "points", "findings", "experiments",
               "price_per_hour_usd")


def _plain(value):
    """``value`` as plain JSON: NaN / inf -> None, numpy scalars -> Python, containers recursively."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
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
    new = _plain(keys)
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


def _headline(points: pd.DataFrame) -> dict:
    """Per headline metric over usable points: best (by the column table's direction), its point, median, n."""
    out = {}
    for m in HEADLINE_METRICS:
        if m not in points:
            continue
        col = pd.to_numeric(points[m], errors="coerce")
        ok = col.notna()
        if not ok.any():
            continue
        col_def = columns.COLUMNS.get(columns.base_column(m)[0]) or columns.COLUMNS.get(m)
        higher = col_def.higher_is_better if col_def is not None else None
        if higher is None:
            higher = not m.startswith(("ttft", "tpot", "e2e", "itl", "usd"))
        idx = col[ok].idxmax() if higher else col[ok].idxmin()
        out[m] = {"best": float(col[idx]), "best_point_id": str(points.loc[idx].get("point_id", "")),
                  "median": float(col[ok].median()), "n": int(ok.sum()),
                  "unit": col_def.unit if col_def is not None else "", "higher_is_better": bool(higher)}
    return out


def build_metrics(run_dir, points: pd.DataFrame | None = None) -> dict:
    """The report's part of ``metrics.json`` for one run (the keys of :data:`REPORT_KEYS`).

    Args:
        run_dir: the run folder.
        points: the points table to summarise (default: ``points.parquet``; the report passes it with its
            cost columns added).

    Returns:
        The dict described in the module docstring (without keys other writers merged in).
    """
    run = Path(run_dir)
    manifest = results.read_manifest(run)
    pts = results.read_points(run) if points is None else points
    status = pts["status"].astype(str) if "status" in pts else pd.Series(["ok"] * len(pts), index=pts.index)
    ok = pts[status == "ok"]
    valid = ok["valid"].fillna(True).astype(bool) if "valid" in ok else pd.Series(True, index=ok.index)
    findings = manifest.get("findings", {}) or {}
    exps = list(dict.fromkeys(list(manifest.get("experiments", {})) +
                              (list(pts["experiment"].dropna().unique()) if "experiment" in pts else [])))
    experiments = {}
    for exp in exps:
        e_ok = ok[ok["experiment"] == exp] if "experiment" in ok else ok.iloc[0:0]
        e_valid = e_ok[valid.reindex(e_ok.index).fillna(True).astype(bool)]
        f = findings.get(exp)
        finding = None
        if f is not None:
            fd = evidence.Finding.from_value(f)
            finding = {"text": fd.text, "supported": None if isinstance(f, str) else bool(fd.supported),
                       "evidence": fd.evidence, "points": len(fd.point_ids)}
        experiments[exp] = {"points": int((pts["experiment"] == exp).sum()) if "experiment" in pts else 0,
                            "valid_points": int(len(e_valid)), "finding": finding, "headline": _headline(e_valid)}
    for exp, f in findings.items():  # a finding of an experiment with no points (e.g. an analysis notebook)
        if exp not in experiments:
            fd = evidence.Finding.from_value(f)
            experiments[exp] = {"points": 0, "valid_points": 0, "headline": {},
                                "finding": {"text": fd.text, "supported": None if isinstance(f, str)
                                            else bool(fd.supported), "evidence": fd.evidence,
                                            "points": len(fd.point_ids)}}
    marked = [v for v in findings.values() if isinstance(v, dict)]
    out = {"schema": SCHEMA, "run_id": manifest.get("run_id", run.name), "status": manifest.get("status"),
           "created_utc": manifest.get("created_utc"),
           "built_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "points": {"total": int(len(pts)), "ok": int(len(ok)), "failed": int(len(pts) - len(ok)),
                      "valid": int(valid.sum()), "invalid": int((~valid).sum())},
           "findings": {"total": len(findings), "supported": sum(bool(v.get("supported")) for v in marked)},
           "experiments": experiments}
    if manifest.get("price_per_hour_usd") is not None:
        out["price_per_hour_usd"] = manifest["price_per_hour_usd"]
    return _plain(out)


def write_metrics(run_dir, points: pd.DataFrame | None = None) -> Path:
    """Write (or refresh) the run's ``metrics.json``: the report's keys replaced, other writers' keys kept.

    Returns:
        The path of ``metrics.json``.
    """
    return merge_metrics(run_dir, build_metrics(run_dir, points), deep=False)
