"""The checker's time is linear in its input, on adversarial shapes (issue 11, item 5).

Each family of degenerate output (the same ones benchmarks/bench_checker_adversarial.py prints) and each
hypothesis-built mix of markup fragments is judged at size n and 8n within one run; the CPU-time ratio must stay
near 8. A quadratic pattern gives about 64. Ratios, never absolute times: the bound holds on a slow or busy
machine alike. CPU time (min over repeats, collector off) keeps other processes and pauses out of the figure.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_checker_adversarial", ROOT / "benchmarks" / "bench_checker_adversarial.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

GROWTH = 8
MAX_RATIO = 25  # linear is about 8; n log n would still pass, quadratic (about 64) cannot
# Below this much CPU a measurement is mostly clock and cache noise; a ratio is taken against at least this.
FLOOR_S = 200e-6

Workload = Callable[[], Any]


def cpu_cost(work: Workload, repeats: int = 3) -> float:
    """The least CPU time of one run of `work` over `repeats` runs, after one untimed run (caches, compiles)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        work()
        best = float("inf")
        for _ in range(repeats):
            start = time.process_time()
            work()
            best = min(best, time.process_time() - start)
        return best
    finally:
        if was_enabled:
            gc.enable()


def growth_ratio(make: Callable[[int], Workload], n: int) -> tuple[float, float, float]:
    small, large = cpu_cost(make(n)), cpu_cost(make(GROWTH * n))
    return large / max(small, FLOOR_S), small, large


@pytest.mark.parametrize("family", sorted(bench.FAMILIES))
def test_each_adversarial_family_is_linear(family: str) -> None:
    # Large enough that a quadratic term with a small constant (a copy of the prefix per match) shows.
    ratio, small, large = growth_ratio(bench.FAMILIES[family], 64_000)
    assert ratio < MAX_RATIO, f"{family}: {small * 1e3:.2f} ms at 64K, {large * 1e3:.2f} ms at 512K, ratio {ratio:.1f}"


# Fragments of markup a broken model could emit. A text is a unit repeated to size, alone (many matches) or after
# a head and before a tail (a unit of blanks after "<" is one long match). Rules anchor on "<", bars, the DSML
# word, "$" and backticks, so a head ends with one of those; half the units' fragments are blanks.
FRAGMENTS = [
    "<", "</", ">", "/", " ", "\t", "\n", "｜", "|", "‖", "｜｜", "DSML", "dsml", "DSLM", "ſ", "tool▁", "tool_calls",
    "invoke", "parameter", "calls", "begin", "sep", "end▁of▁sentence", 'name="', '"', "“", " string=", "true",
    "=", "`", "```", "~~~", "$TOOL_NAME", "think>", "function_calls>", "{", "}", "[", "]", "\\u", "ff5c", "x",
    "<｜DSML｜", "</｜DSML｜parameter>", "<｜DSML｜invoke", "<｜tool▁calls▁begin｜>",
]
ANCHORS = ["<", "</", "<｜", "｜", "|", "DSML", "<｜DSML｜", "</｜DSML｜", "$", "`"]
pieces = st.lists(st.sampled_from(FRAGMENTS), max_size=5).map("".join)
heads = st.tuples(pieces, st.sampled_from(ANCHORS)).map("".join)
units = st.lists(st.one_of(st.sampled_from([" ", "\t", "\n"]), st.sampled_from(FRAGMENTS)), min_size=1, max_size=3).map("".join)
PLACES = ("content", "reasoning", "arguments", "arguments-json", "split-v4", "split-v31")


def _workload(place: str, text: str) -> Workload:
    if place == "content":
        return bench.in_content(text)
    if place == "reasoning":
        return bench.in_reasoning(text)
    if place == "arguments":
        return bench.in_arguments(text)
    if place == "arguments-json":
        return bench.in_arguments(json.dumps({"a": text}))
    return bench.in_split("<｜DSML｜tool_calls>" + text, fmt=place.removeprefix("split-"))


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(place=st.sampled_from(PLACES), framed=st.booleans(), head=heads, unit=units, tail=pieces)
def test_mixed_markup_is_linear(place: str, framed: bool, head: str, unit: str, tail: str) -> None:
    def make(n: int) -> Workload:
        body = unit * max(1, n // len(unit))
        return _workload(place, head + body + tail if framed else body)

    ratio, small, large = growth_ratio(make, 32_000)
    target(ratio)  # steer the search towards inputs whose cost grows fastest
    assert ratio < MAX_RATIO, f"{small * 1e3:.2f} ms at 32K, {large * 1e3:.2f} ms at 256K, ratio {ratio:.1f}"
