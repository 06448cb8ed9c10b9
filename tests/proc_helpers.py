"""Test helpers for processes: waiting on a condition, and whether a process group has ended (tests that launch
servers assert nothing is left behind). Their waits are for what must happen eventually: the budgets are
generous, since a loaded machine decides how soon."""

import os
import time
from pathlib import Path
from typing import Callable

from repro.procs.reaper import _stat as process_stat


def group_gone(pgid: int, timeout: float = 60.0) -> bool:
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
    stat = process_stat(pid)
    return stat is None or stat[0] in ("Z", "X")


def poll(condition: Callable[[], bool], timeout: float = 120.0) -> bool:
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


def pids_where(entry: str, test: Callable[[bytes], bool]) -> set[int]:
    """Processes whose /proc/PID/`entry` (`environ`, `cmdline`) passes `test` (processes gone meanwhile are not)."""
    found = set()
    for process in Path("/proc").iterdir():
        if process.name.isdigit():
            try:
                if test((process / entry).read_bytes()):
                    found.add(int(process.name))
            except OSError:
                continue
    return found


def marked_pids(mark: str) -> set[int]:
    """Processes whose environment carries `REPRO_TEST_MARK=mark`: the servers a test's command launched
    (on any node of a one-machine Ray cluster)."""
    needle = f"REPRO_TEST_MARK={mark}".encode()
    return pids_where("environ", lambda environ: needle in environ.split(b"\0"))
