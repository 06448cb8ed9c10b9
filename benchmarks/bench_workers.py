"""`repro run --workers N` against benchmarks/fast_stream_server.py: sessions sustained, per-worker loop lag, CPU.

Each level runs the real `repro run` path (execute_run: driver, worker processes, one run directory)
with paced streams shaped like a loaded DeepSeek deployment (default: first chunk 2 s after the
request, then 31 more 0.25 s apart, 3 turns a session, starts spread over 5 s). Printed per level:
turns and chunks per second, each worker's event-loop lag p99, TTFT p99 against the server's own
(--ttft), and client CPU (this process and its reaped workers) per streamed chunk.

Usage: `python benchmarks/bench_workers.py [--runs 1:2000,2:2000,2:4000] [--quick]`. Prints numbers only.
"""

from __future__ import annotations

import argparse
import io
import resource
import tempfile
from pathlib import Path

from rich.console import Console

from bench_client import start_server
from repro.runner import RunOptions, ensure_open_files, execute_run
from repro.store import load_run

LAG_LIMIT_S = 0.050


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def one(workers: int, sessions: int, args: argparse.Namespace, root: Path) -> None:
    proc, url = start_server(args.chunks, args.interval, final_after=args.turns, ttft=args.ttft)
    try:
        options = RunOptions.parse({
            "base_url": url, "sessions": sessions, "turns": args.turns, "ramp_up": args.ramp_up,
            "workers": workers, "timeout": 600, "turn_timeout": 300, "stall_timeout": 120,
            "out": root / f"w{workers}-s{sessions}", "observe": "parsed",
        })
        before = cpu_seconds()
        # The server is this process's child too, but it is reaped (and counted) only after this reading.
        result = execute_run(options, console=Console(file=io.StringIO()), live=False, report=False)
        cpu = cpu_seconds() - before
    finally:
        proc.stop()
    run = load_run(result.path)
    summary = result.summary
    chunks = sum(turn.chunks or 0 for s in run.sessions for turn in s.turns)
    bad = sum(s.outcome != "clean" for s in run.sessions)
    lags = summary.worker_loop_lag or ([summary.loop_lag] if summary.loop_lag else [])
    worst = max((p.p99 or 0.0) for p in lags) if lags else float("nan")
    ttft = summary.latency["ttft_s"].p99 or float("nan")
    ok = worst < LAG_LIMIT_S and bad == 0 and ttft - args.ttft < 0.050
    print(f"workers {workers}, sessions {sessions:5d}: {summary.turns} turns in {summary.duration_s:.1f}s "
          f"({chunks / summary.duration_s:.0f} chunks/s); loop lag p99 per worker "
          f"{', '.join(f'{1e3 * (p.p99 or 0):.1f}' for p in lags)} ms; TTFT p99 {1e3 * ttft:.0f} ms "
          f"(server {1e3 * args.ttft:.0f} ms, +{1e3 * (ttft - args.ttft):.0f}); client CPU {cpu:.1f}s = "
          f"{1e6 * cpu / max(chunks, 1):.0f} us per chunk, {cpu / summary.duration_s:.0%} of a core; "
          f"{bad} not clean -> {'ok' if ok else 'over'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="1:2000,2:2000,2:4000", help="WORKERS:SESSIONS pairs.")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--ttft", type=float, default=2.0)
    parser.add_argument("--chunks", type=int, default=32)
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--ramp-up", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="Small numbers, to check that the script runs.")
    args = parser.parse_args()
    runs = [(1, 40), (2, 40)] if args.quick else [tuple(map(int, pair.split(":"))) for pair in args.runs.split(",")]
    ensure_open_files(max(sessions for _, sessions in runs))
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as root:
        for workers, sessions in runs:
            one(workers, sessions, args, Path(root))


if __name__ == "__main__":
    main()
