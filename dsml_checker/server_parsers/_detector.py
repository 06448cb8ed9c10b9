"""SGLang 0.5.20: the deepseek-v4 reasoning parser, then the deepseekv4 text detector (serving_chat.py).

The reasoning parser ends reasoning at `</think>`, or, when there is none, at the first `<｜DSML｜`. The
detector needs the block wrapper; it reads every block (`findall`), drops text after them and unknown
tools, strips `string="true"` values, and on any exception returns the whole text as content.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dsml_checker.formats import SENTINEL, THINK_CLOSE
from dsml_checker.server_parsers._common import TAGS, THINK_OPEN, Parsed, tool_names

_BLOCK = re.compile(re.escape(TAGS.opener) + "(.*?)" + re.escape(TAGS.closer), re.DOTALL)
_INVOKE = re.compile(
    re.escape(TAGS.invoke_open) + r'\s+name="(?P<name>[^"]+)"\s*'
    r"(?:(?P<self_close>/>)|>(?P<body>.*?)(?P<end>(?:" + re.escape(TAGS.invoke_close) + r"|$)))",
    re.DOTALL,
)
_PARAM = re.compile(
    re.escape(TAGS.param_open) + r'\s+name="([^"]+)"\s+string="([^"]+)"\s*>(.*?)' + re.escape(TAGS.param_close),
    re.DOTALL,
)


def _split_reasoning(text: str) -> tuple[str, str]:
    while text.startswith(THINK_OPEN):
        text = text[len(THINK_OPEN):]
    if THINK_CLOSE in text:
        reasoning, _, body = text.partition(THINK_CLOSE)
        return reasoning, body
    tool_at = text.find("<" + SENTINEL)
    return (text[:tool_at], text[tool_at:]) if tool_at >= 0 else (text, "")


def _arguments(body: str) -> Any:
    stripped = body.strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        return json.loads(stripped)  # a JSON invoke body; invalid JSON fails the whole parse
    params: dict[str, Any] = {}
    for key, flag, value in _PARAM.findall(body):
        if flag == "true":
            params[key] = value.strip()
        else:
            try:
                params[key] = json.loads(value.strip())
            except ValueError:
                params[key] = value.strip()
    return params


def _detect(body: str, known: list[str], out: Parsed) -> str | None:
    """The detector's calls into `out`; the content it leaves, or None when it found no call."""
    at = body.find(TAGS.opener)
    if at < 0:
        # An invoke without its wrapper counts as a tool call that does not parse: the text stays as is.
        return None
    content = body[:at].removesuffix("\n\n")
    try:
        sections = _BLOCK.findall(body)
        calls = []
        for section in sections:
            for m in _INVOKE.finditer(section):
                name = m.group("name").strip()
                params = {} if m.group("self_close") else _arguments(m.group("body"))
                if name not in known:
                    out.actions.append("unknown-tool-dropped")
                    continue
                calls.append((name, json.dumps(params or {}, ensure_ascii=False)))
    except ValueError:
        out.actions.append("parse-failed-whole-text-as-content")
        return None
    if not sections:
        out.actions.append("unterminated-block-dropped")
    if len(sections) > 1:
        out.actions.append("later-blocks-parsed")
    out.calls.extend(calls)
    return content


def parse(text: str, tools: list[dict[str, Any]], tool_choice: Any) -> Parsed:
    """Reasoning split by the reasoning parser, then the detector over the rest when tools are active."""
    reasoning, body = _split_reasoning(text)
    out = Parsed(reasoning, body)
    if tool_choice == "none" or not tools:
        return out
    if TAGS.opener not in body and TAGS.invoke_open not in body:
        return out
    content = _detect(body, tool_names(tools), out)
    if content is not None:
        out.content = content
    return out
