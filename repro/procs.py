"""Processes the harness starts: each in its own process group, output captured, stopped for sure.

The simulator launcher, `repro run`'s embedded target and the matrix's deployments all go through
here, so "processes you start, you stop" holds in one place: SIGTERM to the whole group, a bounded
wait, then SIGKILL.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import time
from collections import deque
from pathlib import Path
from typing import Sequence

import httpx

from repro.errors import TargetError

_LIVE: set["ManagedProcess"] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago. The kernel may hand it out again; callers retry on bind failure."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ManagedProcess:
    """A child process that leads its own process group, with its output going to a log file (or nowhere)."""

    def __init__(self, popen: subprocess.Popen[bytes], argv: Sequence[str], log_path: Path | None) -> None:
        self.popen = popen
        self.argv = list(argv)
        self.log_path = log_path
        self.pid = popen.pid
        self.pgid = popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines)).rstrip()

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass

    def group_alive(self) -> bool:
        """Whether any process of the group is left (the leader may be gone while its children live on)."""
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A zombie leader still answers signal 0; reaping it is how we learn it is gone.
        if self.popen.poll() is not None:
            try:
                os.killpg(self.pgid, 0)
            except ProcessLookupError:
                return False
        return True

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM to the group, wait up to `timeout`, then SIGKILL; returns the leader's exit code."""
        _LIVE.discard(self)
        if self.group_alive():
            self._signal_group(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.group_alive():
                try:
                    self.popen.wait(timeout=0.05)
                except subprocess.TimeoutExpired:
                    pass
            if self.group_alive():
                self._signal_group(signal.SIGKILL)
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def __enter__(self) -> "ManagedProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_process(
    cmd: Sequence[str],
    *,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> ManagedProcess:
    """Start `cmd` as the leader of a new process group; stdout and stderr go to `log_path` (appended)."""
    if not cmd:
        raise ValueError("start_process needs a command")
    full_env = {**os.environ, **(env or {})}
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        out = open(log_path, "ab")
    else:
        out = open(os.devnull, "wb")
    try:
        popen = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as err:
        raise TargetError(f"cannot start {cmd[0]!r}: {err.strerror or err}") from None
    finally:
        out.close()
    proc = ManagedProcess(popen, cmd, Path(log_path) if log_path else None)
    _LIVE.add(proc)
    return proc


def wait_http_ready(
    url: str,
    *,
    timeout: float,
    interval: float = 0.2,
    process: ManagedProcess | None = None,
) -> None:
    """Poll `url` until it answers 200; TargetError on timeout or when `process` dies first."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    with httpx.Client(timeout=max(1.0, min(interval * 5, 10.0)), trust_env=False) as client:
        while True:
            if process is not None and not process.alive:
                tail = process.log_tail()
                detail = f"; its output ends with:\n{tail}" if tail else ""
                raise TargetError(
                    f"{process.argv[0]} exited with code {process.returncode} before {url} was ready{detail}"
                )
            try:
                response = client.get(url)
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}"
            except httpx.HTTPError as err:
                last = type(err).__name__
            if time.monotonic() >= deadline:
                raise TargetError(f"{url} not ready after {timeout:g}s (last: {last})")
            time.sleep(interval)


@atexit.register
def _stop_leftovers() -> None:
    # A crash or an unhandled exception must not leave servers running behind the harness.
    for proc in list(_LIVE):
        proc.stop(timeout=3.0)
