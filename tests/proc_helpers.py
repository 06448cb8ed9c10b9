"""Test helpers for processes: waiting on a condition, and whether a process group has ended (tests that launch
servers assert nothing is left behind)."""

import os
import time
from pathlib import Path
from typing import Callable


def group_gone(pgid: int, timeout: float = 10.0) -> bool:
    """True once no process of the group `pgid` exists; False if some still does after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def pid_gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie counts as ended). Its state says so, not its command line,
    which also reads empty for a moment while a live process execs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def poll(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    """True once `condition()` holds; False if it still does not after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Return once `condition()` holds; fail the test naming `what` if it still does not after `timeout` seconds."""
    if not poll(condition, timeout):
        raise AssertionError(f"timed out waiting for {what}")


def marked_pids(mark: str) -> set[int]:
    """Processes whose environment carries `REPRO_TEST_MARK=mark`: the servers a test's command launched
    (on any node of a one-machine Ray cluster)."""
    needle = f"REPRO_TEST_MARK={mark}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
            except OSError:
                continue
    return found
