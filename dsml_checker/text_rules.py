"""Hard rules over free text (`content`, `reasoning_content`, raw arguments): DSML leaks, fragments, tokens.

Every scan starts with plain `in` tests so that ordinary prose skips the regular expressions: the checker
must keep up with a load run (tens of thousands of verdicts per second).
"""

from __future__ import annotations

import bisect
import itertools
import json
import operator
import re
from typing import Any, Iterator

from dsml_checker.findings import Finding, make_finding
from dsml_checker.formats import SENTINEL
from dsml_checker.soft_rules import repeat_unit

_BAR = r"(?:｜｜|\|\||[｜|‖])"
# Case spelt out rather than re.I: matching without IGNORECASE is markedly faster on long text.
_DSML = "[dD][sS][mM][lL]"
_SENT = rf"{_BAR}[ \t]*{_DSML}[ \t]*{_BAR}"
_DSML_WORDS = (b"dsml", "dſml".encode())  # what _DSML matches under re.I, ASCII-lowered
_DOUBLED_BAR = "｜｜".encode()

SENTINEL_ANY_RE = re.compile(_SENT)
# Blanks, an optional closing slash, blanks: written possessive, because `[ \t]*/?[ \t]*` can split a run of k
# blanks between its two halves k ways, and a failed match tries them all (quadratic in a "<" and its blanks).
_BLANKS_SLASH = r"[ \t]*+(?:/[ \t]*+)?"
_VARIANT_RE = re.compile(
    rf"{_SENT}[ \t]*(?:tool_calls|function_calls|toolcalls|tool_use|invoke|invoca|parameter|calls|tool)", re.I
)
# A tag whose sentinel lost a bar, or a bar's bytes at a token boundary (left as U+FFFD, or nothing):
# `<DSML｜tool_calls>`, `</｜DSMLinvoke>`, `<\ufffdDSML｜invoke`. The "<" and the tag word right after keep prose
# that names DSML (`the DSML invoke tag`, `<DSML>`) clean.
_LOST_BAR = r"(?:｜｜|\|\||[｜|‖]|\ufffd{1,3}|)"
# Bytes lost at a boundary add no blanks, so none may stand inside the tag but V4.1's one before its word.
LOST_BAR_RE = re.compile(
    rf"</?{_LOST_BAR}{_DSML}{_LOST_BAR} ?(?:tool_calls|function_calls|toolcalls|tool_use|invoke|invoca|parameter|calls|tool)",
    re.I,
)
_LOST_BAR_REACH = 5  # how far before "dsml" its tag's "<" may stand: "</" and three U+FFFD
# A DSML-ish tag: closing slash, tag word, attributes up to the tag's end, and its ">" when present.
# A tag whose sentinel itself is garbled (<｜DSLM｜invoke, <|DMSL|tool_calls>): a short word between bars.
_GARBLED_TAG_RE = re.compile(
    rf"<{_BLANKS_SLASH}{_BAR}[ \t]*[a-z]{{2,8}}[ \t]*{_BAR}[ \t]*(?:tool_calls|function_calls|toolcalls|tool_use|invoke|invoca|parameter|calls)",
    re.I,
)
_LT_BAR_RE = re.compile(r"<[ \t]*[｜|‖]")
# Attribute damage (rule 11) by pattern: possessive tag words, so a lookahead cannot judge half a word.
_TAG_OPEN = rf"<[ \t]*{_SENT}[ \t]*"
_INV = "[iI][nN][vV][a-zA-Z_]*+"
_PARAM = "[pP][aA][rR][aA][mM][a-zA-Z_]*+"
# Every DSML tag in one pass, up to the end of its word: (1) the closing slash with any blanks before it, (2) an
# invoke word, (3) a parameter word, else a wrapper. Zero-width lookaheads answer rule 11 on the way, each
# holding what a separate scan would have matched there:
# (4) after a parameter closer, prose before the next parameter opener;
# (5) an invoke opener, (6) a parameter opener, whose attributes are damaged;
# (7) an invoke or parameter opener's text up to its name attribute's closing quote, (8) that name.
# Each optional part is written (?:...|), not (?:...)?: a repeat saves every group's mark, a branch does not.
_TAG_SCAN_RE = re.compile(
    rf"<([ \t]*+/)?[ \t]*+{_SENT}[ \t]*(?:({_INV})|({_PARAM})|[a-zA-Z_]*)"
    r"(?(1)"
    rf"(?(3)(?:(?=([^<>]*>\s*[^\s<][^<]*{_TAG_OPEN}{_PARAM}))|))"
    r"|"
    r'(?(2)(?:(?=[^<>]*>)(?!\s+name="[^"“”]*"\s*/?>)()|))'
    r'(?(3)(?:(?=[^<>]*>)(?!\s+name="[^"“”]*"\s+string="(?:true|false)"\s*>)()|))'
    r'(?:(?(2)|(?(3)|(?!)))(?=([^<>]*?\bname="([^"]*)"))|)'
    r")"
)
# One whole tool-call block as the encoder writes it, canonical sentinels only: blanks between tags, names
# without quotes or angle brackets, values without a "<" that could open a tag (blanks, a slash, a bar). Written
# possessive: it never backtracks, so a block cut short or damaged fails in one pass.
_CANONICAL_VALUE = r"(?:[^<]++|<(?![ \t]*+/?[ \t]*+[｜|‖]))*+"
_CANONICAL_PARAM = (
    f'<{SENTINEL}parameter name="[^"“”<>]*+" string="(?:true|false)">{_CANONICAL_VALUE}</{SENTINEL}parameter>'
)
_CANONICAL_INVOKE = rf'<{SENTINEL}invoke name="[^"“”<>]*+">(?:\s*+{_CANONICAL_PARAM})*+\s*+</{SENTINEL}invoke>'
_CANONICAL_BLOCK_RE = re.compile(
    rf"<{SENTINEL}tool_calls>(?:\s*+{_CANONICAL_INVOKE})*+\s*+</{SENTINEL}tool_calls>"
)
_CANONICAL_PARAM_NAME_RE = re.compile(f'<{SENTINEL}parameter name="([^"]*)"')
_WRAPPER_OPENER = f"<{SENTINEL}tool_calls"
_WRAPPER_CLOSER = f"</{SENTINEL}tool_calls>"
_TRUNCATED_RE = re.compile(rf"</?[ \t]*{_BAR}[ \t]*(?:[a-z▁_]*(?:{_BAR})?|dsml[ \t]*{_BAR}[^<>]*)", re.I)
_V3_RE = re.compile(
    rf"<[ \t]*{_BAR}[ \t]*tool[▁_ ]?(?:calls?[▁_ ]?(?:begin|end)|sep|outputs?[▁_ ]?(?:begin|end))[ \t]*{_BAR}[ \t]*>", re.I
)
_CONTROL_TOKEN_RE = re.compile(
    rf"<[ \t]*{_BAR}[ \t]*(?:end[▁_ ]of[▁_ ]sentence|begin[▁_ ]of[▁_ ]sentence|user|assistant|system)[ \t]*{_BAR}[ \t]*>", re.I
)
_PLACEHOLDER_RE = re.compile(r"\$(?:TOOL_NAME|PARAMETER_NAME|PARAMETER_VALUE)")
# Everything that starts at a "<" in one pass: DeepSeek's parameter tag with its string= attribute (counts even
# when no tools were offered), other XML tool tags, think tags, and a bar right after "<" (special tokens) that
# does not open a well-spelt DSML tag, nor one that reads "dsml" within 12 characters past its bars and blanks
# (no special token spells it, and a garbled sentinel is one that does not read "dsml"): a leaked block's tags,
# whatever their bars, are passed over inside the search instead of each being a match to look at.
_LT_RE = re.compile(
    r"<(?:(parameter\s+name\s*=[^<>]*?\bstring\s*=)|(/?function_calls>|invoke\s+name\s*=|/invoke>|function>\s*<name>)"
    rf"|(/?think>)|(?!/?{SENTINEL})({_BLANKS_SLASH}[｜|‖])(?![｜|‖ \t]{{0,8}}+[dD][sS][mM][lL]))"
)
# At a "<" and a bar, the three special-token patterns at once: one match call instead of three, each group
# holding what that pattern alone would match there.
_SPECIAL_AT_LT_RE = re.compile(
    rf"(?:(?=({_V3_RE.pattern}))|)(?:(?=({_CONTROL_TOKEN_RE.pattern}))|)(?:(?=({_GARBLED_TAG_RE.pattern}))|)", re.I
)
# Written "``*", not "`+": a pattern that opens with a plain literal lets `re` skip ahead to it, and the
# difference is tenfold on long text. The same reason puts cheap gates before the other patterns.
_BACKTICKS_RE = re.compile(r"``*")

_DUP_MIN = 40
_DUP_LINE_MIN = 16
_DUP_TRIES = 4
_DUP_MAX_LINES = 64  # each candidate costs a scan of the text: bound the work on huge, repetitive inputs

MARKUP_RULES = frozenset(
    {"sentinel", "sentinel-variant", "wrapper-tag", "bare-invoke", "orphan-closer", "truncated-tag",
     "xml-tool-tags", "v3-special-tokens"}
)


def _code_spans(text: str) -> list[tuple[int, int]]:
    """Markdown inline code spans: a run of backticks closed by the next run of the same length.

    `_quoted_regions` pairs single backticks itself and calls this only when a longer run is present.
    """
    runs = [(m.start(), m.end() - m.start()) for m in _BACKTICKS_RE.finditer(text)]
    by_length: dict[int, list[int]] = {}
    for i, (_, length) in enumerate(runs):
        by_length.setdefault(length, []).append(i)
    spans = []
    i = 0
    while i < len(runs):
        start, length = runs[i]
        same = by_length[length]
        nxt = bisect.bisect_right(same, i)
        if nxt == len(same):
            i += 1  # an unmatched run is literal text
            continue
        close = same[nxt]
        spans.append((start, runs[close][0] + length))
        i = close + 1
    return spans


def _fenced_blocks(text: str) -> list[tuple[int, int]]:
    """Fenced code blocks: lines opening with ``` or ~~~ (up to 3 spaces in), paired in order; open to the end."""
    marks = []
    for mark in ("```", "~~~"):
        at = text.find(mark)
        while at >= 0:
            line = text.rfind("\n", 0, at) + 1
            if at - line <= 3 and not text[line:at].strip(" "):
                marks.append((line, mark))
            at = text.find("\n", at)
            at = -1 if at < 0 else text.find(mark, at)
    marks.sort()
    blocks = []
    opener: tuple[int, str] | None = None
    for line, mark in marks:
        if opener is None:
            opener = (line, mark)
        elif mark == opener[1]:
            end = text.find("\n", line)
            blocks.append((opener[0], len(text) if end < 0 else end))
            opener = None
    if opener is not None:
        blocks.append((opener[0], len(text)))
    return blocks


def _quoted_regions(text: str) -> list[tuple[int, int]]:
    tilde = "~" in text and "~~~" in text
    if "`" not in text:
        return _fenced_blocks(text) if tilde else []
    parts = text.split("`")
    if "" in itertools.islice(parts, 1, len(parts) - 1):
        return _fenced_blocks(text) + _code_spans(text)
    # Single backticks only (the usual case): no ``` fence, and each backtick closes the one before it.
    ticks = list(itertools.accumulate(len(part) + 1 for part in parts[:-1]))
    return (_fenced_blocks(text) if tilde else []) + [(a - 1, b) for a, b in zip(ticks[0::2], ticks[1::2])]


_QUICK_TICKS = 16


def _single_ticks(text: str) -> list[int] | None:
    """Where the backticks stand, when the text quotes with a few single backticks only (no fence, no run of
    two); None otherwise. Found one by one: a search for one character is several times faster than one for
    "``" or "~~~", which most prose makes slow.
    """
    if "~" in text and "~~~" in text:
        return None
    ticks: list[int] = []
    at = text.find("`")
    while at >= 0:
        if len(ticks) == _QUICK_TICKS or (ticks and ticks[-1] == at - 1):
            return None
        ticks.append(at)
        at = text.find("`", at + 1)
    return ticks


def _ticks_quote(ticks: list[int], start: int, end: int) -> bool:
    """Whether [start, end) is quoted by single backticks at `ticks`, as `_quoted_regions` has it: they pair up
    in order, each pair quoting from the first to just after the second."""
    for i in range(1, len(ticks), 2):
        if ticks[i - 1] > start:
            break
        if ticks[i] + 1 >= end:
            return True
    return False


# A field's backticks not looked for yet (None is an answer: more than a few single backticks).
_UNASKED: list[int] = []


class _Collector:
    """Gathers one finding per rule and field, routing matches inside code spans to a single quoted-dsml."""

    __slots__ = ("text", "field", "findings", "seen", "_starts", "_reach", "_ticks")

    def __init__(self, text: str, field: str) -> None:
        self.text = text
        self.field = field
        self.findings: list[Finding] = []
        self.seen: set[str] = set()
        self._starts: list[int] | None = None
        self._reach: list[int] = []
        self._ticks: list[int] | None = _UNASKED

    def quoted(self, start: int, end: int) -> bool:
        if self._starts is None:
            # A few single backticks (most text) answer from their positions, found once per field.
            ticks = self._ticks
            if ticks is _UNASKED:
                ticks = self._ticks = _single_ticks(self.text)
            if ticks is not None:
                return _ticks_quote(ticks, start, end)
            regions = sorted(_quoted_regions(self.text))
            self._starts = [lo for lo, _ in regions]
            # Reach of the regions opened so far: [start, end) is quoted iff some region opened at or before
            # `start` reaches `end`.
            self._reach = list(itertools.accumulate((hi for _, hi in regions), max))
        i = bisect.bisect_right(self._starts, start)
        return i > 0 and self._reach[i - 1] >= end

    def add(self, rule: str, start: int, end: int, *, quotable: bool = True) -> bool:
        """Record `rule` at [start, end) unless already recorded; True when it counts (not quoted)."""
        if rule in self.seen and (not quotable or "quoted-dsml" in self.seen):
            return True  # nothing this match could add
        if quotable and self.quoted(start, end):
            rule = "quoted-dsml"
        if rule not in self.seen:
            self.seen.add(rule)
            self.findings.append(make_finding(rule, self.field, self.text, start, end))
        return rule != "quoted-dsml"


def _dsml_words(text: str, lowered: bytes) -> list[int]:
    """Where the sentinel's word "dsml" is spelt in `text` (character offsets), found in `lowered` (the text as
    UTF-8, ASCII-lowered). Under re.I, [sS] also matches "ſ", hence the second spelling."""
    found = []
    for word in _DSML_WORDS:
        at = lowered.find(word)
        while at >= 0:
            found.append(at)
            at = lowered.find(word, at + 1)
    found.sort()
    if not text.isascii():
        # Byte offsets to character offsets, decoding only the stretch between one word and the next.
        chars = last = 0
        for i, at in enumerate(found):
            chars += len(lowered[last:at].decode("utf-8", "surrogatepass"))
            found[i], last = chars, at
    return found


def _variants(text: str, words: list[int]) -> Iterator[re.Match[str]]:
    """What `_VARIANT_RE.finditer(text)` yields, tried only where the sentinel's word is spelt (`words`).

    The pattern cannot open with a literal, so a scan by it steps through every character; it is matched
    where its bar must begin instead.
    """
    done = 0  # finditer's matches do not overlap: none may start before the previous one ended
    for at in words:
        # Back over the blanks before the word (not text[:at].rstrip: a copy of the prefix per word is quadratic).
        bar_end = at
        while bar_end and text[bar_end - 1] in " \t":
            bar_end -= 1
        # A bar is one or two characters; the pattern tries the doubled bars first, as finditer would.
        for start in (bar_end - 2, bar_end - 1):
            if start >= done and start >= 0:
                m = _VARIANT_RE.match(text, start)
                if m is not None:
                    done = m.end()
                    yield m
                    break


def _lost_bars(text: str, words: list[int]) -> Iterator[re.Match[str]]:
    """Tags whose sentinel lost a bar (`LOST_BAR_RE`), tried from the "<" just before each spelt word; the
    canonical sentinel (`<｜DSML｜`, `</｜DSML｜`) is not one."""
    for at in words:
        lt = text.rfind("<", max(0, at - _LOST_BAR_REACH), at)
        if lt >= 0:
            m = LOST_BAR_RE.match(text, lt)
            if m is not None and SENTINEL not in m.group(0):
                yield m


def _scan_dsml(text: str, lowered: bytes, dsml_count: int, out: _Collector) -> None:
    at = text.find(SENTINEL)
    while at >= 0:
        if out.add("sentinel", at, at + len(SENTINEL)):
            break
        at = text.find(SENTINEL, at + 1)
    # A variant needs a "dsml" outside every canonical sentinel, or doubled bars around one; checking that
    # first spares ordinary leaks the slow scan.
    # (Doubled bars looked for in the bytes: a search for a string of two characters is slow in most text.)
    sentinels = text.count(SENTINEL)
    if dsml_count > sentinels or _DOUBLED_BAR in lowered:
        words = _dsml_words(text, lowered)
        for m in _variants(text, words):
            if not m.group(0).startswith(SENTINEL) and out.add("sentinel-variant", m.start(), m.end()):
                break
        for m in _lost_bars(text, words):
            if out.add("sentinel-variant", m.start(), m.end()):
                break
    # Every tag spells "dsml" after its "<" with no other "<" between: none starts before the last "<" ahead of
    # the first spelling, so the scan starts there instead of stepping through the prose before it.
    first = lowered.find(b"dsml")
    if len(lowered) != len(text):
        first = len(lowered[:first].decode("utf-8", "surrogatepass"))
    start = max(0, text.rfind("<", 0, first))
    if dsml_count != sentinels or not _canonical_block(text, start, sentinels, out):
        _scan_tags(text, out, start)


def _canonical_block(text: str, start: int, sentinels: int, out: _Collector) -> bool:
    """`_scan_tags(text, out, start)`'s work when its tags are one well-formed block opening at `start` (the
    usual leak: the encoder's block delivered as text), answered by one match; False, having done nothing, when
    they may not be.

    Every tag `_TAG_SCAN_RE` can match spells "dsml" in ASCII after its "<": with each "dsml" of the text inside
    one of the `sentinels` canonical sentinels (the caller's test), and all of those inside the block, its tags
    are the block's. Those balance and carry well-formed attributes, with blanks between them: of the full
    scan's findings only the wrapper tags remain, and a parameter named twice in one invoke (attribute damage),
    which is left to the full scan (names repeated anywhere in the block send it there).
    """
    block = _CANONICAL_BLOCK_RE.match(text, start)
    if block is None or text.count(SENTINEL, start, block.end()) != sentinels:
        return False
    names = _CANONICAL_PARAM_NAME_RE.findall(text, start, block.end())
    if len(set(names)) != len(names):
        return False
    # The full scan adds the opener, then the closer too while the opener's finding is quoted-dsml; a tag's span
    # ends with its word, before the ">".
    out.add("wrapper-tag", start, start + len(_WRAPPER_OPENER))
    if "wrapper-tag" not in out.seen:
        out.add("wrapper-tag", block.end() - len(_WRAPPER_CLOSER), block.end() - 1)
    return True


def _scan_tags(text: str, out: _Collector, start: int) -> None:
    """One pass over DSML tags from `start` (no tag opens before it): wrappers, bare invokes and orphan closers
    (hard); then attribute damage."""
    depth = [0, 0, 0]  # open wrappers, invokes, parameters
    wrapper_seen = False
    damaged: list[tuple[int, int]] = []
    named: list[tuple[int, int, bool, str]] = []
    prose: list[tuple[int, int]] = []
    for m in _TAG_SCAN_RE.finditer(text, start):
        closing, invoke, param, prose_after, bad_invoke, bad_param, up_to_name, name = m.groups()
        kind = 1 if invoke else 2 if param else 0
        if not kind and "wrapper-tag" not in out.seen:
            out.add("wrapper-tag", *m.span())
        if closing is not None:
            if prose_after is not None and closing == "/":
                prose.append((m.start(), m.end() + len(prose_after)))
            if depth[kind]:
                depth[kind] -= 1
            else:
                out.add("orphan-closer", *m.span())
        elif kind:
            if bad_invoke is not None or bad_param is not None:
                damaged.append(m.span())
            if up_to_name is not None:
                named.append((m.start(), m.end() + len(up_to_name), kind == 1, name))
            depth[kind] += 1
            if kind == 1 and not wrapper_seen:
                out.add("bare-invoke", *m.span())
        else:
            depth[0] += 1
            wrapper_seen = True
    _add_attr_damage(damaged, named, prose, out)


def _add_attr_damage(
    damaged: list[tuple[int, int]], named: list[tuple[int, int, bool, str]], prose: list[tuple[int, int]], out: _Collector
) -> None:
    """Soft rule 11, in the order of its three searches: malformed attributes, a parameter named twice in one
    invoke, prose between parameters."""
    for start, end in damaged:
        if out.add("attr-damage", start, end):
            return
    names: set[str] = set()
    searched = 0  # a name's value may run past later tags, which a search for the next name then skips
    for start, end, is_invoke, name in named:
        if start < searched:
            continue
        searched = end
        if is_invoke:
            names.clear()
        elif name in names:
            if out.add("attr-damage", start, end):
                return
        else:
            names.add(name)
    for start, end in prose:
        if out.add("attr-damage", start, end):
            return


def _duplicated(text: str, *, anywhere: bool) -> tuple[int, int] | None:
    """Span of a back-to-back repeat of 40+ characters: a re-sent buffer, or a repeated block of lines.

    A re-sent buffer starts with the text itself, so that one search runs always. Blocks of lines repeated
    further in are searched only when `anywhere` (the field already shows markup: the answer repeated after a
    leak), which keeps clean prose to a single pass.
    """
    head = text[:_DUP_MIN]
    again = text.find(head, _DUP_MIN)
    # A text made of one short unit repeated is a repetition loop (soft rule 10), not duplicated output.
    if again >= 0 and not repeat_unit(head):
        first = text[:again]
        if text.startswith(first, again) or first.startswith(text[again:]):
            return 0, min(len(text), 2 * again)
    if not anywhere:
        return None
    # A repeated block is anchored on one of its lines that is long enough to mean something: short lines
    # (table rulers, braces, blank lines) repeat in any answer and would only cost time.
    # Filtered by C-level iterators (no Python step per line): a long answer has hundreds of lines. operator.le
    # is called directly, where the bound `_DUP_LINE_MIN.__le__` would build an argument tuple for every line.
    parts = text.split("\n")
    lines = list(itertools.compress(parts, map(operator.le, itertools.repeat(_DUP_LINE_MIN), map(len, parts))))
    if len(set(lines)) == len(lines):
        return None
    seen: set[str] = set()
    repeated: dict[str, None] = {}
    for line in lines:
        if line in seen:
            repeated[line] = None
        seen.add(line)
    for line in itertools.islice(repeated, _DUP_MAX_LINES):
        # A block whose first line is `line` repeats iff the text between two occurrences recurs right after.
        at = text.find(line)
        for _ in range(_DUP_TRIES):
            nxt = text.find(line, at + len(line))
            if nxt < 0:
                break
            if nxt - at >= _DUP_MIN and text.startswith(text[at:nxt], nxt) and not repeat_unit(line):
                return at, 2 * nxt - at
            at = nxt
    return None


def _angle_signals(text: str) -> tuple[int, re.Match[str] | None]:
    """What `_scan_angles` starts from: where a truncated tag ends the text (-1: none), and the first "<" that
    starts one of its patterns; it can find nothing when both are absent."""
    tail_at = text.rfind("<")
    if text.find(">", tail_at) >= 0 or _TRUNCATED_RE.fullmatch(text, tail_at) is None:
        tail_at = -1
    return tail_at, _LT_RE.search(text)


_NO_ANGLES: tuple[int, re.Match[str] | None] = (-1, None)


def _scan_angles(
    text: str, signals: tuple[int, re.Match[str] | None], out: _Collector, *, reasoning: bool, tools_offered: bool
) -> None:
    """Rules anchored on "<": truncated tags, XML tool tags, special and control tokens, think tags; `signals`
    is `_angle_signals(text)`."""
    tail_at, first = signals
    if tail_at >= 0:
        out.add("truncated-tag", tail_at, len(text))
    if first is None:  # the usual case ("3 < 4" in prose): a search costs less than starting an iteration
        return
    xml: re.Match[str] | None = None
    controls: list[tuple[int, int]] = []
    for m in _LT_RE.finditer(text, first.start()):
        deepseek, other, think, lt_bar = m.groups()
        if (deepseek or (other and tools_offered)) and xml is None:
            xml = m
        elif think and not (reasoning and think == "think>"):
            # Reasoning may open with <think>; only </think> is foreign there.
            controls.append(m.span())
        elif lt_bar:  # a special token, or a garbled sentinel
            at = m.start()
            v3, control, garbled = _SPECIAL_AT_LT_RE.match(text, at).groups()
            if v3 is not None:
                out.add("v3-special-tokens", at, at + len(v3))
            if control is not None:
                controls.append((at, at + len(control)))
            if garbled is not None and "dsml" not in garbled.lower():
                out.add("sentinel-variant", at, at + len(garbled))
    if xml is not None:
        out.add("xml-tool-tags", xml.start(), xml.end())
    if controls:
        _add_controls(controls, out)


def _add_controls(found: list[tuple[int, int]], out: _Collector) -> None:
    for start, end in sorted(found, key=lambda span: span[0]):
        if out.add("control-token-leak", start, end):
            return


def scan_text(
    text: str, encoded: bytes, field: str, *, reasoning: bool, tools_offered: bool
) -> tuple[list[Finding], bool]:
    """Apply the text rules (docs/checker-rules.md) to one field of a message; `encoded` is the text as UTF-8.

    Returns the findings and whether unquoted tool-call markup was among them (for the finish_reason rules).
    """
    if not text:
        return [], False
    # ASCII-lowered bytes: bytes.lower() is several times faster than str.lower().
    lowered = encoded.lower()
    dsml_count = lowered.count(b"dsml")
    signals = _angle_signals(text) if "<" in text else _NO_ANGLES
    angles = signals[0] >= 0 or signals[1] is not None
    dollars = "$" in text and _PLACEHOLDER_RE.search(text) is not None
    # A field without markup, tokens or placeholders (most of them) can only be a re-sent answer: one search
    # rules that out without gathering anything.
    if not (dsml_count or angles or dollars) and (len(text) < 2 * _DUP_MIN or text.find(text[:_DUP_MIN], _DUP_MIN) < 0):
        return [], False
    out = _Collector(text, field)
    if dsml_count:
        _scan_dsml(text, lowered, dsml_count, out)
    if angles:
        _scan_angles(text, signals, out, reasoning=reasoning, tools_offered=tools_offered)
    if dollars:
        _add_controls([m.span() for m in _PLACEHOLDER_RE.finditer(text)], out)
    markup = not MARKUP_RULES.isdisjoint(out.seen)
    if len(text) >= 2 * _DUP_MIN:
        span = _duplicated(text, anywhere=markup)
        if span is not None:
            out.add("duplicated-output", *span, quotable=False)
    return out.findings, markup


NOT_JSON = object()


def _unescaped(text: str, decoded: Any) -> str:
    """JSON text with its \\u escapes resolved, so an escaped sentinel (\\uff5cDSML\\uff5c) is seen; `decoded`
    is the text already decoded, or anything else (NOT_JSON) when it is not JSON."""
    if decoded is NOT_JSON:
        return text
    try:
        return json.dumps(decoded, ensure_ascii=False)
    except (ValueError, RecursionError):
        return text


def _markup_in_arguments(text: str, utf8: bytes) -> re.Match[str] | None:
    if b"dsml" in utf8.lower():
        m = SENTINEL_ANY_RE.search(text)
        if m is not None:
            return m
    for lt_bar in _LT_BAR_RE.finditer(text) if "<" in text else ():
        m = _V3_RE.match(text, lt_bar.start()) or _CONTROL_TOKEN_RE.match(text, lt_bar.start())
        if m is not None:
            return m
    return None


def scan_arguments(text: str, utf8: bytes, field: str, decoded: Any = NOT_JSON) -> list[Finding]:
    """Rules for a raw `arguments` string (`utf8`: the same as UTF-8; `decoded`: the string decoded as JSON,
    when it is JSON): DSML or special-token markup inside it, even \\u-escaped."""
    escaped = "\\u" in text
    # Markup needs a bar, and a "<" or the word "dsml": a table's bars alone (prose in a value) need no search.
    if escaped or (("|" in text or "｜" in text or "‖" in text) and ("<" in text or b"dsml" in utf8.lower())):
        m = _markup_in_arguments(text, utf8)
        if m is None and escaped:
            unescaped = _unescaped(text, decoded)
            m = _markup_in_arguments(unescaped, unescaped.encode("utf-8", "surrogatepass"))
        if m is not None:
            return [make_finding("args-dsml", field, text, m.start(), m.end())]
    return []


def quoted_spans(text: str) -> list[tuple[int, int]]:
    """The Markdown code spans and fenced blocks of `text`: markup inside them is quoted, not leaked."""
    return _quoted_regions(text)
