"""vLLM 0.33: the DeepSeek-V4 lexer engine (vllm/parser/deepseek_v4.py, vllm/parser/engine/).

A lexer finds literal terminals anywhere in the text; a state machine routes the text between them:
reasoning, content, a call's name, its raw arguments, or nowhere (inside a block, between invokes and
after it). A terminal with no transition in the current state is plain text of that state. Arguments
go through the DSML converter (the `string` attribute is optional, a value may end at the next
parameter), then are coerced to the tool's schema (`_fix_arg_types`).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from dsml_checker.formats import SENTINEL, THINK_CLOSE
from dsml_checker.server_parsers._common import TAGS, THINK_OPEN, Parsed, tool_properties

_TERMINALS = {
    THINK_OPEN: "THINK_START",
    THINK_CLOSE: "THINK_END",
    TAGS.opener: "TOOL_START",
    f"<{SENTINEL}toolcalls>": "TOOL_START",  # spellings seen in production, accepted as the opener
    f"<{SENTINEL}tool>": "TOOL_START",
    TAGS.closer: "TOOL_END",
    TAGS.invoke_open + ' name="': "INVOKE_PREFIX",
    '">': "INVOKE_NAME_END",
    TAGS.invoke_close: "INVOKE_END",
    TAGS.param_open: "PARAM_START",
    TAGS.param_close: "PARAM_CLOSE",
}
_LEXER = re.compile("|".join(re.escape(t) for t in sorted(_TERMINALS, key=len, reverse=True)))

# (state, terminal) -> next state; a call starts on INVOKE_PREFIX and ends on the moves out of ARGS.
_MOVES = {
    ("CONTENT", "THINK_START"): "REASONING",
    ("CONTENT", "THINK_END"): "CONTENT",
    ("REASONING", "THINK_START"): "REASONING",
    ("REASONING", "THINK_END"): "CONTENT",
    ("REASONING", "TOOL_START"): "PREAMBLE",
    ("CONTENT", "TOOL_START"): "PREAMBLE",
    ("PREAMBLE", "INVOKE_PREFIX"): "NAME",
    ("CONTENT", "INVOKE_PREFIX"): "NAME",
    ("NAME", "INVOKE_NAME_END"): "ARGS",
    ("ARGS", "INVOKE_END"): "BETWEEN",
    ("ARGS", "TOOL_END"): "BETWEEN",
    ("BETWEEN", "INVOKE_PREFIX"): "NAME",
    ("BETWEEN", "TOOL_END"): "BETWEEN",
    ("BETWEEN", "TOOL_START"): "PREAMBLE",
}

_P_START, _P_CLOSE = re.escape(TAGS.param_open), re.escape(TAGS.param_close)
_PARAM = re.compile(rf'{_P_START}\s+name="([^"]+)"(?:\s+string="([^"]*)")?\s*>(.*?)(?:{_P_CLOSE}|(?={_P_START}\s+name=))',
                    re.DOTALL)


def _convert(raw: str) -> str:
    """vLLM's `_dsml_arg_converter` on a finished call: complete parameters only."""
    params: dict[str, Any] = {}
    for key, flag, value in _PARAM.findall(raw):
        if flag == "true":
            params[key] = value
        else:
            try:
                params[key] = json.loads(value)
            except ValueError:
                params[key] = value
    return json.dumps(params, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------- schema coercion

_ALIASES = {"str": "string", "text": "string", "varchar": "string", "char": "string", "enum": "string",
            "int": "integer", "int32": "integer", "int64": "integer", "uint": "integer", "uint32": "integer",
            "uint64": "integer", "long": "integer", "short": "integer", "unsigned": "integer", "float": "number",
            "float32": "number", "float64": "number", "double": "number", "bool": "boolean", "dict": "object",
            "arr": "array", "list": "array", "sequence": "array"}
_PRIORITY = ("null", "integer", "number", "boolean", "object", "array", "string")


def _types(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return {"string"}
    types: set[str] = set()
    kind = schema.get("type")
    if isinstance(kind, str):
        types.add(kind)
    elif isinstance(kind, list):
        types.update(k for k in kind if isinstance(k, str))
    if isinstance(schema.get("enum"), list):
        for v in schema["enum"]:
            types.add("null" if v is None else "boolean" if isinstance(v, bool) else "integer" if isinstance(v, int)
                      else "number" if isinstance(v, float) else "string" if isinstance(v, str)
                      else "array" if isinstance(v, list) else "object" if isinstance(v, dict) else "string")
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            for choice in schema[key]:
                types |= _types(choice)
    return types or {"string"}


def _finite(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError):
        return False
    return True


def _coerce_text(value: str, types: set[str]) -> Any:
    """vLLM's `coerce_to_schema_type`: the first type in priority order the text converts to."""
    wanted = {_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in types}
    for kind in _PRIORITY:
        if kind not in wanted:
            continue
        if kind == "null" and value.lower() == "null":
            return None
        if kind == "string":
            return value
        if kind in ("integer", "number"):
            try:
                return int(value)
            except ValueError:
                pass
        if kind == "number":
            try:
                number = float(value)
            except ValueError:
                continue
            if math.isfinite(number):
                return number if number != int(number) else int(number)
        if kind == "boolean" and value.lower().strip() in ("true", "1", "false", "0"):
            return value.lower().strip() in ("true", "1")
        if kind in ("object", "array"):
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            if _finite(parsed):
                return parsed
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if _finite(parsed) else value


def _coerce(value: Any, schema: dict[str, Any]) -> tuple[Any, bool]:
    if isinstance(value, str):
        coerced = _coerce_text(value, _types(schema))
        return coerced, coerced is not value
    if isinstance(value, dict):
        nested = schema.get("properties")
        return value, isinstance(nested, dict) and _coerce_all(value, nested)
    if isinstance(value, list):
        items = schema.get("items")
        changed = False
        if isinstance(items, dict):
            for i, item in enumerate(value):
                value[i], item_changed = _coerce(item, items)
                changed |= item_changed
        return value, changed
    coerced = _coerce_text(json.dumps(value, ensure_ascii=False), _types(schema))
    return coerced, type(coerced) is not type(value) or coerced != value


def _coerce_all(args: dict[str, Any], properties: dict[str, Any]) -> bool:
    changed = False
    for key, value in args.items():
        if isinstance(properties.get(key), dict):
            args[key], value_changed = _coerce(value, properties[key])
            changed |= value_changed
    return changed


def _unwrap(args: dict[str, Any], properties: dict[str, Any]) -> dict[str, Any]:
    """`{"arguments": {...}}` around the real arguments is taken off when the schema allows it."""
    for wrapper in ("arguments", "input"):
        if set(args) != {wrapper} or wrapper in properties:
            continue
        inner = args[wrapper]
        if isinstance(inner, str):
            try:
                inner = json.loads(inner)
            except ValueError:
                return args
        if isinstance(inner, dict) and set(inner) <= set(properties):
            return inner
    return args


def _arguments(name: str, raw: str, tools: list[dict[str, Any]], out: Parsed) -> str:
    converted = _convert(raw) if raw.strip() else "{}"
    properties = tool_properties(tools, name)
    if not properties:
        return converted
    args = json.loads(converted)
    unwrapped = _unwrap(args, properties)
    if unwrapped is not args:
        out.actions.append("wrapper-unwrapped")
        converted, args = json.dumps(unwrapped, ensure_ascii=False), unwrapped
    if _coerce_all(args, properties):
        out.actions.append("schema-coerced")
        return json.dumps(args, ensure_ascii=False)
    return converted


# ---------------------------------------------------------------------------------------------- the engine


def parse(text: str, tools: list[dict[str, Any]], tool_choice: Any) -> Parsed:
    """One pass of the lexer engine over the whole text, then the serving layer's whitespace and tool rules."""
    state = "REASONING"
    reasoning: list[str] = []
    content: list[str] = []
    slots: list[list[str]] = []  # [name, raw arguments] per call
    out = Parsed(None, "")
    pos = 0
    for m in [*_LEXER.finditer(text), None]:
        piece = text[pos: m.start() if m else len(text)]
        pieces = [(piece, None)] if piece else []
        if m is not None:
            pieces.append((m.group(), _TERMINALS[m.group()]))
            pos = m.end()
        for value, terminal in pieces:
            move = _MOVES.get((state, terminal)) if terminal else None
            if move is None:
                if state == "REASONING":
                    reasoning.append(value)
                elif state == "CONTENT":
                    content.append(value)
                elif state == "NAME":
                    slots[-1][0] += value
                elif state == "ARGS":
                    slots[-1][1] += value
                elif value.strip():
                    out.actions.append("text-in-block-dropped")
                continue
            if terminal == "INVOKE_PREFIX":
                slots.append(["", ""])
            if state == "BETWEEN" and terminal in ("INVOKE_PREFIX", "TOOL_START"):
                out.actions.append("later-invokes-parsed")
            state = move
    suppressed = tool_choice == "none" and bool(tools)
    for name, raw in slots:
        name = name.strip()
        if not name or suppressed:
            continue
        out.calls.append((name, _arguments(name, raw, tools, out)))
    if suppressed and slots:
        out.actions.append("markup-suppressed")
    out.reasoning = "".join(reasoning).rstrip() or None
    joined = "".join(content)
    out.content = "" if slots and not suppressed and not joined.strip() else joined
    if not tools or tool_choice == "none":
        out.calls = []  # the serving layer keeps calls only for tools it was sent
    out.stop_with_calls = isinstance(tool_choice, dict)
    return out
