"""No import cycle among opprof's modules: an AST scan of every import statement of every module
(top-level, inside a function, under ``TYPE_CHECKING``), relative imports resolved, the source
folders collectors/ and normalizers/ under their installed names (``opprof.collectors.*``,
``opprof.normalizers.*``). ``from P import m`` is an import of the module ``P.m`` when there
is one, else of ``P``; a package's ``__init__`` running before its module is Python's doing,
not an import statement, and is no edge."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

#: Source folder → the package it installs as.
ROOTS = {"opprof": "opprof", "collectors": "opprof.collectors",
         "normalizers": "opprof.normalizers"}


def modules() -> dict[str, Path]:
    """Every module of opprof, by its installed name."""
    out: dict[str, Path] = {}
    for folder, package in ROOTS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _resolve(name: str, known: set[str]) -> str | None:
    """The module of ``known`` that ``name`` (a module or a name in one) is: the longest
    prefix of it that is a module."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    """Module → the opprof modules its import statements name."""
    mods = modules()
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                           for a in node.names]
            for t in targets:
                hit = _resolve(t, known)
                if hit is not None and hit != name:
                    edges.add(hit)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a → … → a) through each strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_path_in(graph, set(g)) for g in groups]


def _path_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest cycle through the group's first module, within the group."""
    start = min(group)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(group)


def test_the_scan_sees_lazy_relative_and_installed_name_imports() -> None:
    graph = import_graph()
    assert len(graph) > 100
    # a function-level import (readahead reads with the Kineto reader in its second process)
    assert "opprof.normalizers.kineto" in graph["opprof.readahead"]
    # collectors/ under its installed name
    assert "opprof.collectors.runner" in graph["opprof.collectors.worker"]
    found = cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert found == [["a", "b", "c", "a"]]


def test_no_import_cycle_among_opprofs_modules() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles:\n" + "\n".join(" → ".join(c) for c in found)
