"""`server/fusee_server/` is a graph without a circle, file by file: each room imports only
rooms below it (docs/server.md, *The server's rooms*). Imports made for type checking only
count too: a circle there is a back-pointer all the same."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "server" / "fusee_server"


def imports(path: Path) -> set[str]:
    """The modules of fusee_server that `path` imports, by module name."""
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "fusee_server" and len(parts) > 1 and parts[1] in modules:
                found.add(parts[1])
    found.discard(path.stem)
    return found


def graph() -> dict[str, set[str]]:
    return {path.stem: imports(path) for path in sorted(PACKAGE.glob("*.py"))}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports, as the modules along it (the first one again last), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(edges.get(node, ())):
            found = visit(target)
            if found is not None:
                return found
        path.pop()
        done.add(node)
        return None

    for node in sorted(edges):
        found = visit(node)
        if found is not None:
            return found
    return None


def test_the_cycle_finder_finds_a_circle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_server_package_imports_without_a_circle() -> None:
    edges = graph()
    assert {"server", "leases", "relay", "disk", "invoker", "listener"} <= set(edges)
    assert edges["server"] >= {"leases", "relay", "disk", "listener"}
    found = cycle(edges)
    assert found is None, f"an import circle: {' -> '.join(found or [])}"
