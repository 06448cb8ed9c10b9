"""The typed fast path of a streamed event (repro.wire.chunks) reads every event exactly as the general path
does (parse_json, then StreamAccumulator.add_chunk), or declines it: odd shapes and odd JSON included."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dsml_checker import StreamAccumulator
from repro.wire import chunks
from repro.wire.client import _Clock, _SSEReader

odd = st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.lists(st.integers(), max_size=2)
text = st.sampled_from(["", "a", "b"]) | st.text(max_size=8)


def member(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A member's value: mostly of the right type, sometimes null or of another type (members are optional:
    each is also left out half the time)."""
    return st.one_of(values, values, values, values, st.none(), odd)


calls = st.lists(st.fixed_dictionaries({}, optional={
    "index": member(st.integers(0, 3)), "id": member(text), "type": member(st.just("function")),
    "function": member(st.fixed_dictionaries({}, optional={"name": member(text), "arguments": member(text)})),
}) | odd, max_size=2)
deltas = st.fixed_dictionaries({}, optional={
    "role": member(st.just("assistant")), "content": member(text), "reasoning_content": member(text),
    "reasoning": member(text), "tool_calls": member(calls),
})
choices = st.fixed_dictionaries({}, optional={
    "index": st.just(0), "delta": member(deltas), "finish_reason": member(st.sampled_from(["stop", "tool_calls"])),
    "text": member(text), "logprobs": st.none(),
})
ordinary = {
    "id": member(text), "object": st.just("chat.completion.chunk"), "choices": member(st.lists(choices | odd, max_size=2)),
    "usage": member(st.fixed_dictionaries({"completion_tokens": member(st.integers(0, 9))})),
}
events = st.one_of(
    *[st.fixed_dictionaries({}, optional=ordinary)] * 3,
    st.fixed_dictionaries({}, optional={**ordinary, "error": member(st.fixed_dictionaries({"message": text})), "text": member(text)}),
)


def state(accumulator: StreamAccumulator) -> tuple[Any, ...]:
    return accumulator.message(), accumulator.finish_reason, accumulator.usage, accumulator.chunks, accumulator.malformed


@settings(max_examples=400, deadline=None)
@given(st.lists(events, min_size=1, max_size=4))
@example([{"id": "c", "choices": [{"delta": {"reasoning_content": "a", "reasoning": "b", "content": ""}}]},
          {"choices": [{"delta": {"reasoning": "c", "tool_calls": [{"index": 0, "function": {"name": "f"}}]}}], "usage": None},
          {"choices": [{"delta": None, "finish_reason": "stop"}], "usage": {"completion_tokens": 3}}])
def test_the_reader_gives_the_same_answer_on_either_path(stream: list[dict[str, Any]]) -> None:
    # The reader with the fast path against the same reader made to decline every event.
    pieces = [b"data: " + json.dumps(event).encode() + b"\n\n" for event in stream]
    outcomes = [read(pieces)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunks, "decode", lambda payload: None)
        outcomes.append(read(pieces))
    assert outcomes[0] == outcomes[1]


def read(pieces: list[bytes]) -> Any:
    """What the reader made of the pieces: the accumulated answer, or the error it raised."""
    reader = _SSEReader(_Clock())
    try:
        for piece in pieces:
            reader.feed(piece)
        reader.finish()
    except Exception as err:  # noqa: BLE001 - the error's type and text are what is compared
        return type(err).__name__, str(err), state(reader.accumulator)
    return state(reader.accumulator), reader.events, reader.request_id, reader.clock.first_token is None


def test_odd_json_is_left_to_the_general_path() -> None:
    for payload in (rb'{"choices":[{"delta":{"content":"\ud800"}}]}', b'{"usage":NaN}', b'{"id":' + b"[" * 300 + b"]" * 300 + b"}",
                    b'{"choices":[{"delta":{"content":5}}]}', b'{"error":{"message":"x"}}', b"[1]", b'{"choices":[{"text":"a"}]}'):
        assert chunks.decode(payload) is None, payload
    assert chunks.decode(b'{"choices":[{"delta":{"content":"a"},"finish_reason":null}]}') is not None
