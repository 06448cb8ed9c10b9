"""`--matrix-deployment SPEC.yaml`: a commit bisection deploys each commit the way a matrix spec
deploys one of its cells (processes, readiness, `/server_info` confirmation, hooks), with the
spec's variables `rev` and `src` set to the commit and its checkout. The spec's `load:` section
gives the probes' load options (the command line wins).
"""

from __future__ import annotations

from pathlib import Path

from repro.errors import UsageError
from repro.matrix.deploy import LaunchPlan, resolve
from repro.matrix.design import Cell, PlannedRun
from repro.matrix.spec import MatrixSpec, load_spec

COMMIT_VARIABLES = ("rev", "src")


def load_deployment(path: Path, cell_text: str | None) -> tuple[MatrixSpec, Cell]:
    """The spec and the cell whose deployment every probe launches: `factor=level,...` over the
    spec's baseline (each factor's baseline or first level)."""
    spec = load_spec(path)
    missing = [name for name in COMMIT_VARIABLES if name not in spec.variables]
    if missing:
        raise UsageError(f"{path}: declare the variable {missing[0]!r} under variables (the bisection sets it per commit)")
    chosen = spec.baseline()
    for item in [part for part in (cell_text or "").split(",") if part.strip()]:
        factor, sep, level = item.partition("=")
        factor, level = factor.strip(), level.strip()
        if not sep or factor not in spec.factors or level not in spec.factors[factor].levels:
            raise UsageError(f"--matrix-cell {item!r}: expected FACTOR=LEVEL with a factor and level of {path}")
        chosen[factor] = level
    return spec, Cell(tuple((factor, chosen[factor]) for factor in spec.factors))


def commit_launch(spec: MatrixSpec, cell: Cell, *, rev: str, src: Path, log_dir: Path) -> LaunchPlan:
    """The cell's launch plan for one commit."""
    variables = {**spec.variables, "rev": rev, "src": str(src)}
    return resolve(spec.model_copy(update={"variables": variables}), PlannedRun(cell, 1, 0), log_dir=log_dir)
