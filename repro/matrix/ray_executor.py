"""`repro matrix --executor ray`: every run (deployment start, load, stop) is one Ray task.

Each task asks for the resources the spec's `resources:` section gives its cell, so Ray places it on
a node that has them, and independent cells run on different nodes at once. A task runs
`repro.matrix.runner.run_cell` in a scratch directory on its node and returns its progress record,
what it printed, and its cells/ and logs/ entries as one archive; the driver unpacks that into the
one matrix directory, so progress.jsonl, `--resume` and the analysis are the local executor's.

A task lost with its node (or its worker) is a failed run, which `--resume` reruns. Interrupting the
driver cancels every task: first as Ctrl-C inside it (the deployment is stopped by its own teardown),
then by force after the deployments' stop time; the `repro.reaper` of each task's worker sweeps the
process groups that task launched when the worker dies.
"""

from __future__ import annotations

import io
import shutil
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console
from rich.text import Text

from repro.matrix.analysis import CellRun
from repro.matrix.design import PlannedRun
from repro.matrix.spec import MatrixSpec
from repro.node import where
from repro.rayutil import alive_nodes, connect, fits, task_options

CANCEL_GRACE_S = 60.0
"""After Ctrl-C, how long the tasks get to stop their deployments before they are killed."""
SCRATCH = "\x00scratch\x00"
"""Stands for the task's scratch directory in what it printed; the driver puts the matrix directory there."""
UNPLACEABLE_AFTER_S = 10.0
"""A run no live node can take fails after this long (an autoscaler may add such a node meanwhile)."""


def _cell_task(spec: MatrixSpec, run: PlannedRun, total: int, cell_reports: bool) -> tuple[str, str, bytes]:
    """In the Ray worker: one run in a scratch directory; (record JSON, printed text, tar.gz of the directory)."""
    from repro.matrix.runner import CELLS, LOGS, run_cell

    scratch = Path(tempfile.mkdtemp(prefix="repro-cell-"))
    screen = io.StringIO()
    try:
        (scratch / CELLS).mkdir()
        # Wide: the scratch path in what it prints is replaced by the matrix directory's, so it must not wrap.
        console = Console(file=screen, width=400, highlight=False)
        record = run_cell(spec, run, scratch, total=total, console=console, cell_reports=cell_reports)
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w:gz") as tar:
            for top in (CELLS, LOGS):
                if (scratch / top).exists():
                    tar.add(scratch / top, arcname=top)
        return record.model_dump_json(), screen.getvalue().replace(str(scratch), SCRATCH), archive.getvalue()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _unpack(archive: bytes, path: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        tar.extractall(path, filter="data")  # refuses absolute paths, links out of the directory, devices


def _failed(run: PlannedRun, resources: dict[str, float], err: BaseException | None) -> CellRun:
    """The record of a run whose task ended without one (`err`), or that no live node can take (None)."""
    if err is None:
        message = (f"no live node of the cluster has the resources this run asks for ({resources}) "
                   f"for {UNPLACEABLE_AFTER_S:g}s")
    else:
        detail = str(err).strip().splitlines()
        message = f"the Ray task ended without a result ({type(err).__name__}: {detail[0] if detail else ''})"
    return CellRun(
        key=run.key, cell=run.cell.as_dict(), replicate=run.replicate, order=run.order, status="failed",
        message=f"{message}; resources {resources}", node=None,
    )


def _unplaceable(
    ray: Any, refs: dict[Any, PlannedRun], ready: list[Any], asked: dict[str, dict[str, float]], since: dict[Any, float]
) -> list[Any]:
    """Tasks that no live node could run for UNPLACEABLE_AFTER_S: Ray would keep them pending for ever
    (the node that had the resource died, or none ever had it)."""
    totals = [node["Resources"] for node in alive_nodes(ray)]
    now = time.monotonic()
    out = []
    for ref, run in refs.items():
        if ref in ready or any(fits(asked[run.key], node) for node in totals):
            since.pop(ref, None)
        elif now - since.setdefault(ref, now) >= UNPLACEABLE_AFTER_S:
            out.append(ref)
    return out


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
    ray, connected = connect(address)
    console.print(Text(f"Ray executor: {len(pending)} run(s) submitted to the cluster from {where()['hostname']}"))
    remote = ray.remote(max_retries=0)(_cell_task)
    asked = {run.key: spec.resources.for_cell(run.cell.as_dict()) for run in pending}
    refs = {
        remote.options(**task_options(asked[run.key]), name=f"repro-{run.key}").remote(spec, run, total, cell_reports): run
        for run in pending
    }
    unplaceable: dict[Any, float] = {}
    try:
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
            for ref in _unplaceable(ray, refs, ready, asked, unplaceable):
                run = refs.pop(ref)
                ray.cancel(ref, force=False)
                yield run, _failed(run, asked[run.key], None)
            for ref in ready:
                run = refs.pop(ref)
                try:
                    record_json, printed, archive = ray.get(ref)
                except ray.exceptions.RayError as err:
                    yield run, _failed(run, asked[run.key], err)
                    continue
                _unpack(archive, path)
                for line in printed.replace(SCRATCH, str(path)).splitlines():
                    console.print(Text(line), soft_wrap=True)  # laid out on the node already
                yield run, CellRun.model_validate_json(record_json)
    finally:
        _cancel(ray, list(refs), console)
        if connected:
            ray.shutdown()


def _cancel(ray: Any, refs: list[Any], console: Console) -> None:
    """Stop the tasks still out: Ctrl-C in each (its deployment stops), then force after CANCEL_GRACE_S."""
    if not refs:
        return
    console.print(Text(f"cancelling {len(refs)} Ray task(s)"))
    for ref in refs:
        ray.cancel(ref, force=False)
    deadline = time.monotonic() + CANCEL_GRACE_S
    left = refs
    while left and time.monotonic() < deadline:
        _, left = ray.wait(left, num_returns=len(left), timeout=0.5)
    for ref in left:
        ray.cancel(ref, force=True)
