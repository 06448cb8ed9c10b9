"""Damage operators: what a stale index-K read does to a completion's raw text (docs/dsml-format.md, "How it breaks").

Each operator rewrites the raw V4 text before the server-side parser sees it, so the damage surfaces as
it would on a real server: a leak into content, DSML in reasoning, a fragment inside arguments, or
nothing at all when the parser repairs or silently drops it. Which operator hits is chosen from the
race alone (the seed and the request), never from what a checker would see: `damage` walks the
operators from a random start (uniform) and takes the first that fits the text.
"""

from __future__ import annotations

import random
from typing import Callable

from dsml_checker.formats import EOS, SENTINEL, THINK_CLOSE, block_opener

_OPENER = block_opener("v4")
_CLOSER = f"</{SENTINEL}tool_calls>"
_PARAM_CLOSE = f"</{SENTINEL}parameter>"
_INVOKE_OPEN = f"<{SENTINEL}invoke"
_INVOKE_CLOSE = f"</{SENTINEL}invoke>"

Operator = Callable[[str, str, str], str | None]
"""(reasoning, body without the end-of-sentence token, a tool name) -> damaged raw text, or None."""


def _has_block(body: str) -> bool:
    return _OPENER in body and _CLOSER in body


def _join(reasoning: str, body: str) -> str:
    return f"{reasoning}{THINK_CLOSE}{body}{EOS}"


def ascii_bars(reasoning: str, body: str, tool: str) -> str | None:
    """The sentinel's full-width bars decoded as ASCII `|`: no block is found, the markup leaks."""
    return _join(reasoning, body.replace(SENTINEL, "|DSML|")) if _has_block(body) else None


def doubled_bars(reasoning: str, body: str, tool: str) -> str | None:
    return _join(reasoning, body.replace(SENTINEL, "｜｜DSML｜｜")) if _has_block(body) else None


def misspelled_opener(reasoning: str, body: str, tool: str) -> str | None:
    return _join(reasoning, body.replace(_OPENER, f"<{SENTINEL}toolcalls>", 1)) if _has_block(body) else None


def dropped_opener(reasoning: str, body: str, tool: str) -> str | None:
    """Well-formed invokes with no wrapper around them."""
    if not _has_block(body):
        return None
    return _join(reasoning, body.replace(_OPENER + "\n", "", 1).replace("\n" + _CLOSER, "", 1))


def block_in_reasoning(reasoning: str, body: str, tool: str) -> str | None:
    """The block emitted before `</think>`: it stays in reasoning_content."""
    at = body.find("\n\n" + _OPENER)
    if at < 0:
        return None
    return _join(reasoning + body[at:], body[:at])


def orphan_closer(reasoning: str, body: str, tool: str) -> str | None:
    """A stray invoke closer after a good block."""
    return _join(reasoning, body + "\n" + _INVOKE_CLOSE) if _has_block(body) else None


def closer_in_argument(reasoning: str, body: str, tool: str) -> str | None:
    """A parameter closer, cut short, emitted inside a string value."""
    at = body.find('string="true">')
    if at < 0:
        return None
    at += len('string="true">') + 2
    return _join(reasoning, body[:at] + _PARAM_CLOSE[:-1] + body[at:])


def typographic_quotes(reasoning: str, body: str, tool: str) -> str | None:
    at = body.find(_INVOKE_OPEN + ' name="')
    if at < 0:
        return None
    head = at + len(_INVOKE_OPEN + " name=")
    end = body.find('"', head + 1)
    return _join(reasoning, body[:head] + "“" + body[head + 1:end] + "”" + body[end + 1:])


def repeated_text(reasoning: str, body: str, tool: str) -> str | None:
    """The re-sent buffer of a failing streaming parser: the answer twice, back to back."""
    return _join(reasoning, body + body)


def leaked_invoke(reasoning: str, body: str, tool: str) -> str | None:
    """A bare invoke opener trailing a text answer."""
    if _OPENER in body:
        return None
    return _join(reasoning, f'{body}\n\n{_INVOKE_OPEN} name="{tool}">')


def think_leak(reasoning: str, body: str, tool: str) -> str | None:
    """The reasoning replayed after its own `</think>`."""
    return _join(reasoning, f"{body}{THINK_CLOSE}{reasoning}")


OPERATORS: dict[str, Operator] = {
    op.__name__: op
    for op in (
        ascii_bars, doubled_bars, misspelled_opener, dropped_opener, block_in_reasoning, orphan_closer,
        closer_in_argument, typographic_quotes, repeated_text, leaked_invoke, think_leak,
    )
}


def damage(raw: str, rng: random.Random, *, tool: str) -> tuple[str, str]:
    """Damage `raw` with an operator picked by `rng`; returns (operator name, damaged raw text).

    Operators are tried from a uniformly drawn starting point; the first one that fits the text wins
    (repeated_text fits every answer, so one always does).
    """
    reasoning, _, body = raw.partition(THINK_CLOSE)
    body = body.removesuffix(EOS)
    names = list(OPERATORS)
    start = rng.randrange(len(names))
    for name in names[start:] + names[:start]:
        damaged = OPERATORS[name](reasoning, body, tool)
        if damaged is not None:
            return name, damaged
    raise AssertionError("repeated_text fits every answer")
