"""The simulator's virtual clock: the same seed and flags give the same faults at any machine load.

Two runs of the faulty configuration against fresh simulators, the second while two busy loops compete for
the CPU, must inject the same faults in the same conversations, turns and layers at the same simulated
times. On the real clock they need not (and under load they do not): that is why every test that bounds a
count of faults runs on the virtual clock.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from rich.console import Console

from repro.run.runner import RunOptions, execute_run
from repro.sim.lockstep import Lockstep, session_order

FAULTY = ("--enable-hierarchical-cache", "--index-k-dtype", "bf16", "--clock", "virtual")


def _faults(sim_server, out: Path) -> tuple[list[tuple[str, int, int, float, int]], dict[str, int]]:
    sim = sim_server(*FAULTY)
    execute_run(RunOptions(base_url=sim.base_url, sessions=30, concurrency=30, out=out, timeout=600, turn_timeout=300),
                console=Console(quiet=True), live=False)
    faults = httpx.get(f"{sim.url}/debug/faults", timeout=10).json()["faults"]
    clock = httpx.get(f"{sim.url}/sim/clock", timeout=10).json()
    return sorted((f["conversation"], f["turn"], f["layer"], f["read_time_s"], f["load_back_tokens"]) for f in faults), clock


@pytest.fixture
def busy_machine() -> Iterator[None]:
    """Two processes that spin for the CPU while the test runs."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(timeout=30)


def test_same_seed_same_faults_with_the_machine_idle_and_busy(sim_server, tmp_path: Path, request) -> None:
    quiet, quiet_clock = _faults(sim_server, tmp_path / "quiet")
    request.getfixturevalue("busy_machine")
    busy, busy_clock = _faults(sim_server, tmp_path / "busy")
    assert quiet and quiet == busy
    assert quiet_clock["timeouts"] == busy_clock["timeouts"] == 0
    assert quiet_clock["ended"] == quiet_clock["planned"] == 30


def test_a_real_clock_simulator_takes_no_load_declaration(sim_server) -> None:
    sim = sim_server("--time-scale", "0")
    assert httpx.get(f"{sim.url}/sim/clock", timeout=10).json() == {"clock": "real"}
    answer = httpx.post(f"{sim.url}/sim/clock/plan", json={"sessions": 3, "concurrency": 1}, timeout=10)
    assert answer.status_code == 400 and "real clock" in answer.json()["error"]["message"]


def test_the_barrier_expects_every_slot_then_the_tail() -> None:
    lockstep = Lockstep(patience_s=60)
    lockstep.plan(sessions=5, concurrency=2)
    assert not lockstep.ready(["0"]) and lockstep.ready(["0", "1"])
    # Untagged requests (a health probe) neither fill a slot nor block one.
    assert not lockstep.ready(["0", None])
    for session in ("0", "1", "2", "3"):
        lockstep.end(session)
    assert lockstep.expected() == 1 and lockstep.ready(["4"])
    lockstep.end("4")
    assert lockstep.expected() == 0 and lockstep.ready([])


def test_arrivals_are_admitted_in_session_order() -> None:
    assert sorted(["10", None, "2", "x"], key=session_order) == ["2", "10", "x", None]
