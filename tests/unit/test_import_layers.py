"""The package's folders import each other without a cycle (every import counted, function-level ones included).

A folder is a room with one role (README "Layout"); a cycle between two rooms means one of them holds code of the
other's role. Modules at the package root (``envs``, ``plugin``, ``cli``, ...) are nodes of their own: ``envs`` is
read by every room and ``plugin`` installs from several, which is their role.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Source folder -> import prefix (pyproject.toml: kernels, profiler and patches install under sglang_dspark).
ROOTS = {"sglang_dspark": "sglang_dspark", "kernels": "sglang_dspark.kernels", "profiler": "sglang_dspark.profiler",
         "patches": "sglang_dspark.patches"}


def _node(module: str) -> str:
    """``sglang_dspark.engine.planner`` -> ``engine``; ``sglang_dspark.envs`` -> ``envs``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _modules() -> dict[str, Path]:
    found = {}
    for folder, prefix in ROOTS.items():
        for path in (REPO / folder).rglob("*.py"):
            relative = path.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            found[".".join([prefix, *parts])] = path
    return found


def _imports(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in names if name.startswith("sglang_dspark.") or name == "sglang_dspark"}


def folder_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        source = _node(module)
        if source == "sglang_dspark":
            continue  # the package's __init__
        for name in _imports(path, module):
            while name not in modules and "." in name:  # ``from pkg.module import symbol``
                name = name.rpartition(".")[0]
            target = _node(name)
            if target not in (source, "sglang_dspark"):
                graph.setdefault(source, set()).add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle as a path (first node repeated at the end), or [] when the graph is acyclic."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) == []


def test_the_graph_sees_imports_between_folders():
    graph = folder_graph()
    assert "scheduling" in graph["engine"] and "profiler" in graph["engine"]


def test_no_import_cycle_between_folders():
    cycle = find_cycle(folder_graph())
    if cycle:
        pytest.fail("import cycle between folders: " + " -> ".join(cycle))
