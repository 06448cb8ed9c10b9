"""The load phase of a run: sessions in one wave (or waves, for `--until-decided`), locally or on workers.

Records are appended to the run directory as each session ends; the target's metrics are scraped
beside the load; a first Ctrl-C halts the load and the sessions in flight are recorded as interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Callable

import anyio
import httpx
from rich.console import Console

from repro.cluster.rayutil import DEFAULT_RESOURCES, connected
from repro.run import clock
from repro.run.display import show_progress
from repro.run.load import LoadProgress, run_load
from repro.run.metrics import MetricsScraper, metrics_url
from repro.run.options import RunOptions
from repro.run.rayshards import check_resources, check_target, ray_actors
from repro.run.replay import ReplaySession
from repro.run.session import Session, SessionConfig
from repro.run.shards import Transport, run_sharded
from repro.run.stopping import BaselineRule, Look, StoppingRule
from repro.store.records import OutcomeCounts, SessionRecord
from repro.store.rundir import METRICS, RunWriter
from repro.wire.client import make_client
from repro.wire.transport import tls_for
from repro.workload.trace import Trace


@dataclass
class Halting:
    """What a first Ctrl-C does to a run (the `stopping` callback around its load and its saving): halt
    the load while it runs (or as soon as it starts, when it came before); once the load is over (a look
    decided, or the last session ended), only note it, so the saving completes: a decided run stays
    decided, and any other run ends as interrupted once summary.json and report.html are written."""

    halt: Callable[[], None] | None = None
    requested: bool = False
    """A Ctrl-C came before the load could take it."""
    over: bool = False
    late: bool = False
    """A Ctrl-C came once the load was over: the saving completes first, then the run ends as interrupted."""

    def __call__(self) -> None:
        if self.over:
            self.late = True
            return
        if self.halt is None:
            self.requested = True
        else:
            self.halt()


@dataclass
class Driven:
    records: list[SessionRecord]
    interrupted: bool
    lag: list[float]
    duration: float
    worker_lag: list[list[float]]
    """Per worker process with `--workers`: its own loop-lag samples (all are in `lag` too)."""
    lost: dict[int, str] = dataclasses.field(default_factory=dict)
    """With `--workers`: the workers lost mid-run, and why."""
    looks: list[Look] | None = None
    """The stopping rule's looks, for a `--until-decided` run."""


def _waves(options: RunOptions) -> list[range]:
    """Session ids per wave: all at once, or `concurrency` at a time for `--until-decided`."""
    if not options.until_decided or options.concurrency is None:
        return [range(options.sessions)]
    step = options.concurrency
    return [range(start, min(start + step, options.sessions)) for start in range(0, options.sessions, step)]


async def drive(
    options: RunOptions,
    config: SessionConfig,
    writer: RunWriter,
    console: Console,
    live: bool,
    base_url: str,
    rule: StoppingRule | BaselineRule | None,
    halting: Halting,
    transport: Transport | None = None,
    on_placed: Callable[[list[dict[str, str]]], None] | None = None,
) -> Driven:
    concurrency = options.concurrency or options.sessions
    records: list[SessionRecord] = []
    progress = LoadProgress(planned=options.sessions)
    origin = progress.t0
    # Set when the disk fills up, or by a Ctrl-C between two waves (one during a wave stops run_load itself).
    halt = anyio.Event()
    looks: list[Look] = []

    def on_finish(record: SessionRecord) -> None:
        records.append(record)
        writer.append_session(record)
        if writer.full is not None:
            halt.set()

    def keep_raw(session_id: int, turn: int, data: bytes, *, suffix: str = "sse") -> str | None:
        path = writer.write_raw(session_id, turn, data, suffix=suffix)
        if writer.full is not None:
            halt.set()
        return path

    interrupted = False
    lag: list[float] = []
    worker_lag: list[list[float]] = []
    lost: dict[int, str] = {}
    duration = 0.0
    loop = asyncio.get_running_loop()
    async with (
        make_client(concurrency, max_bytes_in_flight=config.max_bytes_in_flight) as client,
        httpx.AsyncClient(trust_env=False, headers=config.headers, verify=tls_for(base_url)) as side_client,
        anyio.create_task_group() as group,
    ):
        scraper = MetricsScraper(side_client, metrics_url(base_url), writer.path / METRICS)
        if await scraper.scrape_once(origin):  # no metrics at the first scrape: none are looked for again
            group.start_soon(scraper.follow, origin)
        group.start_soon(show_progress, progress, console, live)

        kind = ReplaySession if isinstance(config.workload, Trace) else Session
        # Between waves (while the rule looks) a Ctrl-C halts the run as one during a wave does
        # (execute_run installs `halting` as the signals' callback).
        halting.halt = lambda: loop.call_soon_threadsafe(halt.set)
        if halting.requested:
            halt.set()
        decided = whole = False
        try:
            for wave in _waves(options):
                await anyio.lowlevel.checkpoint()  # lets a Ctrl-C that came while the rule looked set `halt`
                if halt.is_set():
                    break

                before = len(records)

                def make_session(index: int, first: int = wave.start) -> Session:
                    return kind(first + index, config, client, keep_raw=keep_raw, origin=origin)

                if config.clock_url is not None:
                    await clock.declare(config.clock_url, len(wave), concurrency)
                if options.sharded:  # one wave: RunOptions refuses --workers with --until-decided
                    result = await run_sharded(
                        min(options.workers, concurrency, len(wave)), len(wave), concurrency, config, on_finish, keep_raw,
                        ramp_up=options.ramp_up, progress=progress, stop=halt, transport=transport, on_placed=on_placed,
                    )
                else:
                    result = await run_load(
                        len(wave), concurrency, make_session, on_finish, ramp_up=options.ramp_up, progress=progress,
                        stop=halt,
                    )
                lag += result.loop_lag_s
                worker_lag += result.worker_loop_lag_s
                lost.update(result.lost)
                duration += result.duration_s
                # A Ctrl-C after the wave's last session ended cut nothing short: the wave is looked at
                # (as the gate's replay of sessions.jsonl will), and the run stops after the look.
                ended = records[before:]
                whole = len(ended) == len(wave) and all(record.outcome != "interrupted" for record in ended)
                interrupted = result.interrupted
                if (interrupted and not whole) or rule is None:
                    break
                counts = OutcomeCounts.of(records)
                looks.append(rule.look(counts.corrupt, counts.completed, len(records)))
                progress.stopping = f"look {len(looks)}: {rule.describe(looks[-1])}"
                if looks[-1].decision is not None:
                    decided, interrupted = True, False
                    break
                if interrupted:
                    break
        finally:
            # The load is over: a Ctrl-C from here on only lets the saving finish.
            halting.over, halting.halt = True, None
        await anyio.lowlevel.checkpoint()
        if rule is None and whole and (halt.is_set() or interrupted):
            # The Ctrl-C came after the last session ended, before the load was marked over (a window a loaded
            # machine widens): it cut nothing short, so it is a late one, as if it had come a moment later.
            # It reached `halt`, or run_load's own handler while its task groups closed after the last record.
            halting.late, interrupted = True, False
        # A Ctrl-C that came while the deciding look ran was too late to stop anything: the run is decided.
        interrupted = interrupted or (halt.is_set() and not decided and not halting.late)
        group.cancel_scope.cancel()
        if not interrupted:
            # The counters as the run ends, whatever the scrape interval left out (shielded: the group is cancelled).
            with anyio.CancelScope(shield=True):
                await scraper.scrape_once(origin)
    return Driven(records, interrupted or bool(lost), lag, duration, worker_lag, lost, looks if rule is not None else None)



def ray_transport(options: RunOptions, base_url: str, stack: contextlib.ExitStack) -> Transport:
    """Connect to Ray for the run (disconnected when `stack` closes) and check the cluster can reach the target."""
    ray = stack.enter_context(connected(options.ray_address))
    check_target(ray, base_url)
    resources = options.worker_resources or DEFAULT_RESOURCES
    asked = [resources] * options.workers if isinstance(resources, dict) else resources
    check_resources(ray, asked)
    return ray_actors(ray, asked)
