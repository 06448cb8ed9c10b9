"""The architecture as docs/concepts.md draws it: no import circles among repro's modules, and no module
importing one from a higher layer (import_graph.LAYERS). Imports inside functions and under
TYPE_CHECKING count: a loop hidden in a function is still a loop in the design."""

from __future__ import annotations

from pathlib import Path

import import_graph
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    return import_graph.graph(ROOT)


def test_no_import_circles(edges: dict[str, set[str]]) -> None:
    assert import_graph.circles(edges) == []


def test_no_import_runs_up_a_layer(edges: dict[str, set[str]]) -> None:
    assert import_graph.upward(edges) == []


def test_every_module_has_a_layer(edges: dict[str, set[str]]) -> None:
    for module in edges:
        import_graph.layer(module)  # KeyError names a module no layer holds


def _planted(edges: dict[str, set[str]], module: str, line: str) -> dict[str, set[str]]:
    """The graph with `line` planted in a function at the end of `module`'s source."""
    source = (ROOT / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8")
    planted = f"{source}\n\ndef _planted() -> None:\n    {line}\n"
    return {**edges, module: import_graph.imports(planted, module, set(edges))}


def test_a_planted_circle_is_found(edges: dict[str, set[str]]) -> None:
    # The shape the run had before its phases were split: a lower module calling back into the orchestrator.
    found = import_graph.circles(_planted(edges, "repro.run.shards", "from repro.run.runner import execute_run"))
    assert any({"repro.run.shards", "repro.run.runner"} <= set(circle) for circle in found), found


def test_a_planted_upward_import_is_found(edges: dict[str, set[str]]) -> None:
    planted = _planted(edges, "repro.store.rundir", "from repro.matrix import spec")
    assert ("repro.store.rundir", "repro.matrix.spec") in import_graph.upward(planted)
