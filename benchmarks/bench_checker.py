"""Verdicts per second of dsml_checker.check on realistic ~2 KB turns, clean, corrupt and mixed, on one core,
and the speed against the wave-1 checker, measured side by side in this one process.

Run: `python benchmarks/bench_checker.py [--seconds S] [--repeats R] [--against REV]`. The target is 20,000
verdicts/s for the mix, so the checker never limits a load run. Wall-clock rates depend on what else the
machine runs; the CPU-second rate (verdicts per second of this process's CPU time) is the one-core figure, and
the cost of one verdict in units of a fixed pure-Python loop (the yardstick) lets numbers from a busy machine be
compared with an idle one.

The comparison takes the checker of git revision REV (`git archive` into a temporary directory, imported as
the package `dsml_checker_then`), and times both checkers on the same turns, alternating which goes first,
`--repeats` times; each repeat gives one ratio (CPU time of a verdict then / now, so above 1 means faster now),
and the median is the figure. The default REV, 60a210d, is the wave-1 checker: the last commit of the
checker's first complete wave (every rule of docs/checker-rules.md's text, tool-call, consistency and soft
groups, and the near-linear scans), before raw-text judging, the server-parser emulations and the turn rules
(duplicate-call, reasoning-replayed, resent-prefix, ...) were added. 7b100e4, the first commit with the soft
rules, is no fairer a yardstick: it lacks a dozen later speed-ups of that same wave and is quadratic on
adversarial input.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from dsml_checker import ToolCall, check, render_calls

WAVE_1 = "60a210d"
REPO = Path(__file__).resolve().parent.parent
Judge = Callable[..., Any]

WORDS = (
    "the cache layer request token server latency weather forecast Paris Rome index prefix batch decode "
    "result check value session agent tool output report table config memory host device copy load"
).split()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
                "required": ["query"],
            },
        },
    },
]


def _prose(rng: random.Random, size: int) -> str:
    """Markdown-ish answer text: sentences, a list, a small table, an inline code span, a comparison."""
    parts: list[str] = []
    while sum(map(len, parts)) < size:
        kind = rng.random()
        if kind < 0.6:
            sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20)))
            parts.append(sentence.capitalize() + ". ")
        elif kind < 0.75:
            parts.append("\n- " + " ".join(rng.choice(WORDS) for _ in range(6)) + "\n")
        elif kind < 0.85:
            parts.append(f"\n| layer | ms |\n|---|---|\n| {rng.randint(0, 60)} | {rng.random():.2f} |\n")
        elif kind < 0.95:
            parts.append(f"Use `cache_{rng.choice(WORDS)}` when 3 < {rng.randint(4, 9)}. ")
        else:
            parts.append("\n\n")
    return "".join(parts)[:size]


def _call_message(rng: random.Random) -> dict[str, Any]:
    args = {"query": _prose(rng, 600), "limit": 5, "tags": ["a", "b"]}
    return {
        "role": "assistant",
        "content": _prose(rng, 300),
        "reasoning_content": _prose(rng, 900),
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search_docs", "arguments": json.dumps(args)}}],
    }


def clean_turns(rng: random.Random, n: int) -> list[tuple[dict[str, Any], str]]:
    turns = []
    for i in range(n):
        if i % 2:
            turns.append((_call_message(rng), "tool_calls"))
        else:
            turns.append(({"role": "assistant", "content": _prose(rng, 1400), "reasoning_content": _prose(rng, 600)}, "stop"))
    return turns


def corrupt_turns(rng: random.Random, n: int) -> list[tuple[dict[str, Any], str]]:
    turns = []
    for i in range(n):
        block = render_calls([ToolCall("get_weather", {"city": "Paris", "days": 3}), ToolCall("search_docs", {"query": _prose(rng, 200)})])
        prose = _prose(rng, 1500)
        shape = i % 5
        if shape == 0:  # the classic leak: well-formed block delivered as content
            msg = {"content": prose + "\n\n" + block}
        elif shape == 1:  # garbled bars, truncated
            msg = {"content": prose + "\n\n" + block.replace("｜DSML｜", "|DSML|")[: len(block) // 2]}
        elif shape == 2:  # block stayed in reasoning
            msg = {"content": "", "reasoning_content": prose + block}
        elif shape == 3:  # re-sent buffer
            msg = {"content": prose[:1000] + prose[:1000]}
        else:  # DSML inside arguments
            args = json.dumps({"city": "Paris</｜DSML｜parameter>", "days": 2})
            msg = {"content": prose, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": args}}]}
        turns.append((msg, "stop"))
    return turns


def _yardstick() -> None:
    sum(range(20_000))


def measure(turns: list[tuple[dict[str, Any], str]], seconds: float) -> tuple[float, float, float]:
    """Verdicts per wall second, per CPU second of this process, and the CPU cost of one verdict in yardsticks.

    A yardstick (a fixed pure-Python loop) runs between passes, so a verdict's cost is measured against the
    speed the core had at that very moment: the ratio holds still while other work on the machine comes and goes.
    """
    done = yardsticks = 0
    check_cpu = yard_cpu = wall = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        w0, c0 = time.perf_counter(), time.process_time()
        for message, finish in turns:
            check(message, finish_reason=finish, tools=TOOLS)
        c1 = time.process_time()
        wall += time.perf_counter() - w0
        check_cpu += c1 - c0
        done += len(turns)
        for _ in range(5):
            _yardstick()
        yard_cpu += time.process_time() - c1
        yardsticks += 5
    return done / wall, done / check_cpu, (check_cpu / done) / (yard_cpu / yardsticks)


def checker_at(rev: str) -> Judge:
    """`check` of the dsml_checker at git revision `rev`, imported as `dsml_checker_then` from a temporary copy.

    The copy's own imports are renamed, so both checkers live in this process without sharing a module.
    """
    try:
        tar = subprocess.run(["git", "archive", rev, "dsml_checker"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"bench_checker: cannot take dsml_checker at {rev!r} from git: {getattr(e, 'stderr', b'').decode().strip() or e}")
    root = Path(tempfile.mkdtemp(prefix="bench-checker-"))
    tarfile.open(fileobj=io.BytesIO(tar)).extractall(root)
    package = root / "dsml_checker_then"
    (root / "dsml_checker").rename(package)
    for source in package.rglob("*.py"):
        source.write_text(re.sub(r"\bdsml_checker\b", "dsml_checker_then", source.read_text("utf-8")), "utf-8")
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module("dsml_checker_then").check
    finally:
        sys.path.remove(str(root))
        shutil.rmtree(root)  # every module `check` uses is loaded by now


def _cpu_per_verdict(judge: Judge, turns: list[tuple[dict[str, Any], str]], seconds: float) -> float:
    done, spent = 0, 0.0
    while spent < seconds:
        start = time.process_time()
        for message, finish in turns:
            judge(message, finish_reason=finish, tools=TOOLS)
        spent += time.process_time() - start
        done += len(turns)
    return spent / done


def compare(
    now: Judge, then: Judge, turns: list[tuple[dict[str, Any], str]], repeats: int, seconds: float
) -> list[tuple[float, float]]:
    """CPU seconds per verdict (now, then), one pair per repeat; the two alternate which runs first."""
    pairs = []
    for i in range(repeats):
        if i % 2:
            then_cost = _cpu_per_verdict(then, turns, seconds)
            now_cost = _cpu_per_verdict(now, turns, seconds)
        else:
            now_cost = _cpu_per_verdict(now, turns, seconds)
            then_cost = _cpu_per_verdict(then, turns, seconds)
        pairs.append((now_cost, then_cost))
    return pairs


def kinds(clean: list[tuple[dict[str, Any], str]], corrupt: list[tuple[dict[str, Any], str]]) -> dict[str, list[tuple[dict[str, Any], str]]]:
    """The turns the comparison reports on: clean tool-call turns, clean prose turns, and turns whose DSML leaked
    (into the content, garbled, into the reasoning, into a call's arguments)."""
    return {
        "clean tool-call": [t for t in clean if "tool_calls" in t[0]],
        "clean prose": [t for t in clean if "tool_calls" not in t[0]],
        "DSML leak": [t for i, t in enumerate(corrupt) if i % 5 != 3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    parser.add_argument("--repeats", type=int, default=7, help="side-by-side repeats per kind of turn (median reported)")
    parser.add_argument("--against", default=WAVE_1, help="git revision of the checker to compare with (default: wave 1)")
    parser.add_argument("--no-compare", action="store_true", help="skip the side-by-side comparison")
    opts = parser.parse_args()
    then = None if opts.no_compare else checker_at(opts.against)
    rng = random.Random(7)
    clean = clean_turns(rng, 200)
    corrupt = corrupt_turns(rng, 200)
    for msg, finish in clean:
        verdict = check(msg, finish_reason=finish, tools=TOOLS)
        assert verdict.label == "clean", (verdict.to_dict(), msg)
    for msg, finish in corrupt:
        assert check(msg, finish_reason=finish, tools=TOOLS).label == "corrupt", msg
    realistic = clean + corrupt[: len(clean) * 15 // 85]  # 15% corrupt: the worst rate the seed reports
    even = clean + corrupt
    rng.shuffle(realistic)
    rng.shuffle(even)
    size = sum(len(json.dumps(m, ensure_ascii=False)) for m, _ in even) / len(even)
    print(f"mean message size: {size:.0f} bytes (JSON); load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    start = time.process_time()
    for _ in range(20):
        _yardstick()
    yard_us = (time.process_time() - start) / 20 * 1e6
    print(f"yardstick: sum(range(20000)), {yard_us:.0f} µs of CPU here at the start")
    print(f"{'turns':14s} {'wall verdicts/s':>16s} {'CPU verdicts/s':>16s} {'yardsticks/verdict':>19s}")
    for name, turns in (("clean", clean), ("corrupt", corrupt), ("mix 85/15", realistic), ("mix 50/50", even)):
        wall, cpu, cost = measure(turns, opts.seconds)
        print(f"{name:14s} {wall:16,.0f} {cpu:16,.0f} {cost:19.3f}")
    if then is None:
        return
    print(f"\nagainst the checker at {opts.against} (CPU per verdict then / now; above 1 is faster now), "
          f"{opts.repeats} alternating repeats of {opts.seconds / 4:.2f} s each side")
    print(f"{'turns':16s} {'median':>7s} {'min':>6s} {'max':>6s}  {'µs now':>7s} {'µs then':>7s}  repeats")
    for name, turns in kinds(clean, corrupt).items():
        pairs = compare(check, then, turns, opts.repeats, opts.seconds / 4)
        ratios = [then_cost / now_cost for now_cost, then_cost in pairs]
        now_us = statistics.median(now_cost for now_cost, _ in pairs) * 1e6
        then_us = statistics.median(then_cost for _, then_cost in pairs) * 1e6
        listed = " ".join(f"{r:.2f}" for r in ratios)
        print(f"{name:16s} {statistics.median(ratios):6.2f}× {min(ratios):5.2f}× {max(ratios):5.2f}×  {now_us:7.1f} {then_us:7.1f}  {listed}")

if __name__ == "__main__":
    main()
