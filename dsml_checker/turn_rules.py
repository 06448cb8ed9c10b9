"""Rules for the damage today's parsers leave in a parsed message (real-parsers.md §2c): calls returned twice,
reasoning replayed into the answer, bare XML tool tags, a re-sent streaming buffer, an empty turn, and, when
the raw text is at hand, calls or parameters the parser lost.

Each scan is a bounded number of `str.find`/`startswith` calls: linear in the text, no regular expressions.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any, Hashable

from dsml_checker.findings import Finding, make_finding
from dsml_checker.formats import SENTINEL, THINK_CLOSE
from dsml_checker.invokes import attribute, shown_invokes
from dsml_checker.schema import json_equal, json_key
from dsml_checker.soft_rules import repeat_unit
from dsml_checker.text_rules import Spans, quoted_spans

# reasoning-replayed: the whole reasoning must be at least this long (shorter ones are common phrases), or the
# replay, cut short, at least _REPLAY_CUT_MIN long.
_REPLAY_MIN = 48
_REPLAY_CUT_MIN = 200
# resent-prefix: a first chunk re-sent once counts from this length; shorter ones need a second re-send.
_RESEND_ONCE_MIN = 12
_RESEND_WHOLE_MIN = 8  # the whole field exactly twice
_RESEND_SHORT_MIN = 3
_RESEND_SCAN = 4096  # a re-sent buffer starts at the start: look no further for its first copy
_RESEND_TRIES = 32
_XML_TAGS = ("<invoke", "<parameter")


def _whole(rule: str, field: str, text: str) -> Finding:
    return make_finding(rule, field, text, 0, len(text))


def parsed_args(args: Any) -> dict[str, Any] | None:
    """A call's arguments as an object, or None when they are not one."""
    if isinstance(args, dict):
        return args
    if isinstance(args, str):
        try:
            value = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return None
        return value if isinstance(value, dict) else None
    return None


def call_list(calls: Any) -> list[tuple[str, dict[str, Any] | None]]:
    """(name, arguments object or None) for each well-shaped entry of `tool_calls`."""
    out: list[tuple[str, dict[str, Any] | None]] = []
    for call in calls if isinstance(calls, list) else ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out.append((fn["name"], parsed_args(fn.get("arguments"))))
    return out


def duplicate_call(calls: list[tuple[str, dict[str, Any] | None]]) -> Finding | None:
    """The same name with equal, non-empty arguments twice in one turn: a re-sent buffer parsed twice.

    Zero-argument calls repeat legitimately (poll a clock, roll a die) and are not compared.
    """
    seen: dict[tuple[str, Hashable], list[dict[str, Any]]] = {}
    for i, (name, args) in enumerate(calls):
        if not args:
            continue
        # Met by a hash of the arguments: comparing each call with every earlier one is quadratic in the calls.
        earlier = seen.setdefault((name, json_key(args)), [])
        if any(json_equal(args, other) for other in earlier):
            text = json.dumps({"name": name, "arguments": args}, ensure_ascii=False, default=str)
            return _whole("duplicate-call", f"tool_calls[{i}]", text)
        earlier.append(args)
    return None


def reasoning_replayed(content: str, reasoning: str) -> Finding | None:
    """The reasoning, whole (48+ characters) or a cut replay of 200+, inside the content."""
    core = reasoning.strip()
    if len(core) < _REPLAY_MIN or len(content) < _REPLAY_MIN:
        return None
    at = content.find(core)
    if at >= 0:
        return make_finding("reasoning-replayed", "content", content, at, at + len(core))
    at = content.find(core[:_REPLAY_MIN])
    if at >= 0:
        rest = content[at:].rstrip()
        if len(rest) >= _REPLAY_CUT_MIN and core.startswith(rest):
            return make_finding("reasoning-replayed", "content", content, at, len(content))
    return None


def _grows(text: str, first: int, tries: int) -> bool:
    """Whether the chunk text[:first], re-sent at `first`, is re-sent again as a longer buffer further on."""
    head = text[:first]
    if text.startswith(head, 2 * first):
        return False  # the chunk a third time in a row: repeated words, not a buffer growing
    nxt = text.find(head, 2 * first + 1, _RESEND_SCAN)
    while nxt >= 0 and tries:
        # A text that merely repeats with that period from the second copy on is a repeated block, not a buffer.
        if text.startswith(text[first:nxt], nxt) and text[nxt:] != text[first : len(text) - nxt + first]:
            return True
        nxt = text.find(head, nxt + 1, _RESEND_SCAN)
        tries -= 1
    return False


def _resend_at(text: str, first: int) -> bool:
    head = text[:first]
    unit = repeat_unit(head)
    if not text.startswith(head, first) or 0 < 2 * unit <= first or not any(c.isalnum() for c in head):
        return False
    if len(text) >= 3 * first and text[first:] == text[:-first]:
        return False  # one chunk three times or more and nothing else: a loop or a repeated block, not a buffer
    # Re-sent once, the copies are glued: a chunk ending in a blank before its copy reads as a repeated phrase.
    if not head[-1].isspace() and (first >= _RESEND_ONCE_MIN or (first >= _RESEND_WHOLE_MIN and len(text) == 2 * first)):
        return True
    return _grows(text, first, 4)


def resent_prefix(text: str) -> int:
    """Length of the first chunk of a re-sent streaming buffer ("Let me checkLet me check the…"), or 0.

    A server that re-sends its whole buffer on every chunk writes c1, c1c2, c1c2c3…: the text opens with a
    chunk repeated at once. A chunk of 12+ characters re-sent once counts (or the whole field twice, from 8);
    a shorter one must be re-sent twice, growing, so that a doubled word in prose stays clean.
    """
    if len(text) < 2 * _RESEND_SHORT_MIN:
        return 0
    for first in range(_RESEND_SHORT_MIN, min(_RESEND_WHOLE_MIN, len(text) // 2 + 1)):
        if _resend_at(text, first):
            return first
    probe = text[:_RESEND_WHOLE_MIN]
    at = text.find(probe, _RESEND_WHOLE_MIN, _RESEND_SCAN)
    tries = _RESEND_TRIES
    while at >= 0 and tries and 2 * at <= len(text):
        if _resend_at(text, at):
            return at
        at = text.find(probe, at + 1, _RESEND_SCAN)
        tries -= 1
    return 0


def tool_vocabulary(schemas: dict[str, Any]) -> tuple[frozenset[str], frozenset[str]]:
    """The request's tool names, and the property names of their parameter schemas."""
    params: set[str] = set()
    for schema in schemas.values():
        props = schema.get("properties") if isinstance(schema, dict) else None
        if isinstance(props, dict):
            params.update(k for k in props if isinstance(k, str))
    return frozenset(schemas), frozenset(params)


def bare_tool_tags(text: str, field: str, names: frozenset[str], params: frozenset[str]) -> Finding | None:
    """`<invoke name="T">` or `<parameter name="P">` without the sentinel, naming one of the request's tools or
    their parameters, outside code spans and fences."""
    quoted: Spans | None = None
    for tag, vocabulary in zip(_XML_TAGS, (names, params)):
        at = text.find(tag)
        while at >= 0:
            end = at + len(tag)
            if text[end : end + 1] in (" ", "\t", "\n"):
                name = attribute(text, end, "name", min(len(text), end + 160))
                if name is not None and name in vocabulary:
                    quoted = Spans(quoted_spans(text)) if quoted is None else quoted
                    if not quoted.covers(at, at + 1):
                        return make_finding("bare-tool-tags", field, text, at, end + len(name) + 9)
            at = text.find(tag, end)
    return None


def _skip_spans(raw: str) -> list[tuple[int, int]]:
    """Code spans and fences of the prose before the first DSML tag line, in raw-text offsets: a quoted invoke
    there is an example, not a call. Spans inside the block are not computed (a value may hold backticks)."""
    think = raw.find(THINK_CLOSE)
    spans: list[tuple[int, int]] = []
    start = 0
    for end in (think, len(raw)) if think >= 0 else (len(raw),):
        markup = raw.find("\n\n<" + SENTINEL, start, end)
        prose_end = end if markup < 0 else markup
        spans += [(lo + start, hi + start) for lo, hi in quoted_spans(raw[start:prose_end])]
        start = end + len(THINK_CLOSE)
    return spans


def lost_calls(raw: str, calls: list[tuple[str, dict[str, Any] | None]]) -> list[Finding]:
    """`call-lost`: complete invokes the raw text shows, that no parsed call of that name answers;
    `param-lost`: a parsed call without a parameter its invoke in the raw text shows.

    A block repeated verbatim shows each invoke once (a parser that reads one copy lost nothing).
    """
    shown: dict[str, list[frozenset[str]]] = {}
    texts: set[str] = set()
    for invoke in shown_invokes(raw, skip=_skip_spans(raw)):
        if invoke.text not in texts:
            texts.add(invoke.text)
            shown.setdefault(invoke.name, []).append(invoke.params)
    parsed: dict[str, list[tuple[int, dict[str, Any] | None]]] = {}
    for i, (name, args) in enumerate(calls):
        parsed.setdefault(name, []).append((i, args))
    findings: list[Finding] = []
    lost = [name for name, invokes in shown.items() if len(invokes) > len(parsed.get(name, ()))]
    if lost:
        findings.append(_whole("call-lost", "tool_calls", ", ".join(lost)))
    for name, invokes in shown.items():
        # Each shown invoke, the fullest first, takes the first unused call of its name that has all its parameters.
        # Unused calls are grouped by their parameter names, each group in call order, so an invoke looks at one
        # head per group rather than at every call (quadratic in a turn of many calls of few shapes).
        unused: dict[frozenset[str], deque[int]] = {}
        for i, args in parsed.get(name, ()):
            if args is not None:
                unused.setdefault(frozenset(args), deque()).append(i)
        for params in sorted(invokes, key=len, reverse=True):
            match = min(((group[0], keys) for keys, group in unused.items() if params <= keys), default=None)
            if match is not None:
                group = unused[match[1]]
                group.popleft()
                if not group:
                    del unused[match[1]]
            elif unused:
                i, keys = min((group[0], keys) for keys, group in unused.items())
                missing = ", ".join(sorted(params - keys))
                findings.append(_whole("param-lost", f"tool_calls[{i}].function.arguments", f"{name}: {missing}"))
                return findings
    return findings


def scan_turn(
    content: str, reasoning: str, calls_value: Any, schemas: dict[str, Any] | None, finish_reason: Any, raw: Any
) -> list[Finding]:
    """The rules of this module over one message's texts and calls; `raw` is the turn's raw text, or None."""
    findings: list[Finding] = []
    many = isinstance(calls_value, list) and len(calls_value) > 1
    calls = call_list(calls_value) if many or isinstance(raw, str) else []
    if many:
        found = duplicate_call(calls)
        if found is not None:
            findings.append(found)
    if reasoning and content:
        found = reasoning_replayed(content, reasoning)
        if found is not None:
            findings.append(found)
    vocabulary = None
    for field, text in (("content", content), ("reasoning_content", reasoning)):
        first = resent_prefix(text)
        if first:
            findings.append(make_finding("resent-prefix", field, text, 0, 2 * first))
        if schemas and ("<invoke" in text or "<parameter" in text):
            vocabulary = tool_vocabulary(schemas) if vocabulary is None else vocabulary
            found = bare_tool_tags(text, field, *vocabulary)
            if found is not None:
                findings.append(found)
    if finish_reason == "stop" and not content.strip() and not (isinstance(calls_value, list) and calls_value):
        findings.append(make_finding("empty-turn", "content", content, 0, len(content)))
    if isinstance(raw, str):
        findings += lost_calls(raw, calls)
    return findings
