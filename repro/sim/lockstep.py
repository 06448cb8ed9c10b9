"""The virtual clock's barrier: the engine steps only once every session it expects has its request in.

On the real clock, when a client's next turn arrives relative to the engine's steps depends on how
fast the client's machine is, so the same seed can give different faults under different load. On the
virtual clock (`--clock virtual`) the client declares its load (how many sessions, how many at once),
tags each request with its session and says when a session has ended; the engine then takes a step only
when each session that should be in flight has its request in the engine. Requests that arrived while it
waited are admitted in session order. What the engine does then depends on the seed, the flags and the
conversations alone, not on the machine.

A client that stops talking (killed, or a session that is never ended) would hold the engine forever: after
`patience` real seconds of waiting the barrier gives up on the missing sessions for that step and counts it
in `timeouts`, so a run whose determinism was broken says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

SESSION_HEADER = "X-Repro-Session"
"""The request header naming the client's session on the virtual clock."""


@dataclass
class Lockstep:
    """The declared load and what is known of its sessions."""

    patience_s: float
    planned: int = 0
    concurrency: int = 0
    ended: set[str] = field(default_factory=set)
    timeouts: int = 0
    """Steps taken without every expected session: the determinism of the load was broken that often."""

    def plan(self, sessions: int, concurrency: int) -> None:
        """A new load: `sessions` sessions, at most `concurrency` in flight (what came before is forgotten)."""
        self.planned, self.concurrency = sessions, concurrency
        self.ended = set()

    def end(self, session: str) -> None:
        self.ended.add(session)

    def expected(self) -> int:
        """Sessions that must be in flight: the slots, fewer at the load's tail."""
        return max(0, min(self.concurrency, self.planned - len(self.ended)))

    def ready(self, present: Iterable[str | None]) -> bool:
        """Whether the engine may step, given the sessions of the requests it holds (None: untagged)."""
        live = {session for session in present if session is not None and session not in self.ended}
        return len(live) >= self.expected()

    def status(self) -> dict[str, int]:
        return {"planned": self.planned, "concurrency": self.concurrency, "ended": len(self.ended),
                "timeouts": self.timeouts}


def session_order(session: str | None) -> tuple[int, int, str]:
    """How requests that arrived during one wait are admitted: tagged sessions by number, untagged last."""
    if session is None:
        return (2, 0, "")
    return (0, int(session), "") if session.isdigit() else (1, 0, session)
