"""The import graph of repro's own modules, read from the source (every import: top level, inside
functions, under TYPE_CHECKING), and the layer rule it must keep. Used by tests/test_architecture.py."""

from __future__ import annotations

import ast
from pathlib import Path

LAYERS: list[tuple[str, ...]] = [
    ("repro", "repro.untrusted", "repro.errors"),
    ("dsml_checker", "repro.stats"),
    ("repro.wire", "repro.workload", "repro.store", "repro.procs", "repro.cluster"),
    ("repro.sim",),
    ("repro.report",),
    ("repro.run",),
    ("repro.sweep", "repro.matrix", "repro.bisect"),
    ("repro.schemas",),
    ("repro.cli",),
]
"""Low to high: a module may import its own layer's modules and lower ones, never a higher layer's."""


def modules(root: Path, packages: tuple[str, ...] = ("repro", "dsml_checker")) -> dict[str, Path]:
    """Every module of `packages` under `root`, by dotted name (a package by its own name)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(source: str, name: str, known: set[str], *, is_package: bool = False) -> set[str]:
    """The known modules `source` (module `name`) imports, wherever the import stands; `from p import m`
    counts m when m is a module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph(root: Path) -> dict[str, set[str]]:
    """Module → the modules it imports, for every module under `root`."""
    found = modules(root)
    known = set(found)
    return {name: imports(path.read_text(encoding="utf-8"), name, known, is_package=path.name == "__init__.py")
            for name, path in found.items()}


def layer(module: str) -> int:
    """The index in LAYERS of the longest prefix that names `module`'s place."""
    best, depth = None, -1
    for index, members in enumerate(LAYERS):
        for member in members:
            if (module == member or module.startswith(member + ".")) and member.count(".") > depth:
                best, depth = index, member.count(".")
    if best is None:
        raise KeyError(f"{module} is in no layer: add it to LAYERS")
    return best


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a module to one in a higher layer."""
    return sorted((source, target) for source, targets in edges.items() for target in targets
                  if layer(target) > layer(source))
