"""Rebuild one assistant message from streamed `chat.completion.chunk` objects, so a turn is judged whole."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class _CallParts:
    id: str | None = None
    type: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)


class StreamAccumulator:
    """Merge deltas: content and reasoning concatenated, tool calls by index, the last finish_reason and usage.

    Junk (a chunk that is not an object, a delta or tool-call entry of the wrong shape) is counted in
    `malformed` and otherwise ignored: the caller decides what a malformed stream means.
    """

    def __init__(self) -> None:
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, _CallParts] = {}
        self._top: int | None = None  # max(_calls), kept as calls arrive: max() per delta is quadratic
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.chunks = 0
        self.malformed = 0

    def add_chunk(self, chunk: Any) -> None:
        self.chunks += 1
        if not isinstance(chunk, dict):
            self.malformed += 1
            return
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if choices is None or choices == []:
            return  # the usage-only chunk at the end of a stream
        if not isinstance(choices, list) or not isinstance(choices[0], dict):
            self.malformed += 1
            return
        choice = choices[0]
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta")
        if delta is None:
            return
        if not isinstance(delta, dict):
            self.malformed += 1
            return
        self._add_delta(delta)

    def add_parts(self, usage: dict[str, Any] | None, finish_reason: str | None, content: str | None,
                  reasoning: str | None, tool_calls: list[Any] | None) -> None:
        """`add_chunk` for a chunk its caller already took apart and type-checked (None: the member is absent
        or null): the usage, the first choice's finish reason and its delta's content, reasoning and tool calls."""
        self.chunks += 1
        if usage is not None:
            self.usage = usage
        if finish_reason is not None:
            self.finish_reason = finish_reason
        if content is not None:
            self._content.append(content)
        if reasoning is not None:
            self._reasoning.append(reasoning)
        if tool_calls is not None:
            for entry in tool_calls:
                self._add_call(entry)

    def _add_delta(self, delta: dict[str, Any]) -> None:
        content = delta.get("content")
        if isinstance(content, str):
            self._content.append(content)
        reasoning = delta.get("reasoning_content")
        if not isinstance(reasoning, str):
            reasoning = delta.get("reasoning")  # vLLM's name for the same field
        if isinstance(reasoning, str):
            self._reasoning.append(reasoning)
        calls = delta.get("tool_calls")
        if calls is None:
            return
        if not isinstance(calls, list):
            self.malformed += 1
            return
        for entry in calls:
            self._add_call(entry)

    def _add_call(self, entry: Any) -> None:
        if not isinstance(entry, dict):
            self.malformed += 1
            return
        index = entry.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            # Without an index, a new id starts a new call and anything else continues the last one.
            is_new = entry.get("id") is not None or not self._calls
            index = len(self._calls) if is_new or self._top is None else self._top
        parts = self._calls.setdefault(index, _CallParts())
        self._top = index if self._top is None else max(self._top, index)
        if parts.id is None and isinstance(entry.get("id"), str):
            parts.id = entry["id"]
        if parts.type is None and isinstance(entry.get("type"), str):
            parts.type = entry["type"]
        fn = entry.get("function")
        if fn is None:
            return
        if not isinstance(fn, dict):
            self.malformed += 1
            return
        if parts.name is None and isinstance(fn.get("name"), str) and fn["name"]:
            parts.name = fn["name"]
        if isinstance(fn.get("arguments"), str):
            parts.arguments.append(fn["arguments"])

    def message(self) -> dict[str, Any]:
        """The merged message, shaped like a non-streamed `choices[0].message`."""
        calls = [
            {
                "id": parts.id,
                "type": parts.type or "function",
                "function": {"name": parts.name, "arguments": "".join(parts.arguments)},
            }
            for _, parts in sorted(self._calls.items())
        ]
        return {
            "role": "assistant",
            # A field that never arrived is None; one that arrived empty ("") stays "".
            "content": "".join(self._content) if self._content else None,
            "reasoning_content": "".join(self._reasoning) if self._reasoning else None,
            "tool_calls": calls or None,
        }
