"""The package's layout holds: imports point one way between fusee's subpackages (docs
DESIGN and docs/engine.md), so a newcomer finds each mechanism in one place and the
cold path imports only what it needs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import fusee

ROOT = Path(fusee.__file__).parent

# Each unit and the units it may import. "base" is the package's top-level modules that
# everything shares (errors, names, the value codec, clocks, the journal's record types);
# "top" is the public face (`fusee/__init__.py`, the CLI), which may import anything.
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "workflow": {"base"},
    "storage": {"base", "protocol"},
    "protocol": {"base"},
    "engine": {"base", "workflow", "storage", "protocol"},
    "testing": {"base", "workflow", "storage", "engine"},
    "client": {"base", "workflow", "protocol", "engine"},
    "invoke": {"base", "workflow", "storage", "protocol", "engine"},
}
TOP = {
    "__init__",
    "__main__",
    "_cli",
    "_cli_backup",
    "_cli_common",
    "_cli_doctor",
    "_cli_journal",
    "_cli_objects",
    "_cli_runs",
    "_cli_tools",
    "sync",
}


def unit_of(module: str) -> str:
    parts = module.split(".")  # fusee.engine.shard, fusee._codec, fusee
    if len(parts) > 1 and (ROOT / parts[1]).is_dir():
        return parts[1]
    if len(parts) == 1 or parts[1] in TOP:
        return "top"
    return "base"


def imports_of(path: Path) -> set[str]:
    """Every fusee module a file imports: at the top, inside functions, and under
    TYPE_CHECKING alike (an annotation's import is a dependency too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "fusee":
                found.update(f"fusee.{alias.name}" for alias in node.names)
            elif node.module.startswith("fusee."):
                found.add(node.module)
                # `from fusee.engine import idle` imports the file idle.py
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("fusee."))
    return found


def unit_graph() -> dict[str, dict[str, list[str]]]:
    """unit -> unit it imports -> the imports that make the edge."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        source = unit_of(module)
        for target in sorted(imports_of(path)):
            dest = unit_of(target)
            if dest != source:
                graph.setdefault(source, {}).setdefault(dest, []).append(f"{module} imports {target}")
    return graph


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle as the list of nodes around it, or None."""
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle_and_passes_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_between_subpackages():
    graph = unit_graph()
    cycle = find_cycle({unit: set(dests) for unit, dests in graph.items()})
    assert cycle is None, "import cycle between subpackages: " + " -> ".join(cycle or [])


def file_graph(package: Path) -> dict[str, set[str]]:
    """Within one subpackage: file -> the files of the same subpackage it imports."""
    prefix = ".".join(package.relative_to(ROOT.parent).parts)
    edges: dict[str, set[str]] = {}
    for path in sorted(package.glob("*.py")):
        targets = {t[len(prefix) + 1 :].split(".")[0] for t in imports_of(path) if t.startswith(prefix + ".")}
        edges[path.stem] = {t for t in targets if t != path.stem and (package / f"{t}.py").exists()}
    return edges


def subpackages() -> list[Path]:
    return sorted({path.parent for path in ROOT.rglob("*.py") if path.parent != ROOT})


def test_the_file_graph_sees_every_kind_of_import(tmp_path):
    """An import inside a function or under TYPE_CHECKING makes an edge as a top-level one
    does: a cycle through an annotation is a cycle a reader walks."""
    (tmp_path / "a.py").write_text("from fusee.pkg import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from fusee.pkg.c import x\n")
    (tmp_path / "c.py").write_text("if TYPE_CHECKING:\n    from fusee.pkg.a import A\n")
    edges = {
        p.stem: {t.split(".")[2] for t in imports_of(p) if t.startswith("fusee.pkg.")}
        for p in tmp_path.glob("*.py")
    }
    assert find_cycle(edges) == ["a", "b", "c", "a"]


def test_no_import_cycle_between_the_files_of_a_subpackage():
    """Inside each subpackage (the engine's shard, runs and helpers above all) imports
    point one way too: each helper takes the narrow interface it uses (a Protocol in its
    own file), so a reader can understand a file from those it imports (docs/engine.md,
    *The map*)."""
    cycles = []
    for package in subpackages():
        cycle = find_cycle(file_graph(package))
        if cycle is not None:
            cycles.append(f"fusee/{package.relative_to(ROOT)}/: " + " -> ".join(cycle))
    assert not cycles, "import cycle between files:\n" + "\n".join(cycles)


def test_each_subpackage_imports_only_the_layers_below_it():
    wrong = []
    for unit, dests in unit_graph().items():
        if unit == "top":
            continue
        assert unit in ALLOWED, f"fusee/{unit}/ is new: say in ALLOWED what it may import"
        for dest, why in dests.items():
            if dest not in ALLOWED[unit]:
                wrong.extend(why)
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_importing_fusee_loads_neither_the_server_nor_the_engine_internals_it_can_defer():
    """`import fusee` is on an invoked function's cold path: the server's distribution,
    the CLI, the replayer, the wire (the client's and the handler's: google_crc32c),
    difflib (replay's diffs), the memory backend (Engine.open's durability="memory"),
    `random` (ctx.random, a retry's jitter) and `secrets` with hmac and OpenSSL's hashlib
    (a run's seed is os.urandom's) load only when used. (ssl and pathlib cannot be pinned
    out here: asyncio loads both itself.)"""
    code = "import sys, fusee; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True
        ).stdout.split()
    )
    assert not {m for m in loaded if m.startswith("fusee_server")}
    assert "fusee._cli" not in loaded
    assert not {m for m in loaded if m.startswith(("fusee.protocol", "google_crc32c"))}
    assert not {"fusee.engine.replay", "fusee.client", "fusee.invoke", "difflib"} & loaded
    assert not {"fusee.storage.memory", "random", "secrets", "hmac", "hashlib", "_hashlib"} & loaded


def test_the_engine_map_in_the_docs_says_who_imports_whom():
    """docs/engine.md's table of who imports whom in fusee/engine/ is the code's graph:
    every file is in it, with exactly the engine files it imports."""
    doc = (ROOT.parent / "docs" / "engine.md").read_text()
    table = doc.split("| file | imports (in `fusee/engine/`) |", 1)[1].split("\n\n", 1)[0]
    documented: dict[str, set[str]] = {}
    for row in table.strip().splitlines()[1:]:
        files, imported = (cell.strip() for cell in row.strip("|").split("|"))
        targets = set() if imported == "nothing" else {name.strip() for name in imported.split(",")}
        for name in files.split(","):
            documented[name.strip().strip("`").removesuffix(".py")] = targets
    graph = file_graph(ROOT / "engine")
    assert documented == {name: targets for name, targets in graph.items() if name != "__init__"}
