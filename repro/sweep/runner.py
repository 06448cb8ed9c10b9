"""`repro sweep`: one deployment, the same workload at several concurrencies, and where corruption sets in.

Every level is an ordinary `repro run` (its own run directory under the sweep's) against the same
deployment: the embedded simulator started once, or `--base-url`. Per level: the corruption rate and
the timeout rate with Clopper-Pearson intervals. Concurrency 1 is the control: corruption there does
not need concurrency (a model habit, or a fault of the single request). The onset is the lowest
level whose rate Boschloo's one-sided exact test shows above the control's, Holm-adjusted over the
levels; beside it a Firth logistic fit of corruption on log2(concurrency) draws the onset curve.
Results go to sweep.json, sweep.md and sweep.html (escaped like every report).

With `--executor ray` the whole sweep (the deployment and every level in turn) is one Ray task
placed by the resources it asks for: the levels share one server instance on one node, so the
hardware cannot be confounded with the concurrency. Each level's run directory comes back to the
driver as it ends (a sweep cut short keeps its finished levels, as locally); the task's node is
recorded in sweep.json and shown in the reports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence

from rich.console import Console

from repro.cluster.node import where
from repro.cluster.rayutil import asked_resources, captured, pack, printed, scratch
from repro.errors import EXIT_INTERRUPTED, ReproError, TargetError, UsageError
from repro.matrix.deploy import CellDeployment, resolve
from repro.matrix.design import Cell, PlannedRun
from repro.matrix.spec import load_spec
from repro.run.display import say
from repro.run.options import RunOptions
from repro.run.runner import execute_run
from repro.sim.launch import EMBEDDED_SIM_ARGS, start_sim
from repro.store.paths import default_dir
from repro.store.rundir import dump_json, make_run_dir, new_run_dir
from repro.sweep.analysis import LevelResult, SweepResult, analyse, level_result
from repro.sweep.options import check_sessions

MAX_LEVELS = 32


def _span(part: str) -> list[int]:
    """`1-64:x2` (doubling, the default step) or `8-64:+8`: the levels from low up to high."""
    span, _, step = part.partition(":")
    low, high = (int(x) for x in span.split("-", 1))
    step = step or "x2"
    kind, size = step[0], int(step[1:])
    if low < 1 or high < low or kind not in "x+" or size < (2 if kind == "x" else 1):
        raise ValueError(part)
    values = [low]
    while (values[-1] * size if kind == "x" else values[-1] + size) <= high:
        if len(values) == MAX_LEVELS:
            # Counted while built: `1-100000000:+1` must be refused before it is a list of 10^8 levels.
            raise UsageError(f"--concurrency {part!r}: a sweep needs 2 to {MAX_LEVELS} levels, this range has more")
        values.append(values[-1] * size if kind == "x" else values[-1] + size)
    return values


def parse_levels(text: str) -> list[int]:
    """`1,8,16,32,60` or ranges `1-64:x2` / `8-64:+8`, mixed freely: sorted and distinct."""
    try:
        levels = {value for part in text.split(",") for value in
                  (_span(part.strip()) if "-" in part else [int(part.strip())])}
    except ValueError:
        raise UsageError(f"--concurrency {text!r}: expected levels like 1,8,16,32,60 or a range like 1-64:x2 "
                         "or 8-64:+8") from None
    if min(levels) < 1:
        raise UsageError(f"--concurrency {text!r}: every level must be at least 1")
    if not 2 <= len(levels) <= MAX_LEVELS:
        raise UsageError(f"--concurrency {text!r}: a sweep needs 2 to {MAX_LEVELS} levels, got {len(levels)}")
    return sorted(levels)


@dataclass(frozen=True)
class SpecDeployment:
    """A matrix spec's deployment for one cell (`--spec SPEC --cell factor=level ...`), launched once."""

    spec: Path
    cell: dict[str, str]
    variables: dict[str, str] = field(default_factory=dict)


def _spec_cell(target: SpecDeployment) -> tuple[Any, Any, dict[str, Any]]:
    """The spec, the planned run of the chosen cell, and the spec's load options (the sweep sets the rest)."""
    spec = load_spec(target.spec, target.variables)
    chosen = dict(target.cell)
    for factor, definition in spec.factors.items():
        level = chosen.pop(factor, None)
        if level is None:
            raise UsageError(f"--cell: no level for factor {factor!r} of {target.spec} "
                             f"(one of {', '.join(definition.levels)})")
        if level not in definition.levels:
            raise UsageError(f"--cell {factor}={level}: not a level of {factor!r} "
                             f"(one of {', '.join(definition.levels)})")
    if chosen:
        raise UsageError(f"--cell: {', '.join(sorted(chosen))} is not a factor of {target.spec}")
    cell = Cell(tuple((factor, target.cell[factor]) for factor in spec.factors))
    load = {key: value for key, value in dict(spec.load).items() if key not in ("sessions", "concurrency", "out", "name")}
    return spec, PlannedRun(cell=cell, replicate=1, order=0), load


@contextlib.contextmanager
def _deployment(
    base_url: str | None, sim_args: list[str], spec: SpecDeployment | None, out: Path, console: Console
) -> Iterator[tuple[str, str]]:
    """The deployment every level runs against: `base_url`, a matrix spec's cell, or one embedded simulator."""
    if base_url is not None:
        yield base_url, base_url
        return
    if spec is not None:
        matrix, run, _ = _spec_cell(spec)
        launch = resolve(matrix, run, log_dir=out / "logs")
        with CellDeployment(launch, out / "logs", cell=run.key) as confirmation:
            for note in confirmation.notes:
                say(console, f"sweep: not verified: {note}")
            say(console, f"sweep: launched cell {run.cell.name} of {spec.spec} at {launch.url}")
            yield f"{launch.url}/v1", f"{matrix.name}: cell {run.cell.name}"
        return
    args = [*EMBEDDED_SIM_ARGS, *sim_args]
    with start_sim(args, log_path=out / "sim.log") as sim:
        say(console, f"sweep: started the embedded simulator at {sim.base_url} ({shlex.join(args)})")
        yield sim.base_url, f"embedded simulator ({shlex.join(args)})"


@dataclass(frozen=True)
class RaySweep:
    """`--executor ray`: where the cluster is and what the sweep's task asks of it."""

    address: str | None
    resources: dict[str, float]


def ray_sweep(
    executor: str, *, ray_address: str | None, resources: str | None, base_url: str | None,
    spec: SpecDeployment | None,
) -> RaySweep | None:
    """The executor the command line asks for (None: this process), checked before the sweep directory is made.

    `resources` (JSON) wins over the spec's resources for its cell, which win over one CPU.
    """
    if executor == "ray" and base_url is not None:
        raise UsageError("--executor ray places the sweep's deployment on a node: --base-url names a running "
                         "server instead (use --spec or the embedded simulator)")

    def for_the_cell() -> dict[str, float]:
        assert spec is not None
        matrix, run, _ = _spec_cell(spec)
        return matrix.resources.for_cell(run.cell.as_dict())

    asked = asked_resources(executor, ray_address=ray_address, resources=resources,
                            fallback=for_the_cell if spec is not None else None)
    return None if asked is None else RaySweep(ray_address, asked)


def _measure(
    levels: list[int], base: dict[str, Any], base_url: str | None, sim_args: list[str], spec: SpecDeployment | None,
    out: Path, console: Console, confidence: float,
) -> Iterator[tuple[LevelResult, str]]:
    """Start the deployment, run every level against it in turn (control first), stop it: each level's
    result and the target, as the level ends."""
    with _deployment(base_url, sim_args, spec, out, console) as (url, target):
        for concurrency in levels:
            run_dir = out / f"c{concurrency:03d}"
            options = RunOptions.parse({**base, "base_url": url, "concurrency": concurrency, "out": run_dir,
                                        "name": f"c{concurrency}"}, source="sweep options")
            say(console, f"sweep: concurrency {concurrency}: {base['sessions']} sessions")
            # The run's own view: live progress on a terminal, a progress line every few seconds otherwise.
            run = execute_run(options, console=console, live=True, report=False)
            if run.summary.interrupted:
                raise ReproError(f"sweep interrupted at concurrency {concurrency}; the finished levels' runs are "
                                 f"kept in {out}", exit_code=EXIT_INTERRUPTED)
            level = level_result(concurrency, run_dir, confidence)
            say(console, f"sweep: concurrency {concurrency}: {level.corrupt} of {level.corrupt + level.clean} "
                         f"completed corrupt, {level.timeout} timed out")
            yield level, target


def _kept(results: list[LevelResult], out: Path) -> str:
    return f"the finished levels' runs are kept in {out}" if results else "no level had finished"


def _sweep_task(
    levels: list[int], base: dict[str, Any], sim_args: list[str], spec: SpecDeployment | None, confidence: float
) -> Iterator[tuple[Any, ...]]:
    """In the Ray worker: the whole sweep in a scratch directory, sent back as it goes, so a sweep cut
    short keeps its finished levels: `("level", result, target, printed text, tar.gz of its run
    directory)` as each level ends, then `("end", node, printed text, tar.gz of the rest)` (the
    deployment's logs), or `("error", the ReproError it stopped with, printed text, tar.gz of the rest)`."""
    with scratch("repro-sweep-") as path:
        console, screen = captured()
        sent: set[str] = set()

        def news() -> str:
            text = printed(screen, path)
            screen.seek(0)
            screen.truncate()
            return text

        def rest() -> bytes:
            return pack(path, tuple(sorted(entry.name for entry in path.iterdir() if entry.name not in sent)))

        try:
            for level, target in _measure(levels, base, None, sim_args, spec, path, console, confidence):
                sent.add(level.run_dir)
                yield "level", level, target, news(), pack(path, (level.run_dir,))
        except ReproError as err:
            yield "error", err, news(), rest()
            return
        yield "end", where(), news(), rest()


def _on_ray(
    placement: RaySweep, levels: list[int], base: dict[str, Any], sim_args: list[str], spec: SpecDeployment | None,
    out: Path, console: Console, confidence: float,
) -> tuple[list[LevelResult], str, dict[str, str]]:
    """The sweep as one Ray task, each level unpacked into `out` as it ends. A lost task is a TargetError
    (exit 3) and Ctrl-C a ReproError (exit 130), both keeping the finished levels."""
    from repro.cluster.rayutil import (
        absolute_workload,
        connected,
        replay,
        streamed,
        submit,
        unpack,
    )

    base = absolute_workload(base)
    if spec is not None:
        spec = dataclasses.replace(spec, spec=spec.spec.resolve())
    results: list[LevelResult] = []
    target, node = "", {}
    failure: ReproError | None = None
    with connected(placement.address) as ray:
        task = submit(ray, _sweep_task, placement.resources, f"repro-sweep-{out.name}", levels, base, sim_args, spec,
                      confidence)
        say(console, f"sweep: submitted to the Ray cluster as one task asking for {placement.resources} "
                     "(its lines are shown as each level ends)")
        try:
            with contextlib.closing(streamed(ray, task, placement.resources, console)) as items:
                for value, why in items:
                    if why is not None:
                        raise TargetError(f"sweep stopped: {why}; {_kept(results, out)}")
                    kind, outcome, *sent = value
                    if kind == "level":
                        results.append(outcome)
                        target = sent[0]
                    text, archive = sent[-2:]
                    unpack(archive, out)
                    replay(console, text, out)
                    if kind == "error":
                        failure = outcome  # raised once the task has ended: it is not one to cancel
                    elif kind == "end":
                        node = outcome
        except KeyboardInterrupt:
            at = f"at concurrency {levels[len(results)]}" if len(results) < len(levels) else "after its last level"
            raise ReproError(f"sweep interrupted {at}; {_kept(results, out)}", exit_code=EXIT_INTERRUPTED) from None
    if failure is not None:
        raise failure
    return results, target, node


def run_sweep(
    levels: list[int],
    *,
    sessions: int = 60,
    out: Path | None = None,
    base_url: str | None = None,
    sim_args: Sequence[str] = (),
    spec: SpecDeployment | None = None,
    confidence: float = 0.95,
    run_options: dict[str, Any] | None = None,
    console: Console | None = None,
    placement: RaySweep | None = None,
) -> SweepResult:
    """Run every level (control first) and write sweep.json, sweep.md and sweep.html into `out`; on
    Ray (`placement`, from `ray_sweep`) as one task on one node."""
    console = console or Console()
    if not 0.5 < confidence < 1.0:
        raise UsageError(f"--confidence must be above 0.5 and below 1, got {confidence}")
    if spec is not None and base_url is not None:
        raise UsageError("--spec and --base-url name two deployments: give one")
    check_sessions(sessions, levels)
    # A spec's load section is the workload of every level (concurrency and sessions are the sweep's).
    base = {**(_spec_cell(spec)[2] if spec is not None else {}), "sessions": sessions, **(run_options or {})}
    RunOptions.parse({**base, "base_url": base_url, "concurrency": max(levels)}, source="sweep options")
    if out is None:
        path = default_dir("sweep")
        out = new_run_dir(path.parent, path.name)
    else:
        make_run_dir(out)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if placement is None:
        measured = list(_measure(levels, base, base_url, list(sim_args), spec, out, console, confidence))
        results, target, node = [level for level, _ in measured], measured[-1][1], where()
    else:
        results, target, node = _on_ray(placement, levels, base, list(sim_args), spec, out, console, confidence)
    judged, onset, curve, conclusion = analyse(results, confidence=confidence)
    result = SweepResult(
        name=out.name, target=target, confidence=confidence, sessions_per_level=sessions, levels=judged, onset=onset,
        control_corrupt=judged[0].corrupt > 0, curve=curve, conclusion=conclusion, started_at=started, node=node,
    )
    write_outputs(result, out)
    say(console, f"sweep: {conclusion}")
    say(console, f"sweep: wrote {out / 'sweep.json'}, {out / 'sweep.md'}, {out / 'sweep.html'}")
    return result


def write_outputs(result: SweepResult, out: Path) -> None:
    """sweep.json, sweep.md and sweep.html in the sweep's directory."""
    from repro.sweep.report import (  # jinja2 and matplotlib: only once levels ended
        render_html,
        render_markdown,
    )

    dump_json(out / "sweep.json", result.as_json())
    (out / "sweep.md").write_text(render_markdown(result), encoding="utf-8")
    (out / "sweep.html").write_text(render_html(result), encoding="utf-8")
