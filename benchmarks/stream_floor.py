"""The floor under `repro run --workers`: what streams cost a Python client that does nothing with them.

Same server, same paced streams and the same process layout as benchmarks/bench_workers.py (W worker
processes on uvloop, SESSIONS sessions over them, TURNS requests each on one keep-alive connection),
but each worker only frames the HTTP responses (httptools, as repro's transport does) and counts
their body pieces: no SSE, no JSON, no judging, no records, no driver. Whatever repro does on top
costs more than this, so where the floor plus the server already fill the machine, no client
written on this stack can hold that level here.

Printed per level: chunks per second, each worker's event-loop lag p99 (sampled as repro samples it,
a 10 ms sleep again and again), CPU per chunk of the workers and of the server, the share of the
machine's cores both take, and the load average.

Usage: `python benchmarks/stream_floor.py [--runs 2:5000,2:10000:30]` (WORKERS:SESSIONS[:RAMP_UP],
the stream shape options as in bench_workers.py). Prints numbers only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from urllib.parse import urlsplit

import httptools
from bench_client import start_server
from bench_workers import add_stream_options, levels, process_cpu

from repro.procs.limits import ensure_open_files

LAG_INTERVAL_S = 0.010


class _Exchange(asyncio.Protocol):
    """One keep-alive connection: frames each response and counts its body pieces."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] | None = None
        self.pieces = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.pieces += 1

    def on_message_complete(self) -> None:
        assert self.done is not None
        self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError(f"connection lost: {exc}"))


def _request(port: int, assistants: int) -> bytes:
    body = json.dumps({"model": "bench", "stream": True,
                       "messages": [{"role": "user", "content": "go"}] + [{"role": "assistant", "content": "ok"}] * assistants}
                      ).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (port, len(body), body))


async def _worker(port: int, sessions: int, turns: int, ramp_up: float) -> dict[str, float | int]:
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    stop = asyncio.Event()
    requests = [_request(port, turn) for turn in range(turns)]  # the same for every session: made once

    async def sample() -> None:
        while not stop.is_set():
            before = time.perf_counter()
            await asyncio.sleep(LAG_INTERVAL_S)
            lags.append(max(0.0, time.perf_counter() - before - LAG_INTERVAL_S))

    async def session(index: int) -> int:
        await asyncio.sleep(ramp_up * index / max(sessions, 1))
        transport, exchange = await loop.create_connection(_Exchange, "127.0.0.1", port)
        try:
            for request in requests:
                exchange.done = loop.create_future()
                transport.write(request)
                await exchange.done
        finally:
            transport.close()
        return exchange.pieces

    sampler = asyncio.ensure_future(sample())
    cpu = time.process_time()
    pieces = await asyncio.gather(*(session(i) for i in range(sessions)))
    cpu = time.process_time() - cpu
    stop.set()
    await sampler
    lags.sort()
    return {"chunks": sum(pieces), "cpu_s": cpu, "lag_p99_s": lags[int(0.99 * (len(lags) - 1))] if lags else 0.0}


def _child(port: int, sessions: int, turns: int, ramp_up: float) -> None:
    import uvloop

    print(json.dumps(uvloop.run(_worker(port, sessions, turns, ramp_up))), flush=True)


def one(workers: int, sessions: int, ramp_up: float, args: argparse.Namespace) -> dict[str, float]:
    """Play one level and print its line; returns the client's CPU per chunk (`us_per_chunk`) and its worst lag p99 (`lag_p99_ms`)."""
    proc, url = start_server(args.chunks, args.interval, final_after=args.turns, ttft=args.ttft)
    port = urlsplit(url).port
    try:
        server_before, start = process_cpu(proc.pid), time.perf_counter()
        shares = [sessions // workers + (k < sessions % workers) for k in range(workers)]
        children = [subprocess.Popen([sys.executable, __file__, "--child", f"{port}:{share}:{args.turns}:{ramp_up}"],
                                     stdout=subprocess.PIPE, text=True) for share in shares]
        results = [json.loads(child.communicate(timeout=3600)[0]) for child in children]
        wall, server = time.perf_counter() - start, process_cpu(proc.pid) - server_before
    finally:
        proc.stop()
    chunks = sum(r["chunks"] for r in results)
    lags = ", ".join(f"{1e3 * r['lag_p99_s']:.1f}" for r in results)
    client = sum(r["cpu_s"] for r in results)
    print(f"workers {workers}, sessions {sessions:5d}, ramp-up {ramp_up:g}s: {chunks / wall:.0f} chunks/s over {wall:.1f}s; "
          f"loop lag p99 per worker {lags} ms; "
          f"client {1e6 * client / chunks:.1f} us per chunk, server {1e6 * server / chunks:.1f} us per chunk; "
          f"both {(client + server) / wall / os.cpu_count():.0%} of the machine's {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.2f}")
    return {"us_per_chunk": 1e6 * client / chunks, "lag_p99_ms": 1e3 * max(r["lag_p99_s"] for r in results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_stream_options(parser, "2:5000,2:10000:30")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        port, sessions, turns, ramp_up = args.child.split(":")
        _child(int(port), int(sessions), int(turns), float(ramp_up))
        return
    runs = levels(args)
    ensure_open_files(max(sessions for _, sessions, _ in runs))
    for workers, sessions, ramp_up in runs:
        one(workers, sessions, ramp_up, args)


if __name__ == "__main__":
    main()
