"""A run's data for people outside Python, as the report writes it beside its page: ``requests.csv`` (every request
row; list and dict cells as JSON, text a spreadsheet would run as a formula neutralised) and ``points.json`` (the
manifest's environment and experiments with the point rows) by :func:`export`, and the atomic CSV and text writers
the report's pages and a comparison's combined export use.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from workbench.run import results


def _flat(v):
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, default=str)
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        return json.dumps(v.tolist(), default=str)
    return v


#: First characters that make a spreadsheet read a cell as a formula (OWASP "CSV injection").
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _neutralise(v):
    """A text cell a spreadsheet would run as a formula gets a leading ``'`` (shown as text, not run)."""
    if isinstance(v, str) and v.startswith(_FORMULA_START):
        return "'" + v
    return v


def _csv_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` ready for CSV: list / dict cells as JSON, formula-like text cells neutralised."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object or pd.api.types.is_string_dtype(out[col]):
            out[col] = out[col].map(_flat).map(_neutralise)
    out.columns = [_neutralise(str(c)) for c in out.columns]
    return out


def write_csv(path: Path, df: pd.DataFrame) -> Path:
    return results.atomic_write(path, lambda f: _csv_frame(df).to_csv(f, index=False), text=True)


def write_text(path: Path, text: str) -> Path:
    return results.atomic_write(path, lambda f: f.write(text), text=True)


def export(run_dir, out_dir=None) -> dict[str, Path]:
    """Export one run for people outside Python: ``requests.csv`` and ``points.json``.

    ``requests.csv``: every ``requests.parquet`` row; list columns (``itl_s``) as JSON arrays.
    ``points.json``: ``{"run_id", "created_utc", "status", "environment", "experiments",
    "points": [point rows]}`` (NaN as null).

    Args:
        run_dir: the run folder.
        out_dir: where to write (default: the run folder, next to ``report.html``).

    Returns:
        ``{"requests_csv": path, "points_json": path}``.
    """
    run = Path(run_dir)
    out = Path(out_dir) if out_dir else run
    out.mkdir(parents=True, exist_ok=True)
    manifest = results.read_manifest(run)
    req = results.read_requests(run)
    pts = results.read_points(run)
    paths = {"requests_csv": out / "requests.csv", "points_json": out / "points.json"}
    write_csv(paths["requests_csv"], req)
    summary = {k: manifest.get(k) for k in ("run_id", "created_utc", "status", "environment", "sessions",
                                            "experiments")}
    summary["points"] = json.loads(pts.to_json(orient="records", default_handler=str)) if not pts.empty else []
    write_text(paths["points_json"], json.dumps(summary, indent=2, default=str))
    return paths

