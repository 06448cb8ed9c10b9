"""The report's note on client-side queueing: turns that waited in the client (the run's in-flight byte
budget, a connection) before their request left, or while the budget held their reading paused."""

from __future__ import annotations

from typing import Sequence

from repro.store.records import SessionRecord

NOTICEABLE_S = 0.1
"""A shorter wait is scheduling noise, not queueing worth a note."""


def queueing_note(sessions: Sequence[SessionRecord]) -> str | None:
    """One sentence on the turns that queued in the client, or None when none did noticeably."""
    waits = [turn.queue_s for session in sessions for turn in session.turns if turn.queue_s >= NOTICEABLE_S]
    if not waits:
        return None
    return (f"{len(waits)} turn{'s' if len(waits) != 1 else ''} queued in the client ({sum(waits):.1f} s in all, "
            f"the longest {max(waits):.1f} s), waiting for room in the run's budget of answer bytes in flight "
            "(--max-bytes-in-flight) or for a connection: counted as client queueing (queue_s), not as server latency.")
