"""A resume that cannot mix (issue 36): what a resumed session must share with the run it continues.

A run's points are comparable only when they were measured with the same settings. ``workbench run --resume``
(and ``sweep --resume``) therefore compares, before any notebook runs, this session's :func:`run_identity` with
the one the run recorded at its first session (``manifest.json``: ``resume_identity``):

- ``code`` (issue 51): the git commit of the workbench and a SHA-256 over the package's sources
  (:func:`code_identity`: every file of the ``workbench`` package, uncommitted changes included), so a ``git pull``
  or an edit between a failed point and ``--resume`` (a prompt source, an engine default, a guard limit) is seen even
  where no config names it (an editable install's package version never moves);
- ``packages``: the versions of :data:`PACKAGES` (``importlib.metadata``; no import) and Python;
- ``notebooks``: every notebook's **effective** config, defaults included: its parameters cell merged with the
  given parameters, then its typed config (:func:`effective_config`), so a default changed by a ``git pull``
  between a failed point and its resume is seen;
- ``models``: per notebook that loads a model, the resolved model (folder and weights hash,
  :class:`workbench.measure.models.ModelInfo`'s ``weights_sha256``), device and dtype (``auto`` resolved).

Any difference is one line naming each (``01_batch_size: max_new_tokens 32 -> 8``, ``code: commit 50a5abc ->
80b55af``) and exit 2 (:func:`check_resume` raises :class:`~workbench.errors.ParameterError`), unless the user passes
``--allow-changed``: then the session's identity is appended to ``resume_identity_history`` (the manifest keeps
both) and the kernels see ``$WORKBENCH_ALLOW_CHANGED=1``, under which :func:`point_suffix` gives the points of an
experiment whose config changed new ids (``...@cfg-<hash>``), so they are measured again beside the old ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
from pathlib import Path

from workbench import paths
from workbench.errors import ParameterError

ALLOW_ENV = "WORKBENCH_ALLOW_CHANGED"
#: packages whose version changes what is measured
PACKAGES = ("torch", "transformers", "tokenizers", "accelerate", "numpy", "workbench")
#: config keys that say how a session runs, not what it measures
IGNORED = ("resume", "run_dir")


def _plain(value):
    """A JSON round trip (tuples become lists, paths strings), secrets masked (:func:`workbench.checks.mask_secrets`):
    configs compare as they are recorded."""
    from workbench.checks import mask_secrets

    return mask_secrets(json.loads(json.dumps(value, default=str, sort_keys=True)))


_SOURCE_SUFFIXES = (".py", ".csv", ".json", ".yaml", ".yml", ".txt", ".jinja", ".html", ".css", ".js")


def sources_sha256(root: Path | None = None) -> str:
    """SHA-256 over a package's source files (``root``: the ``workbench`` package): each file's path relative to
    ``root`` and its bytes, in sorted order (caches and compiled files left out). Any edit, committed or not, moves
    it; a checkout of the same tree gives the same value on any machine."""
    import hashlib

    root = Path(root) if root is not None else paths.PACKAGE
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in _SOURCE_SUFFIXES
                    and "__pycache__" not in p.parts):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def code_identity() -> dict:
    """``{"git_commit", "sources_sha256"}`` of the workbench this session runs (:func:`sources_sha256`; the commit
    from :func:`workbench.measure.device.git_commit`, ``-dirty`` with uncommitted changes, None outside git)."""
    from workbench.measure import device

    return {"git_commit": device.git_commit(), "sources_sha256": sources_sha256()}


def packages() -> dict:
    """``{name: version}`` of :data:`PACKAGES` (``None`` when not installed) and ``python``."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def effective_config(notebook, params: dict) -> dict:
    """The config a notebook runs with: its parameters cell's defaults, updated by ``params``, then (where the
    notebook names a typed config) every field of that config, defaults included; without :data:`IGNORED` keys.

    Raises:
        ParameterError: as :func:`workbench.run.notebooks.validate_parameters`.
    """
    from workbench.run import notebooks

    merged = notebooks.validate_parameters(notebook, params)
    out = dict(merged)
    cls = notebooks.notebook_config_class(notebook)
    if cls is not None:
        cfg = cls.from_namespace(merged)
        if dataclasses.is_dataclass(cfg):
            out.update(dataclasses.asdict(cfg))
    return {k: v for k, v in _plain(out).items() if k not in IGNORED}


def config_identity(config) -> dict:
    """A sweep config as compared across sessions (:func:`effective_config`'s form, without :data:`IGNORED`)."""
    d = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config or {})
    return {k: v for k, v in _plain(d).items() if k not in IGNORED}


def _model(cfg: dict) -> dict | None:
    """The resolved model, device and dtype of a notebook config with a ``model`` parameter (None: no model)."""
    spec = cfg.get("model")
    if not isinstance(spec, str) or not spec:
        return None
    from workbench.measure import models

    out = {"model": spec, "device": cfg.get("device", "auto"), "dtype": cfg.get("dtype", "auto")}
    try:
        out["device"], out["dtype"] = models.resolve_names(str(out["device"]), str(out["dtype"]))
    except Exception:  # noqa: BLE001 - an external endpoint run, or no such device here: compared as given
        pass
    try:
        path = Path(models.resolve_model_path(spec))
        out["model_path"] = str(path)
        out["weights_sha256"] = models.weights_hash(path) if path.is_dir() else None
    except Exception:  # noqa: BLE001 - not resolvable here (a hub id offline): compared by its name
        out["model_path"] = out["weights_sha256"] = None
    return out


def run_identity(entries: list[dict]) -> dict:
    """What a session would measure with: ``packages``, ``notebooks`` (name -> effective config) and ``models``
    (name -> resolved model, device, dtype) of the validated ``entries`` (``{"notebook", "parameters"}``)."""
    nbs, mods = {}, {}
    for e in entries:
        name = Path(e["notebook"]).stem
        nbs[name] = effective_config(e["notebook"], e["parameters"])
        m = _model(nbs[name])
        if m is not None:
            mods[name] = m
    return {"code": code_identity(), "packages": packages(), "notebooks": nbs, "models": mods}


def _short(v) -> str:
    text = json.dumps(v, sort_keys=True) if not isinstance(v, str) else v
    return text if len(text) <= 60 else text[:57] + "..."


def differences(recorded: dict, current: dict) -> list[str]:
    """One phrase per difference between two :func:`run_identity` s, e.g. ``01_batch_size: max_new_tokens 32 -> 8``,
    ``torch 2.13.0 -> 2.14.0``, ``01_batch_size: weights_sha256 ab12 -> cd34``. A notebook only in ``current``
    (added to the suite) is no difference: it has no points yet."""
    out = _code_differences(recorded, current)
    old_p, new_p = recorded.get("packages") or {}, current.get("packages") or {}
    out += [f"{k} {old_p.get(k)} -> {new_p.get(k)}" for k in sorted(set(old_p) | set(new_p))
            if old_p.get(k) != new_p.get(k)]
    resolved = set(recorded.get("models") or {}) & set(current.get("models") or {})
    for section in ("models", "notebooks"):
        old_s, new_s = recorded.get(section) or {}, current.get(section) or {}
        for name in sorted(set(old_s) & set(new_s)):
            a, b = old_s[name] or {}, new_s[name] or {}
            # a notebook's model / device / dtype parameters compare resolved, in "models" ("auto" -> "cpu" is none)
            skip = ("model", "device", "dtype") if section == "notebooks" and name in resolved else ()
            out += [f"{name}: {k} {_short(a.get(k, '(unset)'))} -> {_short(b.get(k, '(unset)'))}"
                    for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k) and k not in skip]
    return out


def _code_differences(recorded: dict, current: dict) -> list[str]:
    """The code a session runs against the run's: ``code: commit 50a5abc -> 80b55af``, ``code: workbench sources
    1a2b3c4d -> 5e6f7a8b`` (an edit, committed or not), or that the run recorded none (it predates code
    identities: it cannot be shown to be the same code)."""
    new = current.get("code")
    if not new:
        return []
    old = recorded.get("code")
    if not old:
        return [f"code: not recorded by the run (it predates code identities) -> commit "
                f"{str(new.get('git_commit'))[:12]}, workbench sources {str(new.get('sources_sha256'))[:8]}"]
    out = []
    if old.get("git_commit") != new.get("git_commit"):
        out.append(f"code: commit {str(old.get('git_commit'))[:12]} -> {str(new.get('git_commit'))[:12]}")
    if old.get("sources_sha256") != new.get("sources_sha256"):
        out.append(f"code: workbench sources {str(old.get('sources_sha256'))[:8]} -> "
                   f"{str(new.get('sources_sha256'))[:8]} (a file of the package changed)")
    return out


def check_resume(run_dir, entries: list[dict], allow_changed: bool = False) -> list[str]:
    """Compare this session with the run at ``run_dir`` before any notebook runs; the differences (empty: none).

    A run recorded before identities were kept gets this session's as its record (nothing to compare).

    Raises:
        ParameterError: a difference without ``allow_changed`` (one line naming each; the CLI's exit 2).
    """
    from workbench.run import results

    current = run_identity(entries)
    recorded = results.read_manifest(run_dir).get("resume_identity")
    if not recorded:
        return []
    diff = differences(recorded, current)
    if diff and not allow_changed:
        raise ParameterError(f"--resume: this session differs from the run's ({'; '.join(diff)}); its points would "
                             "mix settings. Restore them, or pass --allow-changed to measure the changed points "
                             "again under new ids")
    return diff


def record(run_dir, entries: list[dict], resume: bool) -> dict:
    """Record this session's identity: the run's ``resume_identity`` at its first session (or when a run recorded
    none); each later session's, when it differs, appended to ``resume_identity_history``. Returns it."""
    from workbench.run import results

    current = run_identity(entries)
    manifest = results.read_manifest(run_dir)
    recorded = manifest.get("resume_identity")
    if not recorded:
        results.update_manifest(run_dir, resume_identity=current)
    elif resume and differences(recorded, current):
        history = list(manifest.get("resume_identity_history") or []) + [current]
        results.update_manifest(run_dir, resume_identity_history=history)
    return current


def point_suffix(recorded_config, config) -> str:
    """The suffix of an experiment's point ids in this session: ``""`` when its config equals the run's
    (``recorded_config``, or none recorded yet), else ``@cfg-<12 hex digits of its SHA-256>`` (the same changed
    config always gets the same ids, so resuming it again skips what it finished).

    Raises:
        ParameterError: the config changed and ``$WORKBENCH_ALLOW_CHANGED`` is not ``1`` (a notebook resumed
            outside ``workbench run``, e.g. by papermill directly), naming the first differences.
    """
    if not recorded_config:
        return ""
    old, new = config_identity(recorded_config), config_identity(config)
    if old == new:
        return ""
    if os.environ.get(ALLOW_ENV) != "1":
        diff = differences({"notebooks": {"config": old}}, {"notebooks": {"config": new}})
        raise ParameterError(f"resume: the config differs from the run's ({'; '.join(d.split(': ', 1)[1] for d in diff)}); "
                             "pass --allow-changed to measure the changed points again under new ids")
    return "@cfg-" + hashlib.sha256(json.dumps(new, sort_keys=True).encode()).hexdigest()[:12]
