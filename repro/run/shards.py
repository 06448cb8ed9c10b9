"""`repro run --workers N`: the sessions sharded across N workers, one run directory.

Worker k of N plays the sessions k, k+N, k+2N, ... (the same ids, hence the same seeds and tasks, as
a one-process run) with the ordinary load generator (`play_shard`), and streams frames back to the
driver: each session's start, every finished session record, every kept raw response, its live
counters, and `done` last. The driver alone writes the run directory, the live view and the summary
(`run_sharded`); how frames travel is a transport's business:

- `local_processes` (here): N processes started through `repro.procs.process` (own process group, registered
  with the reaper), length-prefixed pickles over a Unix socket in a private directory, between the
  driver and processes it started itself;
- `repro.run.rayshards`: N Ray actors, whose frames the driver pulls in batches.

A worker lost mid-run (its process died, its node died) costs only its own sessions: those it had
started and not finished become `error` records ("worker lost: ..."), those it had not started are
not played, the other workers finish theirs, and the run reports which worker was lost and why.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib.util
import pickle
import shutil
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Protocol

import anyio
from anyio.abc import ByteStream

from repro.cluster.node import where
from repro.errors import InternalError, handle_interrupts, stopping
from repro.procs.limits import ensure_open_files
from repro.procs.process import ManagedProcess, one_line, python_module, start_process
from repro.run.load import LoadProgress, LoadResult, run_load
from repro.run.session import RawKeeper, Session, SessionConfig
from repro.store.records import SessionRecord
from repro.store.rundir import raw_name
from repro.wire.client import make_client

CONNECT_TIMEOUT_S = 60.0
"""Time for every worker to start (import repro) and connect."""
DRAIN_TIMEOUT_S = 30.0
"""After a stop, time for the workers to send the records of their sessions in flight."""
PROGRESS_EVERY_S = 0.25
_HEADER = struct.Struct("!I")

Frame = tuple[Any, ...]
"""("start", id) | ("record", SessionRecord) | ("raw", id, turn, bytes, suffix) | ("progress", in_flight, turns)
| ("done", loop lag samples, duration, interrupted): worker to driver, in this order per session."""


@dataclass(frozen=True)
class ShardJob:
    """What the driver sends worker `index` of `count`: its sessions are index, index+count, ... < sessions."""

    index: int
    count: int
    sessions: int
    concurrency: int
    ramp_up: float
    elapsed: float
    """Seconds since the run's start in the driver when the job was sent: the worker's records count from
    there on its own clock (monotonic clocks of two machines share no origin)."""
    config: SessionConfig

    def session_ids(self) -> range:
        return range(self.index, self.sessions, self.count)


def shard_sizes(sessions: int, concurrency: int, workers: int) -> list[tuple[int, int]]:
    """(sessions, concurrency) of each worker: the sessions dealt round-robin, the concurrency split evenly."""
    return [
        (len(range(k, sessions, workers)), max(1, concurrency // workers + (k < concurrency % workers)))
        for k in range(workers)
    ]


class Link(Protocol):
    """One started worker, as the driver reaches it through a transport."""

    node: dict[str, str]
    """Where the worker runs (repro.cluster.node.where in the worker)."""

    async def begin(self, job: ShardJob) -> None:
        """Hand the worker its job; it starts playing at once."""

    def frames(self) -> AsyncIterator[Frame]:
        """The worker's frames in order; the iteration ends after `done`, or when the worker is gone."""

    async def stop(self) -> None:
        """Ask the worker to cut its sessions short (their records still come, as `interrupted`)."""

    async def lost(self) -> str:
        """Why the worker's frames ended without `done` (its exit status and last output, Ray's error)."""


Transport = Callable[[int], contextlib.AbstractAsyncContextManager[list[Link]]]
"""Starts N workers, yields their links once each is up and placed, and ends them all when the block ends."""


@dataclass
class _Worker:
    index: int
    link: Link
    started: dict[int, float] = field(default_factory=dict)
    """Sessions started and not yet recorded: id -> start (seconds since the run's start, driver's clock)."""
    in_flight: int = 0
    turns: int = 0
    done: tuple[list[float], float, bool] | None = None
    """(loop lag samples, duration, interrupted) from the worker's last frame."""
    lost: str | None = None


class _Driver:
    """The driver's bookkeeping of every worker's frames: one code path whatever the transport."""

    def __init__(
        self,
        pool: list[_Worker],
        config: SessionConfig,
        progress: LoadProgress,
        on_finish: Callable[[SessionRecord], None],
        keep_raw: RawKeeper,
    ) -> None:
        self.pool = pool
        self.config = config
        self.progress = progress
        self.on_finish = on_finish
        self.keep_raw = keep_raw

    def apply(self, worker: _Worker, message: Frame) -> None:
        kind = message[0]
        if kind == "start":
            worker.started[message[1]] = self.progress.elapsed_s
        elif kind == "record":
            record: SessionRecord = message[1]
            worker.started.pop(record.session_id, None)
            self._finish(record)
        elif kind == "raw":
            _, session_id, turn, data, suffix = message
            self.keep_raw(session_id, turn, data, suffix=suffix)
        elif kind == "progress":
            worker.in_flight, worker.turns = message[1], message[2]
            self._count()
        elif kind == "done":
            worker.done = (message[1], message[2], message[3])

    def lose(self, worker: _Worker, reason: str) -> None:
        """The worker is gone without its last frame: its sessions in flight end as errors, now."""
        where_ = ", ".join(f"{key} {value}" for key, value in worker.link.node.items())
        worker.lost = f"worker {worker.index} ({where_}) lost: {reason}"
        now = self.progress.elapsed_s
        for session_id, start_s in sorted(worker.started.items()):
            self._finish(SessionRecord(
                session_id=session_id, task=self.config.opening(session_id)[-1]["content"], outcome="error",
                start_s=start_s, end_s=now, error=worker.lost,
            ))
        worker.started.clear()
        worker.in_flight = 0
        self._count()

    def _finish(self, record: SessionRecord) -> None:
        self.progress.outcomes[record.outcome] += 1
        self.progress.wedged += int(record.wedged)
        self.on_finish(record)

    def _count(self) -> None:
        self.progress.in_flight = sum(w.in_flight for w in self.pool)
        self.progress.turns = sum(w.turns for w in self.pool)


async def run_sharded(
    workers: int,
    sessions: int,
    concurrency: int,
    config: SessionConfig,
    on_finish: Callable[[SessionRecord], None],
    keep_raw: RawKeeper,
    *,
    ramp_up: float,
    progress: LoadProgress,
    stop: anyio.Event,
    transport: Transport | None = None,
    on_placed: Callable[[list[dict[str, str]]], None] | None = None,
) -> LoadResult:
    """Run the load on `workers` workers (local processes unless `transport` says otherwise); the same
    contract as `repro.run.load.run_load` (records to `on_finish`), plus the lost workers in `LoadResult.lost`.

    `on_placed` gets every worker's node as soon as all are up, before any session starts.
    """
    interrupted = False
    async with (transport or local_processes)(workers) as links:
        pool = [_Worker(index, link) for index, link in enumerate(links)]
        if on_placed is not None:
            on_placed([link.node for link in links])
        driver = _Driver(pool, config, progress, on_finish, keep_raw)
        start = time.perf_counter()  # the load's duration, as in one process: without the workers' start-up
        sizes = shard_sizes(sessions, concurrency, workers)
        loop_stop = anyio.Event()

        def request_stop() -> None:
            nonlocal interrupted
            interrupted = True
            loop_stop.set()

        def live(worker: _Worker) -> bool:
            return worker.done is None and worker.lost is None

        async def serve(worker: _Worker) -> None:
            async for message in worker.link.frames():
                driver.apply(worker, message)
            if worker.done is None:
                driver.lose(worker, await worker.link.lost())

        async with anyio.create_task_group() as group:
            for worker in pool:
                job = ShardJob(worker.index, workers, sessions, sizes[worker.index][1], ramp_up, progress.elapsed_s, config)
                await worker.link.begin(job)
                group.start_soon(serve, worker)

            async def stop_on(event: anyio.Event) -> None:
                await event.wait()
                request_stop()

            async def broadcast_stop() -> None:
                await loop_stop.wait()
                for worker in pool:
                    if live(worker):
                        await worker.link.stop()
                with anyio.move_on_after(DRAIN_TIMEOUT_S):
                    while any(live(worker) for worker in pool):
                        await anyio.sleep(0.05)
                group.cancel_scope.cancel()

            async def watch() -> None:
                # A lost worker costs only its own sessions: the others play theirs to the end.
                while any(live(worker) for worker in pool):
                    await anyio.sleep(0.05)
                group.cancel_scope.cancel()

            group.start_soon(stop_on, stop)
            group.start_soon(broadcast_stop)
            group.start_soon(watch)
            loop = asyncio.get_running_loop()
            with stopping(lambda: loop.call_soon_threadsafe(request_stop)):
                await anyio.sleep_forever()
        for worker in pool:
            if live(worker):  # stopped, and silent for DRAIN_TIMEOUT_S since
                driver.lose(worker, f"no records within {DRAIN_TIMEOUT_S:g}s of the stop")
    return LoadResult(
        interrupted=interrupted or any(worker.done[2] for worker in pool if worker.done is not None),
        loop_lag_s=[sample for worker in pool if worker.done is not None for sample in worker.done[0]],
        duration_s=time.perf_counter() - start,
        worker_loop_lag_s=[worker.done[0] if worker.done is not None else [] for worker in pool],
        lost={worker.index: worker.lost for worker in pool if worker.lost is not None},
    )


async def play_shard(job: ShardJob, emit: Callable[[Frame], None], stop: anyio.Event) -> None:
    """In a worker, whatever the transport: play the job's sessions; every frame goes to `emit` (which must
    not block), `done` last. Setting `stop` cuts the sessions in flight short."""
    ids = job.session_ids()
    ensure_open_files(job.concurrency)
    origin = time.perf_counter() - job.elapsed
    load_progress = LoadProgress(planned=len(ids))

    def keep_raw(session_id: int, turn: int, data: bytes, *, suffix: str = "sse") -> str:
        emit(("raw", session_id, turn, data, suffix))
        return raw_name(session_id, turn, suffix)

    def make_session(local: int) -> Session:
        emit(("start", ids[local]))
        return Session(ids[local], job.config, client, keep_raw=keep_raw, origin=origin)

    async def report() -> None:
        while True:
            emit(("progress", load_progress.in_flight, load_progress.turns))
            await anyio.sleep(PROGRESS_EVERY_S)

    async with make_client(job.concurrency, headers=None, max_bytes_in_flight=job.config.max_bytes_in_flight) as client, anyio.create_task_group() as side:
        side.start_soon(report)
        result = await run_load(
            len(ids), job.concurrency, make_session, lambda record: emit(("record", record)),
            ramp_up=job.ramp_up, progress=load_progress, stop=stop,
        )
        side.cancel_scope.cancel()
    emit(("progress", 0, load_progress.turns))
    emit(("done", result.loop_lag_s, result.duration_s, result.interrupted))


# The local transport: processes on this machine, frames over a Unix socket.


async def send_frame(stream: ByteStream, *messages: Frame) -> None:
    """`messages` in order, in one write."""
    parts = []
    for message in messages:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        parts += (_HEADER.pack(len(data)), data)
    await stream.send(b"".join(parts))


class FrameReader:
    """The messages of a byte stream, in order: each read takes every whole frame it brought.

    A worker writes what it has queued in one write, so a read usually holds several frames; reading
    each frame's header and body as two buffered reads cost the driver two awaits a frame.
    """

    def __init__(self, stream: ByteStream) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.ready: collections.deque[Frame] = collections.deque()

    async def next(self) -> Frame | None:
        """The next message, or None when the peer closed the connection."""
        while not self.ready:
            try:
                data = await self.stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return None
            buffer = self.buffer
            buffer += data
            start = 0
            while len(buffer) - start >= _HEADER.size:
                end = start + _HEADER.size + _HEADER.unpack_from(buffer, start)[0]
                if end > len(buffer):
                    break
                self.ready.append(pickle.loads(buffer[start + _HEADER.size:end]))  # noqa: S301 - a process this driver started
                start = end
            del buffer[:start]
        return self.ready.popleft()


@dataclass
class _ProcessLink:
    """A local worker process and its connection to the driver."""

    index: int
    process: ManagedProcess
    stream: ByteStream | None = None
    node: dict[str, str] = field(default_factory=dict)

    async def begin(self, job: ShardJob) -> None:
        assert self.stream is not None
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await send_frame(self.stream, ("job", job))  # a worker already gone ends its frames at once

    async def frames(self) -> AsyncIterator[Frame]:
        assert self.stream is not None
        reader = FrameReader(self.stream)
        while (message := await reader.next()) is not None:
            yield message
            if message[0] == "done":
                return

    async def stop(self) -> None:
        if self.stream is not None:
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await send_frame(self.stream, ("stop",))

    async def lost(self) -> str:
        await anyio.to_thread.run_sync(self.process.stop, 5.0)
        return one_line(self.process.log_tail(3)) or f"exit code {self.process.returncode}"


@contextlib.asynccontextmanager
async def local_processes(workers: int) -> AsyncIterator[list[Link]]:
    """The local transport: `workers` processes of this machine, each connected to the driver's socket."""
    private = Path(tempfile.mkdtemp(prefix="repro-shards-"))  # 0700: no other user reaches the socket
    socket_path = private / "driver.sock"
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, private, ignore_errors=True)
        listener = await anyio.create_unix_listener(socket_path)
        pool: list[_ProcessLink] = []
        for index in range(workers):
            process = start_process(
                python_module("repro.run.shards", str(socket_path), str(index)),
                log_path=private / f"worker-{index}.log",
                grace=5.0,
            )
            stack.callback(process.stop, 5.0)
            pool.append(_ProcessLink(index, process))
        async with listener:
            await _connect(listener, pool)
        yield list(pool)


async def _connect(listener: Any, pool: list[_ProcessLink]) -> None:
    """Accept one connection per worker; a worker that dies first, or none in time, is an error."""
    waiting = {link.index: link for link in pool}

    async def accept_all() -> None:
        while waiting:
            stream = await listener.accept()
            hello = await FrameReader(stream).next()
            if hello is None or hello[0] != "hello" or hello[1] not in waiting:
                await stream.aclose()
                continue
            link = waiting.pop(hello[1])
            link.stream, link.node = stream, hello[2]

    async with anyio.create_task_group() as group:
        group.start_soon(accept_all)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while waiting:
            dead = next((link for link in waiting.values() if not link.process.alive), None)
            if dead is not None or time.monotonic() > deadline:
                link = dead or next(iter(waiting.values()))
                tail = one_line(link.process.log_tail(3)) or "no output"
                reason = "exited" if dead else f"did not connect within {CONNECT_TIMEOUT_S:g}s"
                raise InternalError(f"--workers: worker {link.index} {reason}: {tail}")
            await anyio.sleep(0.05)
        group.cancel_scope.cancel()


async def _work(socket_path: str, index: int) -> None:
    """One local worker: connect, take the job, play it, stream every frame back, end with `done`."""
    stream = await anyio.connect_unix(socket_path)
    await send_frame(stream, ("hello", index, where()))
    reader = FrameReader(stream)
    message = await reader.next()
    if message is None:
        return
    job: ShardJob = message[1]
    outbox_in, outbox = anyio.create_memory_object_stream[Frame](max_buffer_size=float("inf"))
    stop = anyio.Event()

    async def send_all() -> None:
        async with outbox:
            try:
                async for item in outbox:
                    # What else is queued goes in the same write: a session's start and its record were a
                    # system call each, on both sides.
                    items = [item]
                    while True:
                        try:
                            items.append(outbox.receive_nowait())
                        except (anyio.WouldBlock, anyio.EndOfStream):
                            break
                    await send_frame(stream, *items)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                stop.set()  # the driver is gone: nobody keeps what is left

    async def listen() -> None:
        # "stop" from the driver, or the driver gone: either way the sessions in flight are cut short.
        await reader.next()
        stop.set()

    async with anyio.create_task_group() as group:
        group.start_soon(send_all)
        async with anyio.create_task_group() as side:
            side.start_soon(listen)
            await play_shard(job, outbox_in.send_nowait, stop)
            side.cancel_scope.cancel()
        outbox_in.close()


def main() -> None:
    """`python -m repro.run.shards SOCKET INDEX`: started by the driver only."""
    handle_interrupts()
    # uvloop (`pip install 'repro[fast]'`) when installed: a worker's event loop does little but I/O callbacks.
    uvloop = importlib.util.find_spec("uvloop") is not None
    anyio.run(_work, sys.argv[1], int(sys.argv[2]), backend_options={"use_uvloop": uvloop})


if __name__ == "__main__":
    main()
