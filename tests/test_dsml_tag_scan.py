"""The short cuts of the leak path answer as the general code they stand in for, on generated blocks that are
whole, cut, garbled, nested, quoted or named twice, among adversarial prose: the canonical-block short cut of
the DSML tag scan (text_rules._canonical_block) gives the full scan's (text_rules._scan_tags) findings, in the
same order, from the same state, wherever it answers at all; and the "<" search of the token rules
(text_rules._LT_RE) passes over a bar that reads "dsml" itself, as the rules' own test of each match did."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsml_checker import ToolCall, render_calls
from dsml_checker.formats import SENTINEL
from dsml_checker.text_rules import _LT_RE, _canonical_block, _Collector, _scan_tags

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Characters and pieces that sit on the short cut's edges: bars of every kind, quotes, "<" with blanks and a
# slash, backticks (quoting), the word dsml in other spellings, tags whole and cut, V4.1's blank before a word.
_CHARS = list("ab x\n\t<>/\"“”`=") + ["｜", "|", "‖", "\ufffd", "D", "S", "M", "L", "ſ"]
_PIECES = [
    SENTINEL, "｜｜DSML｜｜", "|DSML|", "‖DSML‖", "｜ DSML ｜", "dsml", "DſML", "<", "</", "< /", "< ｜", "<｜", "`", "```\n",
    f"<{SENTINEL}tool_calls>", f"</{SENTINEL}tool_calls>", f"<{SENTINEL}invoke name=\"a\">", f"</{SENTINEL}invoke>",
    f"<{SENTINEL}parameter name=\"k\" string=\"true\">", f"</{SENTINEL}parameter>", f"<{SENTINEL} invoke name=\"a\">",
    f"<{SENTINEL}parameter name=\"k“ string=\"true\">", f"<{SENTINEL}invoke name=\"a\"/>", "3 < 4", "3 <| 4",
]
_TEXT = st.text(st.sampled_from(_CHARS), max_size=12)
_PROSE = st.lists(st.one_of(_TEXT, st.sampled_from(_PIECES)), max_size=4).map("".join)
_KEYS = st.sampled_from(["city", "days", "q", "limit", "tags", "n", "", "a b", "x<y", 'q"', "dsml"])
_WORDS = st.text(st.sampled_from(list("ab x\n.,")), max_size=12)
_VALUES = st.one_of(st.integers(), _WORDS, _PROSE, st.lists(st.integers(), max_size=2))
_CALLS = st.lists(
    st.builds(ToolCall, st.sampled_from(["get_weather", "search", "run", "", "<b>"]), st.dictionaries(_KEYS, _VALUES, max_size=3)),
    min_size=0,
    max_size=3,
)


_SOMETIMES = st.integers(0, 3).map(lambda n: n == 0)  # one time in four: most blocks keep the short cut's shape


@st.composite
def _texts(draw: st.DrawFn) -> str:
    """Prose, a rendered block (sometimes its keys named twice, a bar swapped, cut or with a piece inside), prose."""
    block = render_calls(draw(_CALLS))
    if draw(_SOMETIMES):  # a parameter named twice in one invoke
        block = block.replace('name="city"', 'name="days"')
    if draw(_SOMETIMES):
        at = draw(st.integers(0, len(block)))
        block = block[:at] + draw(st.sampled_from(_PIECES) | _TEXT) + block[at:]
    if draw(_SOMETIMES):
        block = block[: draw(st.integers(0, len(block)))]
    if draw(_SOMETIMES):
        block = block.replace(SENTINEL, draw(st.sampled_from(["|DSML|", "｜｜DSML｜｜", "｜dsml｜"])), 1)
    return draw(_WORDS | _PROSE) + block + draw(_WORDS | _PROSE)


def _start(text: str) -> int:
    """Where `_scan_dsml` starts the tag scan: the last "<" before the first "dsml" (ASCII, any case)."""
    lowered = text.encode("utf-8", "surrogatepass").lower()
    first = len(lowered[: lowered.find(b"dsml")].decode("utf-8", "surrogatepass"))
    return max(0, text.rfind("<", 0, first))


@SETTINGS
@given(_texts(), st.booleans())
def test_the_canonical_block_answers_as_the_full_tag_scan(text: str, seen_before: bool) -> None:
    sentinels = text.count(SENTINEL)
    lowered = text.encode("utf-8", "surrogatepass").lower()
    if not sentinels or lowered.count(b"dsml") != sentinels:
        return  # `_scan_dsml` asks the short cut only when every "dsml" is in a canonical sentinel
    start = _start(text)
    fast, full = _Collector(text, "content"), _Collector(text, "content")
    if seen_before:  # the sentinel rule has fired already (quoted or not), as it has whenever the scan runs
        for out in (fast, full):
            out.add("sentinel", text.find(SENTINEL), text.find(SENTINEL) + len(SENTINEL))
    if _canonical_block(text, start, sentinels, fast):
        _scan_tags(text, full, start)
        assert fast.findings == full.findings
        assert fast.seen == full.seen
    else:
        assert fast.findings == [] or seen_before


@SETTINGS
@given(_CALLS, _PROSE.filter(lambda p: "dsml" not in p.lower() and "<" not in p))
def test_a_whole_block_with_distinct_names_takes_the_short_cut(calls: list[ToolCall], prose: str) -> None:
    """Not a vacuous property: the encoder's own block, each name once, without quotes or angle brackets, is
    answered by it."""
    calls = [
        ToolCall("get_weather", {f"k{i}_{j}": value for j, value in enumerate(call.arguments.values())})
        for i, call in enumerate(calls)
    ]
    text = prose + render_calls(calls)
    if "dsml" in "".join(map(str, (c.arguments for c in calls))).lower() or "<" in text[len(prose) :].replace(
        f"<{SENTINEL}", ""
    ).replace(f"</{SENTINEL}", ""):
        return
    if not calls:
        return
    assert _canonical_block(text, _start(text), text.count(SENTINEL), _Collector(text, "content"))


# _LT_RE as it was, and the test `_scan_angles` made of each of its bar matches before the pattern took it over.
_LT_BEFORE = re.compile(
    r"<(?:(parameter\s+name\s*=[^<>]*?\bstring\s*=)|(/?function_calls>|invoke\s+name\s*=|/invoke>|function>\s*<name>)"
    rf"|(/?think>)|(?!/?{SENTINEL})([ \t]*+(?:/[ \t]*+)?[｜|‖]))"
)


def _reads_dsml(text: str, end: int) -> bool:
    return text[end : end + 12].lstrip("｜|‖ \t")[:4].lower() == "dsml"


_BARRED = st.lists(
    st.one_of(_TEXT, st.sampled_from(_PIECES), st.sampled_from(["<｜ ｜ dsml", "< / ‖‖‖‖‖‖‖‖dsml", "<|" + "|" * 9 + "DSML", "<‖\tDsMl"])),
    max_size=8,
).map("".join)


@SETTINGS
@given(_texts() | _BARRED)
def test_the_lt_search_passes_over_bars_that_read_dsml_as_the_rules_did(text: str) -> None:
    kept = [
        (m.span(), m.groups())
        for m in _LT_BEFORE.finditer(text)
        if not (m.group(4) and _reads_dsml(text, m.end()))
    ]
    assert [(m.span(), m.groups()) for m in _LT_RE.finditer(text)] == kept
