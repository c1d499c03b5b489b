"""Notebook parameters, suites, YAML parsing and papermill's view of the parameters cells."""
import json
import os
import sys
from pathlib import Path

import pytest

from workbench import ParameterError
from workbench.run import notebooks

NB = Path(__file__).resolve().parents[2] / "notebooks" / "01_batch_size.ipynb"


def test_notebook_parameters_are_literals_and_unknown_names_rejected():
    params = notebooks.notebook_parameters(NB)
    assert params["batch_sizes"] == [1, 2, 4, 8] and params["run_dir"] == ""
    with pytest.raises(ParameterError, match="^batch_size: not a parameter"):
        notebooks.validate_parameters(NB, {"batch_size": [1]})
    with pytest.raises(ParameterError, match="^batch_sizes:"):
        notebooks.validate_parameters(NB, {"batch_sizes": [0]})
    merged = notebooks.validate_parameters(NB, {"batch_sizes": [2]})
    assert merged["batch_sizes"] == [2] and merged["max_new_tokens"] == params["max_new_tokens"]


def test_notebooks_are_committed_clean():
    for nb in sorted(NB.parent.glob("[0-9]*.ipynb")):
        data = json.loads(nb.read_text())
        assert {"kernelspec", "language_info"} <= set(data["metadata"]), nb.name
        code = [c for c in data["cells"] if c["cell_type"] == "code"]
        assert "parameters" in code[0]["metadata"].get("tags", []), nb.name
        assert all(not c.get("outputs") for c in code), nb.name


def test_suites_validate():
    for name in ("default", "quick"):
        suite = notebooks.load_suite(name)
        for e in suite["notebooks"]:
            notebooks.validate_parameters(e["notebook"], e["parameters"])
    with pytest.raises(ParameterError, match="^suite:"):
        notebooks.load_suite("nope")


def test_papermill_parses_every_parameter_line():
    """papermill drops a parameter whose comment it cannot parse (e.g. one holding '='): keep them all documented."""
    import papermill as pm

    for nb in sorted(NB.parent.glob("[0-9]*.ipynb")):
        ours = notebooks.notebook_parameters(nb)
        theirs = pm.inspect_notebook(str(nb))
        assert set(theirs) == set(ours), nb.name
        assert all(p["help"] for p in theirs.values()), nb.name


@pytest.mark.parametrize("text,value", [("5e-2", 0.05), ("1E3", 1000.0), ("[1e-3, 2]", [0.001, 2]), ("0.25", 0.25),
                                        ("7", 7), ("true", True), ("fast", "fast")])
def test_yaml_reads_scientific_notation_as_floats(text, value):
    assert notebooks.load_yaml(text) == value


@pytest.mark.parametrize("text,message", [
    ("notebooks:\n- parameters: {}\n", "has no 'notebook:'"),
    ("notebooks:\n- notebook: notebooks/01_batch_size.ipynb\n  parameters:\n", "must be a mapping"),
    ("notebooks:\n- notebook: notebooks/01_batch_size.ipynb\n- notebook: notebooks/01_batch_size.ipynb\n",
     "appears twice"),
    # a misspelt key ran the notebook's defaults (or the report's default figures) without a word
    ("notebooks:\n- notebook: notebooks/01_batch_size.ipynb\n  paramaters: {batch_sizes: [1, 2]}\n",
     "entry 1 of s.yaml: unknown key 'paramaters' \\(did you mean 'parameters'\\?"),
    ("figure: none\nnotebooks:\n- notebook: notebooks/01_batch_size.ipynb\n",
     "s.yaml: unknown key 'figure' \\(did you mean 'figures'\\?"),
    ("extra: 1\nnotebooks: []\n", "unknown key 'extra' \\(known: description, budget_s"),
])
def test_malformed_suites_are_one_line_errors(tmp_path, text, message):
    f = tmp_path / "s.yaml"
    f.write_text(text)
    with pytest.raises(ParameterError, match="^suite: .*" + message):
        notebooks.load_suite(str(f))


def _tiny_notebook(path: Path, body: str) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    params = nbformat.v4.new_code_cell('run_dir = ""')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(body)]
    nbformat.write(nb, str(path))
    return path


@pytest.mark.notebook
def test_notebooks_of_one_run_share_a_kernel_but_no_variables(tmp_path, monkeypatch):
    """Inside notebooks.one_kernel: one kernel process for every notebook (imports, model, probe and drift reference
    paid once), the user namespace empty at the start of each, a fresh kernel after a failed notebook, and no
    kernel left running after the block."""
    import json

    import papermill as pm

    from workbench.run import notebooks

    record = ("import json, os, sys\n"
              "seen = 'leak' in globals()\n"
              "leak = 1\n"
              "open(os.path.join(run_dir, 'pids.jsonl'), 'a').write(json.dumps({'pid': os.getpid(), 'leak': seen,"
              " 'modules': 'workbench_probe_marker' in sys.modules}) + chr(10))\n"
              "sys.modules['workbench_probe_marker'] = sys\n")
    nb = _tiny_notebook(tmp_path / "a.ipynb", record)
    boom = _tiny_notebook(tmp_path / "b.ipynb", "raise RuntimeError('boom')")
    run = tmp_path / "run"
    run.mkdir()
    made, stop = [], notebooks._stop_clients
    monkeypatch.setattr(notebooks, "_stop_clients", lambda km: (made.extend(km.workbench_clients), stop(km)))
    with notebooks.one_kernel():
        notebooks.execute_notebook(nb, {}, run, log_output=False)
        notebooks.execute_notebook(nb, {}, run, log_output=False)
        with pytest.raises(pm.PapermillExecutionError):
            notebooks.execute_notebook(boom, {}, run, log_output=False)
        notebooks.execute_notebook(nb, {}, run, log_output=False)
        km = notebooks._SHARED["km"]
        # over Unix sockets in a private folder (no loopback port), and each notebook's client closed once it is done
        # (papermill leaves it open when handed a manager: "Could not destroy zmq context" a notebook at exit)
        assert km.transport == "ipc" and Path(km.ip).parent == Path(km.workbench_folder)
        assert not any(kc.channels_running for kc in made) and made
    assert not Path(km.workbench_folder).exists()
    rows = [json.loads(line) for line in (run / "pids.jsonl").read_text().splitlines()]
    assert rows[0]["pid"] == rows[1]["pid"] != rows[2]["pid"]      # shared; a fresh kernel after the failure
    assert [r["leak"] for r in rows] == [False, False, False]      # no variable crosses notebooks
    assert [r["modules"] for r in rows] == [False, True, False]   # imported modules do (the point of sharing)
    assert notebooks._SHARED is None and not km.has_kernel
    notebooks.execute_notebook(nb, {}, run, log_output=False)     # outside the block: a kernel of its own
    assert json.loads((run / "pids.jsonl").read_text().splitlines()[-1])["pid"] not in {r["pid"] for r in rows}


def test_a_killed_commands_kernel_folder_is_removed_by_the_next_command(tmp_path):
    """A command killed with SIGKILL never removes its kernel's socket folder; the next one removes the folders of
    processes that are gone, and leaves a live process's folder and anything it did not name alone."""
    import subprocess

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    prefix = notebooks.KERNEL_FOLDER_PREFIX
    dead = tmp_path / f"{prefix}{gone.pid}-abc"
    live = tmp_path / f"{prefix}1-def"                      # pid 1: alive
    mine = tmp_path / f"{prefix}{os.getpid()}-ghi"
    other = tmp_path / f"{prefix}notapid"
    for folder in (dead, live, mine, other):
        folder.mkdir()
        (folder / "kernel-1").write_text("")
    assert notebooks._remove_orphan_folders(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and live.exists() and mine.exists() and other.exists()


@pytest.mark.parametrize("entry", ["/etc/passwd", "../../tmp/x.ipynb", "notebooks/../README.md", "/tmp/other.ipynb"])
def test_a_suite_names_only_the_repos_notebooks(tmp_path, entry):
    """Issue 36: a suite could name any .ipynb on disk (or any file)."""
    f = tmp_path / "s.yaml"
    f.write_text(f"notebooks:\n- notebook: {entry}\n")
    with pytest.raises(ParameterError, match="^suite: .*notebooks/ folder") as exc:
        notebooks.load_suite(str(f))
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("content", [b"not json at all", b"\xff\xfe\x00", b"[1, 2]"])
def test_a_non_json_notebook_is_one_line(tmp_path, content):
    p = tmp_path / "x.ipynb"
    p.write_bytes(content)
    with pytest.raises(ParameterError) as exc:
        notebooks.notebook_parameters(p)
    assert str(exc.value).startswith("notebook:") and "\n" not in str(exc.value)


def test_each_parameters_cell_holds_its_configs_defaults():
    """Parameters live in one place: a notebook's parameters cell gives each field its Config's default (the cell is
    what ``papermill`` and a reader see, the Config what the package and the tests build), and names no parameter the
    Config lacks (``run_dir`` and ``resume`` are the runner's). A new parameter written into only one of them, or a
    default changed in one, fails here."""
    import dataclasses

    differ, unknown = [], []
    for nb in sorted(notebooks.NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")):
        cls = notebooks.notebook_config_class(nb)
        if cls is None:   # a run tool (90+): no Config
            continue
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, value in notebooks.notebook_parameters(nb).items():
            if name in ("run_dir", "resume"):
                continue
            f = fields.get(name)
            if f is None:
                unknown.append(f"{nb.stem}: {name}")
                continue
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else "<no default>")
            if default != value:
                differ.append(f"{nb.stem}: {name} = {value!r} in the cell, {default!r} in {cls.__name__}")
    assert not unknown, "parameters the Config does not have:\n" + "\n".join(unknown)
    assert not differ, "parameters cell and Config default disagree:\n" + "\n".join(differ)


def test_reading_and_running_notebooks_does_without_the_iri_grammar():
    """A process that reads or runs notebooks, or a kernel that shows a figure (plotly's renderers import nbformat),
    does not import rfc3987_syntax (its import builds a Lark grammar, seconds each command and each kernel:
    python-jsonschema/jsonschema#1428), and every committed notebook still validates."""
    import subprocess
    import sys

    code = ("import sys, workbench.run.notebooks, papermill, nbformat, jupytext\n"
            "assert sys.modules['rfc3987_syntax'] is None, 'the grammar was imported'\n"
            "for nb in sys.argv[1:]:\n"
            "    nbformat.validate(nbformat.read(nb, as_version=4))\n")
    books = [str(p) for p in sorted(NB.parent.glob("[0-9]*.ipynb"))]
    r = subprocess.run([sys.executable, "-c", code, *books], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    kernel = ("import sys, workbench.share.plots, plotly.io._renderers\n"   # what a notebook's kernel imports
              "assert 'nbformat' in sys.modules and sys.modules['rfc3987_syntax'] is None, 'the grammar was imported'\n")
    r = subprocess.run([sys.executable, "-c", kernel], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_two_library_warnings_no_one_can_act_on_are_kept_out_of_every_log_and_nothing_else_is():
    """torchao's "Failed to load .../_C_*.so" (CUDA kernels and other Pythons' builds its wheel ships) on a machine
    without CUDA, and torch's deprecation of torchao's Enum registrations, printed by every process that loaded a
    model (each notebook's output, each `make run` log); what else those loggers say still passes."""
    import logging

    import torch

    import workbench

    def passes(name, msg):
        record = logging.LogRecord(name, logging.WARNING, __file__, 1, msg, None, None)
        return bool(logging.getLogger(name).filter(record))

    cuda = torch.cuda.is_available()
    assert passes("torchao", "Failed to load /x/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: cannot open") == cuda
    assert passes("torch.utils._pytree", "<enum 'KernelPreference'> is an Enum subclass and is now natively "
                                         "supported by torch.compile as an opaque value type.") is False
    assert passes("torchao", "Skipping import of cpp extensions due to incompatible torch version")
    assert passes("torch.utils._pytree", "something else")
    assert passes("transformers", "Failed to load /x/y.so")                  # another logger's: untouched
    assert workbench._known_noise in logging.getLogger("torchao").filters
