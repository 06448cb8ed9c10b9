"""The matrix loop: one deployment launch and one `repro run` per planned (cell, replicate), in the
design's randomised order, with results under one matrix directory.

Matrix directory: spec.yaml (the spec as given), plan.json (the run order and what it was resolved
from), progress.jsonl (one line per ended run, flushed and fsynced), cells/<cell>-r<k>/ (the run
directories), logs/<cell>-r<k>/ (each launched process's output and processes.json), matrix.json
(the analysis, rewritten atomically after every run), report.html, report.md, junit.xml.

`--resume` keeps every run whose directory holds a summary.json with `interrupted: false`, moves
unfinished run directories aside and reruns them; SIGKILL therefore loses no finished cell.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from rich.console import Console
from rich.table import Table
from rich.text import Text

from repro.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TARGET,
    InternalError,
    UsageError,
    is_interrupt,
    request_interrupt,
)
from repro.jsonl import read_journal, read_json_object
from repro.matrix import sequential
from repro.matrix.analysis import CellRun, MatrixAnalysis, analyse, cell_counts
from repro.matrix.cell import CELLS, LOGS, move_aside, run_cell
from repro.matrix.deploy import stop_stale
from repro.matrix.design import Cell, PlannedRun, cells, plan
from repro.matrix.fingerprint import plan_fields, resume_refusal
from repro.matrix.plan import Plan, PlannedEntry
from repro.matrix.preflight import preflight
from repro.matrix.report import write_reports
from repro.matrix.sidechannels import add_side_channels, summary_lines
from repro.matrix.spec import MatrixSpec, SpecFile, read_spec
from repro.cluster.rayutil import Executor, check_executor
from repro.store.records import Summary
from repro.store.paths import default_dir
from repro.store.rundir import SUMMARY, dump_json
from repro.cluster.rayutil import connected
from repro.cluster.rayutil import require_ray
from repro.matrix.ray_executor import execute_on_ray

SPEC_COPY = "spec.yaml"
PLAN = "plan.json"
PROGRESS = "progress.jsonl"
MATRIX_JSON = "matrix.json"
"""Launches of a run whose `auto` port another process took between its choice and the bind."""


@dataclass(frozen=True)
class MatrixResult:
    path: Path
    analysis: MatrixAnalysis
    exit_code: int
    analysis_error: str | None = None
    """Why the per-factor analysis failed (a harness bug); `analysis` then holds the cells only."""




def finished_summary(run_dir: Path) -> Summary | None:
    """The summary of a run that finished (kept by --resume); None for one to run again."""
    file = run_dir / SUMMARY
    if not file.exists():
        return None
    try:
        summary = Summary.model_validate_json(file.read_text(encoding="utf-8"))
    except ValueError:
        return None
    return None if summary.interrupted else summary


def check_directory(spec: MatrixSpec, path: Path, *, resume: bool, workload: str) -> None:
    """UsageError unless `path` can hold this matrix: without `resume` a new or empty directory, with it one
    whose plan.json this spec and workload (its sha256) may continue. The runner and --dry-run both ask."""
    if not resume:
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise UsageError(f"--out {path}: exists and is not empty; choose a new path or pass --resume")
        return
    if not (path / PLAN).exists():
        raise UsageError(f"--resume {path}: not a matrix directory (no {PLAN})")
    refusal = resume_refusal(read_json_object(path / PLAN, f"--resume {path}"), spec, workload, str(path))
    if refusal is not None:
        raise UsageError(refusal)


def _read_progress(path: Path) -> dict[str, CellRun]:
    """The last record per run key; a torn last line (SIGKILL mid-write) is ignored."""
    return {record.key: record for record in read_journal(path, CellRun.model_validate_json)}


def _append_progress(path: Path, record: CellRun) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(record.model_dump_json() + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _record_from_summary(run: PlannedRun, summary: Summary, rel: str, previous: CellRun | None) -> CellRun:
    extra = previous.model_dump(include={"server_info", "notes", "launch", "duration_s", "node"}) if previous else {}
    return CellRun(
        key=run.key,
        cell=run.cell.as_dict(),
        replicate=run.replicate,
        order=run.order,
        status="finished",
        counts=dict(summary.counts),
        wedged=summary.wedged,
        run_dir=rel,
        exercised=summary.exercised.values() if summary.exercised else {},
        **extra,
    )


class MatrixRunner:
    """Runs (or resumes) one matrix; `run()` returns the analysis and the exit code."""

    def __init__(
        self,
        source: SpecFile,
        path: Path,
        *,
        workload_sha256: str,
        resume: bool = False,
        keep_going: bool = False,
        cell_reports: bool = True,
        console: Console | None = None,
        executor: Executor = "local",
        ray_address: str | None = None,
    ) -> None:
        spec = source.spec
        problems = spec.problems()
        if problems:
            loc, message = problems[0]
            raise UsageError(f"{'.'.join(map(str, loc)) or 'spec'}: {message}")
        self.spec = spec
        self.path = Path(path)
        self.keep_going = keep_going
        self.cell_reports = cell_reports
        self.executor = executor
        self.ray_address = ray_address
        self.console = console or Console(stderr=True, highlight=False)
        self.runs = plan(spec)
        self.cell_order = [c.as_dict() for c in cells(spec)]
        self.records: dict[str, CellRun] = {}
        self.looks: list[sequential.RoundLook] = []
        self.workload_sha256 = workload_sha256
        """The workload's sha256, as preflight hashed it (repro.matrix.fingerprint)."""
        self._prepare(source.text, resume)

    def _prepare(self, spec_text: str, resume: bool) -> None:
        check_directory(self.spec, self.path, resume=resume, workload=self.workload_sha256)
        if resume:
            self.records = _read_progress(self.path / PROGRESS)
            return
        (self.path / CELLS).mkdir(parents=True, exist_ok=True)
        (self.path / SPEC_COPY).write_text(spec_text, encoding="utf-8")
        runs = [PlannedEntry(key=r.key, cell=r.cell.as_dict(), replicate=r.replicate, order=r.order) for r in self.runs]
        plan_record = Plan(name=self.spec.name, variables=self.spec.variables, runs=runs, **plan_fields(self.spec, self.workload_sha256))
        dump_json(self.path / PLAN, plan_record.model_dump(mode="json"))

    def _finished(self, run: PlannedRun) -> CellRun | None:
        run_dir = self.path / CELLS / run.key
        summary = finished_summary(run_dir)
        if summary is None:
            log_dir = self.path / LOGS / run.key
            stale = stop_stale(log_dir)
            if stale:
                self.console.print(Text(f"stopped {', '.join(stale)} left running by an earlier harness ({run.key})"))
            for leftover in (run_dir, log_dir):
                if leftover.exists():
                    move_aside(leftover)
            return None
        return _record_from_summary(run, summary, f"{CELLS}/{run.key}", self.records.get(run.key))

    def _write_matrix(self, *, effects: bool = True, interrupted: bool = False) -> MatrixAnalysis:
        runs = list(self.records.values())
        if not self.spec.design.sequential:
            analysis = analyse(self.spec, runs, self.cell_order, len(self.runs), effects=effects)
        else:
            analysis = analyse(sequential.look_spec(self.spec), runs, self.cell_order, len(self.runs), effects=effects)
            spent = sequential.record(self.spec, self.looks, runs, len(self.runs), interrupted=interrupted)
            analysis.sequential = dataclasses.asdict(spent)
        if effects:
            add_side_channels(analysis, self.path, runs)
        dump_json(self.path / MATRIX_JSON, analysis.to_json())
        return analysis

    def run(self) -> MatrixResult:
        exit_code = EXIT_OK
        interrupted = False
        try:
            with self._executor_connection():
                exit_code = self._run_rounds() if self.spec.design.sequential else self._run_all(self.runs)[0]
        except BaseException as err:
            if not is_interrupt(err):
                raise
            self.console.print(
                Text("matrix interrupted: every process stopped; finished cells are kept (resume with --resume)")
            )
            exit_code = EXIT_INTERRUPTED
            interrupted = True
        try:
            analysis = self._write_matrix(interrupted=interrupted)
        except Exception as err:  # noqa: BLE001 - a bug in the statistics must not cost the cells' data
            if is_interrupt(err):
                raise
            return MatrixResult(self.path, self._write_matrix(effects=False), exit_code, f"{type(err).__name__}: {err}")
        return MatrixResult(self.path, analysis, exit_code)

    def _run_all(self, runs: list[PlannedRun]) -> tuple[int, bool]:
        """Run (or keep, when finished before a resume) each of `runs`: the exit code so far, and whether
        a failed run stopped the matrix (no --keep-going)."""
        exit_code = EXIT_OK
        pending = []
        for run in runs:
            done = self._finished(run)
            if done is not None:
                self.records[run.key] = done
            else:
                pending.append(run)
        with contextlib.closing(self._execute(pending)) as ended:
            for run, record in ended:
                self.records[run.key] = record
                _append_progress(self.path / PROGRESS, record)
                self._write_matrix(effects=False)
                self._show(run, record)
                if record.status == "failed":
                    exit_code = EXIT_TARGET
                    if not self.keep_going:
                        return exit_code, True
        return exit_code, False

    def _run_rounds(self) -> int:
        """The sequential design: round after round of the cells still needed, a look after each."""
        exit_code = EXIT_OK
        self.looks = []
        design_cells = cells(self.spec)
        needed = design_cells
        rounds = sequential.max_rounds(self.spec)
        for round_ in range(1, rounds + 1):
            runs = sequential.round_runs(self.runs, round_, needed)
            self.console.print(Text(f"round {round_} of at most {rounds}: {len(runs)} cell(s)"))
            code, halted = self._run_all(runs)
            exit_code = code if code != EXIT_OK else exit_code
            if halted:
                break
            self.looks.append(sequential.after_round(
                self.spec, round_, runs, list(self.records.values()), self.cell_order, len(self.runs), design_cells
            ))
            needed = [cell for cell in design_cells if cell.name in self.looks[-1].next_cells]
            decided = ", ".join(f"{label}: {verdict}" for label, verdict in self.looks[-1].decided.items()) or "nothing"
            self.console.print(Text(f"look {round_} (alpha {sequential.look_spec(self.spec).design.alpha:.3g}): "
                                    f"decided {decided}; {len(needed)} cell(s) still needed"))
            if not needed:
                break
        return exit_code

    def _executor_connection(self) -> contextlib.AbstractContextManager[object]:
        """Ray: connected once for every round (execute_on_ray reuses the connection); local: nothing."""
        if self.executor != "ray":
            return contextlib.nullcontext()
        return connected(self.ray_address)

    def _execute(self, pending: list[PlannedRun]) -> Iterator[tuple[PlannedRun, CellRun]]:
        """Each pending run with its record as it ends: one after another here, or at once on Ray."""
        if self.executor == "ray":
            yield from execute_on_ray(
                self.spec, pending, self.path, total=len(self.runs), console=self.console,
                cell_reports=self.cell_reports, address=self.ray_address,
            )
            return
        for run in pending:
            yield run, self._run_one(run)

    def _run_one(self, run: PlannedRun) -> CellRun:
        return run_cell(self.spec, run, self.path, total=len(self.runs), console=self.console,
                        cell_reports=self.cell_reports)

    def _show(self, run: PlannedRun, record: CellRun) -> None:
        if record.status == "failed":
            self.console.print(Text(f"  cell {run.key} failed: {record.message}", style="red"))
        table = Table(title=f"tallies after {len(self.records)} of {len(self.runs)} runs", title_justify="left")
        for column in ("cell", "runs", "corrupt", "clean", "timeout", "error", "wedged"):
            table.add_column(column, justify="left" if column == "cell" else "right")
        for key, counts in cell_counts(list(self.records.values())).items():
            runs = sum(r.status == "finished" and tuple(r.cell.items()) == key for r in self.records.values())
            table.add_row(
                Text(Cell(key).name),
                *(str(v) for v in (runs, counts.corrupt, counts.clean, counts.timeout, counts.error, counts.wedged)),
            )
        self.console.print(table)


def run_matrix(
    spec_path: Path,
    *,
    out: Path | None = None,
    resume: bool = False,
    keep_going: bool = False,
    cell_reports: bool = True,
    variables: dict[str, str] | None = None,
    console: Console | None = None,
    executor: str = "local",
    ray_address: str | None = None,
) -> MatrixResult:
    """`repro matrix`: load the spec, run (or resume) every cell, analyse, write matrix.json and the reports."""
    check_executor(executor)
    if ray_address is not None and executor != "ray":
        raise UsageError("--ray-address needs --executor ray")
    if executor == "ray":
        require_ray(ray_address)  # before the matrix directory is made
    if resume and out is None:
        raise UsageError("--resume needs --out: the matrix directory to continue")
    source = read_spec(spec_path, variables)
    spec = source.spec
    workload = preflight(source, programs=executor == "local")  # every cell, before a directory or a server
    console = console or Console(stderr=True, highlight=False)
    path = out or default_dir("matrix", spec.name)
    runner = MatrixRunner(
        source,
        path,
        workload_sha256=workload,
        resume=resume,
        keep_going=keep_going,
        cell_reports=cell_reports,
        console=console,
        executor=executor,  # type: ignore[arg-type]  # checked by check_executor above
        ray_address=ray_address,
    )
    # SIGTERM (a CI job cancelled, `kill`) tears down like Ctrl-C: servers run in their own process groups
    # and would outlive the harness otherwise.
    previous = signal.signal(signal.SIGTERM, request_interrupt)
    try:
        result = runner.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    write_reports(path, result.analysis, list(spec.factors), list(runner.records.values()))
    if result.analysis_error is not None:
        raise InternalError(
            f"the matrix analysis failed ({result.analysis_error}); every cell's data is kept in {path}: "
            f"re-analyse with `repro matrix {spec_path} --out {path} --resume`"
        )
    console.print(Text(result.analysis.verdict or "No finished cells: no verdict."))
    for line in summary_lines(result.analysis):
        console.print(Text(line))
    if result.analysis.sequential:
        for line in sequential.summary_lines(result.analysis.sequential)[-2:]:  # what was spent, why it stopped
            console.print(Text(line))
    failed = sum(r.status == "failed" for r in runner.records.values())
    if failed:
        console.print(Text(f"{failed} run(s) failed and are excluded from the analysis (--resume reruns them)."))
    console.print(Text(f"matrix: {path} (matrix.json, report.html)"))
    return result
