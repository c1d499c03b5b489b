"""A run logged to MLflow (``workbench export RUN --to mlflow``, :mod:`workbench.share.export`).

One parent run per suite run (the run folder) and one child run per point, as AIPerf logs a sweep
(:func:`to_mlflow`). A child holds the point's parameters (:data:`PARAM_COLUMNS`, or those the manifest recorded),
its numeric columns as metrics, its validity as tags; the parent holds the manifest's environment as tags,
``metrics.json``'s counts as metrics, and the report, figures and tables as artifacts. The default store is local
and works offline (:func:`resolve_tracking_uri`); a failure part-way deletes the runs it created.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import checks
from workbench.errors import ParameterError
from workbench.run import results
from workbench.share.export_points import check_run, run_tables

#: Point columns that are parameters of the point (logged as MLflow params), when present.
PARAM_COLUMNS = ("experiment", "model", "device", "device_name", "dtype", "batch_size", "prompt_tokens",
                 "context_tokens", "max_new_tokens", "ignore_eos", "temperature", "top_p", "reasoning_budget",
                 "compression", "compression_ratio", "engine", "policy", "arrival", "rate_rps", "concurrency")

_num = checks.finite_or_none  # a finite float, or None (the one home: workbench.checks)


def _local_store(path: Path) -> tuple[str, str]:
    """``(tracking URI, artifact location)`` of a local store in folder ``path``, after checking it is writable.

    Raises:
        ParameterError: the folder cannot be created or written.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-", delete=True)
        probe.close()
    except OSError as exc:
        raise ParameterError(f"--tracking-uri: {path} cannot be written ({exc.strerror or exc})") from None
    return f"sqlite:///{path.resolve() / 'mlflow.db'}", (path.resolve() / "artifacts").as_uri()


def resolve_tracking_uri(uri: str | None) -> tuple[str, str | None]:
    """The tracking URI and artifact location an export uses (see the module docstring).

    Raises:
        ParameterError: a local store that cannot be written.
    """
    if not uri:
        return _local_store(results.results_root() / "mlflow")
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        folder, _ = _local_store(db.parent)
        return uri, (db.parent.resolve() / "artifacts").as_uri()
    if uri.startswith("file:"):
        from urllib.parse import urlparse

        _local_store(Path(urlparse(uri).path))
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")   # MLflow 3: the file store is opt-in
        return uri, None
    if re.match(r"^[a-z][a-z0-9+.-]*://", uri):
        return uri, None  # a server (http, https, databricks...): checked by MLflow itself
    return _local_store(Path(uri))


def _metric_name(col: str) -> str:
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", col)[:250]


def _child_payload(point: pd.Series, manifest: dict):
    """``(params, metrics, tags)`` of one point's child run."""
    pid = str(point["point_id"])
    recorded = (manifest.get("points", {}).get(pid, {}) or {}).get("params") or {}
    params = {str(k): v for k, v in recorded.items()}
    for col in PARAM_COLUMNS:
        if col in point.index and col not in params and point[col] is not None and not (
                isinstance(point[col], float) and math.isnan(point[col])):
            params[col] = point[col]
    params = {k: (json.dumps(v, default=str) if isinstance(v, (list, dict)) else str(v))[:6000]
              for k, v in params.items()}
    metrics = {}
    for col, v in point.items():
        if col in params or isinstance(v, (bool, np.bool_)) or col in ("valid",):
            continue
        f = _num(v) if isinstance(v, (int, float, np.integer, np.floating)) else None
        if f is not None:
            metrics[_metric_name(col)] = f
    valid = point.get("valid")
    tags = {"workbench.point_id": pid[:5000], "workbench.experiment": str(point.get("experiment")),
            "status": str(point.get("status", "ok")),
            "valid": "unknown" if valid is None or pd.isna(valid) else str(bool(valid)).lower(),
            "invalid_reason": str(point.get("invalid_reason") or "")[:5000]}
    return params, metrics, tags


def to_mlflow(run_dir, tracking_uri: str | None = None, experiment: str = "workbench") -> tuple[str, str]:
    """Log a run to MLflow: a parent run and a child per point (see the module docstring).

    Returns:
        ``(parent run id, tracking URI)``.

    Raises:
        ParameterError: a tracking URI that cannot be written, or MLflow failing part-way (the runs it had
            created are deleted first).
    """
    run = check_run(run_dir)
    uri, artifacts = resolve_tracking_uri(tracking_uri)
    from workbench.share import run_summary

    try:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise ParameterError("--to mlflow: mlflow is not installed (pip install mlflow-skinny)") from None
    manifest, points, _ = run_tables(run)
    summary = run_summary.read_metrics(run) or run_summary.build_metrics(run, points)
    created: list[str] = []
    client = None
    try:
        import logging

        logging.getLogger("mlflow").setLevel(logging.WARNING)
        logging.getLogger("alembic").setLevel(logging.WARNING)
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp else client.create_experiment(experiment, artifact_location=artifacts)
        env = manifest.get("environment", {}) or {}
        tags = {f"env.{k}": (json.dumps(v, default=str) if isinstance(v, (list, dict)) else str(v))[:5000]
                for k, v in env.items()}
        tags.update({"workbench.run_id": run.name, "workbench.status": str(manifest.get("status")),
                     "workbench.suite": str(manifest.get("suite") or "")})
        parent = client.create_run(exp_id, run_name=run.name, tags=tags)
        pid_parent = parent.info.run_id
        created.append(pid_parent)
        now = int(_dt.datetime.now().timestamp() * 1000)
        counts = {f"points_{k}": float(v) for k, v in (summary.get("points") or {}).items()}
        counts.update({f"findings_{k}": float(v) for k, v in (summary.get("findings") or {}).items()})
        client.log_batch(pid_parent, metrics=[Metric(k, v, now, 0) for k, v in counts.items()])
        if manifest.get("price_per_hour_usd") is not None:
            client.log_param(pid_parent, "price_per_hour_usd", manifest["price_per_hour_usd"])
        for _, p in points.iterrows():
            params, mets, ctags = _child_payload(p, manifest)
            ctags["mlflow.parentRunId"] = pid_parent
            child = client.create_run(exp_id, run_name=str(p["point_id"])[:250], tags=ctags)
            created.append(child.info.run_id)
            items = [Param(k, v) for k, v in params.items()]
            mlist = [Metric(k, v, now, 0) for k, v in mets.items()]
            for i in range(0, max(len(items), len(mlist), 1), 100):
                client.log_batch(child.info.run_id, metrics=mlist[i:i + 100], params=items[i:i + 100])
            client.set_terminated(child.info.run_id, "FINISHED" if p.get("status", "ok") == "ok" else "FAILED")
        for name, sub in (("report.html", "report"), ("metrics.json", ""), ("manifest.json", ""),
                          ("points.parquet", "tables"), ("requests.parquet", "tables")):
            if (run / name).is_file():
                client.log_artifact(pid_parent, str(run / name), sub or None)
        figs = run / "figures"
        if figs.is_dir():
            for f in sorted(figs.iterdir()):
                if f.is_file() and f.suffix in (".png", ".svg", ".pdf", ".html", ".js"):
                    client.log_artifact(pid_parent, str(f), "figures")
        status = "FINISHED" if manifest.get("status") == "ok" else "KILLED"
        client.set_terminated(pid_parent, status)
    except ParameterError:
        raise
    except Exception as exc:  # noqa: BLE001 - MLflow's errors (store, network) become one line, runs rolled back
        for rid in reversed(created):
            try:
                client.delete_run(rid)
            except Exception:  # noqa: BLE001 - best effort
                pass
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ParameterError(f"--tracking-uri: MLflow export to {uri} failed ({type(exc).__name__}: {first}); "
                             "the runs it had created were deleted") from None
    return pid_parent, uri
