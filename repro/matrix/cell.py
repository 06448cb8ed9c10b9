"""One run of one matrix cell: launch its deployment, confirm it, run the load on it, stop it.

The local executor calls `run_cell` in its own process; the Ray executor calls it in a task on the node
the cell's resources pick, with a scratch directory whose cells/ and logs/ go back to the driver.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.text import Text

from repro.cluster.node import where
from repro.errors import TargetError
from repro.matrix.analysis import CellRun
from repro.matrix.deploy import CellDeployment, describe, resolve
from repro.matrix.design import PlannedRun
from repro.matrix.exercise import not_exercised
from repro.matrix.spec import AUTO, MatrixSpec
from repro.procs.process import PortTakenError, one_line
from repro.run.options import RunOptions
from repro.run.runner import execute_run
from repro.store.paths import slug

CELLS = "cells"
LOGS = "logs"
PORT_ATTEMPTS = 3


def run_cell(
    spec: MatrixSpec, run: PlannedRun, path: Path, *, total: int, console: Console, cell_reports: bool
) -> CellRun:
    """One run of one cell under the matrix directory `path`: launch, confirm, load, stop; its progress record.

    The local executor calls it in this process; the Ray executor in a task on the node the cell's
    resources pick, with `path` a scratch directory whose cells/ and logs/ go back to the driver.
    """
    log_dir = path / LOGS / run.key
    launch = resolve(spec, run, log_dir=log_dir)  # for the load's URL; relaunches on lost ports resolve anew
    load = dict(spec.load)
    load.update(
        base_url=f"{launch.url}/v1",
        out=str(path / CELLS / run.key),
        name=f"{slug(spec.name)}-{run.key}",
        seed=int(load.get("seed", 0)) + run.replicate - 1,
    )
    options = RunOptions.model_validate(load)
    base = dict(
        key=run.key, cell=run.cell.as_dict(), replicate=run.replicate, order=run.order, launch=describe(launch),
        node=where(),
    )
    console.print(Text(f"[{run.order + 1}/{total}] cell {run.cell.name} replicate {run.replicate}: launching"))
    started = time.monotonic()
    # Ports the harness chose (`auto`) can be chosen again when another process takes one before the bind.
    attempts = PORT_ATTEMPTS if AUTO in spec.variables.values() else 1
    try:
        for attempt in range(1, attempts + 1):
            deployment = CellDeployment(launch, log_dir, cell=run.key)
            watch = deployment.watch()
            try:
                confirmation = deployment.start()
                break
            except PortTakenError as err:
                if attempt == attempts:
                    raise
                # Another process took a port between its choice and the bind (two matrices on one machine).
                console.print(Text(f"  {one_line(str(err))}; relaunching on fresh ports"))
                launch = resolve(spec, run, log_dir=log_dir)
                options = options.model_copy(update={"base_url": f"{launch.url}/v1"})
                base["launch"] = describe(launch)
        try:
            with watch:
                for note in confirmation.notes:
                    console.print(Text(f"  not verified: {note}"))
                result = execute_run(options, console=console, live=False, report=cell_reports)
        finally:
            deployment.stop()
    except TargetError as err:
        message = watch.exit.message(run.key) if watch.exit else str(err)
        return CellRun(
            status="failed",
            message=message,
            notes=deployment.log_notes(),
            duration_s=time.monotonic() - started,
            **base,
        )
    notes = confirmation.notes + deployment.log_notes()
    if watch.exit is not None:
        # The sessions measured a deployment that was falling apart: not a result. Moved aside
        # (kept for a post-mortem) so that --resume reruns the cell.
        aside = move_aside(path / CELLS / run.key)
        return CellRun(
            status="failed",
            message=watch.exit.message(run.key),
            run_dir=aside.relative_to(path).as_posix(),
            notes=notes,
            duration_s=time.monotonic() - started,
            **base,
        )
    if result.summary.interrupted:
        raise KeyboardInterrupt
    idle = not_exercised(spec, run.cell.as_dict(), result.path, confirmation.server_info)
    if idle is not None:
        # Its clean sessions say nothing about a level that never acted: named, left out, rerun by --resume.
        aside = move_aside(path / CELLS / run.key)
        return CellRun(
            status="failed",
            message=f"not exercised: {idle}",
            run_dir=aside.relative_to(path).as_posix(),
            notes=notes,
            duration_s=time.monotonic() - started,
            **base,
        )
    exercised = result.summary.exercised
    return CellRun(
        status="finished",
        exercised=exercised.values() if exercised else {},
        counts=dict(result.summary.counts),
        wedged=result.summary.wedged,
        run_dir=f"{CELLS}/{run.key}",
        server_info=confirmation.server_info,
        notes=notes,
        duration_s=time.monotonic() - started,
        **base,
    )


def move_aside(run_dir: Path) -> Path:
    """Rename a run directory that is not a result to `<name>.partial-N`, kept for a post-mortem."""
    n = 1
    while (aside := run_dir.with_name(f"{run_dir.name}.partial-{n}")).exists():
        n += 1
    run_dir.rename(aside)
    return aside
