"""A long verdict must not freeze the event loop that times every other session (issue 11, item 5).

Two sessions run side by side through `run_load` against a faulty server over real HTTP: one gets a reply of
megabytes of degenerate markup, whose verdict takes seconds of CPU; the other streams slowly under a stall
watchdog. Bounds are ratios of the measured verdict cost, never absolute times.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from faulty_servers import MODEL, huge_reply

from dsml_checker import check
from repro.wire.client import make_client
from repro.run.load import run_load
from repro.store.records import SessionRecord
from repro.run.session import Session, SessionConfig
from repro.workload.scenario import load_workload

HUGE_CHARS = 4_000_000


def verdict_cpu_seconds() -> float:
    """The CPU time of the huge reply's verdict here and now (the machine's speed sets every bound below)."""
    message = {"role": "assistant", "content": huge_reply(HUGE_CHARS)}
    start = time.process_time()
    check(message, finish_reason="stop")
    return time.process_time() - start


@pytest.mark.slow
def test_a_huge_reply_is_judged_off_the_event_loop(faulty: str, tmp_path: Path) -> None:
    cost = verdict_cpu_seconds()
    workload = load_workload().workload
    # The slow session streams a chunk every `gap` seconds for 4 turns of 5 chunks: long enough to overlap the
    # huge reply's transfer and verdict. Its stall watchdog fires if the loop stops for half the verdict's cost.
    gap = max(0.1, cost / 8)
    configs = [
        SessionConfig(url=f"{faulty}/huge:{HUGE_CHARS}/v1/chat/completions", model=MODEL, workload=workload, turns=1),
        SessionConfig(
            url=f"{faulty}/slow:{gap:.3f}/v1/chat/completions", model=MODEL, workload=workload, turns=6,
            stall_timeout=max(4 * gap, cost / 2),
        ),
    ]
    records: dict[int, SessionRecord] = {}

    def keep_raw(session_id: int, turn: int, data: bytes) -> str:
        path = tmp_path / f"{session_id}-{turn}.raw"
        path.write_bytes(data)
        return path.name

    async def go() -> list[float]:
        origin = time.perf_counter()
        async with make_client(2) as client:

            def make_session(index: int) -> Session:
                return Session(index, configs[index], client, keep_raw=keep_raw, origin=origin)

            result = await run_load(2, 2, make_session, lambda record: records.__setitem__(record.session_id, record))
        return result.loop_lag_s

    lags = anyio.run(go)
    huge, slow = records[0], records[1]
    assert huge.turns[0].status == "ok" and huge.turns[0].verdict == "corrupt", huge
    assert slow.outcome == "clean" and not slow.wedged, slow
    # Judged on the loop, the verdict would hold it for its whole cost: one lag sample at least that late, and
    # the chunk gaps the slow session measures stretched by as much.
    assert max(lags) < cost / 4, (max(lags), cost)
    assert max(turn.max_gap_s or 0.0 for turn in slow.turns) < gap + cost / 4, (slow.turns, cost)
