"""Read DSML tags loosely: the tag lexer `check_raw` uses, and the invokes a raw text shows, whatever the damage.

A real parser may repair, drop or cut a call; comparing its output with what the raw text shows needs a reader
that accepts what they reject: any quote around a name, a JSON body, a closer in a value. One pass of
`str.find` over the sentinel, so the cost stays linear in the text.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import Callable, Iterator

from dsml_checker.formats import SENTINEL

_WORD_MAX = 24  # a DSML tag word is short: longer runs are prose, and this bounds the work per tag
_NAME_MAX = 128
_HEAD_MAX = 256  # an invoke opener's attributes end within this many characters, or it is not read
QUOTES = '"“”„‟″‘’‚‛«»「」＂\''  # what a model may put around an attribute value


def span_test(spans: list[tuple[int, int]]) -> Callable[[int], bool]:
    """A test of whether an offset lies inside one of `spans`, in logarithmic time (spans may overlap)."""
    ordered = sorted(spans)
    starts = [lo for lo, _ in ordered]
    reach = list(accumulate((hi for _, hi in ordered), max))

    def inside(at: int) -> bool:
        i = bisect_right(starts, at)
        return i > 0 and reach[i - 1] > at

    return inside


@dataclass(frozen=True)
class Tag:
    """One canonical-sentinel tag: `<｜DSML｜word` or `</｜DSML｜word` starting at `start`."""

    start: int
    closing: bool
    word: str  # without V4.1's leading space

    @property
    def end(self) -> int:
        """Where the tag word ends (not the tag: its attributes follow)."""
        return self.start + (2 if self.closing else 1) + len(SENTINEL) + len(self.word)


def dsml_tags(text: str, start: int = 0, end: int | None = None) -> Iterator[Tag]:
    """Every `<｜DSML｜word` and `</｜DSML｜word` in text[start:end], in order (V4.1's space before the word skipped)."""
    stop = len(text) if end is None else end
    at = text.find(SENTINEL, start, stop)
    while at >= 0:
        closing = text[at - 2 : at] == "</" and at >= start + 2
        if closing or (text[at - 1 : at] == "<" and at > start):
            i = at + len(SENTINEL)
            space = text[i : i + 1] == " "
            j = i + space
            limit = min(stop, j + _WORD_MAX)
            while j < limit and (text[j].isalpha() or text[j] == "_"):
                j += 1
            word = text[i + space : j]
            yield Tag(at - (2 if closing else 1), closing, (" " if space else "") + word)
        at = text.find(SENTINEL, at + len(SENTINEL), stop)


def attribute(text: str, at: int, key: str, limit: int) -> str | None:
    """The value of `key=` right after `at` (blanks allowed around '='), quoted by any quote character."""
    i = at
    while i < limit and text[i] in " \t\n":
        i += 1
    if not text.startswith(key, i):
        return None
    i += len(key)
    while i < limit and text[i] in " \t":
        i += 1
    if i >= limit or text[i] != "=":
        return None
    i += 1
    while i < limit and text[i] in " \t":
        i += 1
    if i >= limit or text[i] not in QUOTES:
        return None
    j = i + 1
    stop = min(limit, j + _NAME_MAX)
    while j < stop and text[j] not in QUOTES and text[j] not in ">\n":
        j += 1
    return text[i + 1 : j]


@dataclass(frozen=True)
class ShownInvoke:
    """A complete invoke as the raw text shows it: the name, the parameter names, and its text (to spot repeats)."""

    name: str
    params: frozenset[str]
    text: str
    strings: tuple[tuple[str, str], ...] = ()  # (name, value) of its string="true" parameters, up to their last closer


def _json_keys(body: str) -> frozenset[str]:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return frozenset()
    return frozenset(value) if isinstance(value, dict) else frozenset()


def shown_invokes(raw: str, *, skip: list[tuple[int, int]] | None = None) -> list[ShownInvoke]:
    """The complete invokes (closed, or self-closing) in `raw`, in order; openers inside a `skip` span are ignored.

    An invoke that the text cuts off (no closer before the next invoke or the end) is not shown: a turn cut by
    max tokens did not finish it.
    """
    tags = list(dsml_tags(raw))
    skipped = span_test(skip or [])
    found: list[ShownInvoke] = []
    for i, tag in enumerate(tags):
        if tag.closing or tag.word.strip() != "invoke" or skipped(tag.start):
            continue
        head_end = raw.find(">", tag.end, tag.end + _HEAD_MAX)
        name = None if head_end < 0 else attribute(raw, tag.end, "name", head_end)
        if name is None:
            continue
        params: set[str] = set()
        strings: list[tuple[str, str]] = []
        open_string: tuple[str, int] | None = None  # a string="true" parameter whose value runs from here
        string_at = -1  # where the value last recorded in `strings` starts
        close = None
        j = i + 1
        while j < len(tags):  # this invoke's own tags, up to the next invoke tag: linear over the whole text
            later = tags[j]
            word = later.word.strip()
            if word == "invoke":
                close = later if later.closing else None
                break
            if word == "parameter" and not later.closing:
                limit = min(len(raw), later.end + _HEAD_MAX)
                key = attribute(raw, later.end, "name", limit)
                if key is not None:
                    params.add(key)
                    value_at = raw.find(">", later.end, limit) + 1
                    flag = raw[later.end : value_at]
                    open_string = (key, value_at) if value_at and 'string="true"' in flag else None
            elif word == "parameter" and raw.startswith(">", later.end) and open_string is not None:
                # The value runs to the last closer before the next tag: a whole closer inside it (which the
                # encoder cannot escape) ended it early on every parser, and the text past it is still its own.
                value = (open_string[0], raw[open_string[1] : later.start])
                if strings and strings[-1][0] == open_string[0] and open_string[1] == string_at:
                    strings[-1] = value
                else:
                    strings.append(value)
                string_at = open_string[1]
            j += 1
        if raw[head_end - 1] == "/":
            found.append(ShownInvoke(name, frozenset(), raw[tag.start : head_end + 1]))
        elif close is not None:
            body = raw[head_end + 1 : close.start]
            if not params and body.strip().startswith("{"):
                params = set(_json_keys(body.strip()))
            found.append(ShownInvoke(name, frozenset(params), raw[tag.start : close.end + 1], tuple(strings)))
    return found
