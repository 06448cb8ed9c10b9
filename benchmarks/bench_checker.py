"""Verdicts per second of dsml_checker.check on realistic ~2 KB turns, clean, corrupt and mixed, on one core.

Run: `python benchmarks/bench_checker.py [--seconds S]`. The target is 20,000 verdicts/s for the mix, so the
checker never limits a load run. Wall-clock rates depend on what else the machine runs; the CPU-second rate
(verdicts per second of this process's CPU time) is the one-core figure, and the cost of one verdict in units
of a fixed pure-Python loop (the yardstick) lets numbers from a busy machine be compared with an idle one.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from typing import Any

from dsml_checker import ToolCall, check, render_calls

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    opts = parser.parse_args()
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

if __name__ == "__main__":
    main()
