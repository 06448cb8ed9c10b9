"""Launched processes: whole groups stop, dead servers are reported with their output."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from proc_helpers import group_gone, pid_gone, poll, wait_for

from repro.errors import TargetError
from repro.procs.process import (
    confirm_listener,
    free_port,
    port_in_use,
    start_process,
    wait_http_ready,
)


def test_stop_kills_children_that_ignore_sigterm(tmp_path: Path) -> None:
    script = "trap '' TERM; (trap '' TERM; sleep 300) & echo started; wait"
    proc = start_process(["bash", "-c", script], log_path=tmp_path / "out.log")
    # Only once the traps are set does the stop test what it means to.
    wait_for(lambda: "started" in proc.log_tail(), 120, "the script to set its traps")
    proc.stop(timeout=0.5)
    assert group_gone(proc.pgid)


def test_wait_http_ready_names_the_dead_process_and_its_output(tmp_path: Path) -> None:
    proc = start_process(
        [sys.executable, "-c", "import sys; print('boom: bad flag'); sys.exit(4)"], log_path=tmp_path / "out.log"
    )
    with pytest.raises(TargetError, match="exited with code 4") as err:
        wait_http_ready(f"http://127.0.0.1:{free_port()}/health", timeout=120, process=proc)
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
        wait_http_ready(f"http://127.0.0.1:{port}/", timeout=120, process=proc)
    finally:
        proc.stop()
    assert group_gone(proc.pgid)


def test_missing_executable_is_a_target_error() -> None:
    with pytest.raises(TargetError, match="cannot start"):
        start_process(["/nonexistent/server-binary"])


HARNESS = """
import sys
from pathlib import Path
from repro.procs.process import start_process
proc = start_process(["bash", "-c", sys.argv[1]], log_path=Path(sys.argv[2]))
print(proc.pgid, flush=True)
sys.stdin.read()  # until the test kills us
"""


def test_sigkill_of_the_harness_stops_its_group_and_what_left_it(tmp_path: Path) -> None:
    # One child stays in the launched group, one leaves it with setsid (its own session, as
    # daemonising launch commands do). SIGKILL gives the harness no chance to clean up.
    pidfile = tmp_path / "detached.pid"
    script = f"setsid sleep 300 & echo $! > {pidfile}; sleep 300 & wait"
    harness = subprocess.Popen(
        [sys.executable, "-c", HARNESS, script, str(tmp_path / "out.log")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
    )
    try:
        pgid = int(harness.stdout.readline())
        assert poll(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
        detached = int(pidfile.read_text())
        assert not pid_gone(detached) and not group_gone(pgid, timeout=0)
        os.killpg(harness.pid, signal.SIGKILL)
        harness.wait(timeout=10)
        assert group_gone(pgid, timeout=120)
        assert poll(lambda: pid_gone(detached), timeout=120)
    finally:
        if harness.poll() is None:
            harness.kill()


def test_repro_run_killed_with_sigkill_leaves_no_embedded_simulator(tmp_path: Path) -> None:
    out = tmp_path / "run"
    repro = subprocess.Popen(
        [sys.executable, "-c", "from repro.cli import main; main()", "run", "--sessions", "40", "--concurrency", "2",
         "--turns", "18", "--out", str(out), "--sim-args", "--time-scale 0.2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    def embedded_sims() -> list[int]:
        return [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
                if b"repro.sim\0serve" in _cmdline(pid) and _parent(pid) == repro.pid]

    try:
        # sessions.jsonl is made before the simulator starts: wait for the simulator itself.
        assert poll(lambda: (out / "sessions.jsonl").exists() and embedded_sims() or repro.poll() is not None, timeout=180)
        assert repro.poll() is None, "the run ended before it could be killed"
        sims = embedded_sims()
        assert len(sims) == 1
        os.killpg(repro.pid, signal.SIGKILL)
        repro.wait(timeout=10)
        assert poll(lambda: pid_gone(sims[0]), timeout=120)
    finally:
        if repro.poll() is None:
            repro.kill()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _parent(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(text[text.rfind(")") + 2:].split()[1])


def test_stop_reaches_children_that_left_the_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "detached.pid"
    proc = start_process(["bash", "-c", f"setsid sleep 300 & echo $! > {pidfile}; wait"])
    assert poll(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
    detached = int(pidfile.read_text())
    proc.stop(timeout=5)
    assert pid_gone(detached)


def test_port_in_use_names_the_occupant_and_confirm_listener_refuses_it(tmp_path: Path) -> None:
    port = free_port()
    occupant = start_process(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
    )
    bystander = start_process(["sleep", "300"], log_path=tmp_path / "bystander.log")
    try:
        wait_http_ready(f"http://127.0.0.1:{port}/", timeout=120, process=occupant)
        assert port_in_use(port).startswith(f"pid {occupant.pid} ({sys.executable} -m http.server {port} ")
        assert confirm_listener(occupant, port) is None
        with pytest.raises(TargetError, match=f"port {port} is held by pid {occupant.pid} .*not by the launched sleep"):
            confirm_listener(bystander, port)
        bystander.stop()
        with pytest.raises(TargetError, match="sleep exited with code -15 though port .* answered"):
            confirm_listener(bystander, port)
    finally:
        occupant.stop()
        bystander.stop()
    assert port_in_use(port) is None


def test_a_chatty_process_log_is_capped_with_its_head_a_note_and_its_latest_output(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    chatty = (
        "print('flags: --enable-hierarchical-cache')\n"
        "for i in range(200000): print(f'line {i:08d}')\n"
        "print('last words')"
    )
    proc = start_process([sys.executable, "-c", chatty], log_path=log, log_max_bytes=64_000)
    assert proc.popen.wait(timeout=60) == 0
    assert proc.log_tail(1) == "last words"
    proc.stop()
    head = log.read_text()
    assert head.startswith("flags: --enable-hierarchical-cache\n")
    assert "[repro: this log is capped at 64000 bytes" in head
    assert "bytes between the head and the tail were dropped]" in head
    files = [log, *tmp_path.glob("server.log.tail*")]
    assert sum(f.stat().st_size for f in files) <= 64_000 + 1_000
    assert (tmp_path / "server.log.tail").read_text().endswith("last words\n")
