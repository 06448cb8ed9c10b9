"""A run-wide budget for response bytes in flight, so memory follows what is in flight, not concurrency × the cap.

Each turn holds a `Ticket` from when it is ready to send until its record is made (the bytes of its
answer live that long). A ticket is charged what its answer has brought so far, and at least the
`estimate` of an answer (the largest of the last answers, so one huge answer does not make the
rest of the run cautious for good):

- A new turn waits (`admit`) while the charges plus its estimate would pass the limit. The wait is
  client-side queueing: the turn's clock counts it as `queue_s`, never as server latency.
- A turn in flight whose bytes push the charges over the limit has its connection's reading paused
  (TCP back-pressure on the server) until room is made, unless it is the oldest turn in flight:
  that one always reads on, so the run always progresses, and memory stays within the limit plus
  one answer. A paused turn's held time is counted as queueing too (see `repro.wire.client`).

Not thread-safe: every call comes from the event loop.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Callable

import anyio

MIN_ESTIMATE = 64 * 1024
"""What a turn is assumed to bring before any answer was seen: a long ordinary answer."""
_RECENT = 64
"""How many of the last answers the estimate looks at."""


def default_limit() -> int:
    """An eighth of the machine's physical memory: an answer costs the client two to three times its bytes."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = 4 << 30
    return max(256 << 20, total // 8)


class Ticket:
    """One turn's share of the budget: admitted once, charged as its bytes arrive, released at the end."""

    __slots__ = ("budget", "charge", "bytes", "admitted", "paused", "resume")

    def __init__(self, budget: InFlight) -> None:
        self.budget = budget
        self.charge = 0
        self.bytes = 0
        self.admitted = False
        self.paused = False
        self.resume: Callable[[], None] | None = None
        """Set by the reader when it pauses: resumes its connection's reading."""

    async def admit(self) -> None:
        """Wait until the budget has room for one more answer (at once when it has)."""
        if not self.admitted:
            await self.budget._admit(self)

    def grow(self, n: int) -> bool:
        """`n` more bytes of the answer arrived; True when its reading must pause for room (once: a paused
        reader still takes in the rest of what was already read)."""
        self.bytes += n
        if self.bytes <= self.charge:
            return False
        return self.budget._grow(self)

    def read(self) -> None:
        """The answer has ended (whole or not): a paused reading is resumed, so its connection is fit for
        reuse; the bytes stay charged until `release`."""
        if self.paused:
            self.budget._unpause(self)

    def release(self) -> None:
        """The turn is recorded: its bytes are no longer held."""
        self.read()
        if self.admitted:
            self.budget._release(self)


class InFlight:
    """The budget of one client (one process): `limit` bytes of answers at once; None is no limit."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.used = 0
        self.tickets: dict[int, Ticket] = {}
        """Admitted and not released, in admission order (the first is the oldest)."""
        self.recent: deque[int] = deque(maxlen=_RECENT)
        self.paused = 0
        """Tickets whose reading is paused: new turns wait behind them."""
        self.changed = anyio.Event()
        self.waiting = 0
        """Turns waiting in `_admit` for `changed`."""

    @property
    def estimate(self) -> int:
        return max(MIN_ESTIMATE, max(self.recent, default=0))

    def ticket(self) -> Ticket:
        return Ticket(self)

    def _full(self, need: int) -> bool:
        return self.limit is not None and bool(self.tickets) and self.used + need > self.limit

    async def _admit(self, ticket: Ticket) -> None:
        while self.paused or self._full(self.estimate):
            # Every release or resumption wakes the waiters to look again; one Event per change.
            self.waiting += 1
            try:
                await self.changed.wait()
            finally:
                self.waiting -= 1
        ticket.admitted = True
        ticket.charge = self.estimate
        self.used += ticket.charge
        self.tickets[id(ticket)] = ticket

    def _grow(self, ticket: Ticket) -> bool:
        self.used += ticket.bytes - ticket.charge
        ticket.charge = ticket.bytes
        if ticket.paused or self.limit is None or self.used <= self.limit or next(iter(self.tickets.values())) is ticket:
            return False
        ticket.paused = True
        self.paused += 1
        return True

    def _release(self, ticket: Ticket) -> None:
        ticket.admitted = False
        if self.tickets.pop(id(ticket), None) is None:
            return
        self.used -= ticket.charge
        self.recent.append(ticket.bytes)
        self._wake()

    def _unpause(self, ticket: Ticket) -> None:
        ticket.paused = False
        self.paused -= 1
        if ticket.resume is not None:
            resume, ticket.resume = ticket.resume, None
            resume()

    def _wake(self) -> None:
        """Resume paused readers in admission order while there is room (the oldest always), then admit."""
        for position, ticket in enumerate(self.tickets.values() if self.paused else ()):
            if ticket.paused and (position == 0 or self.limit is None or self.used <= self.limit):
                self._unpause(ticket)
        if self.waiting:  # nobody to wake: no new Event (anyio looks its backend up for each), as every turn ends here
            self.changed.set()
            self.changed = anyio.Event()
