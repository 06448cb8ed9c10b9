"""The one JSON-lines reader: records are separated by "\\n" and nothing else; and the one reader of the
JSON object files the harness keeps beside them (plan.json, setup.json).

`str.splitlines()` also splits on U+2028, U+2029, NEL and other separators that JSON strings may hold
raw, which cut a valid record in two. Every reader of a JSON-lines file (traces, gateway logs, progress
and probe journals, commit lists) splits here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from repro.errors import UsageError

T = TypeVar("T")


def numbered_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) for every line that is not blank; lines end at "\\n" only."""
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield number, line


def stream_lines(path: Path, label: str, update: Callable[[bytes], object] | None = None) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) for every line of a user's JSON-lines file that is not blank, read one at a
    time, so a file of any size costs its longest line; every byte also goes to `update` (a digest's).

    A binary file's lines end at b"\\n" only, as numbered_lines splits; UTF-8 cannot hold the byte 0x0A inside
    a character, so each line decodes alone. A UsageError `label: cannot read: …` or `PATH:N: not UTF-8 text`.
    """
    try:
        with open(path, "rb") as stream:
            for number, raw in enumerate(stream, start=1):
                if update is not None:
                    update(raw)
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise UsageError(f"{path}:{number}: not UTF-8 text") from None
                if text.strip():
                    yield number, text
    except OSError as err:
        raise UsageError(f"{label}: cannot read: {err.strerror or err}") from None


def read_journal(path: Path, parse: Callable[[str], T]) -> list[T]:
    """Every record of an append-only journal the harness wrote itself, in order.

    A line that does not parse, or is not UTF-8 (a tail torn by SIGKILL mid-write, a stray byte), is
    skipped: each record was written whole, so a damaged line holds no record. A journal that cannot be
    read at all (a directory in its place, no permission) is a UsageError naming it.
    """
    try:
        data = path.read_bytes() if path.exists() else b""
    except OSError as err:
        raise UsageError(f"{path}: cannot read: {err.strerror or err}") from None
    records: list[T] = []
    for line in data.split(b"\n"):
        try:
            records.append(parse(line.decode("utf-8")))
        except ValueError:  # UnicodeDecodeError and pydantic's ValidationError are ValueErrors
            continue
    return records


def read_json_object(path: Path, label: str) -> dict[str, Any]:
    """A JSON object file the harness wrote (a plan, a setup); a UsageError `label: NAME is damaged (why)`
    when it cannot be read, is not JSON, or holds something other than an object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise UsageError(f"{label}: {path.name} is damaged ({type(err).__name__})") from None
    if not isinstance(value, dict):
        raise UsageError(f"{label}: {path.name} is damaged (a JSON {type(value).__name__}, not an object)")
    return value
