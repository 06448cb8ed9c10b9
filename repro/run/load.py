"""The load generator: N sessions at concurrency C in one anyio task group, with ramp-up and interruption.

Knows nothing of matrices or run directories: finished sessions go to a callback as they end.
It samples the event loop's lag while it runs, so a user can tell when the client itself (not the
server) distorted the timings. SIGINT or SIGTERM (main thread only) cancels the sessions in
flight; they are reported through the same callback as `interrupted`. The signals go through
`repro.errors.request_interrupt`, so a second one while the results are saved cannot cut that short.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

import anyio

from repro.errors import stopping
from repro.store.records import SessionRecord

if TYPE_CHECKING:
    from repro.run.session import Session

LAG_INTERVAL_S = 0.05
GC_THRESHOLDS = (20_000, 20, 100)


@dataclass
class LoadProgress:
    """Live counters for the display; updated by the load generator only."""

    planned: int
    in_flight: int = 0
    turns: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    wedged: int = 0
    stopping: str = ""
    """The stopping rule's last look, for a `--until-decided` run."""
    t0: float = field(default_factory=time.perf_counter)

    @property
    def finished(self) -> int:
        return sum(self.outcomes.values())

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0

    @property
    def turns_per_s(self) -> float:
        elapsed = self.elapsed_s
        return self.turns / elapsed if elapsed > 0 else 0.0


@dataclass
class LoadResult:
    interrupted: bool
    loop_lag_s: list[float]
    duration_s: float
    worker_loop_lag_s: list[list[float]] = field(default_factory=list)
    """Per worker process with `--workers`: its own loop-lag samples (all of them are in `loop_lag_s` too)."""
    lost: dict[int, str] = field(default_factory=dict)
    """With `--workers`: each worker lost mid-run, and why (repro.run.shards)."""


class LagSampler:
    """Sleeps a fixed interval again and again; how late each wake-up is, is the loop's lag."""

    def __init__(self, interval: float = LAG_INTERVAL_S) -> None:
        self.interval = interval
        self.samples: list[float] = []

    async def run(self) -> None:
        while True:
            before = time.perf_counter()
            await anyio.sleep(self.interval)
            self.samples.append(max(0.0, time.perf_counter() - before - self.interval))


@contextlib.contextmanager
def _steady_gc() -> Iterator[None]:
    """Fewer, smaller garbage collections while the load runs.

    With hundreds of sessions the default thresholds ran a collection every few milliseconds, and
    full collections over the whole heap (imported modules included) paused the event loop for a
    third of a second, which the lag sampler then reported as client distortion. Objects alive at
    the start are frozen out of collection; young garbage is still collected, just in larger batches.
    """
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


async def run_load(
    sessions: int,
    concurrency: int,
    make_session: Callable[[int], "Session"],
    on_finish: Callable[[SessionRecord], None],
    *,
    ramp_up: float = 0.0,
    progress: LoadProgress | None = None,
    handle_signals: bool = True,
    stop: anyio.Event | None = None,
) -> LoadResult:
    """Run sessions 0..N-1, at most `concurrency` at once, starts spread evenly over `ramp_up` seconds.

    `make_session(i)` is called when session i gets its slot; `on_finish` gets every finished
    session's record, and at an interruption the record of every session still in flight. Setting
    `stop` interrupts the load as a signal would (the caller can no longer keep records, say).
    """
    progress = progress or LoadProgress(planned=sessions)
    limiter = anyio.CapacityLimiter(max(1, concurrency))
    in_flight: dict[int, "Session"] = {}
    sampler = LagSampler()
    interrupted = False
    start = time.perf_counter()

    def finish(record: SessionRecord) -> None:
        progress.outcomes[record.outcome] += 1
        progress.wedged += int(record.wedged)
        on_finish(record)

    def count_turn(_: object) -> None:
        progress.turns += 1

    async def one(index: int) -> None:
        async with limiter:
            session = make_session(index)
            session.on_turn = count_turn
            in_flight[index] = session
            progress.in_flight += 1
            try:
                record = await session.run()
                await session.leave()
            finally:
                progress.in_flight -= 1
            del in_flight[index]
            finish(record)

    loop = asyncio.get_running_loop()
    watch = handle_signals and threading.current_thread() is threading.main_thread()

    with _steady_gc():
        async with anyio.create_task_group() as outer:

            def interrupt() -> None:
                nonlocal interrupted
                interrupted = True
                outer.cancel_scope.cancel()

            async def interrupt_on(event: anyio.Event) -> None:
                await event.wait()
                interrupt()

            outer.start_soon(sampler.run)
            if stop is not None:
                outer.start_soon(interrupt_on, stop)
            # Called from the signal handler: it may only hand the stop to the loop.
            with stopping(lambda: loop.call_soon_threadsafe(interrupt)) if watch else contextlib.nullcontext():
                async with anyio.create_task_group() as group:
                    for index in range(sessions):
                        if ramp_up > 0 and sessions > 1:
                            delay = start + ramp_up * index / sessions - time.perf_counter()
                            if delay > 0:
                                await anyio.sleep(delay)
                        group.start_soon(one, index)
            outer.cancel_scope.cancel()
    for index in sorted(in_flight):
        finish(in_flight[index].interrupted())
    return LoadResult(interrupted=interrupted, loop_lag_s=sampler.samples, duration_s=time.perf_counter() - start)
