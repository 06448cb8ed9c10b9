"""`repro run --workers N` against benchmarks/fast_stream_server.py: sessions sustained, per-worker loop lag, CPU.

Each level runs the real `repro run` path (execute_run: driver, worker processes, one run directory)
with paced streams shaped like a loaded DeepSeek deployment (default: first chunk 2 s after the
request, then 31 more 0.25 s apart, 3 turns a session, starts spread over 5 s). Printed per level:
turns and chunks per second, each worker's event-loop lag p99, TTFT p99 against the server's own
(--ttft), client CPU per streamed chunk split into the driver (this process) and the workers (its
reaped children), the server's CPU per chunk, the load average, and why any session was not clean.
A level passes when every worker's lag p99 is under 50 ms, TTFT p99 is within 50 ms of --ttft and
every session is clean.

With `--floor`, each level is followed at once by benchmarks/stream_floor.py on the same level, and a
line gives repro's CPU per chunk as a ratio to the floor's, measured in the same run.

The workers load repro as an installed copy does, from compiled bytecode (compiled first, removed
after): a checkout run with PYTHONDONTWRITEBYTECODE would otherwise compile each of repro's modules
from source in every worker, a cost no installed copy pays. A first small level warms
up the driver (its lazy imports), as the floor's figures leave out its imports.

Usage: `python benchmarks/bench_workers.py [--runs 1:2000,2:2000,2:4000,2:10000:30] [--floor] [--quick]`
(WORKERS:SESSIONS[:RAMP_UP]: many thousands of sessions want a longer ramp-up than the default 5 s,
or they all start within a few seconds). Prints numbers only.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import io
import os
import resource
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Iterator

from bench_client import start_server
from rich.console import Console

import dsml_checker
import repro
from repro.procs.limits import ensure_open_files
from repro.run.options import RunOptions
from repro.run.runner import execute_run
from repro.store.rundir import load_run

LAG_LIMIT_S = 0.050


def cpu_seconds() -> tuple[float, float, float]:
    """CPU seconds (user + system) of this process (the driver) and of its reaped children (the workers),
    and the system (kernel) part of both."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime, own.ru_stime + children.ru_stime


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a live process, from /proc (the server, before it is stopped)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(workers: int, sessions: int, ramp_up: float, args: argparse.Namespace, root: Path) -> dict[str, float]:
    """Play one level and print its line; returns CPU per chunk (`us_per_chunk`), worst lag p99 and TTFT overhead (ms)."""
    proc, url = start_server(args.chunks, args.interval, final_after=args.turns, ttft=args.ttft)
    try:
        options = RunOptions.parse({
            "base_url": url, "sessions": sessions, "turns": args.turns, "ramp_up": ramp_up,
            "workers": workers, "timeout": 600, "turn_timeout": 300, "stall_timeout": 120,
            "out": root / f"w{workers}-s{sessions}", "observe": "parsed",
        })
        before, server_before = cpu_seconds(), process_cpu(proc.pid)
        # The server is this process's child too, but it is reaped (and counted) only after these readings.
        result = execute_run(options, console=Console(file=io.StringIO()), live=False, report=False)
        after, server = cpu_seconds(), process_cpu(proc.pid) - server_before
        driver, workers_cpu, kernel = after[0] - before[0], after[1] - before[1], after[2] - before[2]
        cpu = driver + workers_cpu
    finally:
        proc.stop()
    run = load_run(result.path)
    summary = result.summary
    chunks = sum(turn.chunks or 0 for s in run.sessions for turn in s.turns)
    bad = sum(s.outcome != "clean" for s in run.sessions)
    # Why a session was not clean, once per distinct error (a run over the limit usually says it here).
    errors = Counter(f"{s.outcome}: {s.error or ', '.join(s.rules)}" for s in run.sessions if s.outcome != "clean")
    lags = summary.worker_loop_lag or ([summary.loop_lag] if summary.loop_lag else [])
    worst = max((p.p99 or 0.0) for p in lags) if lags else float("nan")
    ttft = summary.latency["ttft_s"].p99 or float("nan")
    ok = worst < LAG_LIMIT_S and bad == 0 and ttft - args.ttft < 0.050
    print(f"workers {workers}, sessions {sessions:5d}, ramp-up {ramp_up:g}s: {summary.turns} turns in {summary.duration_s:.1f}s "
          f"({chunks / summary.duration_s:.0f} chunks/s); loop lag p99 per worker "
          f"{', '.join(f'{1e3 * (p.p99 or 0):.1f}' for p in lags)} ms; TTFT p99 {1e3 * ttft:.0f} ms "
          f"(server {1e3 * args.ttft:.0f} ms, +{1e3 * (ttft - args.ttft):.0f}); client CPU {cpu:.1f}s = "
          f"{1e6 * cpu / max(chunks, 1):.1f} us per chunk (driver {1e6 * driver / max(chunks, 1):.1f}, workers "
          f"{1e6 * workers_cpu / max(chunks, 1):.1f}; kernel {kernel / max(cpu, 1e-9):.0%} of it), "
          f"{cpu / summary.duration_s:.0%} of a core; server "
          f"{1e6 * server / max(chunks, 1):.1f} us per chunk; "
          f"{bad} not clean; load average {os.getloadavg()[0]:.2f} -> {'ok' if ok else 'over'}")
    for error, count in errors.most_common(3):
        print(f"  {count} x {error}")
    return {"us_per_chunk": 1e6 * cpu / max(chunks, 1), "lag_p99_ms": 1e3 * worst, "ttft_over_ms": 1e3 * (ttft - args.ttft)}


@contextlib.contextmanager
def compiled() -> Iterator[None]:
    """repro and dsml_checker compiled to bytecode beside their sources, as an installed copy is, while the
    benchmark runs; the bytecode this wrote is removed after (PYTHONDONTWRITEBYTECODE keeps the rest of the
    checkout free of it)."""
    folders = [Path(package.__file__).parent for package in (repro, dsml_checker)]
    before = {path for folder in folders for path in folder.rglob("__pycache__")}
    for folder in folders:
        compileall.compile_dir(folder, quiet=1)
    try:
        yield
    finally:
        for path in {path for folder in folders for path in folder.rglob("__pycache__")} - before:
            shutil.rmtree(path, ignore_errors=True)


def add_stream_options(parser: argparse.ArgumentParser, runs: str) -> None:
    """The levels (`--runs`, default `runs`) and the shape of the paced streams, as both load benchmarks take them."""
    parser.add_argument("--runs", default=runs, help="WORKERS:SESSIONS[:RAMP_UP] levels (RAMP_UP defaults to --ramp-up).")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--ttft", type=float, default=2.0)
    parser.add_argument("--chunks", type=int, default=32)
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--ramp-up", type=float, default=5.0)


def levels(args: argparse.Namespace) -> list[tuple[int, int, float]]:
    """(workers, sessions, ramp-up) of each level of `--runs`."""
    return [(int(fields[0]), int(fields[1]), float(fields[2]) if len(fields) > 2 else args.ramp_up)
            for fields in (level.split(":") for level in args.runs.split(","))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_stream_options(parser, "1:2000,2:2000,2:4000")
    parser.add_argument("--quick", action="store_true", help="Small numbers, to check that the script runs.")
    parser.add_argument("--floor", action="store_true", help="Run stream_floor.py after each level; print the ratio.")
    args = parser.parse_args()
    runs = [(1, 40, args.ramp_up), (2, 40, args.ramp_up)] if args.quick else levels(args)
    ensure_open_files(max(sessions for _, sessions, _ in runs))
    with contextlib.ExitStack() as stack:
        root = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-workers-"))
        stack.enter_context(compiled())
        with contextlib.redirect_stdout(io.StringIO()):
            one(1, 10, 0.0, args, Path(root) / "warm-up")
        for workers, sessions, ramp_up in runs:
            ours = one(workers, sessions, ramp_up, args, Path(root))
            if args.floor:
                import stream_floor  # it imports this module: here, not at the top

                floor = stream_floor.one(workers, sessions, ramp_up, args)
                print(f"  ratio {workers} x {sessions}: repro {ours['us_per_chunk']:.1f} us per chunk, floor "
                      f"{floor['us_per_chunk']:.1f} us = {ours['us_per_chunk'] / floor['us_per_chunk']:.2f}x; lag p99 "
                      f"repro {ours['lag_p99_ms']:.1f} ms, floor {floor['lag_p99_ms']:.1f} ms; TTFT overhead "
                      f"{ours['ttft_over_ms']:+.0f} ms; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
