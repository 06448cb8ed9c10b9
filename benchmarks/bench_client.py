"""How much the `repro run` client costs, and how many sessions one process drives before it distorts timings.

Against benchmarks/fast_stream_server.py on loopback (a separate process, so the server's CPU is
not counted), through the real stack (load → session → client → dsml_checker → sandbox):

1. Client CPU per turn and per streamed chunk: the same sessions with few and with many chunks per
   turn, no pacing; CPU time of this process divided out, the two runs solved for a per-turn base
   and a per-chunk cost. Measured twice: parsed mode (the production request), and raw mode with
   log-probabilities on (`logprobs: true`: each chunk carries its tokens, the text is rebuilt from
   them and judged by check_raw at the end of the turn). The floor (benchmarks/stream_floor.py: a
   uvloop+httptools client that only frames the responses) runs the same sessions against the same
   servers in the same run: its per-turn cost is printed beside repro's (unpaced, a whole answer is
   one read for it, so its per-chunk cost shows only in the sweep).
2. Sustained concurrency: C sessions at once for C = 250, 500, 1000, 2000, ... with paced streams
   shaped like a loaded DeepSeek deployment (default: 2 s to the first chunk, then 32 chunks 0.25 s
   apart, a 10 s turn; starts spread over 5 s); for each C the client's event-loop lag p99; the
   largest C with p99 under 50 ms is the figure of merit (target 2,000). At each C the floor runs the
   same paced streams next, and repro's CPU per paced chunk (its turn costs included) is printed as a
   ratio to the floor's.

Usage: `python benchmarks/bench_client.py [--levels 250,500,1000,2000,3000] [--quick]`. Prints numbers only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio

from repro.procs.limits import ensure_open_files
from repro.procs.process import (
    ManagedProcess,
    free_port,
    start_process,
    wait_http_ready,
)
from repro.run.load import run_load
from repro.run.observe import ObservePlan
from repro.run.session import Session, SessionConfig
from repro.store.records import SessionRecord
from repro.wire.client import make_client
from repro.workload.scenario import load_workload

SERVER = Path(__file__).resolve().parent / "fast_stream_server.py"
FLOOR = Path(__file__).resolve().parent / "stream_floor.py"
LAG_LIMIT_S = 0.050


def start_server(chunks: int, interval: float, final_after: int, ttft: float = 0.0) -> tuple[ManagedProcess, str]:
    port = free_port()
    cmd = [sys.executable, str(SERVER), "--port", str(port), "--ttft", str(ttft), "--chunks", str(chunks),
           "--interval", str(interval), "--final-after", str(final_after)]
    proc = start_process(cmd)
    wait_http_ready(f"http://127.0.0.1:{port}/v1/models", timeout=30, process=proc)
    return proc, f"http://127.0.0.1:{port}/v1"


PARSED = ObservePlan()
RAW = ObservePlan("both", "logprobs")


def drive(base_url: str, sessions: int, turns: int, ramp_up: float = 0.0,
          observe: ObservePlan = PARSED) -> tuple[list[SessionRecord], list[float], float, float]:
    """Run `sessions` sessions at once; returns records, loop-lag samples, wall and CPU seconds of the load."""
    config = SessionConfig(url=f"{base_url}/chat/completions", model="bench", workload=load_workload().workload,
                           turns=turns, timeout=600, turn_timeout=300, stall_timeout=120, observe=observe)
    records: list[SessionRecord] = []

    async def load() -> tuple[list[float], float, float]:
        async with make_client(sessions) as client:
            origin = time.perf_counter()

            def make(index: int) -> Session:
                return Session(index, config, client, keep_raw=lambda *args, **kwargs: "", origin=origin)

            cpu = time.process_time()
            result = await run_load(sessions, sessions, make, records.append, ramp_up=ramp_up, handle_signals=False)
            return result.loop_lag_s, result.duration_s, time.process_time() - cpu

    # On uvloop when installed, as the floor and `repro run --workers` workers run.
    lag, wall, cpu = anyio.run(load, backend_options={"use_uvloop": importlib.util.find_spec("uvloop") is not None})
    return records, lag, wall, cpu


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def floor_run(url: str, sessions: int, turns: int, ramp_up: float = 0.0) -> dict[str, float]:
    """The floor client on the same sessions, in its own process (benchmarks/stream_floor.py): chunks, cpu_s, lag_p99_s."""
    port = url.split(":")[-1].split("/")[0]
    out = subprocess.run([sys.executable, str(FLOOR), "--child", f"{port}:{sessions}:{turns}:{ramp_up}"],
                         capture_output=True, text=True, timeout=3600, check=True).stdout
    return json.loads(out)


def cpu_costs(sessions: int, turns: int) -> None:
    floor: dict[int, float] = {}
    for label, observe in (("logprobs off (parsed)", PARSED), ("logprobs on (both)", RAW)):
        per_turn: dict[int, float] = {}
        for chunks in (1, 64):
            proc, url = start_server(chunks, 0.0, final_after=turns)
            try:
                records, _, wall, cpu = drive(url, sessions, turns, observe=observe)
                if chunks not in floor:
                    floor[chunks] = floor_run(url, sessions, turns)["cpu_s"] / (sessions * turns)
            finally:
                proc.stop()
            done = sum(len(r.turns) for r in records)
            bad = sum(r.outcome != "clean" for r in records)
            unjudged = sum(t.raw_verdict is None for r in records for t in r.turns) if observe.source else 0
            per_turn[chunks] = cpu / done
            print(f"cpu, {label}: {chunks:3d} chunks/turn: {done} turns in {wall:.2f}s wall, {cpu:.2f}s client CPU, "
                  f"{1e3 * cpu / done:.3f} ms CPU/turn ({bad} sessions not clean, {unjudged} turns without a raw verdict)")
        per_chunk = (per_turn[64] - per_turn[1]) / 63
        base = per_turn[1] - per_chunk
        print(f"cpu, {label}: per streamed chunk {1e6 * per_chunk:.1f} us; per turn (request, judge, tools) "
              f"{1e3 * base:.3f} ms ({base / floor[1]:.1f}x the floor's {1e3 * floor[1]:.3f} ms a turn); "
              f"load average {os.getloadavg()[0]:.2f}")


def concurrency(levels: list[int], turns: int, ttft: float, chunks: int, interval: float, ramp_up: float) -> None:
    best = 0
    print(f"sweep: {ttft:g}s to the first chunk, then {chunks} chunks {interval:g}s apart; {turns} turns a session; "
          f"starts spread over {ramp_up:g}s")
    for level in levels:
        proc, url = start_server(chunks, interval, final_after=turns, ttft=ttft)
        try:
            records, lag, wall, cpu = drive(url, level, turns, ramp_up)
            low = floor_run(url, level, turns, ramp_up)
        finally:
            proc.stop()
        done = sum(len(r.turns) for r in records)
        bad = sum(r.outcome != "clean" for r in records)
        lag99 = p99(lag)
        ok = lag99 < LAG_LIMIT_S and bad == 0
        best = level if ok else best
        per_chunk = cpu / (done * chunks)
        floor_chunk = low["cpu_s"] / max(1, low["chunks"])
        print(f"concurrency {level:5d}: {done} turns in {wall:.1f}s ({done / wall:.0f} turns/s, "
              f"{done * chunks / wall:.0f} chunks/s), client CPU {cpu / wall:.0%} of a core "
              f"({1e6 * per_chunk:.0f} us per paced chunk, turn costs included: {per_chunk / floor_chunk:.2f}x the "
              f"floor's {1e6 * floor_chunk:.1f} us, whose loop lag p99 was {1e3 * low['lag_p99_s']:.1f} ms), "
              f"loop lag p99 {1e3 * lag99:.1f} ms, max {1e3 * max(lag, default=0):.1f} ms, "
              f"{bad} not clean -> {'ok' if ok else 'over'}; load average {os.getloadavg()[0]:.2f}")
        if not ok:
            break
    print(f"largest concurrency with loop lag p99 < {1e3 * LAG_LIMIT_S:.0f} ms: {best}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="250,500,1000,2000,3000")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--ttft", type=float, default=2.0, help="Seconds to the first chunk (prefill).")
    parser.add_argument("--chunks", type=int, default=32)
    parser.add_argument("--interval", type=float, default=0.25, help="Seconds between chunks.")
    parser.add_argument("--ramp-up", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="Small numbers, to check that the script runs.")
    parser.add_argument("--cpu-only", action="store_true", help="Only the CPU costs per chunk and turn, no sweep.")
    args = parser.parse_args()
    levels = [20, 40] if args.quick else [int(x) for x in args.levels.split(",")]
    ensure_open_files(max(levels))
    # First calls compile regular expressions and import lazily: keep them out of the figures.
    proc, url = start_server(4, 0.0, final_after=args.turns)
    try:
        drive(url, 10, args.turns)
    finally:
        proc.stop()
    cpu_costs(sessions=20 if args.quick else 200, turns=args.turns)
    if args.cpu_only:
        return
    concurrency(levels, args.turns, args.ttft, args.chunks, args.interval, args.ramp_up)


if __name__ == "__main__":
    main()
