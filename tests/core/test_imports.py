"""The engine's pure core loads no I/O library, and django_redlock's modules import each other without a cycle.

The pure modules decide (quorum, validity, the books, the scripts, the wire format); the drivers
(core/nodes.py, core/anodes.py) and the managers move bytes and time. Importing a pure module in a fresh
interpreter must not load ``redis``, ``socket``, ``select`` or ``asyncio``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "django_redlock"
CORE = PACKAGE / "core"

#: The drivers (sockets, asyncio, redis-py clients) and the managers over them: the rest of core/ stays pure.
DRIVERS = {"__init__", "nodes", "anodes", "wire", "node_spec", "redis_internals", "sentinel", "sync_manager", "async_manager"}
IO_MODULES = ("redis", "socket", "select", "asyncio")


def pure_modules() -> list[str]:
    """Every module of core/ but the drivers, so a new pure module is checked without being listed."""
    return sorted(f"django_redlock.core.{p.stem}" for p in CORE.glob("*.py") if p.stem not in DRIVERS)


def test_the_named_pure_modules_are_checked() -> None:
    named = "base held steps rounds ledger records scripts listing resp lock clock forks extender".split()
    assert {f"django_redlock.core.{name}" for name in named} <= set(pure_modules())


@pytest.mark.parametrize("module", pure_modules())
def test_a_pure_module_loads_no_io(module: str) -> None:
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        f"print(json.dumps([name for name in {IO_MODULES!r} if name in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent).stdout
    assert json.loads(out) == [], f"importing {module} loaded {json.loads(out)}"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(
    body: list[ast.stmt], deferred: bool, types: bool = False
) -> list[ast.Import | ast.ImportFrom]:
    """The imports run when the module loads (inside try/if/with/class too, never under TYPE_CHECKING),
    with ``deferred`` also those inside functions, run on first call, and with ``types`` also those
    under TYPE_CHECKING (a type checker's imports)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node.test) and not types:
            found += _runtime_imports(node.orelse, deferred)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not deferred:
            continue
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                block = getattr(node, field, None)
                if isinstance(block, list):
                    found += _runtime_imports([n for n in block if isinstance(n, ast.stmt)], deferred, types)
                    found += [
                        i for h in block if isinstance(h, ast.ExceptHandler) for i in _runtime_imports(h.body, deferred, types)
                    ]
    return found


def _parents(module: str) -> list[str]:
    """The packages Python imports before ``module``."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(deferred: bool = False, types: bool = False) -> dict[str, set[str]]:
    """django_redlock's modules and the modules of the package each one imports (a submodule's import
    loads its packages' ``__init__`` first, so those count too, but not with ``types``); ``deferred``
    and ``types`` as for :func:`_runtime_imports`."""
    files = {_module_of(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _runtime_imports(ast.parse(path.read_text(), str(path)).body, deferred, types):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    head = package.split(".")
                    head = head[: len(head) - node.level + 1]
                    base = ".".join([*head, base] if base else head)
                # ``from pkg import sub`` imports the submodule; ``from pkg import name`` the package.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for target in targets:
                # A type checker loads no package before its submodule: with ``types``, the modules named only.
                loaded = (target,) if types else (*_parents(target), target)
                graph[name] |= {t for t in loaded if t in files and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the modules along it (first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 on the path being walked, 2 done
    path: list[str] = []

    def walk(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := walk(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := walk(module)):
            return cycle
    return None


def test_find_cycle_names_the_modules_along_it() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_reads_runtime_imports_only() -> None:
    graph = import_graph()
    assert "django_redlock.exceptions" in graph["django_redlock.core.base"]
    assert "django_redlock.core.lock" not in graph["django_redlock.core.base"]  # under TYPE_CHECKING
    assert "django_redlock.core" in graph["django_redlock.core.base"]  # its package loads first
    source = ast.parse(
        "import a\n"
        "if TYPE_CHECKING:\n    import b\nelse:\n    import c\n"
        "try:\n    import d\nexcept ImportError:\n    import e\n"
        "def f():\n    import g\n"
    ).body
    assert [n.names[0].name for n in _runtime_imports(source, deferred=False)] == ["a", "c", "d", "e"]
    assert [n.names[0].name for n in _runtime_imports(source, deferred=True)] == ["a", "c", "d", "e", "g"]


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_cycle_through_deferred_imports() -> None:
    """An import inside a function only hides a cycle until that function runs."""
    cycle = find_cycle(import_graph(deferred=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_type_graph_reads_type_checking_imports_too() -> None:
    source = ast.parse("import a\nif TYPE_CHECKING:\n    import b\nelse:\n    import c\n").body
    assert [n.names[0].name for n in _runtime_imports(source, deferred=True, types=True)] == ["a", "b", "c"]
    graph = import_graph(deferred=True, types=True)
    assert "django_redlock.core" not in graph["django_redlock.core.steps"]  # no package loads first for types


def test_no_import_cycle_through_type_imports() -> None:
    """Layers go one way, types included: an import under TYPE_CHECKING closes no circle either."""
    cycle = find_cycle(import_graph(deferred=True, types=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
