"""StreamAccumulator: streamed deltas rebuild the same message, so a streamed turn is judged whole."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dsml_checker import StreamAccumulator, ToolCall, check, render_calls


def chunk(delta: Any = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def _pieces(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(points, points[1:])]


def test_content_reasoning_and_calls_merge_by_index() -> None:
    acc = StreamAccumulator()
    acc.add_chunk(chunk({"role": "assistant", "reasoning_content": "I should "}))
    acc.add_chunk(chunk({"reasoning_content": "look."}))
    acc.add_chunk(chunk({"content": "Let me check."}))
    acc.add_chunk(chunk({"tool_calls": [{"index": 0, "id": "a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}))
    acc.add_chunk(chunk({"tool_calls": [{"index": 1, "id": "b", "type": "function", "function": {"name": "submit", "arguments": "{}"}}]}))
    acc.add_chunk(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}))
    acc.add_chunk(chunk({"tool_calls": [{"index": 0, "id": "ignored", "function": {"name": "ignored", "arguments": '"Paris"}'}}]}))
    acc.add_chunk(chunk({}, finish="tool_calls"))
    acc.add_chunk({"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5}})
    message = acc.message()
    assert message["content"] == "Let me check."
    assert message["reasoning_content"] == "I should look."
    assert message["tool_calls"] == [
        {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "b", "type": "function", "function": {"name": "submit", "arguments": "{}"}},
    ]
    assert acc.finish_reason == "tool_calls"
    assert acc.usage == {"prompt_tokens": 10, "completion_tokens": 5}
    assert acc.malformed == 0 and acc.chunks == 9


def test_junk_is_counted_not_raised() -> None:
    acc = StreamAccumulator()
    for junk in ["data", 3, None, {"choices": "x"}, {"choices": [5]}, chunk("not a dict"), chunk({"tool_calls": "x"}),
                 chunk({"tool_calls": [7]}), chunk({"tool_calls": [{"index": 0, "function": "f"}]})]:
        acc.add_chunk(junk)
    acc.add_chunk(chunk({"content": "ok", "reasoning_content": None}))
    assert acc.malformed == 9
    assert acc.message()["content"] == "ok"
    assert acc.message()["reasoning_content"] is None


def test_calls_without_an_index_continue_the_last_or_start_on_a_new_id() -> None:
    acc = StreamAccumulator()
    acc.add_chunk(chunk({"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": '{"x"'}}]}))
    acc.add_chunk(chunk({"tool_calls": [{"function": {"arguments": ": 1}"}}]}))
    acc.add_chunk(chunk({"tool_calls": [{"id": "b", "function": {"name": "g", "arguments": "{}"}}]}))
    assert [c["function"] for c in acc.message()["tool_calls"]] == [
        {"name": "f", "arguments": '{"x": 1}'},
        {"name": "g", "arguments": "{}"},
    ]


def test_an_empty_stream_is_an_empty_message() -> None:
    assert StreamAccumulator().message() == {"role": "assistant", "content": None, "reasoning_content": None, "tool_calls": None}


LEAK = "Let me check.\n\n" + render_calls([ToolCall("get_weather", {"city": "Paris"})])


@settings(max_examples=60, deadline=None)
@given(content_cuts=st.lists(st.integers(0, 10_000), max_size=12), arg_cuts=st.lists(st.integers(0, 10_000), max_size=6),
       leak=st.booleans())
def test_any_chunking_gives_the_verdict_of_the_whole(content_cuts: list[int], arg_cuts: list[int], leak: bool) -> None:
    content = LEAK if leak else "The forecast: sunny, 21 °C; 3 < 5 so no umbrella."
    args = json.dumps({"city": "Paris", "days": 3})
    acc = StreamAccumulator()
    for piece in _pieces(content, content_cuts):
        acc.add_chunk(chunk({"content": piece}))
    for i, piece in enumerate(_pieces(args, arg_cuts)):
        head = {"id": "c1", "type": "function", "function": {"name": "get_weather"}} if i == 0 else {"function": {}}
        head["function"]["arguments"] = piece
        acc.add_chunk(chunk({"tool_calls": [{"index": 0, **head}]}))
    acc.add_chunk(chunk({}, finish="tool_calls"))
    whole = {"role": "assistant", "content": content, "reasoning_content": None,
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]}
    assert acc.message() == whole
    assert check(acc.message(), finish_reason=acc.finish_reason) == check(whole, finish_reason="tool_calls")
    assert check(acc.message(), finish_reason=acc.finish_reason).label == ("corrupt" if leak else "clean")
