"""Check every cell of a matrix before its first server starts: the workload loads, every cell's commands,
URLs and hooks substitute, and every launched program is on PATH. A fault is one line naming the spec
line at fault, not a failed cell an hour into the matrix."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from repro.errors import UsageError
from repro.matrix.deploy import LaunchPlan, resolve
from repro.matrix.design import PlannedRun, cells
from repro.matrix.fingerprint import workload_sha256
from repro.matrix.spec import MatrixSpec, SpecFile

PLACEHOLDER_PORT = 1
"""Stands for an `auto` port while checking: no socket is bound."""


@dataclass(frozen=True)
class Checked:
    """What checking the cells found good: each cell's launch plan by name, and the sha256 of the workload
    (hashed as it was checked, so the plan's fingerprint needs no second pass over a long trace)."""

    plans: dict[str, LaunchPlan]
    workload_sha256: str


def _deployment_loc(spec: MatrixSpec, name: str) -> tuple:
    return ("deployment",) if spec.deployment is not None else ("deployments", name)


def check_cells(source: SpecFile) -> Checked:
    """Load the workload and resolve every cell's launch (ports from `auto` left as a placeholder).
    UsageError, naming the spec line at fault, on the first that fails."""
    spec = source.spec
    try:
        workload = workload_sha256(spec)
    except UsageError as err:
        raise UsageError(f"{source.line(('load', 'workload'))}: load.workload: {err}") from None
    plans: dict[str, LaunchPlan] = {}
    for cell in cells(spec):
        run = PlannedRun(cell, replicate=1, order=0)
        try:
            plans[cell.name] = resolve(spec, run, log_dir=Path("logs") / run.key, port_source=lambda: PLACEHOLDER_PORT)
        except UsageError as err:
            loc = _deployment_loc(spec, next(iter(spec.named_deployments())))
            raise UsageError(f"{source.line(loc)}: cell {cell.name}: {err}") from None
    return Checked(plans=plans, workload_sha256=workload)


def missing_programs(source: SpecFile, plans: dict[str, LaunchPlan]) -> list[str]:
    """One line per launched program not found on this machine's PATH (each named once, with its spec line)."""
    found: dict[str, str] = {}
    for plan in plans.values():
        loc = _deployment_loc(source.spec, plan.deployment)
        for launch in plan.processes:
            if launch.argv and launch.argv[0] not in found and shutil.which(launch.argv[0]) is None:
                found[launch.argv[0]] = (f"{source.line(loc)}: {'.'.join(loc)}: {launch.name}: "
                                         f"{launch.argv[0]!r} is not found on PATH")
    return list(found.values())


def preflight(source: SpecFile, *, programs: bool = True) -> str:
    """`repro matrix`'s check before anything starts: UsageError (exit 2) on the first fault; the workload's
    sha256 when all is well. `programs`: whether the launched programs must be on this machine's PATH (not
    when cells run on other nodes)."""
    checked = check_cells(source)
    problems = missing_programs(source, checked.plans) if programs else []
    if problems:
        raise UsageError(problems[0])
    return checked.workload_sha256
