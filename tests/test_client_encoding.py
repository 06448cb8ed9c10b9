"""The turn client's shortcuts give exactly what the plain way gives: request bytes (BodyEncoder) and parsed
stream events (the SSE reader's one-whole-event path), however the bytes are split."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.wire.client import BodyEncoder, _Clock, _Failure, _SSEReader
from repro.wire.rawtext import CompletionText, GenerateText

PLAIN = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
SHARED_RESULT = "def evict(cache):\n    \"\"\"Drop the coldest entry.\"\"\"\n" * 40  # one object, as the sandbox's cache hands out

texts = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40) | st.just(SHARED_RESULT)
messages = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool"]), "content": texts})


def body(history: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "m", "messages": history, "tools": TOOLS, "temperature": 0.5, "stream": True,
            "stream_options": {"include_usage": True}}


@settings(max_examples=40, deadline=None)
@given(turns=st.lists(st.lists(messages, min_size=1, max_size=3), min_size=1, max_size=4))
def test_a_conversation_encodes_to_the_same_bytes_turn_after_turn(turns: list[list[dict[str, Any]]]) -> None:
    # Two sessions share the tools, the long result object and, in the second, the first one's messages.
    first, second = BodyEncoder(), BodyEncoder()
    history: list[dict[str, Any]] = []
    for new in turns:
        history.extend(new)
        expected = PLAIN.encode(body(history)).encode()
        assert first.encode(body(history)) == expected
        assert second.encode(body(list(history))) == expected


def test_odd_bodies_encode_as_json_would() -> None:
    encoder = BodyEncoder()
    for odd in ({1: "int key"}, {"messages": "not a list"}, {"messages": [{2: "x"}, "text", None]}, {}):
        assert encoder.encode(odd) == PLAIN.encode(odd).encode()


EVENTS = [
    {"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
    {"id": "c1", "choices": [{"index": 0, "delta": {"content": "reading the file é\u2028"}, "finish_reason": None}]},
    {"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"p\": 1}"}}
    ]}, "finish_reason": None}]},
    {"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
]


def read(pieces: list[bytes]) -> tuple[dict[str, Any], int, str | None]:
    reader = _SSEReader(_Clock())
    for piece in pieces:
        reader.feed(piece)
    reader.finish()
    return reader.accumulator.message(), reader.events, reader.accumulator.finish_reason


@settings(max_examples=40, deadline=None)
@given(crlf=st.booleans(), space=st.booleans(), cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=12))
def test_a_stream_reads_the_same_whole_or_in_any_pieces(crlf: bool, space: bool, cuts: list[int]) -> None:
    end = b"\r\n" if crlf else b"\n"
    prefix = b"data: " if space else b"data:"
    events = [prefix + json.dumps(event).encode() + end + end for event in EVENTS] + [prefix + b"[DONE]" + end + end]
    stream = b"".join(events)
    whole_events = read(events)
    assert whole_events[0]["tool_calls"][0]["function"]["name"] == "read_file"
    assert whole_events[0]["content"] == "reading the file é\u2028"
    bounds = sorted({min(cut, len(stream)) for cut in cuts} | {0, len(stream)})
    assert read([stream[a:b] for a, b in zip(bounds, bounds[1:])]) == whole_events
    assert read([stream[i : i + 1] for i in range(len(stream))]) == whole_events


@pytest.mark.parametrize(
    ("make", "events", "whole"),
    [
        (CompletionText, [{"choices": [{"index": 0, "text": "Hi", "finish_reason": None}]}], False),
        (CompletionText, [{"choices": [{"index": 0, "text": "Hi", "finish_reason": "stop"}]}], True),
        (GenerateText, [{"text": "Hi", "meta_info": {"finish_reason": None}}], False),
        (GenerateText, [{"text": "Hi", "meta_info": {"finish_reason": {"type": "stop"}}}], True),
    ],
)
def test_a_raw_text_stream_needs_its_finish_reason_too(make: Any, events: list[dict[str, Any]], whole: bool) -> None:
    reader = _SSEReader(_Clock(), make())
    for event in events:
        reader.feed(b"data: " + json.dumps(event).encode() + b"\n\n")
    reader.feed(b"data: [DONE]\n\n")
    if whole:
        reader.finish()
    else:
        with pytest.raises(_Failure, match="^stream ended without a finish reason$"):
            reader.finish()
