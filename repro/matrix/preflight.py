"""Check every cell of a matrix before its first server starts: the workload loads, every cell's commands,
URLs and hooks substitute, and every launched program is on PATH. A fault is one line naming the spec
line at fault, not a failed cell an hour into the matrix."""

from __future__ import annotations

import shutil
from pathlib import Path

from repro.errors import UsageError, yaml_lines
from repro.matrix.deploy import LaunchPlan, resolve
from repro.matrix.design import PlannedRun, cells
from repro.matrix.fingerprint import workload_sha256
from repro.matrix.spec import MatrixSpec, SpecLoader, spec_line

PLACEHOLDER_PORT = 1
"""Stands for an `auto` port while checking: no socket is bound."""


def _deployment_loc(spec: MatrixSpec, name: str) -> tuple:
    return ("deployment",) if spec.deployment is not None else ("deployments", name)


def check_cells(spec: MatrixSpec, source: Path) -> dict[str, LaunchPlan]:
    """Resolve every cell's launch (ports from `auto` left as a placeholder) and load the workload; the
    launch plans by cell name. UsageError, naming the spec line at fault, on the first that fails."""
    lines = yaml_lines(Path(source).read_text(encoding="utf-8"), SpecLoader)
    try:
        workload_sha256(spec)
    except UsageError as err:
        raise UsageError(f"{spec_line(source, lines, ('load', 'workload'))}: load.workload: {err}") from None
    plans: dict[str, LaunchPlan] = {}
    for cell in cells(spec):
        run = PlannedRun(cell, replicate=1, order=0)
        try:
            plans[cell.name] = resolve(spec, run, log_dir=Path("logs") / run.key, port_source=lambda: PLACEHOLDER_PORT)
        except UsageError as err:
            loc = _deployment_loc(spec, next(iter(spec.named_deployments())))
            raise UsageError(f"{spec_line(source, lines, loc)}: cell {cell.name}: {err}") from None
    return plans


def missing_programs(spec: MatrixSpec, source: Path, plans: dict[str, LaunchPlan]) -> list[str]:
    """One line per launched program not found on this machine's PATH (each named once, with its spec line)."""
    lines = yaml_lines(Path(source).read_text(encoding="utf-8"), SpecLoader)
    found: dict[str, str] = {}
    for plan in plans.values():
        loc = _deployment_loc(spec, plan.deployment)
        for launch in plan.processes:
            if launch.argv and launch.argv[0] not in found and shutil.which(launch.argv[0]) is None:
                found[launch.argv[0]] = (f"{spec_line(source, lines, loc)}: {'.'.join(loc)}: {launch.name}: "
                                         f"{launch.argv[0]!r} is not found on PATH")
    return list(found.values())


def preflight(spec: MatrixSpec, source: Path, *, programs: bool = True) -> None:
    """`repro matrix`'s check before anything starts: UsageError (exit 2) on the first fault. `programs`:
    whether the launched programs must be on this machine's PATH (not when cells run on other nodes)."""
    plans = check_cells(spec, source)
    problems = missing_programs(spec, source, plans) if programs else []
    if problems:
        raise UsageError(problems[0])
