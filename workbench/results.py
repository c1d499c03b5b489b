"""Run folders: what ran, where, with which code, and what came out.

Layout (DESIGN.md section 5)::

    results/<run_id>/
      manifest.json      experiment parameters, environment, status of each point
      requests.parquet   one row per request (tidy; ``itl_s`` is a list column)
      points.parquet     one row per sweep point (aggregates, ``status``)
      notebooks/*.ipynb  executed notebooks
      figures/*.json     plotly figures (the report reads these)
      figures/*.html     the same figures, each a page (sharing figures/plotly.min.js; offline)
      report.html        everything, one file

``run_id`` is a UTC timestamp plus a random suffix (and an optional label), so
ids sort by time and never collide; a run never overwrites another. Rows are
rewritten atomically (temporary file + rename) after every point, so an
interrupted run keeps every finished point. Run folders are created only under
the results root (``$WORKBENCH_RESULTS``, else ``results/`` of the repository).
"""

from __future__ import annotations

import datetime as _dt
import glob as _glob
import json
import os
import re
import secrets
import subprocess
from pathlib import Path

import pandas as pd

from .errors import ParameterError

_REPO = Path(__file__).resolve().parents[1]
_LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def results_root() -> Path:
    """``$WORKBENCH_RESULTS`` if set, else ``<repo>/results`` (or ``./results`` outside the repo)."""
    env = os.environ.get("WORKBENCH_RESULTS")
    if env:
        return Path(env).expanduser().resolve()
    if (_REPO / "pyproject.toml").exists():
        return _REPO / "results"
    return Path.cwd() / "results"


def new_run_id(label: str = "") -> str:
    """``YYYYmmddTHHMMSSZ-xxxxxx[-label]``; the label may hold letters, digits, ``_.-`` only.

    Raises:
        ParameterError: a label with ``/``, ``..`` or other characters.
    """
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    rid = f"{stamp}-{secrets.token_hex(3)}"
    if label:
        if not _LABEL_RE.match(label) or ".." in label:
            raise ParameterError(f"label: must match [A-Za-z0-9][A-Za-z0-9_.-]* without '..' (got {label!r})")
        rid += f"-{label}"
    return rid


def _inside_root(path: Path) -> Path:
    root = results_root()
    resolved = path.expanduser().resolve()
    if resolved != root and root not in resolved.parents:
        raise ParameterError(f"run_dir: must be inside the results folder {root} (got {str(path)!r})")
    return resolved


def create_run(label: str = "") -> Path:
    """Create a new, empty run folder under the results root and return it."""
    run = results_root() / new_run_id(label)
    run.mkdir(parents=True, exist_ok=False)
    _write_json(run / "manifest.json", _new_manifest(run.name))
    return run


def open_run(run_dir: str | os.PathLike = "", label: str = "") -> Path:
    """An existing run folder (created if it is a new name under the results root), or a new run when empty.

    Raises:
        ParameterError: ``run_dir`` outside the results root.
    """
    if not str(run_dir):
        return create_run(label)
    run = _inside_root(Path(run_dir))
    run.mkdir(parents=True, exist_ok=True)
    if not (run / "manifest.json").exists():
        _write_json(run / "manifest.json", _new_manifest(run.name))
    return run


def _new_manifest(run_id: str) -> dict:
    return {
        "run_id": run_id,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "status": "running",
        "experiments": {},
        "environment": {},
        "points": {},
    }


def _write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_json_default))
    tmp.replace(path)


def _json_default(obj):
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def read_manifest(run_dir) -> dict:
    """The run's ``manifest.json`` as a dict."""
    return json.loads((Path(run_dir) / "manifest.json").read_text())


def update_manifest(run_dir, **changes) -> dict:
    """Merge top-level keys into the manifest (dict values are merged one level deep)."""
    manifest = read_manifest(run_dir)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(manifest.get(key), dict):
            manifest[key].update(value)
        else:
            manifest[key] = value
    _write_json(Path(run_dir) / "manifest.json", manifest)
    return manifest


def git_commit() -> str | None:
    """The workbench's git commit (with ``-dirty`` when the tree has changes), or None outside git."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=_REPO, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=_REPO, capture_output=True, text=True,
            timeout=5,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except Exception:
        return None


def environment(info=None, seed: int | None = None, probe: bool = True) -> dict:
    """What a run ran on: versions, threads, git commit, device and its probed bandwidth / FLOP/s.

    Args:
        info: :class:`workbench.models.ModelInfo` of the loaded model, or None.
        seed: the run's base seed.
        probe: run :func:`workbench.metrics.probe_device` (1-2 s, cached per process).
    """
    import platform

    import torch
    import transformers

    from . import __version__, metrics

    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "workbench": __version__,
        "git_commit": git_commit(),
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "cpu_count": os.cpu_count(),
        "seed": seed,
    }
    if info is not None:
        env.update(
            model=info.name,
            model_path=info.path,
            model_sha256=info.weights_sha256,
            num_params=info.num_params,
            weight_bytes=info.weight_bytes,
            dtype=info.dtype,
            device=info.device,
            device_name=info.device_name,
        )
        if probe:
            dev = "cuda" if info.device.startswith("cuda") else info.device
            p = metrics.probe_device(dev, info.dtype)
            env.update(bandwidth_bytes_per_s=p["bandwidth_bytes_per_s"], flops_per_s=p["flops_per_s"])
    return env


def _rewrite_rows(path: Path, new: pd.DataFrame, point_id: str) -> None:
    """Replace the rows of ``point_id`` in a parquet file by ``new`` (atomic rename)."""
    frames = []
    if path.exists():
        old = pd.read_parquet(path)
        if "point_id" in old:
            frames.append(old[old["point_id"] != point_id])
    if not new.empty:
        frames.append(new)
    frames = [f for f in frames if not f.empty]
    if not frames and not path.exists():
        return
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({"point_id": pd.Series(dtype=str)})
    tmp = path.with_name(path.name + ".tmp")
    df.to_parquet(tmp, index=False)
    tmp.replace(path)


def record_point(run_dir, point_id: str, requests: pd.DataFrame, point: dict, meta: dict) -> None:
    """Write one finished (or failed) point: its request rows, its point row, its manifest entry.

    A rerun of the same ``point_id`` replaces the old rows, so a resumed run has no duplicates.
    """
    run = Path(run_dir)
    _rewrite_rows(run / "requests.parquet", requests, point_id)
    _rewrite_rows(run / "points.parquet", pd.DataFrame([point]), point_id)
    manifest = read_manifest(run)
    manifest["points"][point_id] = meta
    _write_json(run / "manifest.json", manifest)


def finished_points(run_dir) -> set[str]:
    """Point ids recorded with status ``ok`` (what ``--resume`` skips)."""
    try:
        points = read_manifest(run_dir)["points"]
    except FileNotFoundError:
        return set()
    return {pid for pid, meta in points.items() if meta.get("status") == "ok"}


def _read(run_dir, name: str, experiment: str | None) -> pd.DataFrame:
    path = Path(run_dir) / name
    if not path.exists():
        return pd.DataFrame()
    df = pd.read_parquet(path)
    if experiment is not None and "experiment" in df:
        df = df[df["experiment"] == experiment].reset_index(drop=True)
    return df


def read_requests(run_dir, experiment: str | None = None) -> pd.DataFrame:
    """``requests.parquet`` of one run (optionally one experiment); empty DataFrame when absent."""
    return _read(run_dir, "requests.parquet", experiment)


def read_points(run_dir, experiment: str | None = None) -> pd.DataFrame:
    """``points.parquet`` of one run (optionally one experiment); empty DataFrame when absent."""
    return _read(run_dir, "points.parquet", experiment)


def _expand(paths) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[Path] = []
    for p in paths:
        matches = sorted(_glob.glob(str(p))) or [str(p)]
        out.extend(Path(m) for m in matches)
    return out


def load(paths, table: str = "requests") -> pd.DataFrame:
    """Read one or many runs back as one DataFrame.

    Args:
        paths: a run folder, a parquet file, a glob (``results/2026*``) or a list of them.
        table: ``requests`` or ``points`` (used for folders).

    Returns:
        The rows of every run concatenated; each row keeps its ``run_id``.

    Raises:
        ParameterError: a path that is neither a run folder nor a parquet file.
    """
    if table not in ("requests", "points"):
        raise ParameterError(f"table: must be 'requests' or 'points' (got {table!r})")
    frames = []
    for p in _expand(paths):
        f = p / f"{table}.parquet" if p.is_dir() else p
        if not f.exists() or f.suffix != ".parquet":
            raise ParameterError(f"paths: {str(p)!r} is not a run folder with {table}.parquet nor a parquet file")
        df = pd.read_parquet(f)
        if "run_id" not in df:
            df.insert(0, "run_id", (p if p.is_dir() else p.parent).name)
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def save_figure(run_dir, name: str, fig) -> Path:
    """Save a plotly figure as ``figures/<name>.json`` (for the report) and an offline ``.html`` page.

    Figures appear in the report in the order they were first saved.

    Raises:
        ParameterError: a name with characters other than letters, digits, ``_.-``.
    """
    if not _LABEL_RE.match(name) or ".." in name:
        raise ParameterError(f"figure name: must match [A-Za-z0-9][A-Za-z0-9_.-]* (got {name!r})")
    figs = Path(run_dir) / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    (figs / f"{name}.json").write_text(fig.to_json())
    # plotly.js is written once per run as figures/plotly.min.js (a run has dozens of figures; embedding
    # the 4.7 MB library in each would make a run folder ~150 MB). The report embeds it once instead.
    fig.write_html(figs / f"{name}.html", include_plotlyjs="directory", full_html=True)
    manifest = read_manifest(run_dir)
    order = manifest.setdefault("figures", [])
    if name not in order:
        order.append(name)
        _write_json(Path(run_dir) / "manifest.json", manifest)
    return figs / f"{name}.json"


def save_text(run_dir, relpath: str, text: str) -> Path:
    """Write a text artifact (e.g. generated answers) at ``<run_dir>/<relpath>``, inside the run folder.

    Raises:
        ParameterError: ``relpath`` absolute or escaping the run folder.
    """
    run = Path(run_dir).resolve()
    target = (run / relpath).resolve()
    if Path(relpath).is_absolute() or run not in target.parents:
        raise ParameterError(f"relpath: must stay inside the run folder (got {relpath!r})")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return target
