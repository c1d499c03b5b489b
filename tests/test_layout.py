"""The rules that keep the package's shape (docs/design.md section 2), checked on the source text.

- One experiment per numbered notebook: a module ``workbench/experiments/NAME.py`` or, where the experiment has parts
  of its own (its figures, its search), a small folder ``workbench/experiments/NAME/`` (its ``__init__`` the
  experiment, the parts beside it).
- No experiment imports another experiment (a folder's own modules import each other).
- No module outside a formula's home defines it again (``def exact_match``, ``tpot_s =`` arithmetic, ...).
- Every notebook's committed ``.ipynb`` equals what its jupytext source renders.
- Every folder of the package has its test folder (``tests/<folder>/``).
"""

import ast
import functools
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "workbench"
#: each experiment: its module, or its folder's ``__init__.py``
EXPERIMENTS = sorted([p for p in (PKG / "experiments").glob("*.py") if p.name != "__init__.py"]
                     + [p / "__init__.py" for p in (PKG / "experiments").iterdir() if (p / "__init__.py").is_file()])
NAMES = {p.parent.name if p.name == "__init__.py" else p.stem for p in EXPERIMENTS}


def _experiment_of(rel: tuple) -> str:
    """The experiment a file of ``workbench/experiments/`` belongs to, from its path there (``("batch_size.py",)`` or
    ``("engine_tuning", "figures.py")``): its module's name, or its folder's."""
    return rel[0] if len(rel) > 1 else Path(rel[0]).stem


def _imported_modules(source: str, rel: tuple) -> set[str]:
    """The experiments (names under ``workbench.experiments``) the file at ``rel`` (its path in
    ``workbench/experiments/``) imports; relative imports are resolved from where it sits (``from . import x`` in an
    experiment's folder is its own part, not an experiment)."""
    in_folder, own = len(rel) > 1, _experiment_of(rel)
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 1 and in_folder:  # from . import x / from .x import y: the folder's own parts
                out.add(own)
            elif node.level == 2 and in_folder:  # from .. import x / from ..x import y
                out |= {mod.split(".")[0]} if mod else {a.name for a in node.names}
            elif node.level == 1:  # from . import x / from .x import y
                out |= {mod.split(".")[0]} if mod else {a.name for a in node.names}
            elif mod.startswith("workbench.experiments"):
                rest = mod[len("workbench.experiments"):].lstrip(".")
                out |= {rest.split(".")[0]} if rest else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("workbench.experiments."):
                    out.add(a.name.split(".")[2])
    return out


NOTEBOOKS = PKG.parent / "notebooks"
#: notebooks numbered from here on are run tools (compare runs, ...), not experiments: they have no module
TOOLS_FROM = 90


def _notebook_config(nb: Path) -> str:
    """The ``workbench.config`` metadata (``module:Class``) of a committed notebook, or ''."""
    import json

    return json.loads(nb.read_text(encoding="utf-8"))["metadata"].get("workbench", {}).get("config", "")


def test_there_is_one_module_per_numbered_notebook():
    """Discovered, not listed: each experiment notebook ``NN_name`` (NN < 90) has ``workbench/experiments/name.py`` (or
    the folder ``workbench/experiments/name/``) and names its ``Config`` in its metadata; each experiment has exactly
    one such notebook; the tools (90 and above) have no experiment module."""
    numbered = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    experiments = {nb.stem[3:]: nb for nb in numbered if int(nb.stem[:2]) < TOOLS_FROM}
    assert experiments, f"no numbered notebooks found in {NOTEBOOKS}"
    assert len({nb.stem[:2] for nb in numbered}) == len(numbered), "two notebooks share a number"
    without_module = sorted(nb.name for name, nb in experiments.items() if name not in NAMES)
    assert not without_module, f"experiment notebooks without a module or folder in workbench/experiments/: {without_module}"
    without_notebook = sorted(NAMES - set(experiments))
    assert not without_notebook, f"experiment modules without a numbered notebook: {without_notebook}"
    wrong = {nb.name: _notebook_config(nb) for name, nb in experiments.items()
             if _notebook_config(nb) != f"workbench.experiments.{name}:Config"}
    assert not wrong, f"notebooks whose metadata names another config: {wrong}"
    tools = [nb.name for nb in numbered if int(nb.stem[:2]) >= TOOLS_FROM
             and _notebook_config(nb).startswith("workbench.experiments.")]
    assert not tools, f"run tools (numbered {TOOLS_FROM}+) naming an experiment config: {tools}"


EXPERIMENT_FILES = sorted(p for p in (PKG / "experiments").rglob("*.py") if p != PKG / "experiments" / "__init__.py")


@pytest.mark.parametrize("path", EXPERIMENT_FILES, ids=lambda p: str(p.relative_to(PKG / "experiments")))
def test_experiment_modules_never_import_each_other(path):
    rel = path.relative_to(PKG / "experiments").parts
    others = (_imported_modules(path.read_text(encoding="utf-8"), rel) & NAMES) - {_experiment_of(rel)}
    assert not others, f"{path.relative_to(PKG)} imports experiment(s) {sorted(others)}"


def test_an_experiments_folder_is_one_experiment_and_its_parts_its_own():
    """A folder's ``__init__`` names the experiment, its parts are not experiments; the import rule reads a folder's
    own parts as its own and a sibling experiment as another (a synthetic source)."""
    assert "engine_tuning" in NAMES and "context_compression" in NAMES and not {"charts", "search"} & NAMES
    source = ("from . import search\nfrom .charts import fig_speed\nfrom ..batch_size import recommend\n"
              "from workbench.experiments import scheduling\nfrom workbench.experiments.engine_tuning import x\n")
    assert _imported_modules(source, ("engine_tuning", "x.py")) == {"engine_tuning", "batch_size", "scheduling"}
    assert _imported_modules("from . import temperature\n", ("batch_size.py",)) == {"temperature"}


def test_library_modules_do_not_import_experiments():
    for path in PKG.rglob("*.py"):
        if "experiments" in path.parts or "cli" in path.relative_to(PKG).parts:  # the command line sits above them
            continue
        text = path.read_text(encoding="utf-8")
        assert "experiments" not in re.findall(r"^\s*(?:from|import)\s+\S*(experiments)", text, re.M), path


# one home per formula: pattern -> the only file allowed to hold it
HOMES = {
    r"^\s*def (exact_match|substring_match|rouge_l\w*|section_coverage|normalize_answer|units)\(": "measure/quality.py",
    r"^\s*def (continuation_logprobs|token_nlls|perplexity|mean_ci)\(": "measure/quality.py",
    r"^\s*def (request_timing|percentiles|_percentile)\(": "stats/metrics.py",
    r"[\"']?(tpot_s|decode_tps)[\"']?\s*[:=]\s*[^=\n]*/": "stats/metrics.py",
    r"^\s*def (_?eos_token_ids|_eos_ids|_?warm_up|cache_kwarg|_cache_kwarg)\(": "measure/generation.py",
    r"\\u3400": "measure/quality.py",
    r"^\s*def _?check_(int|float|list|int_list|float_list|choice|str_list)\(": "checks.py",
    r"np\.percentile\(|np\.quantile\(": "stats/metrics.py",
    r"^\s*def (t_interval|ratio_interval|wilson_interval|usable_points|fit_support)\(": "stats/evidence.py",
    # t quantiles: intervals over independent units (evidence), a design's critical values and decisions (decisions)
    # and its analysis (blocks)
    r"stats\.t\.ppf\(": ("stats/evidence.py", "stats/blocks.py", "stats/decisions.py"),
    r"^\s*def (fit_block_model|spread_check|pick_versus|best_of|keep_control|pick_stands)\(": "stats/blocks.py",
    # the keep-the-baseline rule spelled out again (blocks.keep_control is its one home)
    r"direction == \"(higher|lower)\"\) or\b|or \(\w+\.verdict == \"direction\" and \w+\.direction == ": "stats/blocks.py",
    r"^\s*def (critical_value|rounds_needed)\(": "stats/decisions.py",
    r"^\s*def paired_binary\(": "stats/paired.py",
    r"^\s*def (looks|spent|look_alpha)\(": "stats/sequential.py",
    r"Path\(__file__\)\.resolve\(\)\.parents": "paths.py",   # the repository root
    r"^\s*def (float_or_nan|finite_or_none|config_defaults)\(": "checks.py",
}


@pytest.mark.parametrize("pattern,home", list(HOMES.items()))
def test_each_formula_has_one_home(pattern, home):
    offenders = []
    homes = {PKG / h for h in ((home,) if isinstance(home, str) else home)}
    for path in PKG.rglob("*.py"):
        if path in homes:
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(pattern, line, re.M):
                offenders.append(f"{path.relative_to(PKG)}:{i}: {line.strip()}")
    assert not offenders, f"defined outside {home}:\n" + "\n".join(offenders)


def test_float_or_nan_is_not_written_again_under_another_name():
    """checks.float_or_nan is the one "float or NaN" (issue 48); the name pattern above misses a copy named otherwise
    (run/drift.py's ``_number`` at 0e29f3d): its shape - return float(x), NaN on TypeError / ValueError - is found."""
    shape = re.compile(r"try:\n\s+return float\(\w+\)\n\s+except \(TypeError, ValueError\):\n\s+"
                       r"return (math\.nan|float\([\"']nan[\"']\)|np\.nan)")
    copies = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
              if p != PKG / "checks.py" and shape.search(p.read_text(encoding="utf-8"))]
    assert not copies, f"a float-or-NaN helper outside checks.py (use checks.float_or_nan): {copies}"


def _private_imports(path: Path) -> list[str]:
    """Where ``path`` takes a ``_private`` name from another workbench module: ``from X import _name`` (absolute or
    relative) or ``module._name`` on a module it imported from the package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out, imported = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("workbench")):
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    out.append(f"{path.relative_to(PKG)}:{node.lineno}: from {'.' * node.level}{node.module or ''} "
                               f"import {a.name}")
                imported.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("workbench")}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in imported):
            out.append(f"{path.relative_to(PKG)}:{node.lineno}: {node.value.id}.{node.attr}")
    return out


def test_no_private_name_crosses_a_file():
    """A ``_name`` is its module's own: another module that needs it gets a public name (or the code moves)."""
    found = [hit for path in sorted(PKG.rglob("*.py")) for hit in _private_imports(path)]
    assert not found, "private names imported across files:\n" + "\n".join(found)
    # the check sees both forms (a synthetic module inside the package's folder tree)
    probe = PKG / "_probe_private_imports.py"
    try:
        probe.write_text("from workbench.run.results import _x\nfrom .run import results\nresults._y\nresults.ok\n")
        assert [h.split(": ", 1)[1] for h in _private_imports(probe)] == [
            "from workbench.run.results import _x", "results._y"]
    finally:
        probe.unlink()


def test_committed_notebooks_equal_their_sources():
    from workbench.run import notebooks

    assert notebooks.sources(), "no notebook sources found"
    assert notebooks.out_of_sync() == [], "run: python -m workbench.run.notebooks"
    for src in notebooks.sources():
        assert src.with_suffix(".ipynb").exists()
    assert not list(notebooks.NOTEBOOKS_DIR.glob("_build_*.py")), "notebook builders replaced by jupytext sources"


def test_every_notebook_is_thin_and_tagged():
    import json

    for nb_path in sorted(Path(PKG.parent / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(nb_path.read_text())
        assert nb["metadata"]["kernelspec"]["name"] == "python3"
        assert nb["metadata"]["language_info"]["name"] == "python"
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert "parameters" in code[0]["metadata"].get("tags", []), nb_path.name
        for c in code:
            assert not c.get("outputs"), f"{nb_path.name}: outputs committed"
            if "parameters" not in c["metadata"].get("tags", []):
                assert len("".join(c["source"]).splitlines()) <= 20, f"{nb_path.name}: a cell longer than 20 lines"


# ----------------------------------------------------------------------------- the import graph

#: The layers, lowest first, by folder (``docs/design.md`` section 2 and the package map in ``workbench/__init__.py``).
#: A module may import its own folder or a folder below, never one above; circles are refused separately, in any
#: folder. The root holds the ground floor (``errors``, ``checks``, the package itself) and ``__main__`` (the command
#: line's alias). A new folder fails :func:`test_every_module_has_a_layer` until it is placed here.
LAYERS = ["ground", "stats", "measure", "techniques", "inputs", "run", "serving", "load", "predict", "share",
          "experiments", "cli"]
ROOT_LAYERS = {"workbench": "ground", "errors": "ground", "checks": "ground", "paths": "ground", "__main__": "cli"}


def _module_name(path: Path) -> str:
    """``workbench/serving/jobs.py`` -> ``serving.jobs``; ``workbench/__init__.py`` -> ``workbench``."""
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "workbench"


def import_graph() -> dict[str, set[str]]:
    """A copy of :func:`_import_graph` (parsed once per test process: ~3 s each time)."""
    return {k: set(v) for k, v in _import_graph().items()}


@functools.lru_cache(maxsize=1)
def _import_graph() -> dict[str, set[str]]:
    """``{module: workbench modules it imports}`` from the source, with ``ast``: module- and function-level
    imports, absolute (``workbench.x``) and relative (``from ..x import y``, ``from . import x``); imports under
    ``if TYPE_CHECKING:`` (annotations only, never run) are not edges. Names are relative to the package
    (``serving.jobs``); the package itself is ``workbench``."""
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" and name != "workbench" else (
            [] if name == "workbench" else name.split(".")[:-1])
        deps = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {id(n) for b in ast.walk(tree) if isinstance(b, ast.If) and ast.unparse(b.test) in (
            "TYPE_CHECKING", "typing.TYPE_CHECKING") for s in b.body for n in ast.walk(s)}
        for node in ast.walk(tree):
            if id(node) in typing_only:   # an annotation's name, never imported at run time
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    up = node.level - 1
                    if up > len(package):
                        raise AssertionError(f"{path}: relative import beyond the package")
                    base = package[:len(package) - up] + (node.module.split(".") if node.module else [])
                elif node.module == "workbench" or (node.module or "").startswith("workbench."):
                    base = node.module.split(".")[1:]
                else:
                    continue
                for alias in node.names:  # from X import name: the submodule X.name when there is one
                    sub = ".".join(base + [alias.name])
                    deps.add(sub if sub in modules else (".".join(base) or "workbench"))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "workbench" or alias.name.startswith("workbench."):
                        deps.add(".".join(alias.name.split(".")[1:]) or "workbench")
        deps = {d if d in modules else d.rsplit(".", 1)[0] for d in deps}  # an attribute import: its module
        deps.discard(name)
        graph[name] = deps
    return graph


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of a module (``stats.metrics`` -> its folder ``stats``), or -1."""
    folder = module.split(".")[0]
    name = ROOT_LAYERS.get(module) if "." not in module and module not in LAYERS else folder
    return LAYERS.index(name) if name in LAYERS else -1


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as ``[a, b, ..., a]``, or None (depth-first search, sorted for a stable report)."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_import_graph_sees_function_level_and_relative_imports():
    graph = import_graph()
    assert "experiments.batch_size" in graph and "serving.server" in graph and "workbench" in graph
    assert "errors" in graph["workbench"]                          # from workbench.errors import ParameterError
    assert "run.sweeps" in graph["experiments.batch_size"]         # from workbench.run import sweeps
    assert "serving.chat" in graph["serving.server"]               # from . import chat (relative)
    assert "techniques.retrieval" in graph["techniques.compression"]


def test_the_folders_are_the_layers():
    """Each folder of the package is a layer, and an import up the folders is found (a synthetic one)."""
    folders = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(LAYERS) - {"ground"}, f"folders without a layer, or layers without a folder: {folders ^ set(LAYERS)}"
    for folder in folders:
        doc = ast.get_docstring(ast.parse((PKG / folder / "__init__.py").read_text(encoding="utf-8"))) or ""
        assert len(doc.split()) >= 25, f"workbench/{folder}/__init__.py needs its one-paragraph docstring"
    assert layer_of("stats.metrics") < layer_of("measure.generation") < layer_of("run.sweeps") < layer_of("experiments.x")
    # the load generator is a wing of its own above the server: the server side imports nothing from it
    assert layer_of("serving.server") < layer_of("load.client") < layer_of("predict.twin")
    assert layer_of("errors") == 0 and layer_of("nowhere.x") == -1


def folders_without_tests(pkg: Path, tests: Path) -> list[str]:
    """The folders of the package ``pkg`` (those with an ``__init__.py``) without a test folder in ``tests``: a
    package (its own ``__init__.py``, so its file names may repeat another folder's) holding a ``test_*.py``."""
    missing = []
    for folder in sorted(p.name for p in pkg.iterdir() if (p / "__init__.py").exists()):
        here = tests / folder
        if not (here / "__init__.py").exists() or not any(here.glob("test_*.py")):
            missing.append(folder)
    return missing


def test_every_folder_of_the_package_has_its_test_folder(tmp_path):
    """tests/ mirrors workbench/: ``tests/<folder>/`` for each ``workbench/<folder>/`` (tests/conftest.py says what
    stays at the top level). The rule is shown to fail on a tree with a folder untested and one unpackaged."""
    assert not (missing := folders_without_tests(PKG, PKG.parent / "tests")), \
        f"package folders without tests/<folder>/__init__.py and a test_*.py there: {missing}"
    for name, test_file, init in (("a", True, True), ("b", False, True), ("c", True, False)):
        (tmp_path / "pkg" / name).mkdir(parents=True)
        (tmp_path / "pkg" / name / "__init__.py").touch()
        (tmp_path / "tests" / name).mkdir(parents=True)
        if test_file:
            (tmp_path / "tests" / name / "test_x.py").touch()
        if init:
            (tmp_path / "tests" / name / "__init__.py").touch()
    (tmp_path / "pkg" / "data").mkdir()   # not a package folder: needs no tests
    assert folders_without_tests(tmp_path / "pkg", tmp_path / "tests") == ["b", "c"]


def test_find_cycle_reports_the_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_circles():
    graph = import_graph()
    circles = []
    while (cycle := find_cycle(graph)) is not None:   # every circle, each reported once: break it and look again
        circles.append(" -> ".join(cycle))
        graph = {**graph, cycle[0]: graph[cycle[0]] - {cycle[1]}}
    assert not circles, "import circles (each a function in the wrong file):\n" + "\n".join(circles)


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in import_graph() if layer_of(m) < 0)
    assert not unplaced, f"modules in no layer of tests/test_layout.py LAYERS (add them where they belong): {unplaced}"


def test_no_module_imports_one_above_its_layer():
    names = LAYERS
    upward = []
    for module, deps in sorted(import_graph().items()):
        mine = layer_of(module)
        for dep in sorted(deps):
            if mine >= 0 and layer_of(dep) > mine:
                upward.append(f"{module} ({names[mine]}) imports {dep} ({names[layer_of(dep)]})")
    assert not upward, "imports pointing up the layers:\n" + "\n".join(upward)


def test_the_command_line_and_the_experiments_import_without_torch():
    """The command line validates parameters (importing every experiment module) and runs notebooks in a kernel:
    its own process imports neither torch nor transformers (~2 s on the 2-core build VM, paid by every
    ``workbench run`` / ``sweep`` before its first notebook). They come with the first generation."""
    import subprocess
    import sys

    code = ("import importlib, pkgutil, sys, workbench.cli, workbench.run.notebooks, workbench.share.report, "
            "workbench.experiments as E\n"
            "for m in pkgutil.iter_modules(E.__path__): importlib.import_module('workbench.experiments.' + m.name)\n"
            "workbench.cli.build_parser().parse_args(['run', 'quick'])\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_validating_the_quick_suite_on_cpu_imports_no_transformers():
    """Before its first notebook, ``workbench run quick`` validates every notebook's parameters (torch comes in
    to resolve ``device: auto``); transformers' import (~2 s here) waits for the kernel, on CPU at least."""
    import subprocess
    import sys

    code = ("import sys\nfrom workbench.run import notebooks\n"
            "for e in notebooks.load_suite('quick')['notebooks']:\n"
            "    notebooks.validate_parameters(e['notebook'], e['parameters'])\n"
            "print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr[-2000:]


def outside_imports() -> dict[str, set[str]]:
    """``{folder: its modules imported from outside it}``: by the package's other folders and top-level modules
    (:func:`import_graph`), the notebooks' sources and the benchmarks (absolute imports)."""
    graph = import_graph()
    folders = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    seen: dict[str, set[str]] = {f: set() for f in folders}

    def add(importer_folder, dep):
        parts = dep.split(".")
        if len(parts) >= 2 and parts[0] in folders and parts[0] != importer_folder:
            seen[parts[0]].add(parts[1])

    for mod, deps in graph.items():
        for d in deps:
            add(mod.split(".")[0] if "." in mod or mod in folders else None, d)
    for path in [*NOTEBOOKS.glob("*.py"), *(PKG.parent / "benchmarks").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("workbench."):
                base = node.module.split(".")[1:]
                for a in node.names:
                    sub = ".".join(base + [a.name])
                    add(None, sub if sub in graph else ".".join(base))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("workbench."):
                        add(None, ".".join(a.name.split(".")[1:]))
    return seen


def _face(folder: str) -> list[str]:
    tree = ast.parse((PKG / folder / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"workbench/{folder}/__init__.py has no __all__ (its face: what code outside may import)")


def test_each_folder_has_a_face_and_nothing_outside_reaches_past_it():
    """Issue 48: each folder's ``__init__`` names in ``__all__`` the modules notebooks, experiments, benchmarks and
    the other folders may import; an import of any other module of the folder from outside it fails here (a module
    left out of ``__all__`` is the folder's own business: serving's job store, share's CSV writer, ...). The command
    line's face is its ``main``."""
    assert _face("cli") == ["main"]
    for folder, used in outside_imports().items():
        if folder == "cli":
            assert not used, f"cli/ is imported from outside (it only parses and dispatches): {sorted(used)}"
            continue
        face = _face(folder)
        modules = {p.stem for p in (PKG / folder).glob("*.py") if p.name != "__init__.py"} | {
            p.name for p in (PKG / folder).iterdir() if (p / "__init__.py").exists()}
        assert set(face) <= modules, f"workbench/{folder}.__all__ names no module: {sorted(set(face) - modules)}"
        assert used <= set(face), (f"imported from outside workbench/{folder}/ but not in its __all__: "
                                   f"{sorted(used - set(face))}")


def test_a_module_imported_past_a_face_is_found():
    """The face check sees a notebook or another folder importing a module the face leaves out (a synthetic
    graph: serving's job store imported by the load generator)."""
    face = set(_face("serving"))
    assert "job_store" not in face and "server" in face
    assert "job_store" not in outside_imports()["serving"]


def test_ruff_is_clean():
    """pyflakes, isort and pycodestyle's statement errors over the package, tests and benchmarks (the rules in
    pyproject.toml's ``[tool.ruff]``): an unused or undefined name, or imports out of order, fail here."""
    import shutil
    import subprocess
    import sys

    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.fail("ruff is not installed: it is in the test extra (pip install -e '.[test]')")
    got = subprocess.run([ruff, "check", "--output-format", "concise", str(PKG.parent)], capture_output=True,
                         text=True, cwd=PKG.parent)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-1000:]


def _missing_names(path: Path) -> list[str]:
    """The ``workbench`` names a script uses that do not exist: ``from workbench.x import y`` where ``x`` has no
    ``y``, and ``m.attr`` where ``m`` is a workbench module the script imported (module level or in a function)."""
    import importlib

    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases, missing = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "workbench" and not node.level:
            mod = importlib.import_module(node.module)
            for a in node.names:
                target = getattr(mod, a.name, None)
                if target is None:
                    try:
                        target = importlib.import_module(f"{node.module}.{a.name}")
                    except ImportError:
                        missing.append(f"{node.module}.{a.name}")
                        continue
                if isinstance(target, type(ast)):
                    aliases[a.asname or a.name] = target
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "workbench" and a.asname:
                    aliases[a.asname] = importlib.import_module(a.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            if not hasattr(aliases[node.value.id], node.attr):
                missing.append(f"{aliases[node.value.id].__name__}.{node.attr}")
    return sorted(set(missing))


@pytest.mark.parametrize("path", sorted([*(PKG.parent / "benchmarks").glob("*.py"), *NOTEBOOKS.glob("*.py")]),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_name_a_benchmark_or_notebook_uses_exists(path):
    """A benchmark runs only by hand (``make benchmark``) and a notebook only when executed, so a name removed from
    the package breaks them silently (``benchmarks/scheduling.py`` called ``classes.paired_ratio`` after a clean-up
    removed it; notebook 11 read ``scheduling.class_summary`` after ruff dropped the import it rode on): every
    workbench name a benchmark or a notebook's source imports or reads off an imported module exists."""
    assert _missing_names(path) == []


def test_a_missing_benchmark_name_is_found(tmp_path):
    script = tmp_path / "b.py"
    script.write_text("from workbench.stats import classes, metrics\nfrom workbench.stats.decisions import holm\n"
                      "def f():\n    return classes.no_such_name(metrics.percentiles)\n")
    assert _missing_names(script) == ["workbench.stats.classes.no_such_name"]
