"""Soft rule 10 over a whole message: repetition loops and runs of rare characters (KV or indexer damage).

All text fields are joined into one byte string and compared with itself shifted, so a message costs a
handful of C-level big-integer operations however many fields it has: this is the checker's hot path. An
eighth-size sample tells first whether a loop is possible at all (prescan.may_loop, then prescan.may_repeat for
what repeats with a longer period); then a quarter-size sample is compared, and only the windows where it
repeats get the exact byte-level pass. Loops of about 80 bytes and longer are found (units of 3, 6 or 7 bytes
need about 120). The rare-character pass likewise looks at every 3rd byte first (prescan.may_be_rare).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from itertools import accumulate
from typing import Iterator, Sequence

from dsml_checker import prescan
from dsml_checker.findings import Finding, make_finding

_STRIDE = 4
# Sampling every 4th byte turns a loop unit of 1 to 8 bytes into one of 1, 2, 3, 5 or 7 samples; each of those
# divides one of these shifts.
_SAMPLE_SHIFTS = (10, 21)
_SAMPLE_ZEROS = b"\0" * 8
_MIN_LOOP = 48  # no loop the sample can find is shorter
_SHIFTS = (24, 35)  # together their divisors cover every loop unit of 1 to 8 bytes
_MAX_UNIT = 8
_ZEROS = b"\0" * 24
_NONZERO_RE = re.compile(rb"[^\0]")
_FILLER = frozenset(" \t\r\n-=_*#~.:|+/\\")  # whitespace and Markdown rulers repeat legitimately
_SEPARATOR = b"\xff"  # never valid UTF-8, so no loop runs across two fields
_PLAIN = bytes(range(0x20, 0x7F)) + b"\t\n\r"
_NOT_RARE = _PLAIN + _SEPARATOR
_CONTINUATION = bytes(range(0x80, 0xC0))
_RARE_RE = re.compile(
    "[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ue000-\uf8ff\ufff0-\ufffc\u200b-\u200f\u2060-\u2064\ufeff"
    "\U000f0000-\U0010ffff]{3,}"
)
# The same characters as UTF-8, searched first in the bytes that are not printable ASCII: a short string for
# most text, so the character-class scan of the whole field runs only when a rare run is likely.
_RARE_UTF8_RE = re.compile(
    rb"(?:[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\xc2[\x80-\x9f]|\xef\xbf[\xb0-\xbd]|\xee[\x80-\xbf]{2}"
    rb"|\xef[\x80-\xa3][\x80-\xbf]|\xe2\x80[\x8b-\x8f]|\xe2\x81[\xa0-\xa4]|\xef\xbb\xbf"
    rb"|\xf3[\xb0-\xbf][\x80-\xbf]{2}|\xf4[\x80-\x8f][\x80-\xbf]{2}){3,}"
)


def _periodic_runs(data: bytes, shifts: tuple[int, ...], zeros: bytes) -> Iterator[tuple[int, int, int]]:
    """(shift, start, end) for every stretch of `data` that repeats with period `shift` over len(zeros)+ bytes.

    Byte k of `diff` is data[k] ^ data[k - shift], so a run of zero bytes there is such a stretch; the XOR of
    the whole string as one big integer keeps this to a few C-level operations per shift.
    """
    n = len(data)
    whole = int.from_bytes(data, "big")
    for shift in shifts:
        if n < shift + len(zeros):
            continue
        diff = (whole ^ (whole >> (8 * shift))).to_bytes(n, "big")
        at = diff.find(zeros, shift)
        while at >= 0:
            nonzero = _NONZERO_RE.search(diff, at + len(zeros))
            end = n if nonzero is None else nonzero.start()
            yield shift, at, end
            at = diff.find(zeros, end)


def _candidate_windows(raw: bytes) -> list[tuple[int, int]]:
    """Byte windows of `raw` that may hold a loop: there, every 4th byte repeats with a short period."""
    windows = [
        (max(0, _STRIDE * (at - shift - 1)), min(len(raw), _STRIDE * (end + 1)))
        for shift, at, end in _periodic_runs(raw[::_STRIDE], _SAMPLE_SHIFTS, _SAMPLE_ZEROS)
    ]
    windows.sort()
    merged: list[tuple[int, int]] = []
    for lo, hi in windows:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def _loops(raw: bytes) -> list[tuple[int, int]]:
    """Byte spans of loops in `raw`: the exact pass, run only inside the sample's candidate windows."""
    return [(lo + start, lo + end) for lo, hi in _candidate_windows(raw) for start, end in _loop_regions(raw[lo:hi])]


def repeat_unit(seq: str | bytes) -> int:
    """Length of the shortest unit of 1–8 items that `seq` is a repetition of, or 0 when there is none."""
    return next((u for u in range(1, _MAX_UNIT + 1) if seq[u:] == seq[:-u]), 0)


def _loop_regions(raw: bytes) -> Iterator[tuple[int, int]]:
    """Byte spans where a unit of 1–8 bytes repeats over 48+ bytes, fillers excepted."""
    for shift, at, end in _periodic_runs(raw, _SHIFTS, _ZEROS):
        region = raw[at - shift : end]
        unit = repeat_unit(region)
        if unit and not set(region[:unit].decode("utf-8", "replace")) <= _FILLER:
            yield at - shift, end


def _chars(encoded: bytes, offset: int) -> int:
    """Characters in the first `offset` bytes: every character has exactly one non-continuation byte."""
    return len(encoded[:offset].translate(None, _CONTINUATION))


def scan_soft(fields: Sequence[tuple[str, str]], encoded: Sequence[bytes]) -> list[Finding]:
    """Findings for (field name, text) pairs, `encoded` holding each text as UTF-8: one repetition-loop and one
    rare-chars finding per field at most."""
    raw = _SEPARATOR.join(encoded)
    if len(raw) < len(fields):
        return []  # every field is empty
    findings: list[Finding] = []
    loops = _loops(raw) if len(raw) >= _MIN_LOOP and prescan.may_loop(raw) and prescan.may_repeat(raw) else []
    starts = list(accumulate((len(part) + 1 for part in encoded[:-1]), initial=0)) if loops else []
    looped: set[int] = set()
    for lo, hi in loops:
        i = bisect_right(starts, lo) - 1
        if i in looped:
            continue
        looped.add(i)
        name, text = fields[i]
        start, end = _chars(encoded[i], lo - starts[i]), _chars(encoded[i], hi - starts[i])
        findings.append(make_finding("repetition-loop", name, text, start, end))
    if prescan.may_be_rare(raw, _NOT_RARE) and _RARE_UTF8_RE.search(raw.translate(None, _NOT_RARE)):
        for name, text in fields:
            m = _RARE_RE.search(text)
            if m is not None:
                findings.append(make_finding("rare-chars", name, text, m.start(), m.end()))
    return findings
