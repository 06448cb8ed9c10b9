"""Processes the harness starts: each in its own process group, output captured, stopped for sure.

The simulator launcher, `repro run`'s embedded target and the matrix's deployments all go through
here, so "processes you start, you stop" holds in one place: SIGTERM to the whole group (and to
whatever left it, found by the tag each launch carries in its environment), a bounded wait, then
SIGKILL. The same holds when the harness itself is killed: every launch is registered with
`repro.procs.reaper`, a small process that sweeps the registered groups when the harness's end of a pipe
closes. Whether a port answers for the launched process or for something else is told from
/proc/net/tcp and the holders' file descriptors.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import IO, Sequence

# httpx is imported where it is used (wait_http_ready), here and in the modules a `--workers` worker
# imports: with its command line (rich, click, pygments) it costs a process ~0.2 s of CPU, and a worker
# never uses it.

from repro.errors import TargetError
from repro.procs import containers, logcap
from repro.procs.logcap import is_capped, tail_paths
from repro.procs.reaper import TAG_ENV, members, tagged_pids

_LIVE: set["ManagedProcess"] = set()
TAIL_BYTES = 4096
"""How much of a log's end `log_tail` reads: enough for the last lines, bounded for endless ones."""


class PortTakenError(TargetError):
    """Another process holds the port a launched server was to listen on (it may have taken it since the
    port was chosen): with a port the harness chose itself, a fresh port is the remedy."""


def python_module(module: str, *args: str) -> list[str]:
    """The command that runs `python -m module args` in this interpreter, importing the installed package.

    `-P` keeps the working directory off the import path: started from a directory that holds a folder
    named `repro` (a virtual environment called repro, say), a plain `-m` would import that folder
    instead. The environment (PYTHONPATH included) is left as it is.
    """
    return [sys.executable, "-P", "-m", module, *args]


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago. The kernel may hand it out again; callers retry on PortTakenError."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class _Reaper:
    """The harness's end of the pipe to `python -m repro.procs.reaper`, started with the first launch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pipe: IO[bytes] | None = None

    def _send(self, line: str) -> None:
        with self._lock:
            try:
                if self._pipe is None:
                    reaper = subprocess.Popen(
                        python_module("repro.procs.reaper"),
                        stdin=subprocess.PIPE,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                    assert reaper.stdin is not None
                    self._pipe = reaper.stdin
                self._pipe.write(line.encode("ascii") + b"\n")
                self._pipe.flush()
            except OSError:
                # No reaper (or it died): the harness still stops its processes itself; only a SIGKILL
                # of the harness would leave them behind, as it did before there was a reaper.
                self._pipe = None

    def register(self, tag: str, grace: float, pgid: int = 0) -> None:
        self._send(f"+ {tag} {grace:g} {pgid}")

    def unregister(self, tag: str) -> None:
        self._send(f"- {tag}")

    def container(self, tag: str) -> None:
        """The launch `tag` is a `docker run`: a sweep also removes the containers labelled with it."""
        self._send(f"c {tag}")


_REAPER = _Reaper()


class ManagedProcess:
    """A child process that leads its own process group, with its output going to a log file (or nowhere).

    `tag`, when set, is the value of REPRO_PROCESS_TAG in the process's environment: processes that
    carry it are stopped with the group even after they left it (setsid, daemonising).
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        argv: Sequence[str],
        log_path: Path | None,
        *,
        tag: str | None = None,
        grace: float = 10.0,
        writer: subprocess.Popen[bytes] | None = None,
        container: str | None = None,
    ) -> None:
        self.popen = popen
        self.argv = list(argv)
        self.log_path = log_path
        self.pid = popen.pid
        self.pgid = popen.pid
        self.tag = tag
        self.grace = grace
        self.writer = writer
        """The `repro.procs.logcap` process writing a capped log, if any."""
        self.container = container
        """For a `docker run`: the `repro.run` label of its container, removed at stop (repro.procs.containers)."""

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, lines: int = 20) -> str:
        if self.writer is not None and not self.alive:
            # The capped log's writer may still be copying what the process said last.
            try:
                self.writer.wait(timeout=3.0)
            except subprocess.TimeoutExpired:
                pass
        if self.log_path is None or not self.log_path.exists():
            return ""
        paths = [self.log_path]
        if is_capped(self.log_path):
            paths = [path for path in tail_paths(self.log_path) if path.exists()]
        # The last bytes only: a log may be hundreds of megabytes, or one endless line.
        data = b""
        for path in reversed(paths):
            with open(path, "rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - (TAIL_BYTES - len(data))))
                data = fh.read() + data
            if len(data) >= TAIL_BYTES:
                break
        tail = deque(data.decode("utf-8", errors="replace").splitlines(), maxlen=lines)
        return "\n".join(tail).rstrip()

    def detached(self) -> set[int]:
        """Processes that carry this launch's tag, wherever they are now (its own group included)."""
        return tagged_pids(self.tag) if self.tag else set()

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass
        for pid in self.detached():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _anything_left(self) -> bool:
        return self.group_alive() or bool(self.detached())

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
        if self._anything_left():
            self._signal_group(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self._anything_left():
                try:
                    self.popen.wait(timeout=0.05)
                except subprocess.TimeoutExpired:
                    pass
            if self._anything_left():
                self._signal_group(signal.SIGKILL)
        if self.container is not None:
            # The client's end does not stop its container (a SIGKILL is not proxied to it).
            containers.remove(self.container)
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        if self.writer is not None:
            try:
                self.writer.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.writer.kill()
        if self.tag:
            _REAPER.unregister(self.tag)
        return code

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
    grace: float = 10.0,
    log_max_bytes: int | None = None,
) -> ManagedProcess:
    """Start `cmd` as the leader of a new process group; stdout and stderr go to `log_path` (appended).

    The output goes through `repro.procs.logcap`, which keeps the log under `log_max_bytes`
    (`logcap.DEFAULT_MAX_BYTES` when not given): a process that only prints cannot fill the disk.
    The process is registered with the reaper, which gives it `grace` seconds between SIGTERM and
    SIGKILL should the harness die without stopping it.
    """
    if not cmd:
        raise ValueError("start_process needs a command")
    tag = uuid.uuid4().hex
    full_env = {**os.environ, **(env or {}), TAG_ENV: tag}
    cmd, container = containers.labelled(cmd, tag, os.getpid())
    # Registered before the start: a harness killed in between still has the tag swept.
    _REAPER.register(tag, grace)
    if container is not None:
        _REAPER.container(tag)
    writer = None
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    if log_path is not None:
        cap = logcap.DEFAULT_MAX_BYTES if log_max_bytes is None else log_max_bytes
        writer = subprocess.Popen(
            python_module("repro.procs.logcap", str(log_path), str(cap)),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert writer.stdin is not None
        out: IO[bytes] = writer.stdin
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
        _REAPER.unregister(tag)
        raise TargetError(f"cannot start {cmd[0]!r}: {err.strerror or err}") from None
    finally:
        out.close()
    proc = ManagedProcess(
        popen, cmd, Path(log_path) if log_path else None, tag=tag, grace=grace, writer=writer, container=container
    )
    _LIVE.add(proc)
    _REAPER.register(tag, grace, proc.pgid)
    return proc


def one_line(text: str) -> str:
    """`text` (a log's tail, say) on one line, its lines joined with " | ": the CLI prints errors on one line."""
    return " | ".join(line for line in text.splitlines() if line.strip())


def _listening_inodes(port: int) -> set[int] | None:
    """Inodes of the TCP sockets listening on `port` on any address; None where /proc/net is unreadable."""
    found: set[int] = set()
    tables = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        tables += 1
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(int(fields[9]))
    return found if tables else None


def _socket_holders(inodes: set[int]) -> dict[int, int]:
    """pid -> inode for each process we may inspect that holds one of `inodes` open."""
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    holders: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                inode = wanted.get(os.readlink(fd))
                if inode is not None:
                    holders[int(entry.name)] = inode
        except OSError:  # another user's process, or gone already
            continue
    return holders


def describe_pid(pid: int) -> str:
    """`pid 123 (python -m http.server 8000)`, the command line cut short."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        command = " ".join(part.decode(errors="replace") for part in argv if part)
    except OSError:
        command = ""
    command = command if len(command) <= 120 else command[:117] + "..."
    return f"pid {pid} ({command})" if command else f"pid {pid}"


def port_in_use(port: int) -> str | None:
    """Who listens on `port` already (on any address), in words; None when nothing does."""
    inodes = _listening_inodes(port)
    if inodes is None:
        # No /proc/net: a connection attempt is the remaining way to tell.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            return "a process" if sock.connect_ex(("127.0.0.1", port)) == 0 else None
    if not inodes:
        return None
    holders = _socket_holders(inodes)
    return ", ".join(describe_pid(pid) for pid in sorted(holders)) or "a process of another user"


def confirm_listener(process: ManagedProcess, port: int) -> str | None:
    """Check that the server answering on `port` is `process`: alive, and holding every socket listening there.

    Raises PortTakenError (a TargetError) when the process has exited or something else listens on the
    port (a server that lost the port to an occupant dies with "address in use" while the occupant
    answers for it), and TargetError when nothing listens there any more.
    Returns a note when the holder cannot be inspected (another user's process, such as a
    container's), which only the port being free before the launch then vouches for.
    """
    name = process.argv[0]
    if not process.alive:
        tail = one_line(process.log_tail(5))
        raise PortTakenError(
            f"{name} exited with code {process.returncode} though port {port} answered "
            "(another process may serve that port)" + (f"; its output ends with: {tail}" if tail else "")
        )
    inodes = _listening_inodes(port)
    if inodes is None:
        return f"port {port}: cannot tell which process listens (no /proc/net/tcp)"
    if not inodes:
        raise TargetError(f"nothing listens on port {port} any more, though {name} answered there")
    holders = _socket_holders(inodes)
    ours = members(process.pgid, process.tag) if process.tag else {process.pid}
    if process.container is not None:
        ours |= containers.owned(process.container, set(holders) - ours)
    foreign = sorted(pid for pid in holders if pid not in ours)
    if foreign:
        raise PortTakenError(
            f"port {port} is held by {', '.join(describe_pid(pid) for pid in foreign)}, "
            f"not by the launched {name} (pid {process.pid}) or its children"
        )
    if set(holders.values()) != inodes:
        return f"port {port}: held by a process the harness may not inspect (another user's, e.g. a container's)"
    return None


def wait_http_ready(
    url: str,
    *,
    timeout: float,
    interval: float = 0.2,
    process: ManagedProcess | None = None,
) -> None:
    """Poll `url` until it answers 200; TargetError on timeout or when `process` dies first."""
    import httpx  # here, not at the top: see the note above the imports

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
