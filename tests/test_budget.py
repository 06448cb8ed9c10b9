"""Memory bounded by what is in flight: the run-wide budget of answer bytes (new turns wait for room, a turn over
it is paused unless it is the oldest, the waits are client queueing in the records and the report, and every
session still finishes), and a big answer spooled to disk is kept byte for byte."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterator

import anyio
import pytest
from faulty_servers import MODEL, huge_reply
from run_builders import run

from repro.procs.process import free_port, start_process, wait_http_ready
from repro.report.queueing import queueing_note
from repro.run.session import Session, SessionConfig
from repro.store.records import SessionRecord
from repro.store.rundir import load_run
from repro.wire import client
from repro.wire.budget import MIN_ESTIMATE, InFlight, Ticket
from repro.wire.spool import SPOOL_AT
from repro.workload.scenario import load_workload

SERVER = Path(__file__).resolve().parents[1] / "benchmarks" / "big_answer_server.py"


def test_the_oldest_turn_reads_on_the_others_pause_and_new_turns_wait_until_room_is_made() -> None:
    async def scenario() -> None:
        budget = InFlight(4 * MIN_ESTIMATE)
        oldest, second = budget.ticket(), budget.ticket()
        await oldest.admit()
        await second.admit()
        resumed: list[str] = []
        assert not oldest.grow(6 * MIN_ESTIMATE)  # over the limit alone, but the oldest never pauses
        assert second.grow(MIN_ESTIMATE + 1)
        second.resume = lambda: resumed.append("second")
        newcomer = budget.ticket()
        admitted = anyio.Event()

        async def admit() -> None:
            await newcomer.admit()
            admitted.set()

        async with anyio.create_task_group() as group:
            group.start_soon(admit)
            for _ in range(10):
                await anyio.lowlevel.checkpoint()
            assert not admitted.is_set() and not resumed  # a paused turn and no room: the newcomer waits
            oldest.release()
            assert resumed == ["second"]  # room made: the paused reader goes on first
            for _ in range(10):
                await anyio.lowlevel.checkpoint()
            # The newcomer is now assumed to bring as much as the last answer (6 estimates): still no room.
            assert not admitted.is_set() and budget.estimate == 6 * MIN_ESTIMATE
            second.release()
            with anyio.fail_after(5):
                await admitted.wait()
        newcomer.release()
        assert budget.used == 0 and not budget.tickets and budget.paused == 0

    anyio.run(scenario)


def test_no_limit_admits_at_once_and_never_pauses() -> None:
    async def scenario() -> None:
        budget = InFlight(None)
        tickets = [budget.ticket() for _ in range(3)]
        for ticket in tickets:
            await ticket.admit()
            assert not ticket.grow(1 << 30)
        for ticket in tickets:
            ticket.release()
        assert budget.used == 0

    anyio.run(scenario)


@pytest.fixture
def big_server() -> Iterator[str]:
    """Answers of 2 MB, held until the first 6 requests are all in (so they overlap whatever the load)."""
    port = free_port()
    proc = start_process([sys.executable, str(SERVER), "--port", str(port), "--together", "6"])
    try:
        wait_http_ready(f"http://127.0.0.1:{port}/v1/models", timeout=60, process=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


class _Watched(InFlight):
    """The run's budget, watched: the most it held, and how many turns it paused or made wait."""

    runs: list[_Watched] = []

    def __init__(self, limit: int | None) -> None:
        super().__init__(limit)
        self.most = self.pauses = self.waits = 0
        _Watched.runs.append(self)

    async def _admit(self, ticket: Ticket) -> None:
        self.waits += self.paused > 0 or self._full(self.estimate)
        await super()._admit(ticket)

    def _grow(self, ticket: Ticket) -> bool:
        paused = super()._grow(ticket)
        self.most, self.pauses = max(self.most, self.used), self.pauses + paused
        return paused


ANSWER = 2_000_000
LIMIT = 1_000_000


def test_a_run_over_its_byte_budget_holds_turns_back_and_finishes_every_session(
    big_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client, "InFlight", _Watched)
    _Watched.runs.clear()
    out = tmp_path / "run"
    run(out, base_url=f"{big_server}/content/{ANSWER}/v1", model="bench", sessions=12, concurrency=6, turns=1,
        max_bytes_in_flight=LIMIT, observe="parsed", stall_timeout=60, turn_timeout=300, timeout=600)
    loaded = load_run(out)
    assert sorted(s.session_id for s in loaded.sessions) == list(range(12))
    assert all(s.outcome == "clean" and s.finished for s in loaded.sessions), [s.outcome for s in loaded.sessions]
    [budget] = _Watched.runs
    # Each answer alone is over the budget and the first six are in flight together (the server holds them
    # until all six came): readers were paused, and what was held never passed the budget plus the one
    # answer that always reads on (and the last piece each paused reader took in).
    assert budget.pauses > 0
    assert budget.most <= LIMIT + ANSWER + 6 * (1 << 20)
    assert budget.used == 0 and budget.paused == 0
    assert loaded.summary is not None and loaded.summary.latency["queue_s"].count == 12


def test_the_report_notes_turns_that_queued_in_the_client(tmp_path: Path) -> None:
    from run_builders import make_run

    path = make_run(tmp_path / "r", clean=3)
    loaded = load_run(path)
    assert queueing_note(loaded.sessions) is None
    loaded.sessions[0].turns[0].queue_s = 2.5
    note = queueing_note(loaded.sessions)
    assert note is not None and note.startswith("1 turn queued") and "2.5 s" in note and "not as server latency" in note


def test_a_big_answer_kept_from_its_spool_file_is_the_bytes_the_server_sent(faulty: str, tmp_path: Path) -> None:
    """Past SPOOL_AT a streamed answer waits on disk; a corrupt turn's raw/ file is still exactly what came."""
    chars = SPOOL_AT + 1_000_000
    kept: dict[str, bytes] = {}

    def keep_raw(session_id: int, turn: int, data: bytes, *, suffix: str = "sse") -> str:
        kept[f"{session_id}-{turn}.{suffix}"] = bytes(data)
        return f"{session_id}-{turn}.{suffix}"

    async def go() -> SessionRecord:
        config = SessionConfig(url=f"{faulty}/huge:{chars}/v1/chat/completions", model=MODEL,
                               workload=load_workload().workload, turns=1)
        async with client.make_client(1, max_bytes_in_flight=SPOOL_AT) as http:
            return await Session(0, config, http, keep_raw=keep_raw, origin=0.0).run()

    record = anyio.run(go)
    assert record.turns[0].status == "ok" and record.turns[0].verdict == "corrupt"
    raw = kept["0-0.sse"]
    assert len(raw) > SPOOL_AT
    # The server's own text, rebuilt from the kept bytes' events, is the reply it was asked to make.
    content = "".join(
        (json.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for line in raw.decode().split("\n") if line.startswith("data: {")
    )
    assert content == huge_reply(chars)
