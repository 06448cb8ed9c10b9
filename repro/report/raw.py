"""A turn's raw response bytes for the drill-down: a bounded, decoded excerpt, and the texts the checker judged.

The bytes come from the server and are untrusted: nothing here interprets them beyond JSON, a path
that leaves the run directory is refused, and every failure to parse just yields fewer fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsml_checker import StreamAccumulator
from repro.untrusted import parse_json

HEAD_BYTES = 6000
TAIL_BYTES = 2000


@dataclass(frozen=True)
class RawExcerpt:
    """What the report shows of a raw file: its head and tail, decoded, and how much was left out."""

    path: str
    size: int
    head: str
    tail: str
    omitted: int
    """Bytes left out between head and tail (0 when the whole file is shown)."""
    missing: bool = False


@dataclass(frozen=True)
class RawFile:
    data: bytes
    excerpt: RawExcerpt


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def read_raw(run_dir: Path, rel_path: str) -> RawFile:
    """The raw file of a turn, or a RawFile marked missing when it is absent or outside the run directory."""
    root = Path(run_dir).resolve()
    target = (root / rel_path).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        return RawFile(b"", RawExcerpt(rel_path, 0, "", "", 0, missing=True))
    data = target.read_bytes()
    size = len(data)
    if size <= HEAD_BYTES + TAIL_BYTES:
        return RawFile(data, RawExcerpt(rel_path, size, _decode(data), "", 0))
    return RawFile(
        data,
        RawExcerpt(rel_path, size, _decode(data[:HEAD_BYTES]), _decode(data[-TAIL_BYTES:]),
                   size - HEAD_BYTES - TAIL_BYTES),
    )


def _fields(message: dict[str, Any]) -> dict[str, str]:
    """A chat-completion message flattened to the checker's field names (`tool_calls[0].function.arguments`)."""
    fields: dict[str, str] = {}
    for key in ("content", "reasoning_content"):
        if isinstance(message.get(key), str):
            fields[key] = message[key]
    calls = message.get("tool_calls")
    for index, call in enumerate(calls if isinstance(calls, list) else []):
        function = call.get("function") if isinstance(call, dict) else None
        for part in ("name", "arguments"):
            if isinstance(function, dict) and isinstance(function.get(part), str):
                fields[f"tool_calls[{index}].function.{part}"] = function[part]
    return fields


def _events(text: str) -> list[Any]:
    """The JSON payloads of an SSE stream, leniently: events that are not JSON are skipped."""
    payloads = []
    for event in text.replace("\r\n", "\n").split("\n\n"):
        data = "\n".join(line[5:].removeprefix(" ") for line in event.split("\n") if line.startswith("data:"))
        if data.strip() and data.strip() != "[DONE]":
            try:
                payloads.append(parse_json(data))
            except ValueError:
                continue
    return payloads


def response_fields(data: bytes) -> dict[str, str]:
    """The texts of a chat completion (an SSE stream or a JSON body), keyed by the checker's field names.

    Streamed deltas are merged by the checker's own StreamAccumulator, so the offsets of its findings
    point into the same text.
    """
    text = _decode(data)
    if text.lstrip().startswith("{"):
        try:
            body = parse_json(text)
        except ValueError:
            return {}
        choices = body.get("choices") if isinstance(body, dict) else None
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            message = choices[0].get("message")
            return _fields(message) if isinstance(message, dict) else {}
        return {}
    accumulator = StreamAccumulator()
    for chunk in _events(text):
        accumulator.add_chunk(chunk)
    return _fields(accumulator.message())
