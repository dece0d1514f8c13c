"""Import hygiene: sans-IO modules load without an event loop or torch; the package is lazy.

Each check runs in a fresh interpreter, since this one has long since imported everything.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import compass

REPO = Path(__file__).resolve().parents[2]

SANS_IO = [
    "compass.wire.frames",
    "compass.wire.protocol",
    "compass.wire.codec",
    "compass.sched.planner",
    "compass.sched.eft",
    "compass.sched.adjust",
    "compass.sched.view",
    "compass.cache.policy",
    "compass.core.state",
    "compass.front.tensors",
    "compass.front.openai",
    "compass.front.errors",
    "compass.front.declare",
    "compass.elastic.rule",
    "compass.elastic.live",
    "compass.elastic.replicate",
]


def loaded_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``statement``."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    modules: list[str] = json.loads(done.stdout.splitlines()[-1])
    return set(modules)


@pytest.mark.parametrize("module", SANS_IO)
def test_a_sans_io_module_imports_neither_asyncio_nor_torch(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} does not exist yet")
    loaded = loaded_after(f"import {module}")
    assert module in loaded
    assert "asyncio" not in loaded
    assert "torch" not in loaded


def test_importing_compass_imports_nothing_heavy() -> None:
    loaded = loaded_after("import compass")
    assert {"asyncio", "torch", "numpy", "compass.app", "compass.client"}.isdisjoint(loaded)


def test_the_channel_and_the_handler_table_do_not_import_each_other() -> None:
    # the callback types live in compass.wire.handlers, which both of them import
    assert "compass.wire.channel" not in loaded_after("import compass.wire.rpc")
    handlers_only = loaded_after("import compass.wire.handlers")
    assert {"compass.wire.channel", "compass.wire.rpc", "asyncio"}.isdisjoint(handlers_only)


def test_lazy_names_resolve_to_the_defining_objects() -> None:
    from compass.app import App
    from compass.client import Client
    from compass.errors import CompassError

    assert compass.Client is Client
    assert compass.App is App
    assert compass.CompassError is CompassError
    assert compass.__version__ == "0.1.0"


def test_a_lazy_name_resolves_in_a_fresh_interpreter() -> None:
    loaded = loaded_after(
        "import compass\nassert compass.Client.__name__ == 'Client'\n"
        "assert compass.App.__name__ == 'App'"
    )
    assert {"compass.client", "compass.app"} <= loaded


def test_dir_lists_every_public_name() -> None:
    assert set(compass.__all__) <= set(dir(compass))


def test_an_unknown_name_is_a_clear_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'compass' has no attribute 'Clinet'"):
        _ = compass.Clinet
    with pytest.raises(ImportError, match="cannot import name 'Clinet'"):
        exec("from compass import Clinet", {})


def test_the_transport_module_re_exports_the_split_modules() -> None:
    from compass.wire import channel, eventloop, handlers, options, rpc, tcp, transport

    homes = (channel, eventloop, handlers, options, tcp)
    for name in transport.__all__:
        assert any(getattr(home, name, None) is getattr(transport, name) for home in homes), name
    assert rpc.Immediate is handlers.Immediate


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(tree: ast.AST, modules: set[str]) -> set[str]:
    """The compass modules a module imports when it runs: at the top, inside functions (lazy
    imports) and through ``importlib.import_module("...")``; not under ``if TYPE_CHECKING``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    visit_one(other)
                continue
            visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in modules:
                found.add(node.module)
            names = (f"{node.module}.{a.name}" for a in node.names)
            found.update(name for name in names if name in modules)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in modules
        ):
            found.add(str(node.args[0].value))
        visit(node)

    visit(tree)
    return found


def import_cycles(package: Path) -> list[list[str]]:
    """Every set of modules of ``package`` that import each other, directly or not, at run
    time (lazy imports included): the strongly connected components of the import graph."""
    paths = {_module_name(p, package.parent): p for p in sorted(package.rglob("*.py"))}
    modules = set(paths)
    graph = {
        name: _imported(ast.parse(path.read_text(encoding="utf-8")), modules) - {name}
        for name, path in paths.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            connect(name)
    return cycles


def test_the_cycle_finder_finds_a_lazy_circle(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.c import g\n")
    (package / "c.py").write_text("import pkg.a\n")
    (package / "d.py").write_text("if TYPE_CHECKING:\n    import pkg.a\n")
    (package / "e.py").write_text("import importlib\nimportlib.import_module('pkg.d')\n")
    assert import_cycles(package) == [["pkg.a", "pkg.b", "pkg.c"]]
    (package / "d.py").write_text("import pkg.e\n")  # d and e: a circle through import_module
    assert import_cycles(package) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.d", "pkg.e"]]


def test_no_import_circle_in_compass() -> None:
    assert import_cycles(REPO / "compass") == []


def test_the_client_imports_nothing_of_the_worker() -> None:
    loaded = loaded_after("import compass.client")
    assert not {m for m in loaded if m.startswith("compass.worker")}


@pytest.mark.parametrize("module", ["worker/requests", "observe/dashboard", "observe/metrics"])
def test_what_serves_a_worker_does_not_import_the_worker(module: str) -> None:
    # each states what it reads and calls of a worker as protocols (server.Worker is one),
    # so none imports compass.worker.server, not even for its types
    tree = ast.parse((REPO / "compass" / f"{module}.py").read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
            imported.update(f"{node.module}.{alias.name}" for alias in node.names)
    assert "compass.worker.server" not in imported
