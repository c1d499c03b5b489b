"""Run folders: what ran, where, with which code, and what came out.

Layout (docs/design.md section 5)::

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

import contextlib
import datetime as _dt
import errno as _errno
import glob as _glob
import json
import os
import re
import secrets
import socket
from pathlib import Path

import pandas as pd

from workbench.errors import ParameterError
from workbench.measure import device
from workbench.paths import REPO
from workbench.run.locks import check_writer
from workbench.stats import columns

_LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def results_root() -> Path:
    """``$WORKBENCH_RESULTS`` if set, else ``<repo>/results`` (or ``./results`` outside the repo), resolved.

    Resolved once, the same way everywhere: symlinks followed and a relative ``$WORKBENCH_RESULTS`` made
    absolute against the current folder, then written back to ``$WORKBENCH_RESULTS``, so the kernels a
    command starts (whose working folder is the notebook's) see the very same folder.
    """
    env = os.environ.get("WORKBENCH_RESULTS")
    if env:
        root = Path(env).expanduser().resolve()
    elif (REPO / "pyproject.toml").exists():
        return (REPO / "results").resolve()
    else:
        root = (Path.cwd() / "results").resolve()
    if env != str(root):
        os.environ["WORKBENCH_RESULTS"] = str(root)
    return root


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


def inside_root(path: Path) -> Path:
    """``path`` resolved, when it lies inside the results root (where run folders live).

    Raises:
        ParameterError: outside it (one line, naming ``run_dir``).
    """
    root = results_root()
    resolved = path.expanduser().resolve()
    if resolved != root and root not in resolved.parents:
        raise ParameterError(f"run_dir: must be inside the results folder {root} (got {str(path)!r})")
    return resolved


def writable_run(run_dir, must_exist: bool = True) -> Path:
    """``run_dir`` resolved, when this process may write into it as a run: inside the results root and not the
    root itself (whose ``manifest.json`` and tables would belong to no run, beside every run), existing (unless
    ``must_exist`` is False), and no other live process holding its lock. The one check every writer into a run
    folder passes (:func:`open_run`, ``workbench simulate --out`` and ``--validate``).

    Raises:
        ParameterError: one line naming ``run_dir``; :class:`~workbench.run.locks.RunLockedError` (a
            ParameterError) naming the lock's owner.
    """
    run = inside_root(Path(run_dir))
    if run == results_root():
        raise ParameterError(f"run_dir: {str(run_dir)!r} is the results folder itself, not a run; name a run "
                             "folder inside it")
    if must_exist and not run.is_dir():
        raise ParameterError(f"run_dir: {str(run_dir)!r} is not a run folder")
    check_writer(run)
    return run


def create_run(label: str = "") -> Path:
    """Create a new, empty run folder under the results root and return it."""
    run = results_root() / new_run_id(label)
    run.mkdir(parents=True, exist_ok=False)
    _write_json(run / "manifest.json", _new_manifest(run.name))
    return run


def open_run(run_dir: str | os.PathLike = "", label: str = "") -> Path:
    """An existing run folder (created if it is a new name under the results root), or a new run when empty.

    Raises:
        ParameterError: ``run_dir`` outside the results root, or the results root itself; another live process
            writes it (:class:`~workbench.run.locks.RunLockedError`).
    """
    if not str(run_dir):
        return create_run(label)
    run = writable_run(run_dir, must_exist=False)
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
    text = json.dumps(data, indent=2, default=_json_default)
    atomic_write(path, lambda f: f.write(text), text=True)


# ----------------------------------------------------------------------------- safe writes


class RunWriteError(OSError):
    """A write into a run folder failed (disk full, no permission); the message names the path.

    The file being written keeps its previous content; the run stays resumable.
    """


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def check_write_target(path) -> Path:
    """Refuse a write that a symlink would carry out of the results folder.

    A path that lies (as written) inside the results root must still lie inside it once its folder's
    symlinks are resolved. Paths outside the results root (a report's ``-o``) are the user's choice.

    Raises:
        ParameterError: the path's folder resolves outside the results root.
    """
    path = Path(os.path.abspath(Path(path).expanduser()))
    root = results_root()
    if _inside(path, root) and not _inside(path.parent.resolve(), root):
        raise ParameterError(f"{path}: its folder is a symlink out of the results folder {root}; refusing to write")
    return path


_INJECTED_WRITES: dict[str, int] = {}


def _inject_write_error(path: Path) -> None:
    """Test hook: ``WORKBENCH_INJECT_WRITE_ERROR=NAME[:N]`` fails the N-th (default first) write of a file
    called NAME in this process with ``ENOSPC``, after the temporary file is written and before the rename."""
    spec = os.environ.get("WORKBENCH_INJECT_WRITE_ERROR")
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if path.name != name:
        return
    _INJECTED_WRITES[name] = _INJECTED_WRITES.get(name, 0) + 1
    if _INJECTED_WRITES[name] == int(nth or 1):
        raise OSError(_errno.ENOSPC, os.strerror(_errno.ENOSPC), str(path))


def atomic_write(path, write, text: bool = False) -> Path:
    """Write ``path`` atomically: ``write(file)`` into a unique temporary file beside it, flush, fsync,
    then ``os.replace`` over ``path``. A reader (or a process killed mid-write) sees the old file or the
    new one, never a torn one; a symlink at ``path`` is replaced, never followed.

    Args:
        path: the file to write.
        write: ``write(file_object)``; the file is opened ``"x"`` (text, UTF-8) or ``"xb"``.
        text: open in text mode.

    Raises:
        RunWriteError: the write failed (disk full, ...); the message names ``path``; the old file is kept.
        ParameterError: the folder resolves outside the results root (:func:`check_write_target`).
    """
    path = check_write_target(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "x" if text else "xb", **({"encoding": "utf-8"} if text else {})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        _inject_write_error(path)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError) and not isinstance(exc, RunWriteError):
            err = RunWriteError(f"cannot write {path}: {exc.strerror or exc}")
            err.errno = exc.errno
            raise err from exc
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a power cut once the folder is synced
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return path


def write_table(path, df: pd.DataFrame) -> Path:
    """``df`` as a Parquet file at ``path``, atomically (:func:`atomic_write`)."""
    return atomic_write(path, lambda f: df.to_parquet(f, index=False))


# ----------------------------------------------------------------------------- sessions and the manifest


def begin_session(run_dir, resume: bool = False) -> dict:
    """Append this command's session (time, pid, host, commit, arguments) to the manifest's ``sessions``.

    Each resume adds one; :func:`update_manifest` keeps every session's ``environment`` in its session
    and the run's top-level ``environment`` stays the first session's.
    """
    import sys

    from workbench.checks import mask_argv

    check_writer(run_dir)
    session = {"started_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               "pid": os.getpid(), "host": socket.gethostname(), "git_commit": device.git_commit(),
               "argv": mask_argv(sys.argv[1:]), "resume": bool(resume)}   # secrets masked (--api-key X, ...)
    manifest = read_manifest(run_dir)
    manifest.setdefault("sessions", []).append(session)
    _write_json(Path(run_dir) / "manifest.json", manifest)
    return session


def _json_default(obj):
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def read_manifest(run_dir) -> dict:
    """The run's ``manifest.json`` as a dict.

    Raises:
        FileNotFoundError: no manifest.
        ParameterError: a manifest that is not valid JSON (a damaged run folder), naming its path.
    """
    path = Path(run_dir) / "manifest.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ParameterError(f"run_dir: {path} is not a valid manifest ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ParameterError(f"run_dir: {path} is not a valid manifest (not a JSON object)")
    return data


def update_manifest(run_dir, **changes) -> dict:
    """Merge top-level keys into the manifest (dict values are merged one level deep).

    ``environment`` is kept per session (:func:`begin_session`): it goes into the latest session, and
    the top-level ``environment`` is only filled by the first session, so a resume on another machine
    or commit never overwrites what the first points were measured on.
    """
    check_writer(run_dir)
    manifest = read_manifest(run_dir)
    for key, value in changes.items():
        sessions = manifest.get("sessions") or []
        if key == "environment" and isinstance(value, dict) and sessions:
            sessions[-1].setdefault("environment", {}).update(value)
            if len(sessions) > 1 and manifest.get("environment"):
                continue
        if isinstance(value, dict) and isinstance(manifest.get(key), dict):
            manifest[key].update(value)
        else:
            manifest[key] = value
    _write_json(Path(run_dir) / "manifest.json", manifest)
    return manifest


def environment(info=None, seed: int | None = None, probe: bool | str | Path = True) -> dict:
    """What a run ran on (:func:`workbench.measure.device.facts`), reusing the run's own probe where it has one.

    Args:
        info: :class:`workbench.measure.models.ModelInfo` of the loaded model, or None.
        seed: the run's base seed.
        probe: run :func:`workbench.measure.device.probe_device` (seconds, cached per process); a run folder: reuse the
            probe its current session already recorded for the same device and dtype (the notebooks of one
            ``workbench run`` share one probe), else probe.
    """
    prior = _session_probe(probe, info) if isinstance(probe, (str, Path)) and info is not None else None
    return device.facts(info, seed, probe=bool(probe), prior=prior)


def _session_probe(run_dir, info) -> dict | None:
    """The probe figures the run's current session recorded for ``info``'s device and dtype, or None."""
    try:
        sessions = read_manifest(run_dir).get("sessions") or []
    except (FileNotFoundError, ParameterError):
        return None
    env = (sessions[-1] if sessions else {}).get("environment") or {}
    if env.get("device") != info.device or env.get("dtype") != info.dtype or not env.get("bandwidth_bytes_per_s"):
        return None
    return {k: env[k] for k in device.PROBE_KEYS if k in env}


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
    write_table(path, df)


def record_point(run_dir, point_id: str, requests: pd.DataFrame, point: dict, meta: dict) -> None:
    """Write one finished (or failed) point: its request rows, its point row, its manifest entry.

    A rerun of the same ``point_id`` replaces the old rows, so a resumed run has no duplicates. The
    manifest entry (what ``--resume`` skips) is written last, so a point cut short by a kill or a failed
    write (:class:`RunWriteError`) is measured again on resume and replaces its partial rows.
    """
    run = Path(run_dir)
    check_writer(run)
    columns.check_registered([*requests.columns, *point], f"point {point_id}")
    _rewrite_rows(run / "requests.parquet", requests, point_id)
    _rewrite_rows(run / "points.parquet", pd.DataFrame([point]), point_id)
    manifest = read_manifest(run)
    manifest["points"][point_id] = meta
    _write_json(run / "manifest.json", manifest)


def safe_name(name) -> bool:
    """``name`` may become a file name inside a run folder (a figure, an experiment's residuals): it matches
    ``[A-Za-z0-9][A-Za-z0-9_.-]*`` without ``..``. The report reads no path built from any other manifest value."""
    return isinstance(name, str) and bool(_LABEL_RE.match(name)) and ".." not in name


def finished_points(run_dir) -> set[str]:
    """Point ids recorded with status ``ok`` (what ``--resume`` skips).

    With ``WORKBENCH_RERUN_INVALID=1`` in the environment (``workbench run --rerun-invalid RUN_DIR`` sets
    it for the kernels it starts), points marked invalid, and the points of a comparison whose A/A control
    moved (:func:`aa_moved_points`), are not counted as finished, so a resume re-measures exactly those.
    """
    try:
        points = read_manifest(run_dir)["points"]
    except FileNotFoundError:
        return set()
    rerun_invalid = os.environ.get("WORKBENCH_RERUN_INVALID") == "1"
    moved = set(aa_moved_points(run_dir)) if rerun_invalid else set()
    return {pid for pid, meta in points.items()
            if meta.get("status") == "ok" and not (rerun_invalid and meta.get("valid") is False) and pid not in moved}


def save_finding(run_dir, experiment: str, finding) -> None:
    """Record an experiment's headline result for the report's findings section.

    Args:
        run_dir: the run folder.
        experiment: the experiment's name.
        finding: a :class:`workbench.stats.evidence.Finding` (text, evidence, supported, point ids), stored as its
            dict; or a plain sentence (stored as a string, as old manifests hold it: the report reads both).
    """
    from workbench.stats.evidence import Finding

    value = finding.to_dict() if isinstance(finding, Finding) else str(finding)
    update_manifest(run_dir, findings={experiment: value})


def invalid_points(run_dir) -> dict[str, str]:
    """``{point_id: invalid_reason}`` of the run's points marked invalid."""
    pts = read_points(run_dir)
    if pts.empty or "valid" not in pts:
        return {}
    bad = pts[pts["valid"].eq(False)]
    return dict(zip(bad["point_id"], bad["invalid_reason"].fillna("")))


def aa_moved_points(run_dir) -> dict[str, str]:
    """``{point_id: reason}`` of the points whose comparison's A/A control moved (its ratio interval excludes 1,
    :func:`workbench.stats.comparison.aa_moved_columns`): their findings say "not supported: the A/A control
    moved", and ``--rerun-invalid`` measures their comparison again. The points stay valid (their numbers are what
    was measured; it is the comparison between them that the control does not carry)."""
    from workbench.stats import comparison

    pts = read_points(run_dir)
    if pts.empty or "aa_ratio" not in pts:
        return {}
    out = {}
    for row in pts.to_dict("records"):
        if comparison.aa_moved_columns(row):
            out[row["point_id"]] = (f"{row.get('experiment', '')}: the A/A control moved "
                                    f"({row['aa_low']:.3g}-{row['aa_high']:.3g}x)")
    return out


def mark_invalid(run_dir, point_ids: list[str], reason: str) -> None:
    """Mark finished points invalid (``valid = False``, the reason appended) in ``points.parquet`` and the manifest."""
    if not point_ids:
        return
    run = Path(run_dir)
    check_writer(run)
    pts = read_points(run)
    sel = pts["point_id"].isin(point_ids)
    if "invalid_reason" not in pts:
        pts["invalid_reason"] = ""
    pts.loc[sel, "invalid_reason"] = [r + ("; " if r else "") + reason
                                      for r in pts.loc[sel, "invalid_reason"].fillna("")]
    pts.loc[sel, "valid"] = False
    write_table(run / "points.parquet", pts)
    manifest = read_manifest(run)
    for pid in point_ids:
        manifest["points"].setdefault(pid, {})["valid"] = False
    _write_json(run / "manifest.json", manifest)


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


def expand_runs(paths) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[Path] = []
    for p in paths:
        matches = sorted(_glob.glob(str(p)))
        if _glob.has_magic(str(p)):  # a glob keeps run folders and parquet files (not e.g. comparisons/)
            matches = [m for m in matches if (Path(m) / "manifest.json").is_file() or m.endswith(".parquet")]
        out.extend(Path(m) for m in matches or [str(p)])
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
    for p in expand_runs(paths):
        f = p / f"{table}.parquet" if p.is_dir() else p
        if not f.exists() or f.suffix != ".parquet":
            raise ParameterError(f"paths: {str(p)!r} is not a run folder with {table}.parquet nor a parquet file")
        df = pd.read_parquet(f)
        if "run_id" not in df:
            df.insert(0, "run_id", (p if p.is_dir() else p.parent).name)
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


#: The static copies of a figure (``figures/<name>.<format>``, :mod:`workbench.share.static_figures`).
STATIC_FIGURE_FORMATS = ("png", "svg", "pdf")


def save_figure(run_dir, name: str, fig) -> Path:
    """Save a plotly figure as ``figures/<name>.json`` (for the report) and an offline ``.html`` page.

    Figures appear in the report in the order they were first saved. Static copies of an earlier save
    (``<name>.png`` / ``.svg`` / ``.pdf``, :data:`STATIC_FIGURE_FORMATS`) are removed: they showed the figure before
    (a ``--rerun-invalid`` left the old invalid points in the PNGs); the next export with ``--figures`` writes them
    anew.

    Raises:
        ParameterError: a name with characters other than letters, digits, ``_.-``.
    """
    if not _LABEL_RE.match(name) or ".." in name:
        raise ParameterError(f"figure name: must match [A-Za-z0-9][A-Za-z0-9_.-]* (got {name!r})")
    check_writer(run_dir)
    figs = check_write_target(Path(run_dir) / "figures")
    figs.mkdir(parents=True, exist_ok=True)
    atomic_write(figs / f"{name}.json", lambda f: f.write(fig.to_json()), text=True)
    # plotly.js is written once per run as figures/plotly.min.js (a run has dozens of figures; embedding
    # the 4.7 MB library in each would make a run folder ~150 MB). The report embeds it once instead.
    if not (figs / "plotly.min.js").exists():
        import plotly.offline

        atomic_write(figs / "plotly.min.js", lambda f: f.write(plotly.offline.get_plotlyjs()), text=True)
    page = fig.to_html(include_plotlyjs="directory", full_html=True)
    atomic_write(figs / f"{name}.html", lambda f: f.write(page), text=True)
    for fmt in STATIC_FIGURE_FORMATS:
        (figs / f"{name}.{fmt}").unlink(missing_ok=True)
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
    check_writer(run)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, lambda f: f.write(text), text=True)
    return target
