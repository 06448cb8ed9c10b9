"""CPU time of dsml_checker on adversarial inputs, by size: each family must grow linearly with its input.

Run: `python benchmarks/bench_checker_adversarial.py [--sizes 1000,8000,64000,512000] [--only REGEX]`. Each row
is one family (a shape of degenerate model output that once made a pattern backtrack), each column the CPU
time of one verdict at that input size (min over repeats, `time.process_time`), then the ratio of the last two
sizes against their size ratio: linear is about 1×, quadratic is the size ratio. A family whose verdict takes
more than `--give-up` seconds stops growing. tests/test_dsml_linear.py checks the same families by ratio.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from typing import Any, Callable

from dsml_checker import StreamAccumulator, check, split_completion
from dsml_checker.formats import DSMLParseError

Workload = Callable[[], Any]

_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}]
_BLOCK = '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n'


def repeat(unit: str, n: int) -> str:
    """`unit` repeated to about `n` characters."""
    return unit * max(1, n // len(unit))


def in_content(text: str) -> Workload:
    return lambda: check({"role": "assistant", "content": text}, finish_reason="stop", tools=_TOOLS)


def in_reasoning(text: str) -> Workload:
    return lambda: check({"role": "assistant", "content": "ok", "reasoning_content": text}, finish_reason="stop")


def in_arguments(text: str) -> Workload:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": text}}
    return lambda: check({"role": "assistant", "content": None, "tool_calls": [call]}, finish_reason="tool_calls", tools=_TOOLS)


def in_split(text: str, fmt: str = "v4") -> Workload:
    def run() -> None:
        try:
            split_completion(text, fmt=fmt)
        except DSMLParseError:
            pass

    return run


def _call(i: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": json.dumps(args)}}


def many_calls(n: int) -> Workload:
    """n/20 calls of one tool, all with different arguments: none is a duplicate of another."""
    calls = [_call(i, {"a": str(i)}) for i in range(max(1, n // 20))]
    return lambda: check({"role": "assistant", "content": "", "tool_calls": calls}, finish_reason="tool_calls", tools=_TOOLS)


def calls_against_raw(n: int) -> Workload:
    """n/200 calls lacking the invoke's parameter, then as many that have it, against a raw text of n/200 invokes."""
    k = max(1, n // 200)
    calls = [_call(i, {"b": "x"}) for i in range(k)] + [_call(k + i, {"a": str(i)}) for i in range(k)]
    invoke = '<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="true">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
    raw = "\n\n<｜DSML｜tool_calls>\n" + invoke * k + "</｜DSML｜tool_calls>"
    return lambda: check({"role": "assistant", "content": "", "tool_calls": calls}, finish_reason="tool_calls", raw=raw)


def in_stream(n: int) -> Workload:
    """Streamed tool-call deltas without an index: a new call (with an id) then its continuation, n/40 times."""
    chunks = []
    for i in range(max(1, n // 40)):
        chunks.append({"choices": [{"delta": {"tool_calls": [{"id": f"c{i}", "function": {"name": "f", "arguments": "{"}}]}}]})
        chunks.append({"choices": [{"delta": {"tool_calls": [{"function": {"arguments": "}"}}]}}]})

    def run() -> None:
        acc = StreamAccumulator()
        for chunk in chunks:
            acc.add_chunk(chunk)
        acc.message()

    return run


# Family name -> input of about n characters -> one verdict's work.
FAMILIES: dict[str, Callable[[int], Workload]] = {
    "lt-spaces": lambda n: in_content("<" + " " * n),
    "lt-tabs": lambda n: in_content("<" + "\t" * n),
    "lt-spaces-slash": lambda n: in_content("<" + " " * (n // 2) + "/" + " " * (n // 2)),
    "lt-spaces-bar": lambda n: in_content("<" + " " * n + "｜ab"),
    "lt-spaces-reasoning": lambda n: in_reasoning("<" + " \t" * (n // 2)),
    "lt-spaces-args": lambda n: in_arguments('{"a": "<' + " " * n + '｜"}'),
    "spaced-sentinel": lambda n: in_content(repeat("< ｜ DSML ｜ ", n)),
    "bar-blanks-dsml": lambda n: in_content(repeat("｜" + " " * 50 + "DSML ", n)),
    "tool-token": lambda n: in_content(repeat("<｜tool▁", n)),
    "tool-token-args": lambda n: in_arguments(repeat("<｜tool▁", n)),
    "lt-bar": lambda n: in_content(repeat("<｜", n)),
    "sentinel": lambda n: in_content(repeat("｜DSML｜", n)),
    "doubled-bars": lambda n: in_content(repeat("｜｜DSML｜｜ ", n)),
    "invoke-openers": lambda n: in_content(repeat('<｜DSML｜invoke name="', n)),
    "param-closers-prose": lambda n: in_content(repeat("</｜DSML｜parameter> x ", n)),
    "garbled-sentinel": lambda n: in_content(repeat("<｜DSLM｜invoke ", n)),
    "control-tokens": lambda n: in_content(repeat("<｜end▁of▁sentence｜>", n)),
    "backtick-runs": lambda n: in_content(repeat("`` ` ``` ", n)),
    "xml-param-string": lambda n: in_content("<parameter name=" + repeat(" string", n)),
    "escaped-bars-args": lambda n: in_arguments(json.dumps({"a": repeat("\\uff5c", n)})),
    "repeated-lines": lambda n: in_content("<｜DSML｜invoke\n" + "".join(f"line number {i % 200} is here\n" for i in range(n // 22))),
    "parse-unclosed-params": lambda n: in_split(
        _BLOCK + repeat('<｜DSML｜parameter name="a" string="true">x', n) + "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    ),
    "stream-unindexed-calls": in_stream,
    "many-distinct-calls": many_calls,
    "quoted-bare-tags": lambda n: in_content(repeat('`<invoke name="f">` ', n)),
    "raw-spans-and-invokes": lambda n: (
        lambda raw: lambda: check({"role": "assistant", "content": "ok"}, finish_reason="stop", raw=raw)
    )(repeat("`a` ", n // 2) + repeat('<｜DSML｜invoke name="f"/>', n // 2)),
    "calls-against-raw": calls_against_raw,
}


def cpu_seconds(work: Workload, *, repeats: int = 3, budget: float = 1.0) -> float:
    """The least CPU time of one run of `work` over `repeats` runs (fewer when one run exceeds `budget`)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
        if best > budget:
            break
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,8000,64000,512000", help="input sizes in characters, ascending")
    parser.add_argument("--only", default="", help="regular expression: measure the families it finds")
    parser.add_argument("--give-up", type=float, default=20.0, help="stop growing a family past this many CPU seconds")
    opts = parser.parse_args()
    sizes = [int(s) for s in opts.sizes.split(",")]
    print(f"{'family':24s}" + "".join(f"{n:>11,d}" for n in sizes) + "   growth/size-ratio (last two)")
    for name, family in FAMILIES.items():
        if not re.search(opts.only, name):
            continue
        cells, times = [], []
        for n in sizes:
            if times and times[-1] > opts.give_up:
                cells.append(f"{'—':>11s}")
                continue
            seconds = cpu_seconds(family(n))
            times.append(seconds)
            cells.append(f"{seconds * 1e3:9.1f}ms")
        growth = ""
        if len(times) >= 2 and times[-2] > 0:
            size_ratio = sizes[len(times) - 1] / sizes[len(times) - 2]
            growth = f"   {times[-1] / times[-2] / size_ratio:5.2f}×"
        print(f"{name:24s}" + "".join(cells) + growth, flush=True)


if __name__ == "__main__":
    main()
