"""Rules for the damage today's parsers leave in a parsed message (docs/parser-recall.md): calls returned twice,
reasoning replayed into the answer, bare XML tool tags, a re-sent streaming buffer, an empty turn, and, when
the raw text is at hand, calls or parameters the parser lost.

Each scan is a bounded number of `str.find`/`startswith` calls and one search for a literal: linear in the text.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from dsml_checker.findings import Finding, make_finding
from dsml_checker.formats import SENTINEL, THINK_CLOSE
from dsml_checker.invokes import ShownInvoke, attribute, shown_invokes, span_test
from dsml_checker.soft_rules import repeat_unit
from dsml_checker.text_rules import quoted_spans

# reasoning-replayed: the whole reasoning must be at least this long (shorter ones are common phrases), or the
# replay, cut short, at least _REPLAY_CUT_MIN long.
_REPLAY_MIN = 48
_REPLAY_CUT_MIN = 200
_REPLAY_TRIES = 4
# resent-prefix: a first chunk re-sent once counts from this length; shorter ones need a second re-send.
_RESEND_ONCE_MIN = 12
_RESEND_WHOLE_MIN = 8  # the whole field exactly twice
_RESEND_SHORT_MIN = 3
# A re-sent buffer starts at the start and its first chunk is short: look no further for the copies (a long
# answer repeated whole is `duplicated-output`'s).
_RESEND_SCAN = 512
_RESEND_TRIES = 32
_XML_TAGS = ("<invoke", "<parameter")
# One search for either tag: a text with characters beyond Latin-1 (a DSML leak's bars) makes each `in` test
# for an ASCII word several times slower than this.
_XML_TAG_RE = re.compile("<(?:invoke|parameter)")
_MATCH_MAX = 256
_NO_VOCABULARY: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())  # no tools offered


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
    """The same name with equal arguments twice in one turn: a re-sent buffer parsed twice.

    Zero-argument calls count too: a re-sent block duplicates them like any other, and a model that means to
    call one twice gets the same answer twice. Arguments that do not parse are not compared.
    """
    seen: set[str] = set()
    for i, (name, args) in enumerate(calls):
        if args is None:
            continue
        key = json.dumps([name, _canonical(args)], sort_keys=True, default=str)
        if key in seen:
            text = json.dumps({"name": name, "arguments": args}, ensure_ascii=False, default=str)
            return _whole("duplicate-call", f"tool_calls[{i}]", text)
        seen.add(key)
    return None


def _canonical(value: Any) -> Any:
    """`value` with integral floats as ints, so that equal JSON (1 and 1.0, as json_equal has it) dumps alike."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def reasoning_replayed(content: str, reasoning: str) -> Finding | None:
    """The reasoning, whole (48+ characters) or a cut replay of 200+, inside the content."""
    core = reasoning.strip()
    if len(core) < _REPLAY_MIN or len(content) < _REPLAY_MIN:
        return None
    head = core[:_REPLAY_MIN]
    at = content.find(head)
    tries = _REPLAY_TRIES
    while at >= 0 and tries:
        if content.startswith(core, at):
            return make_finding("reasoning-replayed", "content", content, at, at + len(core))
        rest = content[at:].rstrip()
        if len(rest) >= _REPLAY_CUT_MIN and core.startswith(rest):
            return make_finding("reasoning-replayed", "content", content, at, len(content))
        at = content.find(head, at + 1)
        tries -= 1
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
    # The chunk's last characters must recur just before 2 * first: a cheap test that rejects most candidates.
    tail = min(4, first)
    if text[2 * first - tail : 2 * first] != text[first - tail : first]:
        return False
    head = text[:first]
    if not text.startswith(head, first) or 0 < 2 * repeat_unit(head) <= first or not any(c.isalnum() for c in head):
        return False
    if len(text) >= 3 * first and text[first:] == text[:-first]:
        return False  # one chunk three times or more and nothing else: a loop or a repeated block, not a buffer
    if (head + head).find(head, 1) < first:
        return False  # the chunk is itself a word or phrase repeated: prose repeating it, not a buffer
    # Re-sent once, the copies are glued: a chunk ending in a blank before its copy reads as a repeated phrase,
    # unless the field is nothing but two copies of several words.
    if len(text) == 2 * first and first >= _RESEND_WHOLE_MIN and len(head.split()) > 1:
        return True
    if not head[-1].isspace() and first >= _RESEND_ONCE_MIN:
        return True
    return _grows(text, first, 4)


def resent_prefix(text: str) -> int:
    """Length of the first chunk of a re-sent streaming buffer ("Let me checkLet me check the…"), or 0.

    A server that re-sends its whole buffer on every chunk writes c1, c1c2, c1c2c3…: the text opens with a
    chunk repeated at once. A chunk of 12+ characters re-sent once counts (or a field that is two copies of
    several words, from 8 characters); a shorter one must be re-sent twice, growing, so that a doubled word in
    prose stays clean.
    """
    if len(text) < 2 * _RESEND_SHORT_MIN:
        return 0
    # Short chunks first: only where their opening characters recur (one C-level search, not a call per length).
    short = text[:_RESEND_SHORT_MIN]
    at = text.find(short, _RESEND_SHORT_MIN, _RESEND_WHOLE_MIN + _RESEND_SHORT_MIN - 1)
    while 0 <= at < _RESEND_WHOLE_MIN:
        if 2 * at <= len(text) and _resend_at(text, at):
            return at
        at = text.find(short, at + 1, _RESEND_WHOLE_MIN + _RESEND_SHORT_MIN - 1)
    probe = text[:_RESEND_WHOLE_MIN]
    at = text.find(probe, _RESEND_WHOLE_MIN, _RESEND_SCAN)
    tries = _RESEND_TRIES
    while at >= 0 and tries and 2 * at <= len(text):
        if _resend_at(text, at):
            return at
        at = text.find(probe, at + 1, _RESEND_SCAN)
        tries -= 1
    return 0


def tool_schemas(tools: Any) -> dict[str, Any] | None:
    """Name -> parameters schema of the request's tools; None when the request offered no tools."""
    if not isinstance(tools, list) or not tools:
        return None
    schemas: dict[str, Any] = {}
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            schemas[fn["name"]] = fn.get("parameters")
    return schemas


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
    quoted: Callable[[int], bool] | None = None
    for tag, vocabulary in zip(_XML_TAGS, (names, params)):
        at = text.find(tag)
        while at >= 0:
            end = at + len(tag)
            if text[end : end + 1] in (" ", "\t", "\n"):
                name = attribute(text, end, "name", min(len(text), end + 160))
                if name is not None and name in vocabulary:
                    quoted = span_test(quoted_spans(text)) if quoted is None else quoted
                    if not quoted(at):
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
    `param-lost`: a parsed call without a parameter its invoke in the raw text shows; `value-cut`: a parsed
    string argument cut short of the value the raw text shows (a closer inside it ended it early).

    A block repeated verbatim shows each invoke once (a parser that reads one copy lost nothing).
    """
    shown: dict[str, list[ShownInvoke]] = {}
    texts: set[str] = set()
    for invoke in shown_invokes(raw, skip=_skip_spans(raw)):
        if invoke.text not in texts:
            texts.add(invoke.text)
            shown.setdefault(invoke.name, []).append(invoke)
    parsed: dict[str, list[tuple[int, dict[str, Any] | None]]] = {}
    for i, (name, args) in enumerate(calls):
        parsed.setdefault(name, []).append((i, args))
    findings: list[Finding] = []
    lost = [name for name, invokes in shown.items() if len(invokes) > len(parsed.get(name, ()))]
    if lost:
        findings.append(_whole("call-lost", "tool_calls", ", ".join(lost)))
    for name, invokes in shown.items():
        # Each shown invoke, the fullest first, takes the first unused call of its name that has all its parameters.
        unused = [(i, args) for i, args in parsed.get(name, ()) if args is not None]
        if len(unused) > _MATCH_MAX:
            continue  # hundreds of calls of one name: counted above, not matched pair by pair (quadratic)
        for invoke in sorted(invokes, key=lambda shown_one: len(shown_one.params), reverse=True):
            match = next((n for n, (_, args) in enumerate(unused) if invoke.params <= args.keys()), None)
            if match is not None:
                i, args = unused.pop(match)
                cut = _cut_value(invoke, args)
                if cut is not None and "value-cut" not in {f.rule for f in findings}:
                    findings.append(_whole("value-cut", f"tool_calls[{i}].function.arguments", f"{name}.{cut}"))
            elif unused:
                i, args = unused[0]
                missing = ", ".join(sorted(invoke.params - args.keys()))
                findings.append(_whole("param-lost", f"tool_calls[{i}].function.arguments", f"{name}: {missing}"))
                return findings
    return findings


def _cut_value(invoke: ShownInvoke, args: dict[str, Any]) -> str | None:
    """The first string argument that the parser cut short: a proper prefix of the value the raw text shows.

    Both sides are stripped first, since SGLang's detectors strip string values (docs/dsml-format.md, "What the servers' parsers accept")."""
    for key, shown_value in invoke.strings:
        value = args.get(key)
        if isinstance(value, str):
            full, got = shown_value.strip(), value.strip()
            if len(got) < len(full) and full.startswith(got):
                return key
    return None


def scan_turn(
    content: str,
    reasoning: str,
    calls_value: Any,
    tools: Any,
    finish_reason: Any,
    raw: Any,
    calls: list[tuple[str, dict[str, Any] | None]] | None = None,
    schemas: dict[str, Any] | None = None,
) -> list[Finding]:
    """The rules of this module over one message's texts and calls; `tools` is the request's, `raw` the turn's
    raw text, or None; `calls` and `schemas`, when given, are `call_list(calls_value)` and `tool_schemas(tools)`
    already worked out (the schemas are otherwise built only for a text that shows a bare tool tag)."""
    findings: list[Finding] = []
    many = isinstance(calls_value, list) and len(calls_value) > 1
    if calls is None:
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
        if "<" in text and _XML_TAG_RE.search(text) is not None:
            if vocabulary is None:
                schemas = schemas or tool_schemas(tools)
                vocabulary = tool_vocabulary(schemas) if schemas else _NO_VOCABULARY
            if vocabulary is not _NO_VOCABULARY:
                found = bare_tool_tags(text, field, *vocabulary)
                if found is not None:
                    findings.append(found)
    # isspace() stops at the first visible character, where strip() would copy the whole answer.
    if finish_reason == "stop" and (not content or content.isspace()) and not (isinstance(calls_value, list) and calls_value):
        findings.append(make_finding("empty-turn", "content", content, 0, len(content)))
    if isinstance(raw, str):
        findings += lost_calls(raw, calls)
    return findings
