"""The pre-scan never hides a finding: `check` with its cheap signals (dsml_checker.prescan) gives the same
verdict and findings as with every signal answering "maybe", on generated clean and damaged turns; and the
short cuts of the hot path answer as the general code they stand in for."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsml_checker import ToolCall, check, prescan, render_calls
from dsml_checker.check import _decode
from dsml_checker.soft_rules import _NOT_RARE, _SEPARATOR, _candidate_windows, _loops, scan_soft
from dsml_checker.text_rules import NOT_JSON, _quoted_regions, _single_ticks, _ticks_quote
from dsml_checker.turn_rules import scan_turn, tool_schemas

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GATES = [name for name, value in vars(prescan).items() if callable(value) and name.startswith("may_")]

# Pieces that trip the rules (markup whole, garbled and cut; tokens; loops; rare characters; re-sent text),
# mixed with prose, so that a gate that wrongly answers "no" meets the scan it skips.
_BLOCK = render_calls([ToolCall("get_weather", {"city": "Paris", "days": 3})])
_MARKUP = [
    _BLOCK, _BLOCK[: len(_BLOCK) // 2], _BLOCK.replace("｜DSML｜", "|DSML|"), _BLOCK.replace("｜DSML｜", "｜ dsml｜"),
    "<｜DSML｜invoke", "</｜DSML｜parameter>", "<｜DSLM｜invoke ", "<DSML｜tool_calls>", "<｜tool▁calls▁begin｜>",
    "<｜end▁of▁sentence｜>", "</think>", '<invoke name="get_weather">', "<function_calls>", "$TOOL_NAME", "`", "```\n",
    "<", " < ", "｜", "|", "‖", "\ufffd\ufffd\ufffd", "\x00\x01\x02", "\ue000\ue001\ue002", "dsml", "DSML",
]
_UNITS = st.text(st.sampled_from(list("ab0 .-|x\n｜é")), min_size=1, max_size=8)
_PROSE = st.text(st.sampled_from(list("abcdefghij klmnop,.!?\n`<>|")), max_size=120)
_PIECES = st.one_of(
    _PROSE,
    st.sampled_from(_MARKUP),
    st.builds(lambda unit, n: unit * n, _UNITS, st.integers(1, 60)),
)
texts = st.lists(_PIECES, max_size=8).map("".join)
# A text repeated: a re-sent answer, or its first part re-sent growing.
damaged = texts | st.builds(lambda t, k: t[:k] + t, texts, st.integers(0, 200)) | st.builds(lambda t: t + t, texts)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
]


@st.composite
def messages(draw: st.DrawFn) -> tuple[dict[str, Any], str | None]:
    message: dict[str, Any] = {"role": "assistant", "content": draw(st.none() | damaged)}
    if draw(st.booleans()):
        message["reasoning_content"] = draw(damaged)
    calls = []
    for i in range(draw(st.integers(0, 3))):
        args = draw(st.one_of(
            st.builds(lambda city: json.dumps({"city": city}, ensure_ascii=False), damaged),
            st.builds(lambda city: json.dumps({"city": city}), damaged),  # \u-escaped
            damaged,
        ))
        calls.append({"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": args}})
    if calls:
        message["tool_calls"] = calls
    return message, draw(st.sampled_from([None, "stop", "length", "tool_calls"]))


@contextmanager
def every_gate_open() -> Iterator[None]:
    saved = {name: getattr(prescan, name) for name in GATES}
    for name in GATES:
        setattr(prescan, name, lambda *args, **kwargs: True)
    try:
        yield
    finally:
        for name, gate in saved.items():
            setattr(prescan, name, gate)


def test_there_are_gates_to_test() -> None:
    assert {"may_loop", "may_repeat", "may_be_rare"} <= set(GATES)


@SETTINGS
@given(case=messages(), raw=st.none() | damaged)
def test_the_fast_path_finds_what_the_full_path_finds(case: tuple[dict[str, Any], str | None], raw: str | None) -> None:
    message, finish = case
    fast = check(message, finish_reason=finish, tools=TOOLS, raw=raw)
    with every_gate_open():
        full = check(message, finish_reason=finish, tools=TOOLS, raw=raw)
    assert fast == full


_TOOL_LISTS = st.sampled_from([None, [], TOOLS, [{"type": "function"}], [{"function": {"name": "get_weather"}}], "tools"])


@SETTINGS
@given(content=damaged, reasoning=damaged, tools=_TOOL_LISTS, finish=st.sampled_from([None, "stop", "tool_calls"]))
def test_the_turn_rules_build_the_schemas_only_when_needed_and_find_the_same(
    content: str, reasoning: str, tools: Any, finish: str | None
) -> None:
    # check() hands a turn without calls no schemas: the turn rules build them for a bare tool tag alone.
    lazy = scan_turn(content, reasoning, None, tools, finish, None)
    assert lazy == scan_turn(content, reasoning, None, tools, finish, None, None, tool_schemas(tools))


# Bytes with runs of short units among noise: where a gate that wrongly answers "no" would hide a loop.
_RUNS = st.lists(st.binary(max_size=40) | st.builds(lambda u, n: u * n, st.binary(min_size=1, max_size=8), st.integers(1, 80)), max_size=8)


@SETTINGS
@given(parts=_RUNS)
def test_no_loop_signal_means_no_candidate_window_and_no_repeat_signal_no_loop(parts: list[bytes]) -> None:
    raw = b"".join(parts)
    if not prescan.may_loop(raw):
        assert _candidate_windows(raw) == []
    if not prescan.may_repeat(raw):
        assert _loops(raw) == []


# Rare characters of one to four bytes, and their neighbours that are not rare (a lone U+FFFD, a fullwidth bar).
_RARE_CHARS = ["\x00", "\x01", "\x7f", "\x85", "\ufffd", "\ue000", "\u200b", "\ufeff", "\U000f0000", "｜", "é", "\n", "a", " "]
_RARE_TEXT = st.lists(st.sampled_from(_RARE_CHARS) | _PROSE, max_size=12).map("".join)


@SETTINGS
@given(fields=st.lists(_RARE_TEXT, min_size=1, max_size=4))
def test_no_rare_signal_means_no_rare_run(fields: list[str]) -> None:
    encoded = [text.encode("utf-8", "surrogatepass") for text in fields]
    raw = _SEPARATOR.join(encoded)
    if not prescan.may_be_rare(raw, _NOT_RARE):
        # (The whole-string pass may still answer yes: deleting the plain bytes joins rare ones that stood apart.)
        assert not any(f.rule == "rare-chars" for f in scan_soft([(str(i), t) for i, t in enumerate(fields)], encoded))


@pytest.mark.parametrize("rare", ["\x01", "\x85", "\ue000", "\U000f0000"])
@pytest.mark.parametrize("lead", [0, 1, 2, 3])
def test_the_shortest_rare_run_gives_the_rare_signal(rare: str, lead: int) -> None:
    raw = ("x" * lead + rare * 3 + "y").encode("utf-8")
    assert prescan.may_be_rare(raw, _NOT_RARE)


@pytest.mark.parametrize("unit", [b"0", b"ab", b"abc", b"abcd", b"abcde", b"abcdef", b"abcdefg", b"abcdefgh", "ｘ".encode()])
@pytest.mark.parametrize("lead", [0, 1, 2, 3, 5, 7])
def test_a_loop_always_gives_the_signal(unit: bytes, lead: int) -> None:
    raw = b"z" * lead + unit * (200 // len(unit)) + b"y"
    assert _candidate_windows(raw)
    assert prescan.may_loop(raw)
    assert prescan.may_repeat(raw)


@pytest.mark.parametrize("unit", [b"0", b"abc", b"abcde", b"abcdefg", b"abcdefgh"])
@pytest.mark.parametrize("lead", [0, 1, 2, 3])
def test_the_shortest_loop_gives_the_repeat_signal(unit: bytes, lead: int) -> None:
    # 48 bytes of one unit, the least the exact pass reports, wherever it starts against the sample.
    raw = b"\xff" * lead + (unit * 48)[:48] + b"\xfe"
    assert prescan.may_repeat(raw)


def test_a_table_repeated_every_40_bytes_gives_no_repeat_signal() -> None:
    table = b"\n| layer | ms |\n|---|---|\n| 42 | 0.89 |\n"
    assert prescan.may_loop(table * 3) and not prescan.may_repeat(table * 3)


@SETTINGS
@given(text=st.text(st.sampled_from(list("ab`~\n ")), max_size=40), start=st.integers(0, 40), width=st.integers(0, 6))
def test_quoting_counted_up_to_a_match_agrees_with_the_quoted_regions(text: str, start: int, width: int) -> None:
    ticks = _single_ticks(text)
    if ticks is not None:
        regions = _quoted_regions(text)
        assert _ticks_quote(ticks, start, start + width) == any(lo <= start and hi >= start + width for lo, hi in regions)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
_AROUND = st.sampled_from(["", " ", "\n", "\ufeff", "x", "{", "}", ",1"])


@SETTINGS
@given(value=_JSON, before=_AROUND, after=_AROUND, cut=st.integers(0, 3))
def test_arguments_decode_as_json_loads_does(value: Any, before: str, after: str, cut: int) -> None:
    text = before + json.dumps(value, ensure_ascii=cut % 2 == 0) + after
    text = text[: len(text) - cut // 2]  # sometimes cut short by a character
    try:
        expected = json.loads(text)
    except ValueError:
        expected = NOT_JSON
    got = _decode(text)
    # json.dumps of both sides compares NaN with NaN (it is never equal to itself).
    assert got is expected if expected is NOT_JSON else json.dumps(got) == json.dumps(expected)
