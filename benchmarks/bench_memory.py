"""Peak memory of `repro run` against answers of tens of megabytes: what a big answer costs, and the budget.

Against benchmarks/big_answer_server.py on loopback, each scenario is one `repro run` process (the
real stack: reader, accumulator, checker, records, raw/), started fresh so its peak RSS (the
kernel's high-water mark, from wait4) is its own:

1. three sessions at once, each receiving one 50 MB answer;
2. one turn carrying 10,000 tool calls;
3. concurrency 60 against 50 MB answers under `--max-bytes-in-flight` (default 512 MiB here): peak
   RSS beside the budget, sessions finished, and the turns that waited for it.

A baseline process (the same CLI answering `--help`-free imports: `repro run` against a server
sending a one-line answer) gives the fixed base, so each peak is also printed above that base.
`--tracemalloc` runs scenario 1 in this process instead and prints where the largest allocations
were made at the peak (the copies of the answer).

Usage: `python benchmarks/bench_memory.py [--only 1,2,3] [--answer-mb 50] [--budget-mb 512] [--tracemalloc]`.
Prints numbers only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _child import run_child

from repro.procs.process import free_port, start_process, wait_http_ready

SERVER = Path(__file__).resolve().parent / "big_answer_server.py"
MB = 1_000_000


def start_server() -> tuple[object, str]:
    port = free_port()
    proc = start_process([sys.executable, str(SERVER), "--port", str(port)])
    wait_http_ready(f"http://127.0.0.1:{port}/v1/models", timeout=30, process=proc)
    return proc, f"http://127.0.0.1:{port}"


def repro_run(base: str, out: Path, *args: str, turns: str = "1") -> tuple[float, dict]:
    """One `repro run` process to its end: (peak RSS in MB, its summary.json)."""
    cmd = [sys.executable, "-c", "from repro.cli import main; main()", "run", "--base-url", base, "--model", "bench", "--turns", turns,
           "--out", str(out), "--no-report", "--stall-timeout", "120", "--turn-timeout", "600", "--timeout", "900",
           *args]
    ended = run_child(cmd)
    if ended.code not in (0, 1):
        raise SystemExit(f"repro run failed ({ended.code}): {ended.err.strip()[-400:]}")
    summary = json.loads((out / "summary.json").read_text())
    return ended.max_rss_kib / 1024 * 1.048576, summary


def queued_turns(out: Path, over_s: float = 0.05) -> int:
    turns = [turn for line in (out / "sessions.jsonl").read_text().splitlines() for turn in json.loads(line)["turns"]]
    return sum(turn["queue_s"] > over_s for turn in turns)


def scenarios(args: argparse.Namespace, server: str, scratch: Path) -> None:
    size = int(args.answer_mb * MB)
    base_rss, _ = repro_run(f"{server}/content/100/v1", scratch / "base", "--sessions", "1")
    print(f"base: one session, one 100-byte answer: peak RSS {base_rss:.0f} MB")
    if "1" in args.only:
        rss, summary = repro_run(f"{server}/content/{size}/v1", scratch / "three", "--sessions", "3", "--concurrency", "3")
        print(f"3 sessions x {args.answer_mb:g} MB answers at once: peak RSS {rss:.0f} MB "
              f"({rss - base_rss:.0f} MB over the base, {(rss - base_rss) / (3 * args.answer_mb):.2f}x the answers' bytes); "
              f"outcomes {summary['counts']}")
    if "2" in args.only:
        rss, summary = repro_run(f"{server}/calls/{args.calls}/v1", scratch / "calls", "--sessions", "1")
        print(f"one turn of {args.calls} tool calls: peak RSS {rss:.0f} MB ({rss - base_rss:.0f} MB over the base); "
              f"outcomes {summary['counts']}")
    if "3" in args.only:
        budget = int(args.budget_mb * MB)
        out = scratch / "budget"
        start = time.perf_counter()
        rss, summary = repro_run(f"{server}/content/{size}/v1", out, "--sessions", str(args.sessions),
                                 "--concurrency", str(args.sessions), "--max-bytes-in-flight", str(budget))
        print(f"{args.sessions} sessions at once x {args.answer_mb:g} MB answers, budget {args.budget_mb:g} MB in flight: "
              f"peak RSS {rss:.0f} MB ({rss - base_rss:.0f} MB over the base, {(rss - base_rss) / args.budget_mb:.2f}x the budget); "
              f"outcomes {summary['counts']}; "
              f"{queued_turns(out)} turns queued > 50 ms for the budget; {time.perf_counter() - start:.0f}s")


def traced(url: str, sessions: int, turns: int, scratch: Path) -> None:
    """One scenario in this process under tracemalloc: the allocation sites held at the peak."""
    import tracemalloc

    from repro.cli import main

    import threading

    tracemalloc.start(8)
    peak: list[tracemalloc.Snapshot] = []
    done = threading.Event()

    def watch() -> None:
        # A snapshot whenever the traced memory passes the last one's by a tenth: the last is the peak's.
        taken = 0
        while not done.wait(0.02):
            current = tracemalloc.get_traced_memory()[0]
            if current > taken * 1.1 and current > 20 * MB:
                peak[:] = [tracemalloc.take_snapshot()]
                taken = current

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    sys.argv = ["repro", "run", "--base-url", url, "--model", "bench", "--turns", str(turns),
                "--sessions", str(sessions), "--out", str(scratch / "traced"), "--no-report"]
    try:
        main()
    except SystemExit:
        pass
    done.set()
    watcher.join()
    current, most = tracemalloc.get_traced_memory()
    print(f"tracemalloc: peak {most / MB:.0f} MB, now {current / MB:.0f} MB")
    for stat in peak[0].statistics("traceback")[:10] if peak else ():
        print(f"  {stat.size / MB:8.1f} MB  {stat.count} blocks\n    " + "\n    ".join(stat.traceback.format()[-6:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="1,2,3")
    parser.add_argument("--answer-mb", type=float, default=50)
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--sessions", type=int, default=60)
    parser.add_argument("--budget-mb", type=float, default=512)
    parser.add_argument("--tracemalloc", action="store_true")
    args = parser.parse_args()
    proc, server = start_server()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            print(f"load average {os.getloadavg()[0]:.2f}")
            if args.tracemalloc:
                if args.only == "2":
                    traced(f"{server}/calls/{args.calls}/v1", 1, 1, Path(scratch))
                else:
                    traced(f"{server}/content/{int(args.answer_mb * MB)}/v1", 3, 1, Path(scratch))
            else:
                scenarios(args, server, Path(scratch))
    finally:
        proc.stop()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
