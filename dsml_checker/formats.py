"""Render DeepSeek tool calls as model text (V4, V3.2, V4.1 DSML; V3/V3.1 special tokens) and parse it back.

Strict mode follows DeepSeek's reference grammar byte for byte (docs/dsml-format.md, "DeepSeek-V4"); tolerant mode accepts
what SGLang's detector accepts: JSON invoke bodies, self-closing invokes, loose whitespace between tags.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

SENTINEL = "｜DSML｜"
EOS = "<｜end▁of▁sentence｜>"
THINK_CLOSE = "</think>"
V3_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
V3_CALLS_END = "<｜tool▁calls▁end｜>"
V3_CALL_BEGIN = "<｜tool▁call▁begin｜>"
V3_CALL_END = "<｜tool▁call▁end｜>"
V3_SEP = "<｜tool▁sep｜>"
MODES = ("strict", "tolerant")


class DSMLParseError(ValueError):
    """Markup that does not parse: `position` is an offset into the parsed text, `rule` names the rule broken.

    `detail` is the message without the position, for re-raising at another offset.
    """

    def __init__(self, message: str, *, position: int, rule: str) -> None:
        super().__init__(f"{message} at position {position} (rule {rule})")
        self.detail = message
        self.position = position
        self.rule = rule


@dataclass(frozen=True)
class ToolCall:
    """One call as the model meant it: a function name and its arguments object."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Completion:
    """Raw model text split the way a reasoning parser plus a tool-call parser split it."""

    reasoning: str | None
    content: str
    calls: list[ToolCall]
    block_span: tuple[int, int] | None


@dataclass(frozen=True)
class DsmlTags:
    """The tag names of one DSML dialect; V4.1 puts a space before each of them."""

    block: str
    invoke: str
    parameter: str

    @property
    def opener(self) -> str:
        return f"<{SENTINEL}{self.block}>"

    @property
    def closer(self) -> str:
        return f"</{SENTINEL}{self.block}>"

    @property
    def invoke_open(self) -> str:
        return f"<{SENTINEL}{self.invoke}"

    @property
    def invoke_close(self) -> str:
        return f"</{SENTINEL}{self.invoke}>"

    @property
    def param_open(self) -> str:
        return f"<{SENTINEL}{self.parameter}"

    @property
    def param_close(self) -> str:
        return f"</{SENTINEL}{self.parameter}>"


DSML_FORMATS: dict[str, DsmlTags] = {
    "v4": DsmlTags("tool_calls", "invoke", "parameter"),
    "v32": DsmlTags("function_calls", "invoke", "parameter"),
    "v41": DsmlTags(" calls", " invoke", " parameter"),
}
FORMATS = (*DSML_FORMATS, "v3", "v31")


def _check_fmt(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"unknown DSML format {fmt!r}; expected one of {', '.join(FORMATS)}")


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown parse mode {mode!r}; expected one of {', '.join(MODES)}")


def to_json(value: Any) -> str:
    """JSON as DeepSeek's encoder writes it: non-ASCII kept literally."""
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------- rendering


def _render_dsml(calls: Sequence[ToolCall], tags: DsmlTags) -> str:
    invokes = []
    for call in calls:
        params = []
        for key, value in call.arguments.items():
            is_str = isinstance(value, str)
            params.append(
                f'{tags.param_open} name="{key}" string="{"true" if is_str else "false"}">'
                f"{value if is_str else to_json(value)}{tags.param_close}"
            )
        invokes.append(f'{tags.invoke_open} name="{call.name}">\n' + "\n".join(params) + f"\n{tags.invoke_close}")
    return f"{tags.opener}\n" + "\n".join(invokes) + f"\n{tags.closer}"


def render_calls(calls: Sequence[ToolCall], fmt: str = "v4") -> str:
    """The tool-call block alone, from its opener to its closer, in the format `fmt`.

    Like DeepSeek's encoder, nothing is escaped: a name or key holding `"`, or a string value holding the
    parameter closer, renders markup that no parser can read back.
    """
    _check_fmt(fmt)
    if fmt in DSML_FORMATS:
        return _render_dsml(calls, DSML_FORMATS[fmt])
    if fmt == "v3":
        body = "\n".join(
            f"{V3_CALL_BEGIN}function{V3_SEP}{c.name}\n```json\n{to_json(c.arguments)}\n```{V3_CALL_END}" for c in calls
        )
    else:
        body = "".join(f"{V3_CALL_BEGIN}{c.name}{V3_SEP}{to_json(c.arguments)}{V3_CALL_END}" for c in calls)
    return f"{V3_CALLS_BEGIN}{body}{V3_CALLS_END}"


def render_completion(*, reasoning: str | None, content: str, calls: Sequence[ToolCall], fmt: str = "v4") -> str:
    """The whole raw text of a thinking-mode turn: `reasoning</think>content`, the block, end of sentence."""
    head = "" if reasoning is None else reasoning + THINK_CLOSE
    block = "\n\n" + render_calls(calls, fmt) if calls else ""
    return f"{head}{content}{block}{EOS}"


# ---------------------------------------------------------------------------------------------- strict DSML


class _Cursor:
    """A position in the text being parsed, with the expectations of the strict grammar."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, message: str, rule: str, pos: int | None = None) -> DSMLParseError:
        return DSMLParseError(message, position=self.pos if pos is None else pos, rule=rule)

    def at(self, token: str) -> bool:
        return self.text.startswith(token, self.pos)

    def expect(self, token: str, rule: str) -> None:
        if not self.at(token):
            if token.startswith(self.text[self.pos :]):
                raise self.fail(f"text ends before {token!r}", "truncated")
            got = self.text[self.pos : self.pos + len(token)]
            raise self.fail(f"expected {token!r}, found {got!r}", rule)
        self.pos += len(token)

    def until(self, token: str, rule: str, what: str) -> str:
        end = self.text.find(token, self.pos)
        if end < 0:
            raise self.fail(f"{what} is not terminated by {token!r}", rule)
        value = self.text[self.pos : end]
        self.pos = end + len(token)
        return value


def _json_value(raw: str, *, position: int, rule: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as err:
        raise DSMLParseError(f"value is not valid JSON ({err.msg})", position=position, rule=rule) from None
    except RecursionError:
        raise DSMLParseError("value is nested too deeply to parse", position=position, rule=rule) from None


def _parse_dsml_strict(text: str, tags: DsmlTags) -> list[ToolCall]:
    cur = _Cursor(text)
    cur.expect(tags.opener + "\n", "block-opener")
    calls: list[ToolCall] = []
    while True:
        cur.expect(tags.invoke_open + ' name="', "invoke-opener")
        name_at = cur.pos
        name = cur.until('">\n', "invoke-name", "invoke name")
        if not name or '"' in name or "\n" in name:
            raise cur.fail(f"invalid invoke name {name!r}", "invoke-name", name_at)
        args: dict[str, Any] = {}
        if cur.at("\n" + tags.invoke_close):
            cur.pos += 1
        elif cur.at(tags.invoke_close):
            pass  # a zero-argument invoke as deepseek-recipe's encoder writes it: no blank line inside
        else:
            while True:
                param_at = cur.pos
                cur.expect(tags.param_open + ' name="', "param-opener")
                key = cur.until('" string="', "param-attributes", "parameter name")
                flag_at = cur.pos
                flag = cur.until('">', "param-attributes", "string attribute")
                if flag not in ("true", "false"):
                    raise cur.fail(f'string attribute must be "true" or "false", found {flag!r}', "param-string-attr", flag_at)
                value_at = cur.pos
                raw = cur.until(tags.param_close, "param-unterminated", f"parameter {key!r}")
                if key in args:
                    raise cur.fail(f"parameter {key!r} appears twice", "param-duplicate", param_at)
                args[key] = raw if flag == "true" else _json_value(raw, position=value_at, rule="param-json")
                if cur.at("\n" + tags.invoke_close):
                    cur.pos += 1
                    break
                cur.expect("\n", "param-separator")
        cur.expect(tags.invoke_close, "invoke-closer")
        calls.append(ToolCall(name, args))
        if cur.at("\n" + tags.closer):
            cur.pos += 1 + len(tags.closer)
            break
        cur.expect("\n", "invoke-separator")
    rest = text[cur.pos :]
    if rest not in ("", EOS):
        raise cur.fail(f"only end-of-sentence may follow the block, found {rest[:20]!r}", "trailing-text")
    return calls


# ---------------------------------------------------------------------------------------------- tolerant DSML


@dataclass(frozen=True)
class _TolerantPatterns:
    invoke: re.Pattern[str]
    param: re.Pattern[str]


@functools.cache
def _tolerant_patterns(tags: DsmlTags) -> _TolerantPatterns:
    return _TolerantPatterns(
        invoke=re.compile(re.escape(tags.invoke_open) + r'\s+name\s*=\s*"([^"]*)"\s*(/?)>'),
        param=re.compile(re.escape(tags.param_open) + r'\s+name\s*=\s*"([^"]*)"\s+string\s*=\s*"([^"]*)"\s*>'),
    )


def _params(body: str, tags: DsmlTags, pats: _TolerantPatterns) -> Iterator[tuple[int, int, str, str, str, int]]:
    """(start, flag offset, name, string flag, raw value, end) of each parameter: an opener, then up to its closer.

    The value's end is found with str.find, not a lazy `(.*?)closer` in the pattern: that pattern rescans to the
    end of the body from every opener when no closer follows (quadratic in a run of unclosed parameters).
    """
    pos = 0
    while (m := pats.param.search(body, pos)) is not None:
        close = body.find(tags.param_close, m.end())
        if close < 0:
            return  # no later opener has a closer either
        pos = close + len(tags.param_close)
        yield m.start(), m.start(2), m.group(1), m.group(2), body[m.end() : close], pos


def _parse_tolerant_body(body: str, offset: int, tags: DsmlTags, pats: _TolerantPatterns) -> dict[str, Any]:
    stripped = body.strip()
    if not stripped:
        return {}
    if stripped.startswith("{"):
        at = offset + body.index("{")
        value = _json_value(stripped, position=at, rule="invoke-json")
        if not isinstance(value, dict):
            raise DSMLParseError("JSON invoke body is not an object", position=at, rule="invoke-json")
        return value
    args: dict[str, Any] = {}
    last = 0
    for start, flag_at, key, flag, raw, end in _params(body, tags, pats):
        if body[last:start].strip():
            raise DSMLParseError("text between parameters", position=offset + last, rule="param-boundary")
        if flag not in ("true", "false"):
            raise DSMLParseError(
                f'string attribute must be "true" or "false", found {flag!r}', position=offset + flag_at, rule="param-string-attr"
            )
        if key in args:
            raise DSMLParseError(f"parameter {key!r} appears twice", position=offset + start, rule="param-duplicate")
        if flag == "true":
            args[key] = raw
        else:
            # SGLang keeps the raw string when a string="false" value is not JSON (docs/dsml-format.md).
            try:
                args[key] = json.loads(raw)
            except (ValueError, RecursionError):
                args[key] = raw
        last = end
    if body[last:].strip():
        raise DSMLParseError("unparsed text at the end of an invoke", position=offset + last, rule="param-boundary")
    return args


def _parse_dsml_tolerant(text: str, tags: DsmlTags) -> list[ToolCall]:
    pats = _tolerant_patterns(tags)
    start = len(text) - len(text.lstrip())
    if not text.startswith(tags.opener, start):
        raise DSMLParseError(f"expected {tags.opener!r}", position=start, rule="block-opener")
    pos = start + len(tags.opener)
    end = text.find(tags.closer, pos)
    if end < 0:
        raise DSMLParseError(f"block is not closed by {tags.closer!r}", position=len(text), rule="block-unterminated")
    calls: list[ToolCall] = []
    while True:
        gap_end = text.find(tags.invoke_open, pos, end)
        gap = text[pos : end if gap_end < 0 else gap_end]
        if gap.strip():
            raise DSMLParseError("text between invokes", position=pos + len(gap) - len(gap.lstrip()), rule="invoke-boundary")
        if gap_end < 0:
            break
        m = pats.invoke.match(text, gap_end, end)
        if m is None:
            raise DSMLParseError("malformed invoke opener", position=gap_end, rule="invoke-opener")
        name = m.group(1)
        if not name:
            raise DSMLParseError("empty invoke name", position=m.start(1), rule="invoke-name")
        if m.group(2):
            calls.append(ToolCall(name, {}))
            pos = m.end()
            continue
        close = text.find(tags.invoke_close, m.end(), end)
        if close < 0:
            raise DSMLParseError(f"invoke {name!r} is not closed", position=m.start(), rule="invoke-closer")
        calls.append(ToolCall(name, _parse_tolerant_body(text[m.end() : close], m.end(), tags, pats)))
        pos = close + len(tags.invoke_close)
    tail = text[end + len(tags.closer) :].strip()
    if tail not in ("", EOS):
        raise DSMLParseError(f"text after the block: {tail[:20]!r}", position=end + len(tags.closer), rule="trailing-text")
    if not calls:
        raise DSMLParseError("block holds no invoke", position=start, rule="block-empty")
    return calls


# ---------------------------------------------------------------------------------------------- V3 / V3.1


def _parse_v3(text: str, fmt: str, mode: str) -> list[ToolCall]:
    strict = mode == "strict"
    cur = _Cursor(text)

    def skip_ws() -> None:
        if not strict:
            while cur.pos < len(text) and text[cur.pos].isspace():
                cur.pos += 1

    skip_ws()
    cur.expect(V3_CALLS_BEGIN, "block-opener")
    calls: list[ToolCall] = []
    while True:
        skip_ws()
        if calls and cur.at(V3_CALLS_END):
            cur.pos += len(V3_CALLS_END)
            break
        if calls and fmt == "v3" and strict:
            cur.expect("\n", "invoke-separator")
        cur.expect(V3_CALL_BEGIN, "invoke-opener")
        if fmt == "v3":
            cur.expect("function", "invoke-opener")
            cur.expect(V3_SEP, "invoke-opener")
            name_at = cur.pos
            name = cur.until("\n", "invoke-name", "function name")
            if not strict:
                name = name.strip()
            args_at = cur.pos
            body = cur.until(V3_CALL_END, "invoke-closer", f"call {name!r}")
            fenced = re.fullmatch(r"\s*```json\n(.*)\n```\s*" if not strict else r"```json\n(.*)\n```", body, re.DOTALL)
            if fenced is None and strict:
                raise DSMLParseError("arguments are not in a json fence", position=args_at, rule="invoke-json")
            raw = fenced.group(1) if fenced else body
        else:
            name_at = cur.pos
            name = cur.until(V3_SEP, "invoke-name", "function name")
            if not strict:
                name = name.strip()
            args_at = cur.pos
            raw = cur.until(V3_CALL_END, "invoke-closer", f"call {name!r}")
        if not name or '"' in name:
            raise DSMLParseError(f"invalid function name {name!r}", position=name_at, rule="invoke-name")
        args = _json_value(raw, position=args_at, rule="invoke-json")
        if not isinstance(args, dict):
            raise DSMLParseError("arguments are not a JSON object", position=args_at, rule="invoke-json")
        calls.append(ToolCall(name, args))
    rest = text[cur.pos :]
    if (rest if strict else rest.strip()) not in ("", EOS):
        raise cur.fail(f"only end-of-sentence may follow the block, found {rest[:20]!r}", "trailing-text")
    return calls


# ---------------------------------------------------------------------------------------------- public parsing


def parse_calls(text: str, *, mode: str = "strict", fmt: str = "v4") -> list[ToolCall]:
    """Parse one tool-call block (starting with its opener) back into calls, or raise DSMLParseError."""
    _check_fmt(fmt)
    _check_mode(mode)
    if fmt in DSML_FORMATS:
        tags = DSML_FORMATS[fmt]
        return _parse_dsml_strict(text, tags) if mode == "strict" else _parse_dsml_tolerant(text, tags)
    return _parse_v3(text, fmt, mode)


def block_opener(fmt: str) -> str:
    """The text that starts a tool-call block in the format `fmt`."""
    _check_fmt(fmt)
    return DSML_FORMATS[fmt].opener if fmt in DSML_FORMATS else V3_CALLS_BEGIN


def split_completion(text: str, *, mode: str = "tolerant", fmt: str = "v4") -> Completion:
    """Split raw model text into reasoning, content and calls; raise DSMLParseError on a malformed block.

    Positions in errors and in `block_span` are offsets into `text`. Strict mode requires the block's
    start marker to be exactly `\\n\\n` + opener; tolerant mode finds the opener anywhere after `</think>`.
    """
    _check_fmt(fmt)
    _check_mode(mode)
    think = text.find(THINK_CLOSE)
    if think >= 0:
        reasoning: str | None = text[:think]
        body_at = think + len(THINK_CLOSE)
    else:
        reasoning, body_at = None, 0
    body_end = len(text) - len(EOS) if text.endswith(EOS) else len(text)
    opener = block_opener(fmt)
    marker = "\n\n" + opener if mode == "strict" else opener
    found = text.find(marker, body_at, body_end)
    if found < 0:
        return Completion(reasoning, text[body_at:body_end], [], None)
    block_at = found + len(marker) - len(opener)
    content = text[body_at:found]
    if mode == "tolerant":
        content = content.removesuffix("\n\n")
    block = text[block_at:body_end]
    try:
        calls = parse_calls(block, mode=mode, fmt=fmt)
    except DSMLParseError as err:
        raise DSMLParseError(err.detail, position=block_at + err.position, rule=err.rule) from None
    closer = DSML_FORMATS[fmt].closer if fmt in DSML_FORMATS else V3_CALLS_END
    block_end = text.rfind(closer, block_at, body_end) + len(closer)
    return Completion(reasoning, content, calls, (block_at, block_end))


def stated_thinking(request: Any) -> bool | None:
    """The thinking mode a chat request body states in `chat_template_kwargs` (`thinking`, or SGLang's
    `enable_thinking`); None when it states none, and the server's default decides."""
    kwargs = request.get("chat_template_kwargs") if isinstance(request, dict) else None
    if isinstance(kwargs, dict):
        for key in ("thinking", "enable_thinking"):
            if isinstance(kwargs.get(key), bool):
                return bool(kwargs[key])
    return None
