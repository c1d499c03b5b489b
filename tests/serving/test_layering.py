"""The shape of workbench/serving (issue 22) and of the load generator's wing, workbench/load (issue 48): who imports
whom, where SSE framing lives, unique private names.

Read from the source with ``ast`` (no model, no server): each rule names the module and the line that breaks it. The
wall between the two wings is the folder rule (``load`` one layer above ``serving`` in tests/test_layout.py
``LAYERS``): the server side imports nothing from the load generator.
"""

import ast
import re
from pathlib import Path

import pytest

import workbench.load
import workbench.serving

SERVING = Path(workbench.serving.__file__).parent
MODULES = sorted(p.stem for p in SERVING.glob("*.py") if p.stem != "__init__")
WINGS = {"serving": workbench.serving, "load": workbench.load}


def _tree(name, folder=SERVING):
    return ast.parse((folder / f"{name}.py").read_text(encoding="utf-8"))


def _sibling_imports(name, package="serving") -> set:
    """Sibling modules ``name`` imports anywhere in ``workbench/<package>`` (module level or inside functions; not
    the annotation-only imports under ``if TYPE_CHECKING:``)."""
    folder = Path(WINGS[package].__file__).parent
    siblings = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    out = set()
    tree = _tree(name, folder)
    typing_only = {id(n) for b in ast.walk(tree) if isinstance(b, ast.If) and ast.unparse(b.test) in (
        "TYPE_CHECKING", "typing.TYPE_CHECKING") for s in b.body for n in ast.walk(s)}
    for node in ast.walk(tree):
        if id(node) in typing_only:   # an annotation's name (if TYPE_CHECKING:), never imported at run time
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:  # from .x import ...
                out.add(node.module.split(".")[0])
            elif node.level == 1:  # from . import x, y
                out.update(a.name for a in node.names)
            elif node.module == f"workbench.{package}":  # from workbench.<package> import x, y
                out.update(a.name for a in node.names)
            elif node.module and node.module.startswith(f"workbench.{package}."):
                out.add(node.module.split(".")[2])
    return out & siblings


def _serving_imports(name) -> set:
    return _sibling_imports(name, "serving")


def test_the_server_side_imports_nothing_from_the_load_generator():
    """The folder rule, read here too: no module of workbench/serving names workbench.load."""
    for name in MODULES:
        for node in ast.walk(_tree(name)):
            mods = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                    [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            assert not any(m == "workbench.load" or m.startswith("workbench.load.") for m in mods), \
                f"serving/{name}.py imports the load generator ({mods})"


def test_no_import_circle_inside_serving():
    graph = {m: _serving_imports(m) for m in MODULES}

    def reach(start):
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m])
        return seen

    circles = sorted(m for m in MODULES if m in reach(m))
    assert not circles, f"modules on an import circle: {circles} ({ {m: sorted(graph[m]) for m in circles} })"
    assert "server" not in reach("jobs")


def test_sse_framing_lives_in_events_only():
    """Only events.py writes ``data:`` / ``id:`` lines; the routes call its sse_data / numbered / DONE."""
    for name in set(MODULES) - {"events"}:
        src = (SERVING / f"{name}.py").read_text(encoding="utf-8")
        for needle in ('"data: ', "'data: ", 'f"id: ', "f'id: "):
            assert needle not in src, f"{name}.py frames SSE itself ({needle!r})"


def test_private_module_functions_have_one_definition():
    seen = {}
    for name in MODULES:
        for node in _tree(name).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("_"):
                assert node.name not in seen, f"{node.name} defined in {seen.get(node.name)}.py and {name}.py"
                seen[node.name] = name


def test_no_generation_outside_engines():
    """Only the engines call the model (engines.py's interface, engine_kinds.py's schedulers): the server, chat and
    jobs hand requests to the engine."""
    for name in set(MODULES) - {"engines", "engine_kinds"}:
        src = (SERVING / f"{name}.py").read_text(encoding="utf-8")
        assert "generate_measured(" not in src and "threading.Thread(target=self._work" not in src, name


@pytest.mark.parametrize("package", sorted(WINGS))
def test_modules_import_only_modules_listed_above_them_in_the_package_docstring(package):
    """Each wing's __init__.py lists every module, lowest first; an import of a module listed later is an arrow back
    up."""
    folder = Path(WINGS[package].__file__).parent
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    order = list(dict.fromkeys(re.findall(r":mod:`\.(\w+)`", WINGS[package].__doc__)))
    assert sorted(order) == modules, f"the package docstring lists {sorted(order)}, the folder holds {modules}"
    for i, name in enumerate(order):
        later = _sibling_imports(name, package) - set(order[:i])
        assert not later, f"{package}/{name}.py imports {sorted(later)}, listed after it"


def test_route_handlers_live_at_module_level():
    """Handlers are module functions reading request.app.state (nanochat's chat_web.py), not closures in create_app."""
    for name in MODULES:
        for outer in ast.walk(_tree(name)):
            if not isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(outer):
                if inner is outer or not isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                routes = [d for d in inner.decorator_list if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
                          and d.func.attr in ("get", "post", "delete", "put", "exception_handler", "middleware")]
                assert not routes, f"{name}.py: route {inner.name} is nested in {outer.name}"
