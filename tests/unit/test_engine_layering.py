"""The engine's modules import each other without cycles, type-only imports included.

A cycle hidden behind ``if TYPE_CHECKING`` still means two modules know each other's
internals; the engine is layered instead: the state owner (:mod:`translation.state`) under the
request flows (:mod:`translation.heartbeat`, :mod:`translation.describe`), under the entry point
(:mod:`translation.coordinator`), under the classic translation. Test modules of the simulator
are left out (they drive the whole engine).
"""

from __future__ import annotations

import ast
import pathlib

import translation

ROOT = pathlib.Path(translation.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: pathlib.Path, name: str, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            if target in known and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    paths = {
        _module_name(p): p for p in ROOT.rglob("*.py") if "simulation" not in p.parts
    }
    known = set(paths)
    return {name: _imports(path, name, known) for name, path in paths.items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_engine_has_no_import_cycle() -> None:
    graph = _graph()
    assert "translation.state" in graph["translation.heartbeat"]  # the graph is really read
    cycle = _find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None
