"""No import cycles inside the checked packages, counting imports made inside functions.

Every module under ``src/siftmq`` is parsed with :mod:`ast`; each ``import`` and ``from … import``
anywhere in it (module level, function bodies, class bodies) is an edge, except those under an
``if TYPE_CHECKING:`` guard, which never run. ``from pkg import name`` points at ``pkg.name`` when
that is a module, else at ``pkg``; relative imports are resolved against the importing module.
Importing ``a.b.c`` also runs ``a`` and ``a.b``, but those parent edges are left out: a package's
``__init__`` re-exporting its submodules is not a cycle worth refusing. No cycle is allowed
anywhere in siftmq.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted((SRC / "siftmq").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement below ``node`` that can run (the body of ``if TYPE_CHECKING`` cannot)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.orelse:
                yield from _runtime_imports(ast.Module(body=[sub], type_ignores=[]))
        else:
            yield from _runtime_imports(child)


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _targets(stmt: ast.Import | ast.ImportFrom, module: str, path: Path, known: set[str]) -> set[str]:
    if isinstance(stmt, ast.Import):
        return {alias.name for alias in stmt.names if alias.name in known}
    base = stmt.module or ""
    if stmt.level:
        package = _package_of(module, path)
        for _ in range(stmt.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    out: set[str] = set()
    for alias in stmt.names:
        sub = f"{base}.{alias.name}"
        if sub in known:
            out.add(sub)
        elif base in known:
            out.add(base)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: set[str] = set()
        for stmt in _runtime_imports(tree):
            edges |= _targets(stmt, module, path, known)
        edges.discard(module)
        graph[module] = edges
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_the_graph_sees_function_level_and_relative_imports() -> None:
    graph = import_graph()
    assert "siftmq.filter.backends.arrow" in graph["siftmq.filter.compiler"]  # imported lazily
    assert "siftmq.filter.javalang" in graph["siftmq.filter.ast"]


def test_finds_a_cycle() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    assert find_cycles(import_graph()) == []


def test_relative_and_submodule_imports_resolve() -> None:
    known = {"p", "p.a", "p.b", "p.sub", "p.sub.c", "p.sub.d"}
    code = (
        "from . import d\nfrom .d import thing\nfrom ..b import x\nfrom .. import a, b\n"
        "from p import b\nimport p.sub.d\nfrom p.a import name\nimport os\n"
    )
    inner = [_targets(s, "p.sub.c", Path("p/sub/c.py"), known) for s in _runtime_imports(ast.parse(code))]
    assert inner == [{"p.sub.d"}, {"p.sub.d"}, {"p.b"}, {"p.a", "p.b"}, {"p.b"}, {"p.sub.d"}, {"p.a"}, set()]
    (stmt,) = _runtime_imports(ast.parse("from . import c\n"))
    assert _targets(stmt, "p.sub", Path("p/sub/__init__.py"), known) == {"p.sub.c"}


def test_type_checking_imports_are_not_edges() -> None:
    code = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import p.a\nelse:\n    import p.b\n"
    names = [a.name for s in _runtime_imports(ast.parse(code)) for a in s.names]
    assert names == ["TYPE_CHECKING", "p.b"]
