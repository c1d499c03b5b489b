"""Export a run to the tools the field uses: MLflow, llm-d's Benchmark Report v0.2, ``vllm bench serve`` JSON.

``workbench export RUN --to mlflow|br0.2|vllm-json`` (:func:`export_run`):

- ``mlflow``: one parent run per suite run (the run folder) and one child run per point, as AIPerf logs a
  sweep. A child holds the point's parameters, its numeric columns as metrics (the workbench's names, units in
  the name: ``ttft_s_p50``, ``output_throughput_tps``, ``usd_per_mtok_output``), its validity as tags
  (``valid``, ``invalid_reason``, ``status``); the parent holds the manifest's environment as tags
  (``env.<key>``), ``metrics.json``'s counts as metrics, and the report, figures, ``metrics.json``,
  ``manifest.json`` and the parquet tables as artifacts. The default store is local and works offline: an
  sqlite database ``<results>/mlflow/mlflow.db`` with artifacts under ``<results>/mlflow/artifacts``
  (MLflow 3 keeps its ``./mlruns`` file store in maintenance mode). ``--tracking-uri`` takes a folder (the same
  layout there), an ``sqlite:///`` / ``file:`` / ``http(s)://`` URI. A local store that cannot be written is
  refused before anything is created; a failure part-way deletes the runs it created.
- ``br0.2``: one Benchmark Report v0.2 per point (the format inference-perf emits; schema vendored in
  ``workbench/schemas/``, from llm-d/llm-d-benchmark), each validated with ``jsonschema`` before any is written.
- ``vllm-json``: one file per point with the fields ``vllm bench serve --save-result --save-detailed`` writes
  (``vllm/benchmarks/serve.py``: ``duration``, ``completed``, ``total_input_tokens``, ``request_throughput``,
  ``output_throughput``, ``mean_ttft_ms`` / ``median_ttft_ms`` / ``std_ttft_ms`` / ``p99_ttft_ms`` and the same
  for ``tpot``, ``itl``, ``e2el``, the per-request lists), plus ``workbench_*`` keys for what vLLM has no field
  for (point id, validity, ignore_eos). A percentile the samples cannot support (docs/design.md section 4: p99 needs
  100) is null, with ``workbench_percentile_note`` saying so.

The documents are built in :mod:`workbench.share.export_points` (Benchmark Report v0.2 and ``vllm bench serve``
JSON, one per point) and :mod:`workbench.share.export_mlflow` (the MLflow runs); this module dispatches
(:func:`export_run`), says what an export carries (:func:`describe`) and writes the file exports.

Every export says first what it exports: points finished, valid, invalid and failed, and the run's status when
it is not finished (an interrupted run exports the points on disk). File exports are written into a
temporary folder and moved into place whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from workbench.errors import ParameterError
from workbench.run import results
from workbench.share.export_mlflow import to_mlflow
from workbench.share.export_points import br02_reports, check_run, run_tables, vllm_results

FORMATS = ("mlflow", "br0.2", "vllm-json")


def describe(run_dir) -> list[str]:
    """What an export of the run carries, one line each: the counts, and a warning when the run is unfinished
    or most of its measured points are invalid."""
    run = check_run(run_dir)
    manifest, points, _ = run_tables(run)
    status = str(manifest.get("status"))
    n = len(points)
    ok = points[points["status"] == "ok"] if "status" in points else points
    valid = int(ok["valid"].fillna(True).astype(bool).sum()) if "valid" in ok else len(ok)
    lines = [f"exporting {n} point(s) of {run.name}: {len(ok)} measured ({valid} valid, {len(ok) - valid} invalid), "
             f"{n - len(ok)} failed"]
    if status != "ok":
        lines.append(f"note: the run's status is {status!r}: only the points on disk are exported "
                     f"({'resume it with workbench run --resume ' + str(run) if status in ('running', 'interrupted') else 'failed notebooks have no points'})")
    if len(ok) and (len(ok) - valid) * 2 > len(ok):
        lines.append(f"note: {len(ok) - valid} of {len(ok)} measured points are invalid (other load or drift); "
                     "they are exported with valid=false; re-measure with workbench run --rerun-invalid")
    if n == 0:
        lines.append("note: the run has no points; only its manifest and report are exported")
    return lines


def export_run(run_dir, to: str, tracking_uri: str | None = None, out=None) -> list[str]:
    """Export a run; returns the lines to print (what is exported, then where it went).

    Args:
        run_dir: the run folder.
        to: one of :data:`FORMATS`.
        tracking_uri: MLflow only: a folder or URI (default ``<results>/mlflow``).
        out: br0.2 / vllm-json only: the folder to write (default ``<run>/exports/<format>``).

    Raises:
        ParameterError: unknown format, not a run folder, a tracking URI that cannot be written, an output
            folder that exists and is not empty, a report the BR0.2 schema rejects.
    """
    if to not in FORMATS:
        raise ParameterError(f"--to: unknown format {to!r} (allowed: {', '.join(FORMATS)})")
    if tracking_uri is not None and to != "mlflow":
        raise ParameterError("--tracking-uri: only for --to mlflow")
    run = check_run(run_dir)
    lines = describe(run)
    if to == "mlflow":
        parent, uri = to_mlflow(run, tracking_uri)
        lines.append(f"mlflow: parent run {parent} in {uri}")
    else:
        docs = br02_reports(run) if to == "br0.2" else vllm_results(run)
        folder = write_documents(run, docs, to, out)
        lines.append(f"{to}: {len(docs)} file(s) in {folder}")
    return lines


def _safe_name(point_id: str) -> str:
    digest = hashlib.sha1(point_id.encode("utf-8")).hexdigest()[:8]
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", point_id)[:80].strip("._") or "point"
    return f"{stem}-{digest}"


def write_documents(run: Path, docs: dict[str, dict], fmt: str, out=None) -> Path:
    """Write ``{point_id: document}`` as ``<folder>/<safe point id>.json``, whole or not at all.

    Raises:
        ParameterError: the folder exists and is not empty, or cannot be written.
    """
    folder = Path(out) if out else run / "exports" / fmt
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ParameterError(f"-o: {folder} exists and is not an empty folder (choose another, or remove it)")
    if not out:
        results.check_write_target(folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    except OSError as exc:
        raise ParameterError(f"-o: {folder} cannot be written ({exc.strerror or exc})") from None
    try:
        for pid, doc in docs.items():
            (tmp / f"{_safe_name(pid)}.json").write_text(json.dumps(doc, indent=2, allow_nan=False), encoding="utf-8")
        if folder.exists():
            folder.rmdir()
        os.replace(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder
