"""Rules over free text (`content`, `reasoning_content`, raw arguments): DSML leaks, fragments, tokens, loops.

Every scan starts with plain `in` tests so that ordinary prose skips the regular expressions: the checker
must keep up with a load run (tens of thousands of verdicts per second).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from dsml_checker.findings import Finding, make_finding

_BAR = r"(?:｜｜|\|\||[｜|‖])"
_SENT = rf"{_BAR}[ \t]*dsml[ \t]*{_BAR}"
CANONICAL = "｜DSML｜"

SENTINEL_ANY_RE = re.compile(_SENT, re.I)
_VARIANT_RE = re.compile(
    rf"{_SENT}[ \t]*(?:tool_calls|function_calls|toolcalls|tool_use|invoke|invoca|parameter|calls|tool)", re.I
)
_TAG_RE = re.compile(rf"<[ \t]*(/?)[ \t]*{_SENT}[ \t]*([a-z_]*)", re.I)
_TRUNCATED_RE = re.compile(rf"</?[ \t]*{_BAR}[ \t]*(?:[a-z▁_]*|dsml[ \t]*{_BAR}[^<>]*)", re.I)
_V3_RE = re.compile(
    rf"<[ \t]*{_BAR}[ \t]*tool[▁_ ]?(?:calls?[▁_ ]?(?:begin|end)|sep|outputs?[▁_ ]?(?:begin|end))[ \t]*{_BAR}[ \t]*>", re.I
)
_CONTROL_TOKEN_RE = re.compile(
    rf"<[ \t]*{_BAR}[ \t]*(?:end[▁_ ]of[▁_ ]sentence|begin[▁_ ]of[▁_ ]sentence|user|assistant|system)[ \t]*{_BAR}[ \t]*>", re.I
)
_THINK_RE = re.compile(r"</?think>")
_PLACEHOLDER_RE = re.compile(r"\$(?:TOOL_NAME|PARAMETER_NAME|PARAMETER_VALUE)")
# The string= attribute is DeepSeek's own, so that shape counts even when no tools were offered.
_XML_DEEPSEEK_RE = re.compile(r"<parameter\s+name\s*=[^<>]*?\bstring\s*=")
_XML_TOOLS_RE = re.compile(r"</?function_calls>|<invoke\s+name\s*=|</invoke>|<function>\s*<name>")
_FENCE_RE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})[^\n]*\n.*?(?:^[ \t]{0,3}\1[ \t]*$|\Z)", re.M | re.S)
_SPAN_RE = re.compile(r"(?<!`)(`+)(?!`).+?(?<!`)\1(?!`)", re.S)
_RARE_RE = re.compile(
    "[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ue000-\uf8ff\ufff0-\ufffc\u200b-\u200f\u2060-\u2064\ufeff"
    "\U000f0000-\U0010ffff]{3,}"
)
_INVOKE_ATTRS_RE = re.compile(r'\s+name="[^"“”]*"\s*/?')
_PARAM_ATTRS_RE = re.compile(r'\s+name="[^"“”]*"\s+string="(?:true|false)"\s*')
_PARAM_NAME_RE = re.compile(r'name="([^"]*)"')

_DUP_MIN = 40
_LOOP_SHIFTS = (24, 35)  # together their divisors cover every loop unit of 1 to 8 bytes
_LOOP_MIN_ZEROS = 24
_LOOP_MAX_UNIT = 8
_LOOP_FILLER = frozenset(" \t\r\n-=_*#~.:|+/\\")
_ZEROS = b"\0" * _LOOP_MIN_ZEROS
_PLAIN_ASCII = bytes(range(0x20, 0x7F)) + b"\t\n\r"

MARKUP_RULES = frozenset(
    {"sentinel", "sentinel-variant", "wrapper-tag", "bare-invoke", "orphan-closer", "truncated-tag",
     "xml-tool-tags", "v3-special-tokens"}
)


@dataclass(frozen=True)
class TextScan:
    """The findings of one text field, and whether unquoted tool-call markup was among them."""

    findings: list[Finding]
    markup: bool


def _quoted_regions(text: str) -> list[tuple[int, int]]:
    if "`" not in text and "~~~" not in text:
        return []
    regions = [m.span() for m in _FENCE_RE.finditer(text)]
    regions.extend(m.span() for m in _SPAN_RE.finditer(text))
    return regions


class _Collector:
    """Gathers one finding per rule and field, routing matches inside code spans to a single quoted-dsml."""

    def __init__(self, text: str, field: str) -> None:
        self.text = text
        self.field = field
        self.findings: list[Finding] = []
        self.seen: set[str] = set()
        self._regions: list[tuple[int, int]] | None = None

    def quoted(self, start: int, end: int) -> bool:
        if self._regions is None:
            self._regions = _quoted_regions(self.text)
        return any(lo <= start and end <= hi for lo, hi in self._regions)

    def add(self, rule: str, start: int, end: int, *, quotable: bool = True) -> bool:
        """Record `rule` at [start, end) unless already recorded; True when it counts (not quoted)."""
        if quotable and self.quoted(start, end):
            rule = "quoted-dsml"
        if rule not in self.seen:
            self.seen.add(rule)
            self.findings.append(make_finding(rule, self.field, self.text, start, end))
        return rule != "quoted-dsml"


def _tag_kind(word: str) -> str:
    low = word.lower()
    if low.startswith("inv"):
        return "invoke"
    if low.startswith("param"):
        return "parameter"
    return "wrapper"


def _scan_dsml(text: str, out: _Collector) -> None:
    at = text.find(CANONICAL)
    while at >= 0:
        if out.add("sentinel", at, at + len(CANONICAL)):
            break
        at = text.find(CANONICAL, at + 1)
    for m in _VARIANT_RE.finditer(text):
        if not m.group(0).startswith(CANONICAL) and out.add("sentinel-variant", m.start(), m.end()):
            break
    depth = {"wrapper": 0, "invoke": 0, "parameter": 0}
    wrapper_seen = False
    for m in _TAG_RE.finditer(text):
        closing, kind = m.group(1), _tag_kind(m.group(2))
        if kind == "wrapper":
            out.add("wrapper-tag", m.start(), m.end())
        if closing:
            if depth[kind] == 0:
                out.add("orphan-closer", m.start(), m.end())
            else:
                depth[kind] -= 1
            continue
        depth[kind] += 1
        if kind == "wrapper":
            wrapper_seen = True
        elif kind == "invoke" and not wrapper_seen:
            out.add("bare-invoke", m.start(), m.end())
    _scan_attributes(text, out)


def _scan_attributes(text: str, out: _Collector) -> None:
    """Soft: damaged attributes, duplicate parameter names, prose between parameters (rule 11)."""
    names: set[str] = set()
    last_param_close = -1
    for m in _TAG_RE.finditer(text):
        kind = _tag_kind(m.group(2))
        if m.group(1):
            if kind == "parameter":
                last_param_close = text.find(">", m.end())
            continue
        if kind == "wrapper":
            continue
        close = text.find(">", m.end())
        if close < 0:
            continue
        attrs = text[m.end() : close]
        damaged = not (_INVOKE_ATTRS_RE if kind == "invoke" else _PARAM_ATTRS_RE).fullmatch(attrs)
        if kind == "invoke":
            names.clear()
            last_param_close = -1
        else:
            name = _PARAM_NAME_RE.search(attrs)
            if name is not None:
                damaged = damaged or name.group(1) in names
                names.add(name.group(1))
            if last_param_close >= 0 and text[last_param_close + 1 : m.start()].strip():
                damaged = True
        if damaged and out.add("attr-damage", m.start(), close + 1):
            return


def _duplicated(text: str) -> tuple[int, int] | None:
    """Span of a back-to-back repeat of 40+ characters: a re-sent buffer, or a block of repeated lines."""
    head = text[:_DUP_MIN]
    again = text.find(head, _DUP_MIN)
    if again >= 0:
        first = text[:again]
        if text.startswith(first, again) or first.startswith(text[again:]):
            return 0, min(len(text), 2 * again)
    lines = text.split("\n")
    distinct = set(lines)
    blank = lines.count("")
    if len(distinct) - ("" in distinct) == len(lines) - blank:
        return None  # no non-blank line occurs twice, so no block of lines can repeat
    last: dict[str, int] = {}
    offsets: list[int] = []
    pos = 0
    for j, line in enumerate(lines):
        offsets.append(pos)
        pos += len(line) + 1
        if not line.strip():
            continue
        prev = last.get(line)
        last[line] = j
        if prev is None:
            continue
        period = j - prev
        block = lines[prev:j]
        if sum(map(len, block)) + period >= _DUP_MIN and lines[j : j + period] == block:
            return offsets[prev], min(len(text), 2 * offsets[j] - offsets[prev])
    return None


def _loop(text: str, raw: bytes) -> tuple[int, int] | None:
    """Span of a unit of 1–8 characters repeated over ~50+ characters, ignoring whitespace and rulers."""
    n = len(raw)
    whole = int.from_bytes(raw, "big")
    for shift in _LOOP_SHIFTS:
        if n < shift + _LOOP_MIN_ZEROS:
            continue
        # Byte k of `diff` is raw[k] ^ raw[k - shift]: a run of zeros is a stretch repeating with that period.
        diff = (whole ^ (whole >> (8 * shift))).to_bytes(n, "big")
        at = diff.find(_ZEROS, shift)
        while at >= 0:
            end = at + _LOOP_MIN_ZEROS
            end = len(diff) - len(diff[end:].lstrip(b"\0"))
            region = raw[at - shift : end]
            unit = next((u for u in range(1, _LOOP_MAX_UNIT + 1) if region[u:] == region[:-u]), 0)
            if unit and not set(region[:unit].decode("utf-8", "replace")) <= _LOOP_FILLER:
                if text.isascii():
                    return at - shift, end
                start = len(raw[: at - shift].decode("utf-8", "ignore"))
                return start, start + len(region.decode("utf-8", "ignore"))
            at = diff.find(_ZEROS, end)
    return None


def _control_tokens(text: str, *, has_lt: bool, reasoning: bool) -> list[re.Match[str]]:
    """Leaked template tokens (rule 6); reasoning may open with <think>, only </think> is foreign there."""
    found: list[re.Match[str]] = []
    if has_lt:
        found.extend(_CONTROL_TOKEN_RE.finditer(text))
        if "think>" in text:
            found.extend(m for m in _THINK_RE.finditer(text) if not (reasoning and m.group(0) == "<think>"))
    if "$" in text:
        found.extend(_PLACEHOLDER_RE.finditer(text))
    return sorted(found, key=lambda m: m.start())


def scan_text(text: str, field: str, *, reasoning: bool, tools_offered: bool) -> TextScan:
    """Apply the text rules of dsml-format.md §5 to one field of a message."""
    out = _Collector(text, field)
    if not text:
        return TextScan(out.findings, False)
    has_lt = "<" in text
    low = text.lower()
    if "dsml" in low:
        _scan_dsml(text, out)
    if has_lt:
        tail_at = text.rfind("<")
        if ">" not in text[tail_at:] and _TRUNCATED_RE.fullmatch(text, tail_at):
            out.add("truncated-tag", tail_at, len(text))
        m = _XML_DEEPSEEK_RE.search(text)
        if m is None and tools_offered:
            m = _XML_TOOLS_RE.search(text)
        if m is not None:
            out.add("xml-tool-tags", m.start(), m.end())
        if "tool" in low:
            m = _V3_RE.search(text)
            if m is not None:
                out.add("v3-special-tokens", m.start(), m.end())
    for m in _control_tokens(text, has_lt=has_lt, reasoning=reasoning):
        if out.add("control-token-leak", m.start(), m.end()):
            break
    if len(text) >= 2 * _DUP_MIN:
        span = _duplicated(text)
        if span is not None:
            out.add("duplicated-output", *span, quotable=False)
    _scan_soft(text, out)
    markup = any(f.rule in MARKUP_RULES for f in out.findings)
    return TextScan(out.findings, markup)


def _scan_soft(text: str, out: _Collector) -> None:
    """Soft rule 10: repetition loops and runs of rare characters."""
    raw = text.encode("utf-8", "surrogatepass")
    span = _loop(text, raw)
    if span is not None:
        out.add("repetition-loop", *span, quotable=False)
    # Printable ASCII cannot hold a rare character; only other text pays for the regular expression.
    if raw.translate(None, _PLAIN_ASCII):
        m = _RARE_RE.search(text)
        if m is not None:
            out.add("rare-chars", m.start(), m.end(), quotable=False)


def _unescaped(text: str) -> str:
    """JSON text with its \\u escapes resolved, so an escaped sentinel (\\uff5cDSML\\uff5c) is seen."""
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        return text


def scan_arguments(text: str, field: str) -> list[Finding]:
    """Rules for a raw `arguments` string: DSML fragments inside it (hard), loops and rare runs (soft)."""
    out = _Collector(text, field)
    if "dsml" in text.lower():
        m = SENTINEL_ANY_RE.search(text)
        if m is None and "\\u" in text:
            m = SENTINEL_ANY_RE.search(_unescaped(text))
        if m is not None:
            out.add("args-dsml", m.start(), m.end(), quotable=False)
    _scan_soft(text, out)
    return out.findings
