"""`repro run --workers N`: the sessions sharded across N local worker processes, one run directory.

Worker k of N plays the sessions k, k+N, k+2N, ... (the same ids, hence the same seeds and tasks, as
a one-process run) with the ordinary load generator, and streams every finished session record, every
kept raw response and its live counters to the driver over a Unix socket in a private directory. The
driver alone writes the run directory, the live view and the summary. Workers are launched through
`repro.procs` (own process group, registered with the reaper) and stopped at the end, on Ctrl-C and on
any error. Frames are length-prefixed pickles between the driver and processes it started itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import pickle
import shutil
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import anyio
from anyio.abc import ByteStream
from anyio.streams.buffered import BufferedByteReceiveStream

from repro.errors import InternalError, stopping
from repro.load import LoadProgress, LoadResult
from repro.procs import ManagedProcess, one_line, start_process
from repro.records import SessionRecord
from repro.session import RawKeeper, SessionConfig

CONNECT_TIMEOUT_S = 60.0
"""Time for every worker to start (import repro) and connect."""
DRAIN_TIMEOUT_S = 30.0
"""After a stop, time for the workers to send the records of their sessions in flight."""
PROGRESS_EVERY_S = 0.25
_HEADER = struct.Struct("!I")


@dataclass(frozen=True)
class ShardJob:
    """What the driver sends worker `index` of `count`: its sessions are index, index+count, ... < sessions."""

    index: int
    count: int
    sessions: int
    concurrency: int
    ramp_up: float
    origin: float
    """time.perf_counter() of the run's start in the driver (CLOCK_MONOTONIC: the same in every process)."""
    config: SessionConfig

    def session_ids(self) -> range:
        return range(self.index, self.sessions, self.count)


def shard_sizes(sessions: int, concurrency: int, workers: int) -> list[tuple[int, int]]:
    """(sessions, concurrency) of each worker: the sessions dealt round-robin, the concurrency split evenly."""
    return [
        (len(range(k, sessions, workers)), max(1, concurrency // workers + (k < concurrency % workers)))
        for k in range(workers)
    ]


async def send_frame(stream: ByteStream, message: tuple[Any, ...]) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    await stream.send(_HEADER.pack(len(data)) + data)


async def receive_frame(reader: BufferedByteReceiveStream) -> tuple[Any, ...] | None:
    """The next message, or None when the peer closed the connection."""
    try:
        size = _HEADER.unpack(await reader.receive_exactly(_HEADER.size))[0]
        return pickle.loads(await reader.receive_exactly(size))  # noqa: S301 - a process this driver started
    except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, anyio.ClosedResourceError):
        return None


@dataclass
class _Worker:
    index: int
    process: ManagedProcess
    stream: ByteStream | None = None
    in_flight: int = 0
    turns: int = 0
    done: tuple[list[float], float, bool] | None = None
    """(loop lag samples, duration, interrupted) from the worker's last frame."""


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
) -> LoadResult:
    """Run the load on `workers` processes; the same contract as `repro.load.run_load` (records to `on_finish`)."""
    private = Path(tempfile.mkdtemp(prefix="repro-shards-"))  # 0700: no other user reaches the socket
    socket_path = private / "driver.sock"
    start = time.perf_counter()
    interrupted = False
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, private, ignore_errors=True)
        listener = await anyio.create_unix_listener(socket_path)
        pool: list[_Worker] = []
        for index in range(workers):
            process = start_process(
                [sys.executable, "-m", "repro.shards", str(socket_path), str(index)],
                log_path=private / f"worker-{index}.log",
                grace=5.0,
            )
            stack.callback(process.stop, 5.0)
            pool.append(_Worker(index, process))
        async with listener:
            await _connect(listener, pool)
        start = time.perf_counter()  # the load's duration, as in one process: without the workers' start-up
        sizes = shard_sizes(sessions, concurrency, workers)
        loop_stop = anyio.Event()

        def request_stop() -> None:
            nonlocal interrupted
            interrupted = True
            loop_stop.set()

        async with anyio.create_task_group() as group:
            for worker in pool:
                assert worker.stream is not None
                job = ShardJob(worker.index, workers, sessions, sizes[worker.index][1], ramp_up, progress.t0, config)
                await send_frame(worker.stream, ("job", job))
                group.start_soon(_serve, worker, pool, progress, on_finish, keep_raw)

            async def stop_on(event: anyio.Event) -> None:
                await event.wait()
                request_stop()

            async def broadcast_stop() -> None:
                await loop_stop.wait()
                for worker in pool:
                    if worker.done is None and worker.stream is not None:
                        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                            await send_frame(worker.stream, ("stop",))
                with anyio.move_on_after(DRAIN_TIMEOUT_S):
                    while any(worker.done is None and worker.stream is not None for worker in pool):
                        await anyio.sleep(0.05)
                group.cancel_scope.cancel()

            async def watch() -> None:
                # A worker gone without its last frame crashed: the others are stopped, not waited for.
                while not all(worker.done is not None or worker.stream is None for worker in pool):
                    if any(worker.stream is None for worker in pool):
                        loop_stop.set()
                    await anyio.sleep(0.05)
                group.cancel_scope.cancel()

            group.start_soon(stop_on, stop)
            group.start_soon(broadcast_stop)
            group.start_soon(watch)
            loop = asyncio.get_running_loop()
            with stopping(lambda: loop.call_soon_threadsafe(request_stop)):
                await anyio.sleep_forever()
        failed = [worker for worker in pool if worker.done is None]
        if failed and not interrupted:
            worker = failed[0]
            worker.process.stop(5.0)
            tail = one_line(worker.process.log_tail(3)) or f"exit code {worker.process.returncode}"
            raise InternalError(f"--workers: worker {worker.index} ended without finishing its sessions: {tail}")
    lags = [worker.done[0] for worker in pool if worker.done is not None]
    return LoadResult(
        interrupted=interrupted or any(worker.done[2] for worker in pool if worker.done is not None),
        loop_lag_s=[sample for lag in lags for sample in lag],
        duration_s=time.perf_counter() - start,
        worker_loop_lag_s=lags,
    )


async def _connect(listener: Any, pool: list[_Worker]) -> None:
    """Accept one connection per worker; a worker that dies first, or none in time, is an error."""
    waiting = {worker.index: worker for worker in pool}

    async def accept_all() -> None:
        while waiting:
            stream = await listener.accept()
            hello = await receive_frame(BufferedByteReceiveStream(stream))
            if hello is None or hello[0] != "hello" or hello[1] not in waiting:
                await stream.aclose()
                continue
            waiting.pop(hello[1]).stream = stream

    async with anyio.create_task_group() as group:
        group.start_soon(accept_all)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while waiting:
            dead = next((w for w in waiting.values() if not w.process.alive), None)
            if dead is not None or time.monotonic() > deadline:
                worker = dead or next(iter(waiting.values()))
                tail = one_line(worker.process.log_tail(3)) or "no output"
                reason = "exited" if dead else f"did not connect within {CONNECT_TIMEOUT_S:g}s"
                raise InternalError(f"--workers: worker {worker.index} {reason}: {tail}")
            await anyio.sleep(0.05)
        group.cancel_scope.cancel()


async def _serve(
    worker: _Worker,
    pool: list[_Worker],
    progress: LoadProgress,
    on_finish: Callable[[SessionRecord], None],
    keep_raw: RawKeeper,
) -> None:
    """Apply one worker's frames until its last one (or its connection closing)."""
    assert worker.stream is not None
    reader = BufferedByteReceiveStream(worker.stream)
    try:
        while (message := await receive_frame(reader)) is not None:
            kind = message[0]
            if kind == "record":
                record: SessionRecord = message[1]
                progress.outcomes[record.outcome] += 1
                progress.wedged += int(record.wedged)
                on_finish(record)
            elif kind == "raw":
                _, session_id, turn, data, suffix = message
                keep_raw(session_id, turn, data, suffix=suffix)
            elif kind == "progress":
                worker.in_flight, worker.turns = message[1], message[2]
                progress.in_flight = sum(w.in_flight for w in pool)
                progress.turns = sum(w.turns for w in pool)
            elif kind == "done":
                worker.done = (message[1], message[2], message[3])
                return
    finally:
        if worker.done is None:
            worker.stream = None  # gone without its last frame: `watch` treats the worker as crashed


async def _work(socket_path: str, index: int) -> None:
    """One worker: connect, take the job, run its sessions, stream everything back, end with `done`."""
    from repro.client import make_client
    from repro.load import run_load
    from repro.runner import ensure_open_files
    from repro.session import Session
    from repro.store import raw_name

    stream = await anyio.connect_unix(socket_path)
    await send_frame(stream, ("hello", index))
    reader = BufferedByteReceiveStream(stream)
    message = await receive_frame(reader)
    if message is None:
        return
    job: ShardJob = message[1]
    ids = job.session_ids()
    ensure_open_files(job.concurrency)
    outbox_in, outbox = anyio.create_memory_object_stream[tuple[Any, ...]](max_buffer_size=float("inf"))
    stop = anyio.Event()
    load_progress = LoadProgress(planned=len(ids))

    def keep_raw(session_id: int, turn: int, data: bytes, *, suffix: str = "sse") -> str:
        outbox_in.send_nowait(("raw", session_id, turn, data, suffix))
        return raw_name(session_id, turn, suffix)

    async def send_all() -> None:
        async with outbox:
            try:
                async for item in outbox:
                    await send_frame(stream, item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                stop.set()  # the driver is gone: nobody keeps what is left

    async def listen() -> None:
        # "stop" from the driver, or the driver gone: either way the sessions in flight are cut short.
        await receive_frame(reader)
        stop.set()

    async def report() -> None:
        while True:
            outbox_in.send_nowait(("progress", load_progress.in_flight, load_progress.turns))
            await anyio.sleep(PROGRESS_EVERY_S)

    async with make_client(job.concurrency, headers=None) as client, anyio.create_task_group() as group:
        group.start_soon(send_all)

        def make_session(local: int) -> Session:
            return Session(ids[local], job.config, client, keep_raw=keep_raw, origin=job.origin)

        async with anyio.create_task_group() as side:
            side.start_soon(listen)
            side.start_soon(report)
            result = await run_load(
                len(ids), job.concurrency, make_session, lambda record: outbox_in.send_nowait(("record", record)),
                ramp_up=job.ramp_up, progress=load_progress, stop=stop,
            )
            side.cancel_scope.cancel()
        outbox_in.send_nowait(("progress", 0, load_progress.turns))
        outbox_in.send_nowait(("done", result.loop_lag_s, result.duration_s, result.interrupted))
        outbox_in.close()


def main() -> None:
    """`python -m repro.shards SOCKET INDEX`: started by the driver only."""
    from repro.errors import handle_interrupts

    handle_interrupts()
    # uvloop (`pip install 'repro[fast]'`) when installed: a worker's event loop does little but I/O callbacks.
    uvloop = importlib.util.find_spec("uvloop") is not None
    anyio.run(_work, sys.argv[1], int(sys.argv[2]), backend_options={"use_uvloop": uvloop})


if __name__ == "__main__":
    main()
