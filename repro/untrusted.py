"""Text from a server or a model, made safe to parse and to store.

`parse_json` is the one way the harness parses JSON it did not write: a runaway `[[[[…` is a
ValueError like any other bad JSON, never a RecursionError that unwinds the task group, and what it
returns is nested shallowly enough for `str`, `json.dumps` and pydantic to handle anywhere.
`scrub_surrogates` makes a string encodable as UTF-8: JSON may escape lone surrogates (`"\\ud800"`),
which no UTF-8 file can hold. `csv_cell` keeps a spreadsheet from reading a cell as a formula;
`printable` keeps a terminal from obeying escape sequences.
"""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx  # only named: see repro.procs.process for why it is not imported here

MAX_DEPTH = 256
"""Deepest nesting accepted. Chat-completion JSON nests a handful of levels; Python's own limit is ~1,000."""

REPLACEMENT = "\ufffd"
"""What a lone surrogate becomes in stored text (the raw bytes on disk keep the original escape)."""

_SURROGATE = re.compile("[\ud800-\udfff]")


class NestingError(ValueError):
    """JSON nested deeper than MAX_DEPTH."""


_SCAN = json.JSONDecoder().scan_once
"""json's C scanner, as `json.loads` uses it (memo cleared per call): called directly by `_scan`."""


def _scan(data: str | bytes | bytearray) -> Any:
    """`json.loads(data)` for a bare object or array in UTF-8 (a streamed event), else `_NOT_SCANNED`.

    json.loads wraps that one C call in about 4 µs of Python (encoding sniffing, whitespace regexes),
    as much again as the parse; paid for every streamed chunk. Anything else, and every failure, is
    left to json.loads, so values and error messages stay exactly its own.
    """
    if not data or data[0] not in _OPENERS or data[-1] not in _CLOSERS:
        return _NOT_SCANNED
    try:
        # A second byte of 0 would make json.loads read UTF-16/32; such text fails here and goes to it.
        text = data if isinstance(data, str) else data.decode("utf-8")
        value, end = _SCAN(text, 0)
    except (ValueError, StopIteration, RecursionError):
        return _NOT_SCANNED
    return value if end == len(text) else _NOT_SCANNED


_OPENERS = frozenset((ord("{"), ord("["), "{", "["))
_CLOSERS = frozenset((ord("}"), ord("]"), "}", "]"))
_NOT_SCANNED = object()


def parse_json(data: str | bytes | bytearray) -> Any:
    """`json.loads` for untrusted text: ValueError (NestingError when too deep) for anything that is not sane JSON."""
    value = _scan(data)
    if value is _NOT_SCANNED:
        try:
            value = json.loads(data)
        except RecursionError:
            raise NestingError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    # A short text cannot nest deeply, and the count of opening brackets (C-fast) bounds the depth:
    # the value is walked only past both bounds, so the streamed events of a turn cost next to nothing.
    if may_nest_too_deep(data) and json_depth(value) > MAX_DEPTH:
        raise NestingError(f"JSON nested deeper than {MAX_DEPTH} levels")
    return value


def may_nest_too_deep(data: str | bytes | bytearray) -> bool:
    """Whether JSON text could nest past MAX_DEPTH: it is long enough and opens enough brackets (C-fast counts)."""
    if len(data) <= 2 * MAX_DEPTH:
        return False
    if isinstance(data, str):
        return data.count("[") + data.count("{") > MAX_DEPTH
    return data.count(b"[") + data.count(b"{") > MAX_DEPTH


def json_depth(value: Any) -> int:
    """How deeply lists and objects nest in `value` (0 for a scalar), counted without recursion."""
    if not isinstance(value, (dict, list)):
        return 0
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def scrub_surrogates(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD, so it encodes as UTF-8; unchanged when it already does."""
    if text.isascii():  # no surrogate, and no copy made to find that out
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub(REPLACEMENT, text)
    return text


_UNCHANGED = frozenset((int, float, bool, type(None)))
"""Values `scrub_json` returns as they are, tested before the call: every record built goes through it."""


def scrub_json(value: Any) -> Any:
    """`value` (JSON-shaped: dicts, lists, strings, numbers) with `scrub_surrogates` applied to every string and key."""
    if isinstance(value, str):
        return scrub_surrogates(value)
    if isinstance(value, dict):
        return {
            key if type(key) is str and key.isascii() else scrub_json(key):
                item if type(item) in _UNCHANGED else scrub_json(item)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [item if type(item) in _UNCHANGED else scrub_json(item) for item in value]
    return value


def get_bounded(client: httpx.Client, url: str, *, max_bytes: int, timeout_s: float) -> tuple[int, bytes]:
    """GET `url`: status and body; ValueError when the body outgrows `max_bytes` or `timeout_s` in all.

    The client's own timeout bounds each read, not the whole answer: a server that drips forever or never stops
    sending would otherwise hold the caller and its memory without end."""
    deadline = time.monotonic() + timeout_s
    body = bytearray()
    with client.stream("GET", url) as response:
        for piece in response.iter_bytes():
            body += piece
            if len(body) > max_bytes or time.monotonic() > deadline:
                raise ValueError(f"the answer did not end within {max_bytes} bytes and {timeout_s:g}s")
        return response.status_code, bytes(body)


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")
"""What makes a spreadsheet read a cell as a formula (the full-width forms too, which some convert)."""


def csv_cell(value: Any) -> Any:
    """A CSV cell that a spreadsheet shows as text: a string that would start a formula gets a leading `'`
    (the OWASP advice; the quote shows, the formula does not run). Anything else is returned as it is."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""C0 and C1 controls (ESC starts a terminal's escape sequences, CSI is one character in C1), DEL, and the
Unicode line and paragraph separators."""


def printable(text: str) -> str:
    """`text` with every control character replaced by U+FFFD: shown on a terminal or in Markdown, it can
    neither move the cursor, recolour, retitle the window, nor break a line."""
    return _CONTROL.sub(REPLACEMENT, text)
