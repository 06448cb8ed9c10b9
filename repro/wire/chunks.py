"""A streamed chat-completion event taken apart in one C call: the client's per-chunk fast path.

`decode` turns the JSON of an ordinary `chat.completion.chunk` straight into typed records (msgspec
structs: the types are checked while decoding, so nothing is checked twice and no dict is built for
the chunk or its choice). It answers None for anything it cannot take apart so: not JSON to msgspec's
taste (a lone surrogate escape, NaN, deep nesting), a field of another type, an `error` member or a
completions-style `text`. The caller then takes the general path (`repro.untrusted.parse_json` and
`StreamAccumulator.add_chunk`), so every answer, odd ones included, is judged exactly as before:
the fast path only ever accepts what the general path reads the same way.
"""

from __future__ import annotations

from typing import Any

import msgspec

from repro.untrusted import MAX_DEPTH, may_nest_too_deep

_ABSENT = msgspec.Raw()
"""A member that must be missing for the fast path (its bytes are kept, not parsed, when present)."""


# gc=False: a decoded chunk holds no cycle and lives for one call; not tracking its structs makes each
# allocation and release cheaper (every streamed chunk makes three).
class Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    """vLLM's name for reasoning_content."""
    tool_calls: list[Any] | None = None


class Choice(msgspec.Struct, gc=False):
    delta: Delta | None = None
    finish_reason: str | None = None
    text: msgspec.Raw = _ABSENT


class Chunk(msgspec.Struct, gc=False):
    id: Any = None
    choices: list[Choice] | None = None
    usage: dict[str, Any] | None = None
    error: msgspec.Raw = _ABSENT
    text: msgspec.Raw = _ABSENT


_DECODER = msgspec.json.Decoder(Chunk)


def decode(payload: bytes) -> Chunk | None:
    """The event as a `Chunk`, or None when the general path must read it (see the module docstring)."""
    # The length test is may_nest_too_deep's own first one, here to spare an ordinary event the call.
    if len(payload) > 2 * MAX_DEPTH and may_nest_too_deep(payload):
        return None  # perhaps nested deeper than the harness accepts: parse_json's judgement
    try:
        chunk = _DECODER.decode(payload)
    except (msgspec.DecodeError, RecursionError):
        return None
    if chunk.error or chunk.text or (chunk.choices and chunk.choices[0].text):
        return None
    return chunk
