"""A corrupt turn's raw text and parsed message side by side, each with its findings' spans marked.

The raw column is the text the model generated (rebuilt from log-probabilities or read from a raw
endpoint); the parsed column is the message the server's parser returned, field by field. A raw
finding whose span the parsed message does not show corrupt is marked as hidden by the parser.
Findings on the message a faithful parse of the raw text gives (field `content`, …) are placed in the
raw text by their stored excerpt, which the checker cuts from that text. Pure: no I/O; the texts are
untrusted and only ever rendered through the template's autoescaping.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from repro.store.records import FindingRecord

EXCERPT_BEFORE = 20
"""Characters the checker keeps before a span in a finding's excerpt (dsml_checker.findings.make_finding)."""
WINDOW_CHARS = 6000
"""Most characters of one text shown; a longer one is shown around its marks."""
MARGIN_CHARS = 1500


@dataclass(frozen=True)
class Segment:
    """A run of text, marked (`kind` "finding" or "hidden") with the rules that flag it, or plain."""

    text: str
    kind: str | None = None
    rules: str = ""


@dataclass(frozen=True)
class MarkedText:
    """One text cut into segments, with how many characters were left out before and after the window."""

    label: str
    segments: list[Segment]
    omitted_before: int = 0
    omitted_after: int = 0


@dataclass(frozen=True)
class SideBySide:
    raw: MarkedText | None
    """None when the run kept no raw text for this turn (parsed mode, or the raw text was not whole)."""
    parsed: list[MarkedText]
    """One entry per field of the parsed message; empty when it could not be read back from the raw bytes."""
    unplaced: list[str] = field(default_factory=list)
    """Findings on the raw side whose span cannot be pointed at in the raw text (e.g. a lost call)."""
    hidden: bool = False
    """The raw text is corrupt and the parsed message is not: the parser hid the damage."""


Span = tuple[int, int, str, str]
"""start, end, kind, rule."""


def place(text: str, finding: FindingRecord, field_name: str) -> tuple[int, int] | None:
    """Where `finding`'s span lies in `text` (the text of `field_name`), or None when it cannot be told."""
    if finding.field == field_name and 0 <= finding.start <= finding.end <= len(text):
        return finding.start, finding.end
    if not finding.excerpt or finding.field == "finish_reason":
        return None
    at = text.find(finding.excerpt)
    if at < 0:
        return None
    start = at + min(finding.start, EXCERPT_BEFORE)
    return start, min(len(text), start + finding.end - finding.start)


def marked(label: str, text: str, spans: list[Span]) -> MarkedText:
    """`text` cut at the spans (overlapping ones merged, their rules joined), windowed around them when long."""
    spans = sorted(span for span in spans if span[1] > span[0])
    merged: list[list] = []
    for start, end, kind, rule in spans:
        if merged and start < merged[-1][1]:
            last = merged[-1]
            last[1] = max(last[1], end)
            last[2] = "hidden" if "hidden" in (last[2], kind) else kind
            if rule not in last[3]:
                last[3].append(rule)
        else:
            merged.append([start, end, kind, [rule]])
    low, high = 0, len(text)
    if len(text) > WINDOW_CHARS:
        first = merged[0][0] if merged else 0
        low = max(0, first - MARGIN_CHARS)
        high = min(len(text), max(low + WINDOW_CHARS, (merged[-1][1] if merged else 0) + MARGIN_CHARS))
        high = min(high, low + 2 * WINDOW_CHARS)
    segments: list[Segment] = []
    at = low
    for start, end, kind, rules in merged:
        start, end = max(start, low), min(end, high)
        if end <= start:
            continue
        if start > at:
            segments.append(Segment(text[at:start]))
        segments.append(Segment(text[max(start, at):end], kind, ", ".join(rules)))
        at = max(at, end)
    if at < high:
        segments.append(Segment(text[at:high]))
    return MarkedText(label, segments, low, len(text) - high)


def side_by_side(
    raw_text: str | None, fields: dict[str, str], parsed: list[FindingRecord], raw: list[FindingRecord],
    lost: list[FindingRecord], *, hidden: bool,
) -> SideBySide:
    """The two columns of one turn: `raw_text` with `raw` and `lost` marked, `fields` with `parsed` marked."""
    raw_column = None
    unplaced: list[str] = []
    if raw_text is not None:
        spans: list[Span] = []
        for finding in raw:
            where = place(raw_text, finding, "raw")
            if where is None:
                unplaced.append(f"{finding.rule}: {finding.field} {finding.excerpt}")
            else:
                spans.append((*where, "hidden" if hidden else "finding", finding.rule))
        unplaced += [f"{finding.rule}: {finding.excerpt}" for finding in lost]
        raw_column = marked("raw text the model generated", raw_text, spans)
    columns = []
    for name, text in fields.items():
        spans = [(*where, "finding", finding.rule) for finding in parsed
                 if finding.field == name and (where := place(text, finding, name)) is not None]
        columns.append(marked(name, text, spans))
    return SideBySide(raw_column, columns, unplaced, hidden)
