"""`repro run --workers N`: sessions sharded across local worker processes, one run directory."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from faulty_servers import sessions_seen, start_faulty_server
from hypothesis import given
from hypothesis import strategies as st
from proc_helpers import marked_pids, pids_where, wait_for
from rich.console import Console
from run_builders import assert_every_shard_cut_short, assert_worker_1_lost

from repro.errors import EXIT_INTERNAL, EXIT_INTERRUPTED
from repro.run.finish import RunResult
from repro.run.runner import execute_run
from repro.run.options import RunOptions
from repro.run.shards import shard_sizes
from repro.sim.launch import SimHandle
from repro.store.rundir import load_run


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, root = start_faulty_server(tmp_path_factory.mktemp("faulty") / "server.log")
    yield root
    proc.stop()


def run(out: Path, **options: Any) -> tuple[RunResult, str]:
    screen = io.StringIO()
    result = execute_run(RunOptions.parse({"out": out, **options}), console=Console(file=screen, width=150), live=False)
    return result, screen.getvalue()


@given(st.integers(1, 500), st.integers(1, 500), st.integers(1, 16))
def test_shards_deal_every_session_once_and_split_the_concurrency(sessions: int, concurrency: int, workers: int) -> None:
    sizes = shard_sizes(sessions, concurrency, workers)
    assert sum(n for n, _ in sizes) == sessions
    assert max(n for n, _ in sizes) - min(n for n, _ in sizes) <= 1
    assert all(c >= 1 for _, c in sizes)
    assert sum(c for _, c in sizes) == max(concurrency, workers)


def test_two_workers_run_the_same_sessions_as_one_process(
    sim_server: Callable[..., SimHandle], tmp_path: Path
) -> None:
    sim = sim_server("--enable-hierarchical-cache", "--index-k-dtype", "bf16")
    common = dict(base_url=sim.base_url, sessions=14, turns=3, seed=7, timeout=120)
    one, _ = run(tmp_path / "one", **common)
    two, screen = run(tmp_path / "two", workers=2, **common)
    assert two.exit_code == 0, screen
    a, b = load_run(one.path), load_run(two.path)

    def identity(sessions: list) -> list[tuple[int, str]]:
        return sorted((s.session_id, s.task) for s in sessions)

    assert identity(b.sessions) == identity(a.sessions)
    assert sorted(s.session_id for s in b.sessions) == list(range(14))
    assert b.summary is not None and b.summary.sessions == 14 and not b.summary.interrupted
    assert b.summary.turns == sum(len(s.turns) for s in b.sessions) > 0
    # One loop-lag series per worker, pooled into the run's.
    assert len(b.summary.worker_loop_lag) == 2
    assert b.summary.loop_lag is not None
    assert b.summary.loop_lag.count == sum(p.count for p in b.summary.worker_loop_lag)
    assert "worker 1 loop lag" in screen
    # Kept raw responses name files the driver wrote.
    for session in b.sessions:
        for turn in session.turns:
            if turn.raw_path is not None:
                assert (two.path / turn.raw_path).is_file()


def test_workers_start_from_a_directory_holding_a_repro_folder(faulty: str, tmp_path: Path) -> None:
    """A folder named `repro` in the working directory (a virtual environment called repro, say) is not
    what the worker processes import: they run the installed package, as the command itself does."""
    here = tmp_path / "cwd"
    (here / "repro").mkdir(parents=True)
    (here / "repro" / "__init__.py").write_text('raise ImportError("imported the working directory\'s repro/")\n')
    out = tmp_path / "run"
    command = Path(sys.executable).with_name("repro")  # the console script a user runs
    args = ["run", "--base-url", f"{faulty}/good~anydir/v1", "--sessions", "4", "--turns", "2",
            "--workers", "2", "--no-report", "--out", str(out)]
    proc = subprocess.run([str(command), *args], cwd=here, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    loaded = load_run(out)
    assert sorted(s.session_id for s in loaded.sessions) == [0, 1, 2, 3]
    assert loaded.summary is not None and loaded.summary.turns > 0
    assert len(loaded.summary.worker_loop_lag) == 2
    assert (out / "summary.json").is_file() and not (out / "report.html").exists()  # --no-report


def _shard_pids(mark: str) -> set[int]:
    """The worker processes of the run started with `_marked(mark)` (other runs on the machine are not counted)."""
    return marked_pids(mark) & pids_where("cmdline", lambda cmdline: b"repro.run.shards" in cmdline)


def _marked(mark: str) -> dict[str, str]:
    return {**os.environ, "REPRO_TEST_MARK": mark}


def test_sigint_stops_the_workers_and_keeps_every_session(faulty: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    mark = f"shards-sigint-{os.getpid()}"
    args = ["run", "--base-url", f"{faulty}/slow:0.1/v1", "--sessions", "12", "--concurrency", "4",
            "--workers", "2", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-c", "from repro.cli import main; main()", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_marked(mark))
    sessions_file = out / "sessions.jsonl"
    deadline = time.monotonic() + 180
    while not (sessions_file.exists() and sessions_file.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, "no session finished in time"
        time.sleep(0.05)
    assert len(_shard_pids(mark)) == 2
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert not _shard_pids(mark)
    assert_every_shard_cut_short(out, 12)


def test_a_lost_worker_costs_only_its_sessions_in_flight(faulty: str, tmp_path: Path) -> None:
    mode = "slow:0.3~lost"  # 1.5 s a turn: every session is in flight when the worker goes
    out = tmp_path / "run"
    mark = f"shards-lost-{os.getpid()}"
    args = ["run", "--base-url", f"{faulty}/{mode}/v1", "--sessions", "8", "--turns", "4", "--workers", "2",
            "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-c", "from repro.cli import main; main()", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_marked(mark))
    try:
        wait_for(lambda: len(sessions_seen(faulty, mode)) == 8, 180, "every session to send its first turn")
        (second,) = [pid for pid in _shard_pids(mark)
                     if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[-2] == b"1"]
        os.kill(second, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_INTERNAL, err
    assert err.count("\n") == 1 and "run incomplete: 1 of 2 workers lost (worker 1 (hostname " in err, err
    loaded = assert_worker_1_lost(out)  # worker 1's sessions were in flight; worker 0 finished its own
    assert [p.index for p in loaded.manifest.workers if p.lost] == [1]
    assert (out / "report.html").exists()
    assert not _shard_pids(mark)
