"""``metrics.json``: a run's machine-readable summary, so Make, DVC or CI can depend on a run.

Written at the run folder's root (docs/design.md section 10) every time the run's report is built
(:func:`workbench.share.report.build_report` calls :func:`write_metrics`). It holds the headline figures of each
experiment (over its valid points) and every finding, supported or not, with its evidence. Other parts of the
workbench add their own keys with :func:`~workbench.run.metrics_file.merge_metrics` (e.g. the twin's
``mape_e2e_p50`` / ``mape_ttft_p50``):
a rebuild of the report replaces only the keys the report owns (:data:`REPORT_KEYS`) and keeps the rest.

Shape (``schema`` ``workbench.stats.metrics/1``)::

    {"schema", "run_id", "status", "created_utc", "built_utc",
     "points": {"total", "ok", "failed", "valid", "invalid"},
     "findings": {"total", "supported", "decided", "direction", "equivalent", "undecided", "measurements"},
     "experiments": {EXP: {"points", "valid_points",
                           "finding": {"text", "supported", "evidence", "points", "verdict", "margin",
                                       "rounds", "seconds", "rounds_needed", "seconds_needed"} | null,
                           "headline": {METRIC: {"best", "best_point_id", "median", "n", "unit",
                                                 "higher_is_better"}}}},
     ...keys merged in by others}

Values are plain JSON (NaN becomes null). Writes are atomic and serialised by a lock file beside
``metrics.json``, so two writers never lose each other's keys.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import pandas as pd

from workbench.run import results
from workbench.run.metrics_file import METRICS_FILE, merge_metrics, plain, read_metrics  # noqa: F401
from workbench.stats import columns, evidence

SCHEMA = "workbench.stats.metrics/1"
#: The point columns summarised per experiment (those a run has).
HEADLINE_METRICS = ["ttft_s_p50", "ttft_s_p99", "tpot_s_p50", "e2e_s_p50", "output_throughput_tps",
                    "request_throughput_rps", "goodput_rps", "usd_per_mtok_output", "usd_per_mtok_input"]
#: Top-level keys the report writes (replaced whole on every build); any other key is kept.
REPORT_KEYS = ("schema", "run_id", "status", "created_utc", "built_utc", "points", "findings", "experiments",
               "price_per_hour_usd")


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
                       "evidence": fd.evidence, "points": len(fd.point_ids),
                       **{k: v for k, v in fd.to_dict().items() if k not in ("text", "evidence", "supported",
                                                                             "point_ids")}}
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
           "findings": {"total": len(findings), "supported": sum(bool(v.get("supported")) for v in marked),
                        **evidence.verdict_counts(marked)},
           "experiments": experiments}
    if manifest.get("price_per_hour_usd") is not None:
        out["price_per_hour_usd"] = manifest["price_per_hour_usd"]
    return plain(out)


def write_metrics(run_dir, points: pd.DataFrame | None = None) -> Path:
    """Write (or refresh) the run's ``metrics.json``: the report's keys replaced, other writers' keys kept.

    Returns:
        The path of ``metrics.json``.
    """
    return merge_metrics(run_dir, build_metrics(run_dir, points), deep=False)
