"""Run one measured child process to its end and read what the kernel counted for it (os.wait4): its exit
code, its CPU and its peak RSS, its reaped children's included. The benchmarks that time or weigh a whole
process (a `repro run`, a conversion, a peer's client) all start it through `run_child`.

The child's output goes to files, never to a pipe: wait4 waits before anything reads, and a child writing
more than a pipe holds would block on it forever.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Mapping, Sequence

POLL_S = 0.1
"""How often a child with a deadline is asked whether it has ended."""


@dataclass(frozen=True)
class Ended:
    """A child process that ended, with what wait4 counted for it."""

    code: int
    """Its exit code (a negative signal number when a signal ended it)."""
    out: str
    """Its standard output ("" when it went to a log)."""
    err: str
    """Its standard error ("" when it went to a log)."""
    cpu_s: float
    """User and system CPU seconds: its own and its reaped children's."""
    max_rss_kib: int
    """Its peak resident set (the kernel's high-water mark), in KiB (Linux's unit)."""
    wall_s: float
    timed_out: bool = False
    """It was still running at the deadline and was killed."""


def run_child(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
              log: Path | None = None, timeout_s: float | None = None, own_group: bool = False) -> Ended:
    """Run `argv` to its end. `log`: its stdout and stderr together in that file (else read back into `out`
    and `err`). `timeout_s`: killed at that deadline. `own_group`: in its own process group, which is killed
    once it ends (whatever it left running there goes with it)."""
    with contextlib.ExitStack() as stack:
        if log is not None:
            out_file = err_file = stack.enter_context(log.open("wb"))
        else:
            out_file = stack.enter_context(tempfile.TemporaryFile())
            err_file = stack.enter_context(tempfile.TemporaryFile())
        started = time.perf_counter()
        proc = subprocess.Popen(list(argv), stdout=out_file, stderr=err_file if log is None else subprocess.STDOUT,
                                env=None if env is None else dict(env), cwd=cwd, start_new_session=own_group)
        status, usage, timed_out = _wait(proc, timeout_s, own_group)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        if own_group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        out = err = ""
        if log is None:
            out, err = (_read(file) for file in (out_file, err_file))
    return Ended(code=proc.returncode, out=out, err=err, cpu_s=usage.ru_utime + usage.ru_stime,
                 max_rss_kib=usage.ru_maxrss, wall_s=wall, timed_out=timed_out)


def _wait(proc: subprocess.Popen, timeout_s: float | None, own_group: bool) -> tuple[int, os.struct_rusage, bool]:
    if timeout_s is None:
        _, status, usage = os.wait4(proc.pid, 0)
        return status, usage, False
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            return status, usage, False
        if time.monotonic() > deadline:
            (os.killpg if own_group else os.kill)(proc.pid, signal.SIGKILL)
            _, status, usage = os.wait4(proc.pid, 0)
            return status, usage, True
        time.sleep(POLL_S)


def _read(file: IO[bytes]) -> str:
    file.seek(0)
    return file.read().decode(errors="replace")
