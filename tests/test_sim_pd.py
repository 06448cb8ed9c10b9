"""PD wedges, end to end: `repro run`'s sessions against real simulators in PD mode over HTTP.

/debug/wedges is the ground truth: every recorded wedge must be a turn the harness saw stall (or, past
the waiting timeout, fail), and no stalled turn may be missing from it. Asserted on counts, never on timing.

The simulators run on the virtual clock (`--clock virtual`): which transfers lose their notice follows from
the seed and the load alone, not from how busy the machine is, so "at least one wedge at 60 sessions" and
"none in null mode" are the seed's. A wedge still ends in real time (the client's stall timeout aborts it),
so its simulated waiting timeout is set beyond reach where the stall is what the test watches. A healthy
stream pauses while the engine waits for the sessions between turns (at most the clock's patience), so the
stall timeout is set well beyond that patience: on a loaded machine a 5 s one flagged healthy turns.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from repro.run.options import RunOptions
from repro.run.runner import execute_run
from repro.sim.model import conversation_key
from repro.store.records import SessionRecord

VIRTUAL = ("--clock", "virtual")
PD = ("--disaggregation-mode", "decode")
NEVER_FAILS = ("--disaggregation-waiting-timeout", "1e9")
"""Simulated seconds: on the virtual clock, steps with nothing else to do race through simulated time while a
wedged client waits out its real stall timeout; the default 300 s would fail the wedge before the stall."""
TIGHT = ("--disaggregation-metadata-slots", "40")
"""Fewer slots than the default's 45: at 60 sessions the seeds saw 10-16 wedged sessions instead of 1-4, so a
run without any would be a broken mechanism rather than bad luck."""
PATIENCE = ("--lockstep-patience", "20")
"""Real seconds the virtual clock waits for a session between turns before it steps without it: the longest a
healthy stream can pause for another session, however slow the clients are on a loaded machine."""
STALL_S = 60.0
"""Real seconds without a byte: far beyond the longest healthy pause (PATIENCE), so only a wedge stalls."""


def _run(base_url: str, out: Path, sessions: int, stall_timeout: float = STALL_S) -> list[SessionRecord]:
    options = RunOptions(base_url=base_url, sessions=sessions, out=out, stall_timeout=stall_timeout,
                         timeout=600, turn_timeout=300)
    execute_run(options, console=Console(quiet=True), live=False)
    with open(out / "sessions.jsonl", encoding="utf-8") as fh:
        return [SessionRecord.model_validate_json(line) for line in fh]


def _metrics(url: str) -> dict[str, float]:
    """Every sample of /metrics, through prometheus_client's parser, by sample name."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def _wedges(url: str) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/debug/wedges", timeout=10).json()["wedges"]


def _turns_with(records: list[SessionRecord], status: str) -> set[tuple[str, int]]:
    """(conversation, turn index) of the turns with this status: the identity a wedge record carries."""
    return {(conversation_key([{"role": "user", "content": r.task}]), t.index)
            for r in records for t in r.turns if t.status == status}


@pytest.mark.timeout(900)  # each wedge holds its session for the 60 s stall timeout; a loaded machine adds more
def test_pd_at_60_sessions_wedges_and_each_wedged_session_is_a_recorded_wedge(sim_server, tmp_path: Path) -> None:
    sim = sim_server(*PD, *TIGHT, *NEVER_FAILS, *VIRTUAL, *PATIENCE)
    records: list[SessionRecord] = []
    runner = threading.Thread(target=lambda: records.extend(_run(sim.base_url, tmp_path / "run", 60)))
    runner.start()
    # While the first wedge sits in its transfer (its client waits STALL_S for a byte), look at the server.
    seen: dict[str, Any] = {}
    deadline = time.monotonic() + 120
    while runner.is_alive() and time.monotonic() < deadline and not seen:
        if _wedges(sim.url):
            seen = {"health": httpx.get(f"{sim.url}/health", timeout=10).status_code,
                    "health_generate": httpx.get(f"{sim.url}/health_generate", timeout=30).status_code,
                    "metrics": _metrics(sim.url)}
        else:
            runner.join(timeout=0.05)
    runner.join(timeout=600)
    assert not runner.is_alive()
    assert seen, "no wedge appeared while the run was going"
    assert seen["health"] == 200 and seen["health_generate"] == 200
    assert seen["metrics"]["sglang:num_decode_transfer_queue_reqs"] > 0
    wedges = _wedges(sim.url)
    # One for one: every recorded wedge is a stalled turn, and every stalled turn is a recorded wedge.
    assert _turns_with(records, "stalled") == {(w["conversation"], w["turn"]) for w in wedges}
    assert sum(r.wedged for r in records) == len({w["conversation"] for w in wedges}) >= 1
    assert all(w["state"] == "Transferring" for w in wedges)
    # The harness gave up first: its abort ended each wedge before the 300 s waiting timeout could fail it.
    final = _metrics(sim.url)
    assert final["sglang:num_transfer_failed_reqs_total"] == 0
    assert final["sglang:num_decode_transfer_queue_reqs"] == 0 and final["sglang:num_decode_prealloc_queue_reqs"] == 0
    assert httpx.get(f"{sim.url}/server_info", timeout=10).json()["disaggregation_mode"] == "decode"


def test_null_mode_at_60_sessions_never_wedges(sim_server, tmp_path: Path) -> None:
    sim = sim_server(*TIGHT, *VIRTUAL, *PATIENCE)
    records = _run(sim.base_url, tmp_path / "run", 60)
    assert not any(r.wedged for r in records)
    assert {r.outcome for r in records} == {"clean"}
    assert _wedges(sim.url) == []
    assert "sglang:num_decode_transfer_queue_reqs" not in _metrics(sim.url)


def test_pd_single_session_never_wedges(sim_server, tmp_path: Path) -> None:
    sim = sim_server(*PD, *TIGHT, *VIRTUAL)
    records = _run(sim.base_url, tmp_path / "run", 1)
    assert records[0].outcome == "clean" and not records[0].wedged and len(records[0].turns) >= 3
    assert _wedges(sim.url) == []
    assert _metrics(sim.url)["sglang:num_transfer_failed_reqs_total"] == 0


def test_waiting_timeout_fails_each_wedge_with_an_error_event(sim_server, tmp_path: Path) -> None:
    # Four slots for 16 sessions: notices are lost often. A 20 s waiting timeout, simulated, ends each wedge
    # within the engine's own steps, long before the client's real stall timeout: the harness sees the error event.
    sim = sim_server(*PD, "--disaggregation-metadata-slots", "4", "--disaggregation-waiting-timeout", "20", *VIRTUAL)
    records = _run(sim.base_url, tmp_path / "run", 16, stall_timeout=60)
    wedges = _wedges(sim.url)
    failed = [t for r in records for t in r.turns if t.status == "error"]
    assert wedges and not any(r.wedged for r in records)
    assert _turns_with(records, "error") == {(w["conversation"], w["turn"]) for w in wedges}
    assert all("KV transfer" in (t.error or "") and t.chunks == 0 for t in failed)
    assert _metrics(sim.url)["sglang:num_transfer_failed_reqs_total"] == len(wedges)
