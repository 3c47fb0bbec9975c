"""The gate package's modules import one another without a cycle (``TYPE_CHECKING`` imports count too): each
module can be read, and tested, on top of the ones it imports."""

from __future__ import annotations

import ast
from pathlib import Path

import claude_bottle.gate

PACKAGE = "claude_bottle.gate"


def imports() -> dict[str, set[str]]:
    """Each module of the package, and the modules of the package it imports anywhere in its text."""
    folder = Path(claude_bottle.gate.__file__).parent
    modules = {f"{PACKAGE}.{path.stem}": path for path in folder.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found |= {node.module} & modules.keys()
                found |= {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names} & modules.keys()
        graph[name] = found - {name}
    return graph


def test_no_import_cycle_in_the_gate() -> None:
    graph = imports()
    assert f"{PACKAGE}.connection" in graph and graph[f"{PACKAGE}.api"], "the package was read"
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        for imported in sorted(graph[module]):
            assert imported not in path, "import cycle: " + " -> ".join((*path[path.index(imported):], imported))
            if imported not in done:
                visit(imported, (*path, imported))
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, (module,))
