"""The end of a run: summary.json, the manifest's end time, the gate, the final view and report.html.

When the disk filled up, the run was stopped: what could be saved is, and one line says what was not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from repro.errors import (
    EXIT_FAILED,
    EXIT_INCONCLUSIVE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    InternalError,
    ReproError,
    saving,
)
from repro.run.display import final_view, say
from repro.run.drive import Driven
from repro.run.options import RunOptions
from repro.run.plan import utc_now
from repro.run.stopping import BaselineRule, StoppingRule, stopping_record
from repro.store.records import Manifest, Summary
from repro.store.exercise import assess, read_samples
from repro.store.rundir import METRICS, REPORT, RunWriter


@dataclass(frozen=True)
class RunResult:
    """What `execute_run` returns: the run directory, its summary and the exit code it earned."""
    path: Path
    summary: Summary
    exit_code: int



def finish(
    options: RunOptions,
    run_dir: Path,
    writer: RunWriter,
    manifest: Manifest,
    driven: Driven,
    rule: StoppingRule | BaselineRule | None,
    console: Console,
    report: bool,
) -> RunResult:
    """After the load: summary.json, the manifest's end time, the gate, the final view and the report."""
    from repro.store.summary import (
        summarize,  # scipy, for the intervals: not before the load is over
    )

    writer.sync()  # the lines of the load's last loop pass: a failed fsync counts in `lost` before it is read
    full = writer.full
    observe = manifest.observe or {}
    records, interrupted, lag, duration = driven.records, driven.interrupted, driven.lag, driven.duration
    if driven.lost:
        lost_workers = "; ".join(driven.lost.values())
        stop_reason = f"{len(driven.lost)} of {len(manifest.workers)} workers lost ({lost_workers})"
        manifest = manifest.model_copy(update={"workers": [
            place.model_copy(update={"lost": driven.lost.get(place.index)}) for place in manifest.workers
        ]})
    else:
        stop_reason = None
    exercised = assess(read_samples(run_dir / METRICS), manifest.server_info)
    summary = summarize(
        records, loop_lag_s=lag, worker_loop_lag_s=driven.worker_lag, duration_s=duration, interrupted=interrupted,
        lost=writer.lost,
        stop_reason=f"the run stopped early: cannot write ({full.strerror or full})" if full is not None else stop_reason,
        observe=observe.get("mode"), raw_source=observe.get("raw_source"), exercised=exercised,
    )
    stopped = None
    if rule is not None and driven.looks is not None:
        stopped = stopping_record(rule, driven.looks, wave=options.concurrency or options.sessions,
                                  cap=options.sessions, interrupted=interrupted or full is not None)
        summary = summary.model_copy(update={"stopping": stopped})
        say(console, f"stopping: {stopped.decision.upper()} after {stopped.sessions} of {stopped.cap} sessions: "
                     f"{stopped.reason}")
    try:
        writer.write_summary(summary)
        writer.write_manifest(manifest.model_copy(update={"ended_at": utc_now()}))
        saved = "summary.json written"
    except OSError as err:
        saved = f"summary.json not written ({err.strerror or err})"
    if full is not None:
        console.print(final_view(summary, run_dir))
        kept = len(records) - writer.lost
        lost = f", {writer.lost} finished sessions not saved" if writer.lost else ""
        raise ReproError(
            f"run stopped: cannot write to {run_dir}: {full.strerror or full}; "
            f"{kept} sessions kept in sessions.jsonl{lost}; {saved}",
            exit_code=EXIT_INTERRUPTED,
        )
    exit_code = EXIT_INTERRUPTED if interrupted else EXIT_OK
    if options.max_corruption_rate is not None:
        summary, gate_code = _gate(run_dir, summary, options, writer, console)
        exit_code = exit_code if interrupted else gate_code
    elif stopped is not None and not interrupted:
        exit_code = {"pass": EXIT_OK, "fail": EXIT_FAILED}.get(stopped.decision, EXIT_INCONCLUSIVE)
    console.print(final_view(summary, run_dir))
    if report:
        with saving("report.html"):
            write_report(run_dir, console)
    if driven.lost:
        # Not a verdict on the target: the run's own machinery failed (exit 255), with what was kept.
        raise InternalError(f"run incomplete: {stop_reason}; their sessions in flight are recorded as errors, "
                            f"the ones they had not started were not played; {saved}")
    return RunResult(path=run_dir, summary=summary, exit_code=exit_code)



def _gate(run_dir: Path, summary: Summary, options: RunOptions, writer: RunWriter, console: Console) -> tuple[Summary, int]:
    """Judge the finished run with `repro gate`'s rule and keep its verdict in summary.json."""
    from repro.run.gate import evaluate  # scipy: only when the run is gated

    assert options.max_corruption_rate is not None
    result = evaluate(run_dir, max_corruption_rate=options.max_corruption_rate, confidence=options.confidence,
                      baseline=options.baseline, margin=options.margin)
    summary = summary.model_copy(update={"gate": result.as_record()})
    writer.write_summary(summary)
    for line in result.lines():
        say(console, line)
    return summary, result.exit_code


def write_report(run_dir: Path, console: Console) -> None:
    """report.html beside the records; a report that cannot be rendered does not undo the run."""
    from repro.report import (
        render_report,  # matplotlib and jinja2: only when a report is asked for
    )

    try:
        render_report([run_dir], run_dir / REPORT)
    except ReproError as err:
        say(console, f"report: not written: {err}")
        return
    say(console, f"Report: {run_dir / REPORT}")

