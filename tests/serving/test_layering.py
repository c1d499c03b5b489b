"""The shape of workbench/serving (issue 22): who imports whom, where SSE framing lives, unique private names.

Read from the source with ``ast`` (no model, no server): each rule names the module and the line that breaks it.
"""

import ast
from pathlib import Path

import workbench.serving

SERVING = Path(workbench.serving.__file__).parent
MODULES = sorted(p.stem for p in SERVING.glob("*.py") if p.stem != "__init__")


def _tree(name):
    return ast.parse((SERVING / f"{name}.py").read_text(encoding="utf-8"))


def _serving_imports(name) -> set:
    """Sibling modules ``name`` imports anywhere (module level or inside functions)."""
    out = set()
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:  # from .x import ...
                out.add(node.module.split(".")[0])
            elif node.level == 1:  # from . import x, y
                out.update(a.name for a in node.names)
            elif node.module and node.module.startswith("workbench.serving."):
                out.add(node.module.split(".")[2])
    return out & set(MODULES)


def test_clients_import_nothing_from_the_server_side():
    server_side = {"server", "chat", "jobs", "http", "monitoring"}
    for client in ("client", "load", "senders"):
        assert not _serving_imports(client) & server_side, f"{client}.py imports {_serving_imports(client) & server_side}"


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
    for name in set(MODULES) - {"events", "load", "senders", "client"}:  # the clients parse SSE, they do not write it
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


def test_modules_import_only_modules_listed_above_them_in_the_package_docstring():
    """serving/__init__.py lists every module, lowest first; an import of a module listed later is an arrow back up."""
    import re

    order = list(dict.fromkeys(re.findall(r":mod:`\.(\w+)`", workbench.serving.__doc__)))
    assert sorted(order) == MODULES, f"the package docstring lists {sorted(order)}, the folder holds {MODULES}"
    for i, name in enumerate(order):
        later = _serving_imports(name) - set(order[:i])
        assert not later, f"{name}.py imports {sorted(later)}, listed after it"


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
