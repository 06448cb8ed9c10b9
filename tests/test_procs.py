"""Launched processes: whole groups stop, dead servers are reported with their output."""

import sys
import time
from pathlib import Path

import pytest

from repro.errors import TargetError
from repro.procs import free_port, start_process, wait_http_ready

from proc_helpers import group_gone


def test_stop_kills_children_that_ignore_sigterm(tmp_path: Path) -> None:
    script = "trap '' TERM; (trap '' TERM; sleep 300) & echo started; wait"
    proc = start_process(["bash", "-c", script], log_path=tmp_path / "out.log")
    deadline = time.monotonic() + 10
    while "started" not in proc.log_tail() and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.stop(timeout=0.5)
    assert group_gone(proc.pgid)


def test_wait_http_ready_names_the_dead_process_and_its_output(tmp_path: Path) -> None:
    proc = start_process(
        [sys.executable, "-c", "import sys; print('boom: bad flag'); sys.exit(4)"], log_path=tmp_path / "out.log"
    )
    with pytest.raises(TargetError, match="exited with code 4") as err:
        wait_http_ready(f"http://127.0.0.1:{free_port()}/health", timeout=20, process=proc)
    assert "boom: bad flag" in str(err.value)
    proc.stop()


def test_wait_http_ready_times_out_with_the_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/health"
    with pytest.raises(TargetError, match="not ready after 0.5s"):
        wait_http_ready(url, timeout=0.5, interval=0.1)


def test_ready_server_is_seen(tmp_path: Path) -> None:
    port = free_port()
    proc = start_process(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        log_path=tmp_path / "http.log",
    )
    try:
        wait_http_ready(f"http://127.0.0.1:{port}/", timeout=20, process=proc)
    finally:
        proc.stop()
    assert group_gone(proc.pgid)


def test_missing_executable_is_a_target_error() -> None:
    with pytest.raises(TargetError, match="cannot start"):
        start_process(["/nonexistent/server-binary"])
