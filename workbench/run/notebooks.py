"""Notebooks as text, their parameters, suites, and papermill execution.

- Source of truth: a jupytext percent-format script ``notebooks/NN_name.py`` (``# %%`` cells, the
  ``parameters`` tag in a cell header, notebook metadata in the YAML header). :func:`sync` writes the
  ``.ipynb`` beside it (outputs empty, stable cell ids); ``python -m workbench.run.notebooks`` syncs them all
  and ``--check`` fails when a committed ``.ipynb`` differs from its source.
- Parameters are data: :func:`notebook_parameters` reads the tagged cell with ``ast.literal_eval``
  (never ``eval``); :func:`validate_parameters` checks names against it (papermill only warns on unknown
  names) and values with the notebook's typed config (metadata ``workbench.config = module:Class``).
- :func:`load_yaml` reads parameter files, suites and ``-p`` values; unlike YAML 1.1 it reads ``5e-2``
  as a float (YAML 1.2's float rule), so scientific notation works everywhere.
- :func:`execute_notebook` runs one with papermill into ``<run_dir>/notebooks/``; inside :func:`one_kernel` the
  notebooks of a run share one kernel (imports, model, probe and drift reference paid once).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import os
import re
import sys
from pathlib import Path

from workbench.errors import ParameterError
from workbench.paths import REPO

NOTEBOOKS_DIR = REPO / "notebooks"
SUITES_DIR = REPO / "suites"

# A process that reads or runs notebooks does without rfc3987_syntax's Lark grammar: workbench/__init__.py.


# ----------------------------------------------------------------------------- YAML


def _yaml_loader():
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader with YAML 1.2's float rule (``5e-2``, ``1E3`` are floats, not strings)."""

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X),
        list("-+0123456789."),
    )
    return Loader


def load_yaml(text: str, name: str = "YAML"):
    """Parse YAML data safely (no tags, no code) with YAML 1.2 floats, bounded: at most
    :data:`workbench.checks.MAX_DATA_NODES` values once its aliases are expanded (a "billion laughs" document is a few
    hundred bytes that every later walk, the parameter checks and the manifest's JSON included, would expand
    exponentially), and no value that holds itself.

    Args:
        text: the YAML text.
        name: what it is, for the error (``suite``, ``-f FILE``, a parameter's name).

    Raises:
        yaml.YAMLError: invalid YAML; ParameterError: past the bound (one line naming ``name`` and the limit).
    """
    import yaml

    from workbench import checks

    data = yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    try:
        return checks.check_expanded_size(name, data)
    except ParameterError as exc:
        raise ParameterError(str(exc).replace("YAML: ", f"{name}: ", 1)) from None


def yaml_problem(exc) -> str:
    """One line for a YAML parse error: what the parser found and where (``line L, column C`` of the text, 1-based),
    e.g. ``expected ',' or ']', but got ':' at line 5, column 12 (while parsing a flow sequence from line 4, column
    18)``."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and start is not None:
        context += f" from line {start.line + 1}, column {start.column + 1}"
    return f"{problem}{where}" + (f" ({context})" if context else "")


# ----------------------------------------------------------------------------- jupytext sources


def sources(directory: Path = NOTEBOOKS_DIR) -> list[Path]:
    """The notebook sources: ``NN_name.py`` percent scripts in ``directory``, sorted."""
    return sorted(p for p in Path(directory).glob("[0-9][0-9]_*.py"))


def render(source: Path):
    """The ``nbformat`` notebook of a percent-format source, outputs empty, cell ids stable (``cell-NN``)."""
    import jupytext

    nb = jupytext.read(source, fmt="py:percent")
    nb.metadata.pop("jupytext", None)
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:02d}"
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def sync(source: Path) -> Path:
    """Write ``source``'s ``.ipynb`` beside it; returns its path."""
    import nbformat

    out = Path(source).with_suffix(".ipynb")
    nbformat.write(render(source), out)
    return out


def out_of_sync(directory: Path = NOTEBOOKS_DIR) -> list[str]:
    """Names of notebooks whose committed ``.ipynb`` differs from what its source renders (or is missing)."""
    import nbformat

    stale = []
    for src in sources(directory):
        ipynb = src.with_suffix(".ipynb")
        if not ipynb.exists() or nbformat.writes(render(src)).rstrip() != ipynb.read_text(encoding="utf-8").rstrip():
            stale.append(ipynb.name)
    return stale


# ----------------------------------------------------------------------------- parameters


def _read(path) -> dict:
    """The notebook's JSON.

    Raises:
        ParameterError: it does not exist, is not a file, or is not notebook JSON (one line naming it)."""
    path = Path(path)
    if not path.exists():
        raise ParameterError(f"notebook: {str(path)!r} does not exist")
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ParameterError(f"notebook: {str(path)!r} is not a Jupyter notebook (not UTF-8 JSON: {first})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ParameterError(f"notebook: {str(path)!r} is not a Jupyter notebook (no cells list)")
    return nb


def notebook_parameters(path) -> dict:
    """``{name: default value}`` of a notebook's ``parameters`` cell (literals, parsed, never evaluated).

    Raises:
        ParameterError: the notebook does not exist or has no tagged ``parameters`` cell.
    """
    nb = _read(path)
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            tree = ast.parse("".join(cell["source"]))
            out = {}
            for node in tree.body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    out[node.target.id] = ast.literal_eval(node.value) if node.value is not None else None
                elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    out[node.targets[0].id] = ast.literal_eval(node.value)
            return out
    raise ParameterError(f"notebook: {Path(path).name} has no cell tagged 'parameters'")


def notebook_config_class(path):
    """The config class named in the notebook metadata ``workbench.config`` (``module:Class``), or None."""
    target = _read(path).get("metadata", {}).get("workbench", {}).get("config")
    if not target:
        return None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def validate_parameters(path, params: dict) -> dict:
    """Check names against the notebook's parameters cell, then values with its typed config.

    Args:
        path: the notebook.
        params: overrides (already typed: lists are lists).

    Returns:
        The full parameter dict (defaults updated by ``params``).

    Raises:
        ParameterError: an unknown name, a value the config rejects, or a secret anywhere in a value (a
            secret-named key at any depth, a URL carrying one: :func:`workbench.checks.check_no_secrets`).
    """
    defaults = notebook_parameters(path)
    if "run_dir" in params:
        raise ParameterError("run_dir: set by the command line; use --resume RUN_DIR to continue a run")
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ParameterError(
            f"{unknown[0]}: not a parameter of {Path(path).name} (known: {', '.join(sorted(defaults))})"
        )
    from workbench import checks

    for name, value in params.items():  # parameters are recorded everywhere a run writes: no secret may be one
        checks.check_no_secrets(name, value)
    merged = {**defaults, **params}
    cls = notebook_config_class(path)
    if cls is not None:
        cls.from_namespace(merged)
    return merged


# ----------------------------------------------------------------------------- execution and suites


#: the kernel manager :func:`one_kernel` shares between the notebooks executed inside it (None: one kernel each)
_SHARED: dict | None = None


@contextlib.contextmanager
def one_kernel():
    """Within this block :func:`execute_notebook` runs every notebook in one ``python3`` kernel, started by the
    first notebook and shut down when the block ends: the imports (torch, transformers: seconds a kernel), the
    loaded model (:func:`workbench.measure.models.load_model`'s memo), the device probe and the
    drift reference are paid once per run instead of once per notebook. No variable crosses from one notebook
    to the next: the kernel's user namespace is reset (``%reset -f``) before each later one. After a notebook fails
    its kernel is shut down, so the next one starts in a fresh process. Nested blocks share the outer kernel.
    """
    global _SHARED
    if _SHARED is not None:
        yield
        return
    _SHARED = {"km": None}
    try:
        yield
    finally:
        km, _SHARED = _SHARED["km"], None
        _shutdown(km)


def _kernel_manager():
    """The manager of a kernel this process starts for its notebooks: over IPC (Unix sockets in a private temporary
    folder; a kernel on TCP listens on loopback ports any local user can reach, and ipykernel warns so in every
    run), and it remembers the clients it makes, so :func:`_stop_clients` can close their channels once a notebook is
    done (papermill leaves its client's channels open when it is handed a manager, nbclient's ``cleanup_kc``: each
    stayed subscribed to the kernel's output until the command exited, "Could not destroy zmq context" a notebook)."""
    import tempfile

    from jupyter_client.manager import AsyncKernelManager

    class _Manager(AsyncKernelManager):
        def client(self, **kwargs):
            kc = super().client(**kwargs)
            self.workbench_clients.append(kc)
            return kc

    _remove_orphan_folders(tempfile.gettempdir())
    folder = tempfile.mkdtemp(prefix=f"{KERNEL_FOLDER_PREFIX}{os.getpid()}-")
    km = _Manager(kernel_name="python3", transport="ipc", ip=os.path.join(folder, "kernel"))
    km.workbench_clients, km.workbench_folder = [], folder
    return km


KERNEL_FOLDER_PREFIX = "workbench-kernel-"   # + the owning command's pid + "-" + mkdtemp's random part


def _remove_orphan_folders(tmp: str) -> list[str]:
    """Remove the kernels' socket folders (:func:`_kernel_manager`) whose owning process is gone: a command killed
    with SIGKILL never reaches :func:`_shutdown`, and its folder would stay in the temporary folder for good.

    Args:
        tmp: the temporary folder to look in.

    Returns:
        the folders removed (those of live processes, and any not named by this module, are left alone).
    """
    import shutil

    removed = []
    for path in Path(tmp).glob(f"{KERNEL_FOLDER_PREFIX}*-*"):
        pid = path.name[len(KERNEL_FOLDER_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue                  # its process is alive (or is another user's: not ours to remove)
        except ProcessLookupError:
            pass
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(str(path))
    return removed


def _stop_clients(km) -> None:
    """Close the channels of the clients ``km`` made (:func:`_kernel_manager`)."""
    clients, km.workbench_clients = km.workbench_clients, []
    for kc in clients:
        try:
            kc.stop_channels()
        except Exception:  # noqa: BLE001 - a client whose kernel is gone has nothing left to close
            pass


def _shutdown(km) -> None:
    """Stop a kernel at once (its process group killed): its notebooks are done and written, and every run-folder
    write is atomic, so nothing is lost; a polite shutdown waits seconds for an interpreter holding torch and a
    model to tear itself down. Processes a notebook left running in the kernel's group go with it; its clients'
    channels and its sockets' folder go too."""
    if km is None:
        return
    import shutil

    from jupyter_core.utils import run_sync

    _stop_clients(km)
    try:
        if run_sync(km.is_alive)():
            run_sync(km.shutdown_kernel)(now=True)
    except Exception:  # noqa: BLE001 - a kernel that is already gone needs no shutdown
        pass
    shutil.rmtree(km.workbench_folder, ignore_errors=True)


def _reset_namespace(km) -> None:
    """``%reset -f`` in the shared kernel: the next notebook starts with an empty user namespace (modules and
    their memos stay imported). Then a full collection, and what survives it (modules, the loaded model, memos) is
    frozen (``gc.freeze``): later collections - the next reset's, each peak-memory window's - scan only what the
    next notebook made, not the frozen rest (results/LOG.md, 2026-12-06: what a reset cost before)."""
    kc = km.blocking_client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        kc.execute_interactive("get_ipython().run_line_magic('reset', '-f')\n"
                               "import gc as _gc; _gc.collect(); _gc.freeze(); del _gc",
                               store_history=False, timeout=120, output_hook=lambda msg: None)
    finally:
        kc.stop_channels()


def execute_notebook(path, params: dict, run_dir, log_output: bool = True) -> Path:
    """Execute a notebook with papermill into ``<run_dir>/notebooks/``, with ``run_dir`` injected.

    The kernel is the ``python3`` kernel of this interpreter (its folder goes
    first on ``PATH``): a new one per call, or inside :func:`one_kernel` the kernel shared by the calls in that
    block. Output is streamed to the console when ``log_output``.

    Returns:
        The executed notebook's path.

    Raises:
        papermill.PapermillExecutionError: a cell failed (the executed notebook is still written).
    """
    import papermill as pm

    from workbench.checks import mask_secrets

    path = Path(path).resolve()
    out = Path(run_dir) / "notebooks" / path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    # the kernel inherits this process's environment when it starts: set what it needs for this call only,
    # so the caller (a test session, a JupyterLab started later) keeps its own
    kernel_env = {"PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
                  "WORKBENCH_HEADLESS": "1"}  # kernels started here have no frontend (workbench.share.live.has_frontend)
    saved = {k: os.environ.get(k) for k in kernel_env}
    os.environ.update(kernel_env)
    shared = _SHARED
    if shared is not None and shared["km"] is not None and shared["cwd"] != path.parent:
        _shutdown(shared["km"])       # a notebook in another folder: the kernel's working folder must be its own
        shared["km"] = None
    if shared is not None and shared["km"] is None:  # the first notebook of the block starts the shared kernel
        shared.update(km=_kernel_manager(), cwd=path.parent, used=False)
    km = shared["km"] if shared is not None else _kernel_manager()   # else a kernel for this notebook alone
    try:
        if shared is not None and shared["used"]:
            _reset_namespace(km)  # the previous notebook's variables go before this one starts (none after the last)
        pm.execute_notebook(
            str(path),
            str(out),
            # the executed notebook records its parameters cell: a masked copy (workbench.checks.mask_secrets)
            parameters={**mask_secrets(params), "run_dir": str(Path(run_dir).resolve())},
            cwd=str(path.parent),
            # the notebook's own stdout / stderr, as it prints them; papermill's log (log_output) adds "Executing
            # Cell 3----" and "Ending Cell 3----" around each cell and sends stderr as a logging warning
            log_output=False,
            stdout_file=sys.stdout if log_output else None,
            stderr_file=sys.stderr if log_output else None,
            progress_bar=False,
            kernel_name="python3",
            km=km,
        )
        if shared is not None:
            shared["used"] = True
            _stop_clients(km)
        else:
            _shutdown(km)
    except BaseException:
        if shared is not None:  # a failed or interrupted notebook: the next one gets a fresh kernel
            shared["km"] = None
        _shutdown(km)
        raise
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out


#: The keys a suite file may hold (:func:`load_suite`), and those of each of its ``notebooks:`` entries.
SUITE_KEYS = ("description", "budget_s", "figures", "reference_reuse_s", "price_per_hour", "notebooks")
ENTRY_KEYS = ("notebook", "parameters")


def _unknown_key(where: str, found, known) -> None:
    """Raise a one-line :class:`ParameterError` for the first key of ``found`` not in ``known`` (a misspelt
    ``parameters:`` would otherwise run the notebook's defaults without a word), naming the closest known key."""
    import difflib

    unknown = [str(k) for k in found if k not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ParameterError(f"suite: {where}: unknown key {unknown[0]!r} ({hint}known: {', '.join(known)})")


def load_suite(suite: str) -> dict:
    """Read a suite: a name in ``suites/`` (``default``, ``quick``) or a YAML path.

    Format: ``{"description": str, "budget_s": seconds (optional), "figures": static formats of the run's report
    (optional: ``"png,svg"``, a list, or ``none``; default png,svg where a renderer is present),
    "reference_reuse_s": seconds a drift reference stands for the machine's speed (optional, 1-600; default 15:
    :data:`workbench.run.drift.REFERENCE_REUSE_S`), "price_per_hour": the machine's price in USD an hour (optional:
    the report's cost columns), "notebooks": [{"notebook": path, "parameters": dict}]}``; notebook paths are
    relative to the repository. ``budget_s``: after that many seconds of the run no design adds a round beyond its
    minimum (:mod:`workbench.run.design`). Any other key (:data:`SUITE_KEYS`, :data:`ENTRY_KEYS`) is an error.

    Raises:
        ParameterError: unknown suite, an unknown key, or a malformed file.
    """
    import yaml

    path = Path(suite)
    if not path.suffix:
        path = SUITES_DIR / f"{suite}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in SUITES_DIR.glob("*.yaml")))
        raise ParameterError(f"suite: {suite!r} is neither a suite name ({known}) nor a YAML file")
    from workbench import checks

    checks.check_file_size("suite", path)
    try:
        data = load_yaml(path.read_text(encoding="utf-8"), "suite")
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        what = yaml_problem(exc) if isinstance(exc, yaml.YAMLError) else str(exc).splitlines()[0]
        raise ParameterError(f"suite: {path} is not valid UTF-8 YAML: {what}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("notebooks"), list):
        raise ParameterError(f"suite: {path} must hold a 'notebooks' list")
    _unknown_key(path.name, data, SUITE_KEYS)
    if data.get("budget_s") is not None:   # the suite's time budget for rounds beyond each design's minimum
        from workbench import checks

        checks.check_float("budget_s", data["budget_s"], lo=0, lo_open=True)
    if data.get("reference_reuse_s") is not None:   # how long a drift reference stands for the machine's speed
        from workbench import checks

        checks.check_float("reference_reuse_s", data["reference_reuse_s"], lo=1, hi=600)
    seen = set()
    for i, entry in enumerate(data["notebooks"]):
        if not isinstance(entry, dict) or not entry.get("notebook"):
            raise ParameterError(f"suite: entry {i + 1} of {path.name} has no 'notebook:'")
        _unknown_key(f"entry {i + 1} of {path.name}", entry, ENTRY_KEYS)
        params = entry.get("parameters", {})
        if not isinstance(params, dict):
            raise ParameterError(f"suite: parameters of {entry['notebook']} must be a mapping (got {params!r})")
        entry["parameters"] = params
        entry["notebook"] = str((REPO / str(entry["notebook"])).resolve())
        nb = Path(entry["notebook"])
        if nb.parent != NOTEBOOKS_DIR.resolve() or nb.suffix != ".ipynb":  # a suite runs the repo's notebooks only
            raise ParameterError(f"suite: entry {i + 1} of {path.name}: {entry['notebook']} is not a notebook of "
                                 f"the repository's notebooks/ folder (a suite may name only those)")
        if entry["notebook"] in seen:
            raise ParameterError(f"suite: {Path(entry['notebook']).name} appears twice in {path.name}")
        seen.add(entry["notebook"])
    data["path"] = str(path)
    return data


def main(argv=None) -> int:
    """``python -m workbench.run.notebooks [--check]``: write every ``.ipynb`` from its source, or check them."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m workbench.run.notebooks", description=main.__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 when a committed .ipynb differs from its source")
    args = ap.parse_args(argv)
    if args.check:
        stale = out_of_sync()
        for name in stale:
            print(f"out of sync: notebooks/{name} (run python -m workbench.run.notebooks)")
        return 1 if stale else 0
    for src in sources():
        print(f"wrote {sync(src).relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
