"""Peak memory of loading a large trace against the sessions that replay it: a generated trace of about
`--mb` MB (the example conversations, repeated under new ids), loaded by `repro run`'s loader in a fresh
process for each `--sessions` value, and optionally replayed end to end (`--run`: `repro run --sessions 10
--turns 1` against the embedded simulator). Prints each process's peak RSS and time.

A trace streams: every line is validated and hashed, but only the conversations the sessions replay are kept,
so a 200 MB trace at --sessions 10 costs about what the interpreter does, where keeping every conversation
costs several times the file's size. `all` keeps every conversation (what a run whose sessions outnumber the
conversations keeps).

    .venv/bin/python benchmarks/bench_trace_memory.py [--mb 200] [--sessions 10 all] [--run]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from _child import run_child

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "traces.jsonl"

LOAD = """
import resource, sys
from repro.workload.scenario import load_scenario
sessions = None if sys.argv[2] == "all" else int(sys.argv[2])
trace = load_scenario(sys.argv[1], sessions=sessions).scenario
print(len(trace.conversations), trace.count, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""

BASELINE = """
import resource
import repro.workload.scenario
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def write_trace(path: Path, megabytes: int) -> tuple[int, int]:
    """The example's conversations repeated under new ids up to `megabytes` MB; (lines, bytes)."""
    examples = [json.loads(line) for line in EXAMPLE.read_text(encoding="utf-8").split("\n") if line.strip()]
    written = lines = 0
    with open(path, "w", encoding="utf-8") as fh:
        while written < megabytes * 1_000_000:
            conversation = examples[lines % len(examples)] | {"id": f"conversation-{lines}"}
            line = json.dumps(conversation, ensure_ascii=False) + "\n"
            fh.write(line)
            written += len(line.encode("utf-8"))
            lines += 1
    return lines, written


def measured(argv: list[str]) -> tuple[str, float, float]:
    """Run a child to its end; (its stdout, wall seconds, its own peak RSS in MB, from wait4)."""
    ended = run_child(argv)
    if ended.code != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed ({ended.code}): {ended.err[-500:]}")
    return ended.out, ended.wall_s, ended.max_rss_kib / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--sessions", nargs="+", default=["10", "all"])
    parser.add_argument("--run", action="store_true", help="also replay 10 sessions of one turn end to end")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "big.jsonl"
        lines, size = write_trace(trace, args.mb)
        print(f"trace: {lines} conversations, {size / 1e6:.0f} MB")
        _, _, base = measured([sys.executable, "-c", BASELINE])
        print(f"interpreter with the loader imported: peak RSS {base:.0f} MB")
        for sessions in args.sessions:
            out, seconds, peak = measured([sys.executable, "-c", LOAD, str(trace), sessions])
            kept, count, _ = out.split()
            print(f"load, --sessions {sessions:>4}: kept {kept} of {count} conversations; peak RSS {peak:.0f} MB "
                  f"({peak / (size / 2**20):.2f}x the file); {seconds:.1f} s")
        if args.run:
            out_dir = Path(tmp) / "runs"
            argv = [str(Path(sys.executable).parent / "repro"), "run", "--workload", str(trace), "--sessions", "10",
                    "--turns", "1", "--out", str(out_dir), "--sim-args", "--time-scale 0 --clock virtual"]
            _, seconds, peak = measured(argv)
            print(f"repro run --sessions 10 --turns 1: peak RSS {peak:.0f} MB; {seconds:.1f} s")


if __name__ == "__main__":
    main()
