"""`repro run --workers 2` with local processes against Ray actors on the two-node test cluster, same load.

Starts `ray.cluster_utils.Cluster` on loopback (two nodes, one CPU and 80 MB of object store each,
custom resources node_a and node_b), and benchmarks/fast_stream_server.py with paced streams shaped
like a loaded deployment (first chunk 2 s after the request, then 31 more 0.25 s apart, 3 turns a
session, starts spread over 5 s). Runs the same sessions with `--workers 2` (local processes) and
`--workers 2 --executor ray --worker-resources '[{"node_a": 1}, {"node_b": 1}]'`, through the real
`execute_run` path, and prints per executor: wall time (start-up included), load time, turns per
second, each worker's loop-lag p99, TTFT p99 against the server's, the sessions not clean, and
whether both runs recorded the same session ids and tasks.

Usage: `python benchmarks/run_ray.py [--sessions 1000]`. Prints numbers only.
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from pathlib import Path

from bench_client import start_server
from ray_bench import two_nodes
from rich.console import Console

from repro.procs.limits import ensure_open_files
from repro.run.options import RunOptions
from repro.run.runner import execute_run
from repro.store.rundir import load_run


def one(name: str, url: str, args: argparse.Namespace, root: Path, **extra: object) -> list[tuple[int, str]]:
    options = RunOptions.parse({
        "base_url": url, "sessions": args.sessions, "turns": args.turns, "ramp_up": args.ramp_up, "workers": 2,
        "timeout": 600, "turn_timeout": 300, "stall_timeout": 120, "out": root / name, "observe": "parsed", **extra,
    })
    start = time.perf_counter()
    result = execute_run(options, console=Console(file=io.StringIO()), live=False, report=False)
    wall = time.perf_counter() - start
    run = load_run(result.path)
    summary = result.summary
    bad = sum(s.outcome != "clean" for s in run.sessions)
    lags = ", ".join(f"{1e3 * (p.p99 or 0):.1f}" for p in summary.worker_loop_lag)
    ttft = summary.latency["ttft_s"].p99 or float("nan")
    print(f"{name:5s}: wall {wall:.1f}s, load {summary.duration_s:.1f}s; {summary.turns} turns "
          f"({summary.turns / summary.duration_s:.0f}/s); loop lag p99 per worker {lags} ms; TTFT p99 "
          f"{1e3 * ttft:.0f} ms (server {1e3 * args.ttft:.0f} ms); {bad} not clean")
    return sorted((s.session_id, s.task) for s in run.sessions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--ttft", type=float, default=2.0)
    parser.add_argument("--ramp-up", type=float, default=5.0)
    args = parser.parse_args()
    ensure_open_files(args.sessions)
    proc, url = start_server(32, 0.25, final_after=args.turns, ttft=args.ttft)
    try:
        with two_nodes() as cluster, tempfile.TemporaryDirectory(prefix="run-ray-") as tmp:
            local = one("local", url, args, Path(tmp))
            on_ray = one("ray", url, args, Path(tmp), executor="ray", ray_address=cluster.address,
                         worker_resources=[{"node_a": 1}, {"node_b": 1}])
        print(f"same session ids and tasks: {local == on_ray}")
    finally:
        proc.stop()


if __name__ == "__main__":
    main()
