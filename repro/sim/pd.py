"""The decode side of a PD pair: prealloc queue, transfer queue, metadata slots, and how a wedge happens.

SGLang's states: Bootstrapping (prealloc queue) → WaitingForInput (slot claimed, prefill pending) →
Transferring (KV on the wire, completion notice not yet seen) → Success (decode starts) or Failed.

The wedge is mechanistic. The decode side hands out its fixed pool of metadata slots round-robin by
bootstrap room, without checking that the slot's previous owner is done: with no more transfers in
flight than slots, the previous owner always is. The prefill writes its completion notice into the
slot; the decode reads the slots once per scheduler step, after claiming slots for new requests. When
more transfers are in flight than slots, a new claim can reset a slot whose notice landed but was not
yet read, or a second notice can overwrite the first: that notice is lost, its request waits in
`Transferring` until `--disaggregation-waiting-timeout` fails it, and nothing reaches its client.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Generic, Literal, Protocol, TypeVar

TransferState = Literal["Bootstrapping", "WaitingForInput", "Transferring", "Success", "Failed"]


@dataclass
class Transfer:
    """One request's KV transfer as the decode side tracks it."""

    state: TransferState = "Bootstrapping"
    slot: int = -1
    claimed_s: float = 0.0
    notice_s: float | None = None
    """When the prefill's completion notice lands in the slot (set once the prefill ran)."""
    landed: bool = False
    lost: bool = False


@dataclass(frozen=True)
class Wedge:
    """A lost completion notice: the request will never leave `Transferring`."""

    request_id: str
    state: TransferState
    slot: int
    sim_time_s: float
    cause: Literal["slot reclaimed", "notice overwritten"]
    by_request_id: str
    in_flight: int
    """Requests in the transfer queue when the notice was lost."""


class TransferringRequest(Protocol):
    """What the decode side reads and sets of a request (the engine's requests have it)."""

    rid: str
    transfer: Transfer | None
    on_wedged: Callable[[Wedge], None] | None


EngineRequest = TypeVar("EngineRequest", bound=TransferringRequest)


class DecodeTransfers(Generic[EngineRequest]):
    """The decode server's PD queues and metadata slots. Single-threaded: called from the engine's steps."""

    def __init__(self, slots: int, waiting_timeout_s: float) -> None:
        self.slots: list[str | None] = [None] * slots
        """What each slot holds: the request id of the last notice written there, or None once reset."""
        self.next_slot = 0
        self.waiting_timeout_s = waiting_timeout_s
        self.prealloc: deque[EngineRequest] = deque()
        self.queue: list[EngineRequest] = []
        """The transfer queue: slot claimed, waiting for the prefill's KV and its notice."""

    @property
    def pending(self) -> bool:
        return bool(self.prealloc or self.queue)

    def holds(self, request: EngineRequest) -> bool:
        return request.transfer is not None and request in self.queue

    def add(self, request: EngineRequest) -> None:
        request.transfer = Transfer()
        self.prealloc.append(request)

    def sent(self, request: EngineRequest, notice_s: float) -> None:
        """The prefill ran and its KV is on the wire; the notice lands at `notice_s` (simulated)."""
        assert request.transfer is not None
        request.transfer.state = "Transferring"
        request.transfer.notice_s = notice_s

    def step(self, now: float, capacity: int) -> tuple[list[EngineRequest], list[EngineRequest], list[EngineRequest]]:
        """One scheduler step's PD work at `now`: (newly claimed, transferred, failed) requests.

        The order is SGLang's decode loop: notices that landed since the last step are in their slots;
        then the prealloc queue claims slots; then the transfer queue is polled.
        """
        self._land(now)
        claimed: list[EngineRequest] = []
        while self.prealloc and len(claimed) < capacity:
            request = self.prealloc.popleft()
            self._claim(request, now)
            claimed.append(request)
        done: list[EngineRequest] = []
        failed: list[EngineRequest] = []
        for request in list(self.queue):
            transfer = request.transfer
            assert transfer is not None
            if transfer.landed and self.slots[transfer.slot] == request.rid:
                transfer.state = "Success"
                self.slots[transfer.slot] = None
                self.queue.remove(request)
                done.append(request)
            elif now - transfer.claimed_s >= self.waiting_timeout_s:
                transfer.state = "Failed"
                self.queue.remove(request)
                failed.append(request)
        return claimed, done, failed

    def forget(self, request: EngineRequest) -> None:
        """Drop a request its client abandoned, wherever it waits."""
        if request in self.prealloc:
            self.prealloc.remove(request)
        elif request in self.queue:
            self.queue.remove(request)

    def _land(self, now: float) -> None:
        arriving = [r for r in self.queue if r.transfer and not r.transfer.landed
                    and r.transfer.notice_s is not None and r.transfer.notice_s <= now]
        for request in sorted(arriving, key=lambda r: r.transfer.notice_s if r.transfer else 0.0):
            transfer = request.transfer
            assert transfer is not None
            transfer.landed = True
            previous = self.slots[transfer.slot]
            if previous is not None:
                self._lose(previous, now, "notice overwritten", request.rid)
            self.slots[transfer.slot] = request.rid

    def _claim(self, request: EngineRequest, now: float) -> None:
        transfer = request.transfer
        assert transfer is not None
        slot = self.next_slot
        self.next_slot = (slot + 1) % len(self.slots)
        previous = self.slots[slot]
        if previous is not None:
            self._lose(previous, now, "slot reclaimed", request.rid)
        self.slots[slot] = None
        transfer.state, transfer.slot, transfer.claimed_s = "WaitingForInput", slot, now
        self.queue.append(request)

    def _lose(self, rid: str, now: float, cause: Literal["slot reclaimed", "notice overwritten"], by: str) -> None:
        victim = next((r for r in self.queue if r.rid == rid), None)
        if victim is None or victim.transfer is None or victim.transfer.lost:
            return
        victim.transfer.lost = True
        if victim.on_wedged is not None:
            victim.on_wedged(Wedge(request_id=rid, state=victim.transfer.state, slot=victim.transfer.slot,
                                   sim_time_s=round(now, 6), cause=cause, by_request_id=by, in_flight=len(self.queue)))
