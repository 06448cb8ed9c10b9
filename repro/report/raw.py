"""A turn's raw response bytes for the drill-down: a bounded, decoded excerpt, and the texts the checker judged.

The bytes come from the server and are untrusted: nothing here interprets them beyond JSON, a path
that leaves the run directory is refused, and every failure to parse just yields fewer fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def _collect(message: dict[str, Any], fields: dict[str, str], *, streamed: bool) -> None:
    for key in ("content", "reasoning_content"):
        value = message.get(key)
        if isinstance(value, str):
            fields[key] = fields.get(key, "") + value if streamed else value
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return
    for position, call in enumerate(calls):
        if not isinstance(call, dict):
            continue
        index = call.get("index", position) if streamed else position
        function = call.get("function")
        if not isinstance(index, int) or not isinstance(function, dict):
            continue
        for part in ("name", "arguments"):
            value = function.get(part)
            if isinstance(value, str):
                key = f"tool_calls[{index}].function.{part}"
                fields[key] = fields.get(key, "") + value if streamed else value


def response_fields(data: bytes) -> dict[str, str]:
    """The texts of a chat completion (an SSE stream or a JSON body), keyed by the checker's field names.

    Streamed deltas are concatenated, because the checker judges the whole text, never a single chunk.
    """
    text = _decode(data)
    fields: dict[str, str] = {}
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            body = json.loads(stripped)
        except ValueError:
            return fields
        choices = body.get("choices") if isinstance(body, dict) else None
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            message = choices[0].get("message")
            if isinstance(message, dict):
                _collect(message, fields, streamed=False)
        return fields
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if not payload or payload == "[DONE]":
            continue
        try:
            chunk = json.loads(payload)
        except ValueError:
            continue
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            delta = choices[0].get("delta")
            if isinstance(delta, dict):
                _collect(delta, fields, streamed=True)
    return fields
