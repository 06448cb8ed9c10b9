"""Cheap signals that let `check` skip a scan which cannot fire on a turn.

Each function here is a necessary condition of the scan it guards finding anything: when it answers False the
scan's result is known to be empty, so skipping it changes no verdict. Each answers in a few C-level operations
over the turn's bytes, where the scan it spares costs many. tests/test_dsml_prescan.py holds every one of them
to that (the same verdicts and findings with every signal answering "maybe").
"""

from __future__ import annotations

_ZEROS4 = b"\0\0\0\0"


def may_loop(raw: bytes) -> bool:
    """False only when soft_rules' sample pass can find no candidate window in `raw` (hence no loop).

    That pass compares every 4th byte with the one 10 and 21 samples (40 and 84 bytes) back and needs 8 equal
    samples in a row. Of 8 consecutive multiples of 4, four are multiples of 8, in a row: so bytes 8m and
    8m - 40 agree for four consecutive m, or bytes 8m and 8m - 84 = 8(m - 11) + 4 do. Both are checked on
    every 8th byte, half the bytes of the sample pass, with half the run to find.
    """
    even = raw[::8]
    n = len(even)
    x = int.from_bytes(even, "big")
    if (x ^ (x >> 40)).to_bytes(n, "big").find(_ZEROS4, 5) >= 0:
        return True
    odd = int.from_bytes(raw[4::8].ljust(n, b"\0"), "big")  # bytes 8m + 4, padded to line up with `even`
    return (x ^ (odd >> 88)).to_bytes(n, "big").find(_ZEROS4, 11) >= 0



_ZEROS6 = b"\0" * 6
_ZEROS5 = b"\0" * 5


def may_repeat(raw: bytes) -> bool:
    """False only when soft_rules finds no repetition loop in `raw`: asked after `may_loop`, whose sample also
    answers yes to text that repeats with a longer period (a small table repeated every 40 bytes).

    A loop is a stretch of 48+ bytes repeating a unit of 1 to 8 bytes. Its every 4th byte then repeats 20 bytes
    on (units of 1, 2, 4, 5), 24 (1, 2, 3, 4, 6, 8) or 28 (7): 5, 6 or 7 samples, over the stretch's 12+ samples,
    so 6, 6 and 5 equal samples in a row at those shifts.
    """
    sample = raw[::4]
    n = len(sample)
    x = int.from_bytes(sample, "big")
    return (
        (x ^ (x >> 48)).to_bytes(n, "big").find(_ZEROS6, 6) >= 0
        or (x ^ (x >> 40)).to_bytes(n, "big").find(_ZEROS6, 5) >= 0
        or (x ^ (x >> 56)).to_bytes(n, "big").find(_ZEROS5, 7) >= 0
    )


def may_be_rare(raw: bytes, common: bytes) -> bool:
    """False only when soft_rules' rare-character pass can find nothing in `raw`, whose rare characters are
    never among the bytes `common` (printable ASCII, blanks, the field separator).

    A run of 3+ rare characters is 3+ consecutive bytes outside `common` (every byte of a multi-byte character
    is), so every 3rd byte holds one of them: a third of the bytes go through the deletion the pass runs on all.
    """
    return bool(raw[::3].translate(None, common))
