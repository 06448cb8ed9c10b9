"""`repro run` end to end, as its phases: options → target → plan → drive → finish.

`execute_run` is the synchronous entry point the CLI, the matrix, the sweep and bisection call. Each
phase is its own module and none calls back into this one. The statistics, gate and report modules
are imported where they are first used: scipy and matplotlib take seconds to import, and a usage or
target error should not wait for them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from pathlib import Path

import anyio
from rich.console import Console

from repro.errors import UsageError, saving, stopping
from repro.procs.limits import ensure_open_files
from repro.run.display import say
from repro.run.drive import Halting, drive, ray_transport
from repro.run.finish import RunResult, finish
from repro.run.options import DEFAULT_TURNS, RunOptions
from repro.run.pressure import sized_workload
from repro.run.plan import manifest, observe_plan, session_config
from repro.run.stopping import rule_for
from repro.run.target import auth_headers, reach
from repro.store.paths import default_dir
from repro.store.records import Manifest, WorkerPlace
from repro.store.rundir import RunWriter, make_run_dir, new_run_dir
from repro.workload.scenario import load_scenario


def execute_run(
    options: RunOptions, *, console: Console | None = None, live: bool = True, report: bool = True,
    control: str | None = None,
) -> RunResult:
    """Run the whole job; TargetError (exit 3) when the target is unreachable or serves no model.

    `report=False` skips `report.html` (a caller that renders reports itself, such as the matrix).
    `control` names the control arm this run is (repro.run.control), in its manifest from the first write.
    """
    console = console or Console()
    # Everything a bad option or file can fail on is checked before anything is made.
    loaded = load_scenario(options.workload, replay=options.replay, sessions=options.sessions)
    headers = auth_headers(options)
    secrets = [value.removeprefix("Bearer ") for value in headers.values()]
    rule = rule_for(options)
    if options.executor == "ray":
        from repro.cluster.rayutil import require_ray  # Ray loads only for a Ray run

        require_ray(options.ray_address)
    name = options.name or loaded.name
    run_dir, created = run_directory(options, name)  # before a simulator starts or a target is asked anything
    ensure_open_files(options.concurrency or options.sessions)
    halting = Halting()
    with contextlib.ExitStack() as signals:
        with contextlib.ExitStack() as stack:
            start = stack.enter_context(StartGuard(run_dir, created))
            if options.base_url is None:
                # Before the simulator starts: its log lands in the run directory, which is then the run's own.
                writer = start.open_writer(stack, secrets)
            target = reach(options, headers, run_dir, stack, console)
            if options.base_url is not None:
                writer = start.open_writer(stack, secrets)
            transport = ray_transport(options, target.base_url, stack) if options.executor == "ray" else None
            scenario = sized_workload(
                loaded.scenario, pressure=options.pressure, server_info=target.server_info, base_url=target.base_url,
                headers=headers, active=min(options.concurrency or options.sessions, options.sessions),
                turns=options.turns or DEFAULT_TURNS, say=lambda line: say(console, line))
            config = session_config(options, target, scenario, headers)
            observed = observe_plan(options, config, target.base_url, headers)
            config = dataclasses.replace(config, observe=observed.plan)
            for warning in observed.warnings:
                say(console, writer.scrub_text(warning))  # a probe's error may quote a server that echoed the key
            start.write_manifest(manifest(options, name, run_dir.name, loaded, target, observed, control=control))
            if threading.current_thread() is threading.main_thread():
                # From its first session to the end of its saving, a run takes a Ctrl-C itself: one that comes
                # after the last session lets summary.json and report.html be written first.
                signals.enter_context(stopping(halting))
            with saving("the records of the sessions in flight, summary.json and report.html"):
                driven = anyio.run(drive, options, config, writer, console, live, target.base_url, rule, halting,
                                   transport, start.on_placed)
        with saving("summary.json and report.html"):
            result = finish(options, run_dir, writer, start.manifest, driven, rule, console, report)
    if halting.late and rule is None:
        # Everything is saved; the Ctrl-C still stops whoever called: the CLI (exit 130), a matrix or a sweep.
        # A `--until-decided` run that had decided keeps its decision.
        raise KeyboardInterrupt
    return result


def run_directory(options: RunOptions, name: str) -> tuple[Path, bool]:
    """The run directory, made now (so a concurrent run cannot take it); True if this call created it."""
    if options.out is not None:
        return options.out, make_run_dir(options.out)
    path = default_dir(name)
    return new_run_dir(path.parent, path.name), True


class StartGuard:
    """Until the manifest is written, an exception removes what the run made, so nothing blocks a rerun
    with the same --out; after, it holds the manifest, which the workers' places update.

    Entered first in the run's ExitStack, so it exits last: after the simulator stopped writing its log.
    Only what this run made is removed (rmdir, not rmtree): a directory that holds anything else stays.
    """

    def __init__(self, run_dir: Path, created: bool) -> None:
        self.run_dir = run_dir
        self.created = created
        self.writer: RunWriter | None = None
        self.manifest: Manifest | None = None

    def __enter__(self) -> "StartGuard":
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: object) -> None:
        if kind is None or self.manifest is not None:
            return
        with contextlib.suppress(OSError):
            if self.writer is not None:  # else the directory may be another run's: touch none of its files
                self.writer.discard()
                (self.run_dir / "sim.log").unlink(missing_ok=True)  # its tail is in the error already
            if self.created:
                self.run_dir.rmdir()

    def open_writer(self, stack: contextlib.ExitStack, secrets: list[str]) -> RunWriter:
        """The run's writer, closed when `stack` closes; from now on a failed start discards its files."""
        self.writer = RunWriter(self.run_dir, secrets=secrets)
        stack.callback(self.writer.close)
        return self.writer

    def write_manifest(self, manifest: Manifest) -> None:
        """The manifest as the load starts: from here on the run directory is a run, and is kept."""
        assert self.writer is not None
        try:
            self.writer.write_manifest(manifest)
        except OSError as err:
            raise UsageError(f"--out {self.run_dir}: cannot write the manifest: {err.strerror or err}") from None
        self.manifest = manifest

    def on_placed(self, nodes: list[dict[str, str]]) -> None:
        """The workers' nodes, once placed: in the manifest at once (written again at the end)."""
        assert self.writer is not None and self.manifest is not None
        self.manifest = self.manifest.model_copy(
            update={"workers": [WorkerPlace(index=i, node=n) for i, n in enumerate(nodes)]})
        with contextlib.suppress(OSError):  # a full disk is noticed at the end
            self.writer.write_manifest(self.manifest)
