"""`check_raw()`: judge the text a model generated for one turn against DeepSeek's reference grammar.

The raw text is what DeepSeek's reference encoder renders for an assistant turn: `{reasoning}</think>{content}`,
then, when there are calls, `\\n\\n<｜DSML｜tool_calls>\\n…\\n</｜DSML｜tool_calls>`, then optionally
`<｜end▁of▁sentence｜>`. How the edges are judged:

- end of sentence: optional at the very end (some servers strip it); anything after it is `raw-eos-early`.
- thinking mode (`thinking=`): on, the text must hold `</think>` (`raw-think-missing` when a complete text has none);
  off, the whole text is content and any `</think>` in it is replayed reasoning. Unknown (None): a text without
  `</think>` is taken for a non-thinking turn. The first `</think>` ends the reasoning; another
  one before or after the block is `raw-think-replayed`, even inside a code span (the encoder cannot write one
  there and every reasoning parser cuts at it). Inside a `string="true"` value it is the value's text.
- `finish_reason="length"` without the end of sentence: the text may stop anywhere, so a tag, marker or block
  cut at the very end is the info finding `raw-truncated`, never a hard one; only the complete invokes are
  checked against the tools, and `tool_choice="required"` is not held against a turn cut before its call.
  Any other finish reason (or None) means the text is complete: an unclosed block is `raw-block-unterminated`.
- the block starts at the first `\n\n<｜DSML｜tool_calls` after `</think>`, as the reference parser reads it, even
  inside a code fence; DSML elsewhere in the prose is judged by the text rules (quoted markup stays info).
- a turn with no content and no calls is `empty-turn` (reasoning alone included), as in `check()`.

Every departure from the grammar is a hard `raw-*` finding on the field "raw" (offsets into the text). The
strictly parsed reasoning, content and calls then go through `check()` as the message a faithful parser
would return (finish reason "tool_calls" with calls, else "stop"), which adds the text, name and schema rules.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from dsml_checker.check import check, depth_guarded
from dsml_checker.findings import Finding, Verdict, make_finding
from dsml_checker.formats import (
    DSML_FORMATS,
    EOS,
    FORMATS,
    SENTINEL,
    THINK_CLOSE,
    DSMLParseError,
    DsmlTags,
    ToolCall,
    block_opener,
    parse_calls,
)
from dsml_checker.invokes import QUOTES, dsml_tags
from dsml_checker.text_rules import LOST_BAR_RE, MARKUP_RULES

_FIELD = "raw"
_ODD_QUOTES = QUOTES.replace('"', "")  # in place of the ASCII '"' the grammar wants
# Strict-parser rules (formats._parse_dsml_strict, _parse_v3) -> raw rule, before refinement by what is there.
_PARSE_RULES = {
    "block-opener": "raw-opener-misspelled",
    "invoke-name": "raw-invoke-name",
    "param-attributes": "raw-string-attr",
    "param-string-attr": "raw-string-attr",
    "param-duplicate": "raw-param-duplicate",
    "param-json": "raw-param-json",
    "invoke-json": "raw-param-json",
}


class _Out:
    """The raw findings of one turn: at most one per rule, the first place it fires."""

    def __init__(self, raw: str) -> None:
        self.raw = raw
        self.findings: list[Finding] = []
        self.seen: set[str] = set()

    def add(self, rule: str, start: int, end: int | None = None) -> None:
        if rule not in self.seen:
            self.seen.add(rule)
            stop = min(len(self.raw), start + 1 if end is None else max(end, start))
            self.findings.append(make_finding(rule, _FIELD, self.raw, start, stop))


def _cut_tail(text: str, tokens: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that is a proper, non-empty prefix of one of `tokens`."""
    best = 0
    for token in tokens:
        for k in range(min(len(token) - 1, len(text)), best, -1):
            if text.endswith(token[:k]):
                best = k
                break
    return best


def _known_tag(text: str, at: int, closing: bool, word: str, tags: DsmlTags, *, cut_ok: bool) -> bool:
    """Whether the tag at `at` is one the grammar has, spelt in full (or cut by the end of the text when `cut_ok`)."""
    if closing:
        wanted = [f"</{SENTINEL}{w}>" for w in (tags.block, tags.invoke, tags.parameter)]
    else:
        wanted = [tags.opener, f'{tags.invoke_open} name="', f'{tags.param_open} name="']
    for full in wanted:
        if text.startswith(full, at) or (cut_ok and len(text) - at < len(full) and full.startswith(text[at:])):
            return True
    return False


def _garbled_near(text: str, at: int) -> bool:
    window = text[max(0, at - 4) : at + 16]
    if "|DSML" in window or "DSML|" in window or "｜｜" in window or "‖" in window:
        return True
    return any(SENTINEL not in m.group(0) for m in LOST_BAR_RE.finditer(text, max(0, at - 4), at + 24))


def _odd_quote_near(text: str, at: int) -> bool:
    """An attribute (`name=` / `string=`) opened by a quote other than '"' close to `at`."""
    window = text[at : at + 64]
    i = window.find("=")
    while i >= 0:
        if window[i + 1 : i + 2] and window[i + 1] in _ODD_QUOTES:
            return True
        i = window.find("=", i + 1)
    return False


def _cut_token(block: str, at: int, fmt: str) -> bool:
    """Whether block[at:] is the start of a token the grammar allows there: where the strict parser expected
    one alternative, a cut may have left the beginning of another."""
    rest = block[at:]
    if fmt not in DSML_FORMATS:
        return any(token.startswith(rest) for token in ("\n", "<｜tool▁call▁begin｜>", "<｜tool▁calls▁end｜>"))
    tags = DSML_FORMATS[fmt]
    tokens = (tags.opener + "\n", f'{tags.invoke_open} name="', f'{tags.param_open} name="', "\n" + tags.invoke_close,
              tags.invoke_close, "\n" + tags.closer, tags.closer)
    return any(token.startswith(rest) for token in tokens)


def _refine(err: DSMLParseError, block: str) -> str:
    """The raw rule for a strict-parser error, from what stands where the parser stopped."""
    at = err.position
    if _garbled_near(block, at):
        return "raw-sentinel-garbled"
    if _odd_quote_near(block, max(0, at - 24)):
        return "raw-attr-quotes"
    if err.rule == "param-separator":
        return "raw-closer-in-value"  # no newline after a parameter closer: the value held one
    return _PARSE_RULES.get(err.rule, "raw-tag-grammar")


def _key_rule(key: str) -> str:
    """The rule for a parameter name that swallowed markup: the strict parser read on to the next ` string="`,
    so the parameter's own tag (up to its ">") lacked that attribute or spelt it with other quotes."""
    head = key.split(">", 1)[0]
    if any(q in head for q in _ODD_QUOTES):
        return "raw-attr-quotes"
    if '"' in head and "string=" not in head:
        return "raw-string-attr"
    return "raw-tag-grammar"


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _complete_calls(block: str, fmt: str) -> list[ToolCall]:
    """The calls of a cut block up to its last complete invoke, or none."""
    if fmt not in DSML_FORMATS:
        return []
    tags = DSML_FORMATS[fmt]
    last = block.rfind("\n" + tags.invoke_close)
    if last < 0:
        return []
    try:
        return parse_calls(block[: last + 1 + len(tags.invoke_close)] + "\n" + tags.closer, mode="strict", fmt=fmt)
    except DSMLParseError:
        return []


def _judge_tail(tail: str, at: int, opener: str, out: _Out) -> None:
    """Text after the block closer, which only the end of sentence may follow."""
    body = tail.lstrip()
    again = tail.find(opener[:-1] if opener.endswith(">") else opener)
    if again >= 0:
        out.add("raw-second-block", at + again, at + len(tail))
    elif body.startswith(("</" + SENTINEL, "<｜tool▁call")):
        out.add("raw-orphan-closer", at + len(tail) - len(body), at + len(tail))
    else:
        out.add("raw-text-after-block", at, at + len(tail))


def _judge_block(block: str, at: int, fmt: str, truncated: bool, out: _Out) -> tuple[list[ToolCall], int]:
    """Findings over the block (starting at its opener, at offset `at` of the raw text); its calls and length."""
    if fmt in DSML_FORMATS:
        tags = DSML_FORMATS[fmt]
        for tag in dsml_tags(block):
            if not _known_tag(block, tag.start, tag.closing, tag.word, tags, cut_ok=truncated):
                if tag.closing and tag.word.strip()[:5] == tags.parameter.strip()[:5]:
                    rule = "raw-closer-in-value"
                elif not tag.closing and _odd_quote_near(block, tag.end):
                    rule = "raw-attr-quotes"
                else:
                    rule = "raw-tag-fragment"
                out.add(rule, at + tag.start, at + tag.end)
    try:
        calls = parse_calls(block, mode="strict", fmt=fmt)
        end = len(block)
    except DSMLParseError as err:
        if err.rule == "trailing-text":
            end = err.position
            calls = parse_calls(block[:end], mode="strict", fmt=fmt)
            _judge_tail(block[end:], at + end, block_opener(fmt), out)
        elif err.rule == "truncated" or "not terminated" in err.detail or _cut_token(block, err.position, fmt):
            end = len(block)
            if truncated:
                out.add("raw-truncated", at + err.position, at + len(block))
                calls = _complete_calls(block, fmt)
            else:
                out.add("raw-block-unterminated", at + err.position, at + len(block))
                calls = []
        else:
            out.add(_refine(err, block), at + err.position, at + err.position + 24)
            return [], len(block)
    for call in calls:
        if any(SENTINEL in s for s in _strings(call.arguments)):
            out.add("raw-markup-in-value", at, at + end)
        for key in call.arguments:
            # Blanks or "=" in a parameter name: an attribute pasted into it (`name="q string="true">`), which
            # SGLang 0.5.23's parser (deepseek-recipe) reads to the first blank, writing invalid JSON.
            if '"' in key or "\n" in key or SENTINEL in key or "=" in key or " " in key:
                out.add(_key_rule(key), at, at + end)
            elif THINK_CLOSE in key:  # only a string value's text may hold it (module docstring)
                out.add("raw-think-replayed", at, at + end)
    return calls, end


def _classify_content(content: str, at: int, fmt: str, rules: set[str], out: _Out) -> None:
    """Name the grammar departure behind tool-call markup that the text rules found in the content."""
    if "sentinel-variant" in rules:
        out.add("raw-sentinel-garbled", at)
    if fmt not in DSML_FORMATS:
        return
    tags = DSML_FORMATS[fmt]
    for tag in dsml_tags(content):
        pos, word = tag.start, tag.word
        if tag.closing:
            continue
        if word == tags.invoke:
            end = content.find(">", pos)
            complete = (end > 0 and content[end - 1] == "/") or content.find(tags.invoke_close, pos) >= 0
            out.add("raw-opener-missing" if complete else "raw-bare-invoke", at + pos)
        elif word == tags.block:
            out.add("raw-block-marker", at + pos)  # the exact opener, not after a blank line
        elif word != tags.parameter:
            out.add("raw-opener-misspelled", at + pos)
        return


def _structured(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [
        {"id": f"raw_{i}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
        for i, c in enumerate(calls)
    ]


@depth_guarded
def check_raw(
    raw: str, *, tools: Any = None, tool_choice: Any = None, finish_reason: str | None = None, fmt: str = "v4",
    thinking: bool | None = None,
) -> Verdict:
    """Judge the raw text of one assistant turn against DeepSeek's reference grammar (see the module docstring).

    `tools`/`tool_choice` are the request's (OpenAI format), `finish_reason` the server's ("length" means the
    text may be cut anywhere), `fmt` one of dsml_checker.formats.FORMATS, `thinking` the request's thinking
    mode (None: unknown). Never raises on any text.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown DSML format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if not isinstance(raw, str):
        return Verdict.of((make_finding("message-shape", _FIELD, repr(raw)[:80], 0, 0),))
    out = _Out(raw)
    text = raw
    eos = text.find(EOS)
    if eos >= 0:
        if eos + len(EOS) != len(text):
            out.add("raw-eos-early", eos, len(text))
        text = text[:eos]
    truncated = finish_reason == "length" and eos < 0
    opener = block_opener(fmt)
    marker = "\n\n" + (opener[:-1] if fmt in DSML_FORMATS else opener)
    if truncated:
        cut = _cut_tail(text, (THINK_CLOSE, marker, EOS))
        if cut:
            out.add("raw-truncated", len(text) - cut, len(text))
            text = text[: len(text) - cut]
    think = text.find(THINK_CLOSE) if thinking is not False else -1
    if think < 0 and thinking and not truncated:
        out.add("raw-think-missing", 0, len(text))
    reasoning = None if think < 0 else text[:think]
    body_at = 0 if think < 0 else think + len(THINK_CLOSE)
    found = text.find(marker, body_at)
    content_end = len(text) if found < 0 else found
    content = text[body_at:content_end]
    calls: list[ToolCall] = []
    if found >= 0:
        block_at = found + 2
        calls, length = _judge_block(text[block_at:], block_at, fmt, truncated, out)
        tail_at = block_at + length
    else:
        tail_at = len(text)
    for span_start, span_end in ((body_at, content_end), (tail_at, len(text))):
        again = text.find(THINK_CLOSE, span_start, span_end)
        if again >= 0:
            out.add("raw-think-replayed", again, len(text))
    message = {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": _structured(calls)}
    if truncated and not calls:
        finish, choice = "length", tool_choice if tool_choice == "none" else None
    else:
        finish, choice = ("tool_calls" if calls else "length" if truncated else "stop"), tool_choice
    parsed = check(message, finish_reason=finish, tools=tools, tool_choice=choice)
    markup_in = {f.field for f in parsed.findings if f.rule in MARKUP_RULES}
    if "reasoning_content" in markup_in:
        out.add("raw-dsml-in-reasoning", 0, think)
    if "content" in markup_in:
        _classify_content(content, body_at, fmt, {f.rule for f in parsed.findings if f.field == "content"}, out)
    return Verdict.of(tuple(out.findings) + parsed.findings)
