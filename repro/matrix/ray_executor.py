"""`repro matrix --executor ray`: every run (deployment start, load, stop) is one Ray task.

Each task asks for the resources the spec's `resources:` section gives its cell, so Ray places it on
a node that has them, and independent cells run on different nodes at once. A task runs
`repro.matrix.cell.run_cell` in a scratch directory on its node and returns its progress record,
what it printed, and its cells/ and logs/ entries as one archive; the driver unpacks that into the
one matrix directory, so progress.jsonl, `--resume` and the analysis are the local executor's.

A task lost with its node (or its worker) is a failed run, which `--resume` reruns. Interrupting the
driver cancels every task (repro.cluster.rayutil.cancel); the `repro.procs.reaper` of each task's worker sweeps the
process groups that task launched when the worker dies.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console
from rich.text import Text

from repro.cluster.node import where
from repro.cluster.rayutil import (
    as_completed,
    captured,
    connected,
    pack,
    printed,
    replay,
    scratch,
    submit,
    unpack,
)
from repro.matrix.analysis import CellRun
from repro.matrix.cell import CELLS, LOGS, run_cell
from repro.matrix.design import PlannedRun
from repro.matrix.spec import MatrixSpec


def _cell_task(spec: MatrixSpec, run: PlannedRun, total: int, cell_reports: bool) -> tuple[str, str, bytes]:
    """In the Ray worker: one run in a scratch directory; (record JSON, printed text, tar.gz of its cells/ and logs/)."""
    with scratch("repro-cell-") as path:
        (path / CELLS).mkdir()
        console, screen = captured()
        record = run_cell(spec, run, path, total=total, console=console, cell_reports=cell_reports)
        return record.model_dump_json(), printed(screen, path), pack(path, (CELLS, LOGS))


def _failed(run: PlannedRun, why: str) -> CellRun:
    """The record of a run whose task ended without one, or that no live node can take."""
    return CellRun(
        key=run.key, cell=run.cell.as_dict(), replicate=run.replicate, order=run.order, status="failed",
        message=why, node=None,
    )


def execute_on_ray(
    spec: MatrixSpec,
    pending: list[PlannedRun],
    path: Path,
    *,
    total: int,
    console: Console,
    cell_reports: bool,
    address: str | None,
) -> Iterator[tuple[PlannedRun, CellRun]]:
    """Submit every pending run at once; yield each with its record as it ends (in whatever order)."""
    with connected(address) as ray:
        console.print(Text(f"Ray executor: {len(pending)} run(s) submitted to the cluster from {where()['hostname']}"))
        runs: dict[Any, PlannedRun] = {}
        asked: dict[Any, dict[str, float]] = {}
        for run in pending:
            resources = spec.resources.for_cell(run.cell.as_dict())
            ref = submit(ray, _cell_task, resources, f"repro-{run.key}", spec, run, total, cell_reports)
            runs[ref], asked[ref] = run, resources
        # Closed explicitly, before the disconnect: leaving early cancels the tasks still out.
        with contextlib.closing(as_completed(ray, asked, console)) as ended:
            for ref, value, why in ended:
                run = runs[ref]
                if why is not None:
                    yield run, _failed(run, why)
                    continue
                record_json, text, archive = value
                unpack(archive, path)
                replay(console, text, path)
                yield run, CellRun.model_validate_json(record_json)
