"""The package's modules import one another without a circle (decision 0019).

The graph is read from the source: every ``import`` and ``from ... import`` of a package module, at
module level and inside functions alike (a lazy import is still a dependency), except those under
``if TYPE_CHECKING:`` (never run). ``from pkg import name`` is an edge to ``pkg.name`` when that is a
module, else to ``pkg``; a name the package root serves lazily (``_LAZY``) is an edge to the
module that defines it. Importing ``pkg.sub.mod`` runs ``pkg/sub/__init__.py`` first, so it is an
edge to ``pkg.sub`` too, unless the importer lives in ``pkg.sub`` (which has run by then); the
root's ``__init__`` is the public facade every import passes and is left out of those edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

import django_workhorse

PACKAGE = Path(django_workhorse.__file__).resolve().parent
ROOT = "django_workhorse"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    return {
        module_name(path): path for path in PACKAGE.rglob("*.py") if "migrations" not in path.relative_to(PACKAGE).parts
    }


def _type_checking_blocks(tree: ast.Module) -> set[int]:
    """The ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for inner in ast.walk(node) if isinstance(inner, (ast.Import, ast.ImportFrom)))
    return skipped


def _resolve_from(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if _is_package(module) else 0)]
    return ".".join([*base, node.module] if node.module else base)


def _is_package(module: str) -> bool:
    return package_modules()[module].name == "__init__.py"


def lazy_names() -> dict[str, str]:
    """The root's names served by ``__getattr__``: name -> defining module."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and target.id == "_LAZY" and node.value is not None:
                return ast.literal_eval(node.value)
    return {}


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    lazy = lazy_names()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skipped = _type_checking_blocks(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _resolve_from(name, node)
                for alias in node.names:
                    candidate = f"{source}.{alias.name}"
                    if candidate in modules:
                        targets.append(candidate)
                    elif source == ROOT and alias.name in lazy:
                        targets.append(lazy[alias.name])
                    else:
                        targets.append(source)
            found = {target for target in targets if target in modules}
            found |= {parent for target in found for parent in _parent_packages(target, name, modules)}
            graph[name].update(found - {name})
    return graph


def _parent_packages(target: str, importer: str, modules: dict[str, Path]) -> list[str]:
    """The packages whose ``__init__`` importing ``target`` runs, but the root and the importer's own."""
    parts = target.split(".")
    parents = [".".join(parts[:i]) for i in range(2, len(parts))]
    return [p for p in parents if p in modules and not (importer == p or importer.startswith(p + "."))]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_graph_sees_function_level_imports_and_skips_type_checking_ones():
    graph = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert cycles(graph) == [["a", "b"]]
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\ndef f():\n    import y\n"
    tree = ast.parse(source)
    skipped = _type_checking_blocks(tree)
    seen = [n.names[0].name for n in ast.walk(tree) if isinstance(n, ast.Import) and id(n) not in skipped]
    assert seen == ["y"]


def test_the_graph_covers_every_room():
    graph = import_graph()
    rooms = {name.split(".")[1] for name in graph if name.count(".") >= 1}
    assert {"enqueueing", "tasks", "schedules", "effects", "observability", "operations", "worker", "sql"} <= rooms
    assert "django_workhorse.schedules.evaluation" in graph["django_workhorse.worker.loop"]  # function-level
