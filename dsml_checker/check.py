"""`check()`: judge one whole assistant turn (an OpenAI chat-completion message) against every rule."""

from __future__ import annotations

import functools
import json
import json.scanner
import re
from typing import Any, Callable, ParamSpec

from dsml_checker.findings import Finding, Verdict, make_finding
from dsml_checker.schema import schema_error
from dsml_checker.soft_rules import scan_soft
from dsml_checker.text_rules import NOT_JSON, scan_arguments, scan_text
from dsml_checker.turn_rules import scan_turn, tool_schemas

# Quotes, angle brackets, whitespace or a fullwidth bar in a name mean markup spilled into it.
_BAD_NAME_RE = re.compile(r"[\"'<>`\s｜]")


_CLEAN = Verdict("clean", ())
_TOO_DEEP = Verdict.of((Finding("message-shape", "message", 0, 0, "nested too deeply to judge", "hard"),))
P = ParamSpec("P")


def depth_guarded(judge: Callable[P, Verdict]) -> Callable[P, Verdict]:
    """`judge`, returning a message-shape verdict where it would raise RecursionError.

    Judging walks the message's structure (repr, json.dumps, schemas, argument values), and Python's recursion
    limit is about a thousand frames: a structure nested that deep is damage in itself, never an exception.
    JSON *text* nested too deep is caught where it is parsed (args-not-object) and never gets here.
    """

    @functools.wraps(judge)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> Verdict:
        try:
            return judge(*args, **kwargs)
        except RecursionError:
            return _TOO_DEEP

    return guarded


def _text(value: Any) -> str:
    """A message field as text: content may be null, a string, or a list of text parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))
    return str(value)


def _whole(rule: str, field: str, text: str, excerpt: str | None = None) -> Finding:
    found = make_finding(rule, field, text, 0, len(text))
    return found if excerpt is None else Finding(found.rule, field, 0, len(text), excerpt, found.severity)


def _bad_name(name: Any) -> bool:
    return not isinstance(name, str) or not name or _BAD_NAME_RE.search(name) is not None


# The decoder's C scanner, called directly: json.loads adds three Python calls and two regex matches (the
# whitespace around the value), a fifth of decoding a typical call's arguments.
_scan_value = json.scanner.make_scanner(json.JSONDecoder())


def _decode(args: str) -> Any:
    """`args` decoded as JSON, or NOT_JSON; decoded once per call, shared by every rule that reads it."""
    try:
        try:
            value, end = _scan_value(args, 0)
        except StopIteration:  # not a value at offset 0: leading blanks, a BOM, or no JSON at all
            return json.loads(args)
        # Anything after the value (blanks allowed, "extra data" not) is json.loads' to judge.
        return value if end == len(args) else json.loads(args)
    except (ValueError, RecursionError):  # RecursionError: arrays or objects nested about a thousand deep
        return NOT_JSON


def _check_arguments(args: Any, utf8: bytes | None, field: str, schema: Any, has_schema: bool) -> tuple[list[Finding], Any]:
    """Findings over one call's arguments, and the arguments as an object (None when they are not one);
    `utf8` is `args` as UTF-8 when it is a string."""
    if isinstance(args, dict):
        text, parsed, found = json.dumps(args, ensure_ascii=False, default=str), args, []
    elif utf8 is not None:
        text, decoded = args, _decode(args)
        found = scan_arguments(args, utf8, field, decoded)
        if decoded is NOT_JSON:
            # An empty string is how several servers send a zero-argument call.
            parsed = None if args.strip() else {}
        else:
            parsed = decoded if isinstance(decoded, dict) else None
        if parsed is None:
            return [*found, _whole("args-not-object", field, text)], None
    else:
        return [_whole("args-not-object", field, repr(args))], None
    if has_schema:
        found += _check_schema(parsed, text, field, schema)
    return found, parsed


def _check_schema(parsed: dict[str, Any], text: str, field: str, schema: Any) -> list[Finding]:
    if not isinstance(schema, dict):
        return []
    if not parsed and schema.get("required"):
        return [_whole("ghost-call", field, text)]
    error = schema_error(parsed, schema)
    return [] if error is None else [_whole("args-schema", field, text, excerpt=error)]


def _check_calls(
    calls: Any, schemas: dict[str, Any] | None, texts: list[tuple[str, str]], encoded: list[bytes]
) -> tuple[list[Finding], list[tuple[str, dict[str, Any] | None]]]:
    """Findings over structured tool_calls, and (name, arguments object or None) for each well-shaped call
    (turn_rules.call_list's answer, without decoding the arguments again); appends each argument text to
    `texts` and its UTF-8 to `encoded`."""
    if not isinstance(calls, list):
        return [_whole("tool-call-shape", "tool_calls", repr(calls)[:80])], []
    findings: list[Finding] = []
    parsed_calls: list[tuple[str, dict[str, Any] | None]] = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            findings.append(_whole("tool-call-shape", f"tool_calls[{i}]", repr(call)[:80]))
            continue
        name = fn.get("name")
        named = isinstance(name, str)
        if _bad_name(name):
            findings.append(_whole("bad-tool-name", f"tool_calls[{i}].function.name", str(name)))
        elif schemas is not None and name not in schemas:
            findings.append(_whole("unknown-tool", f"tool_calls[{i}].function.name", name))
        known = named and schemas is not None and name in schemas
        args, args_field = fn.get("arguments"), f"tool_calls[{i}].function.arguments"
        utf8 = None
        if isinstance(args, str):
            utf8 = args.encode("utf-8", "surrogatepass")
            texts.append((args_field, args))
            encoded.append(utf8)
        found, parsed = _check_arguments(args, utf8, args_field, schemas[name] if known else None, known)
        if found:
            findings += found
        if named:
            parsed_calls.append((name, parsed))
    return findings, parsed_calls


def _tool_choice_name(tool_choice: Any) -> str | None:
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return fn["name"]
    return None


def _check_consistency(
    *, parsed_calls: list[tuple[str, dict[str, Any] | None]], n_calls: int, markup: bool, finish_reason: Any, tool_choice: Any
) -> list[Finding]:
    findings: list[Finding] = []
    reason = finish_reason if isinstance(finish_reason, str) else ""
    if reason == "tool_calls" and n_calls == 0:
        findings.append(_whole("finish-tool-calls-empty", "finish_reason", reason))
    if markup and reason in ("stop", "length") and n_calls == 0:
        findings.append(_whole("dsml-leak-finish", "finish_reason", reason))
    if tool_choice is None or tool_choice == "auto":
        return findings
    wanted = _tool_choice_name(tool_choice)
    rule = None
    if tool_choice == "none" and (n_calls or markup):
        rule = "tool-choice-none"
    elif (tool_choice == "required" or wanted is not None) and n_calls == 0:
        rule = "tool-choice-required"
    elif wanted is not None and any(name != wanted for name, _ in parsed_calls):
        rule = "tool-choice-mismatch"
    if rule is not None:
        findings.append(_whole(rule, "tool_choice", json.dumps(tool_choice, default=str)))
    return findings


def check(
    message: Any, *, finish_reason: str | None = None, tools: Any = None, tool_choice: Any = None, raw: str | None = None
) -> Verdict:
    """Judge one assistant message (`content`, `reasoning_content`, `tool_calls`) and its finish reason.

    `tools` and `tool_choice` are the request's, in OpenAI format; without tools the name and schema checks
    are skipped. `raw`, the text the model generated for this turn, adds the rules comparing the parsed calls
    with the invokes it shows (`call-lost`, `param-lost`); judging the raw text itself is `check_raw`'s job.
    Any input shape is accepted: malformed messages become findings, never exceptions.
    """
    # depth_guarded's work, written out: the hot path spares a call through *args and **kwargs.
    try:
        return _judge(message, finish_reason, tools, tool_choice, raw)
    except RecursionError:
        return _TOO_DEEP


def _judge(message: Any, finish_reason: Any, tools: Any, tool_choice: Any, raw: Any) -> Verdict:
    if not isinstance(message, dict):
        return Verdict.of((_whole("message-shape", "message", repr(message)[:80]),))
    # The schemas are built where a call needs them; a turn without calls asks only whether tools were offered
    # (and the turn rules build them in the rare case of a bare tool tag).
    offered = isinstance(tools, list) and bool(tools)
    content = message.get("content")
    if not isinstance(content, str):
        content = _text(content)
    reasoning = message.get("reasoning_content")
    if reasoning is None:
        reasoning = message.get("reasoning")
    if not isinstance(reasoning, str):
        reasoning = _text(reasoning)
    content_utf8 = content.encode("utf-8", "surrogatepass")
    reasoning_utf8 = reasoning.encode("utf-8", "surrogatepass")
    findings, markup = scan_text(content, content_utf8, "content", reasoning=False, tools_offered=offered)
    found, reasoning_markup = scan_text(reasoning, reasoning_utf8, "reasoning_content", reasoning=True, tools_offered=offered)
    if found:
        findings += found
    markup = markup or reasoning_markup
    texts: list[tuple[str, str]] = [("content", content), ("reasoning_content", reasoning)]
    encoded: list[bytes] = [content_utf8, reasoning_utf8]
    calls = message.get("tool_calls")
    parsed_calls: list[tuple[str, dict[str, Any] | None]] = []
    schemas = None
    if calls is not None:
        schemas = tool_schemas(tools)
        found, parsed_calls = _check_calls(calls, schemas, texts, encoded)
        if found:
            findings += found
    found = scan_soft(texts, encoded)
    if found:
        findings += found
    found = scan_turn(content, reasoning, calls, tools, finish_reason, raw, parsed_calls, schemas)
    if found:
        findings += found
    n_calls = len(calls) if isinstance(calls, list) else 0
    calls_missing = not n_calls and isinstance(finish_reason, str) and finish_reason == "tool_calls"
    if markup or calls_missing or not (tool_choice is None or tool_choice == "auto"):
        # Otherwise no consistency rule can fire.
        findings += _check_consistency(
            parsed_calls=parsed_calls, n_calls=n_calls, markup=markup, finish_reason=finish_reason, tool_choice=tool_choice
        )
    # Most turns are clean: one shared verdict spares building a new one (a Verdict is immutable).
    return Verdict.of(tuple(findings)) if findings else _CLEAN
