"""`repro trace convert` against conversation length: one conversation of N turns, logged as a gateway logs it
(every call carries the whole history so far), converted; prints the log size and the time per length.

A converter linear in the log's size takes about 4x the time when the turns double (the log itself
grows 4x, each call repeating the history); a cubic one took 194 s at 400 turns (34 MB). Each conversion
runs in a fresh process, whose peak RSS is printed: the converter streams the log (twice), so its memory
follows the conversation written, not the log read.

    .venv/bin/python benchmarks/bench_convert.py [--turns 100 200 400]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from _child import run_child

CONVERT = """
import sys, time
from pathlib import Path
from repro.workload.convert import convert
started = time.perf_counter()
calls, conversations = convert(Path(sys.argv[1]), Path(sys.argv[2]))
print(calls, conversations, time.perf_counter() - started)
"""

FILLER = "word " * 16


def write_log(path: Path, turns: int) -> int:
    """One conversation of `turns` assistant turns, one log line per call; returns the log's size in bytes."""
    history: list[dict] = [{"role": "system", "content": "You are a coding agent. " + FILLER},
                           {"role": "user", "content": "Fix the bug. " + FILLER}]
    with open(path, "w", encoding="utf-8") as fh:
        for turn in range(turns):
            answer = {"role": "assistant", "content": f"step {turn}: " + FILLER}
            response = {"id": f"r{turn}", "object": "chat.completion", "created": 1_700_000_000 + turn,
                        "choices": [{"index": 0, "message": answer, "finish_reason": "stop"}]}
            fh.write(json.dumps({"request": {"model": "m", "messages": history}, "response": response}) + "\n")
            history = [*history, answer, {"role": "user", "content": f"go on ({turn}) " + FILLER}]
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="*", default=[100, 200, 400])
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-convert-") as tmp:
        print(f"{'turns':>6} {'log MB':>8} {'convert s':>10} {'peak RSS MB':>12}")
        for turns in options.turns:
            log = Path(tmp) / f"log-{turns}.jsonl"
            size = write_log(log, turns)
            ended = run_child([sys.executable, "-c", CONVERT, str(log), str(Path(tmp) / f"trace-{turns}.jsonl")])
            assert ended.code == 0, ended.err[-500:]
            calls, conversations, elapsed = ended.out.split()
            assert (int(calls), int(conversations)) == (turns, 1)
            print(f"{turns:>6} {size / 1e6:>8.1f} {float(elapsed):>10.2f} {ended.max_rss_kib / 1024:>12.0f}", flush=True)


if __name__ == "__main__":
    main()
