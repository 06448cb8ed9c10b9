"""Stop what a harness started once the harness is gone, however it went (SIGKILL included).

`python -m repro.procs.reaper` reads one line per process group the harness starts (`+ <tag> <grace> <pgid>`,
sent once before the start with pgid 0 and again once the pgid is known) or has stopped (`- <tag>`),
and `c <tag>` for a registered launch that is a `docker run`, whose container (labelled with the tag) it removes too,
from a pipe whose other end only the harness holds. The
kernel closes that end when the harness dies, so end-of-file is the parent-death signal: no polling,
no race with a harness that dies between two checks. Every group still registered is then swept.

A launched process carries its tag in its environment (`REPRO_PROCESS_TAG`), and children inherit it,
so a sweep also finds what left the group: a `setsid` launcher, a daemonising server. A group or a
process is only signalled while something in it carries the tag, so a reused process id is never hit.

Standard library only: it is the first process the harness starts and must start fast.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from repro.procs import containers

TAG_ENV = "REPRO_PROCESS_TAG"
PROC = Path("/proc")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of `pid`, or None once it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return fields[0], int(fields[2])


def _pids() -> list[int]:
    try:
        return [int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()]
    except OSError:
        return []


def tagged_pids(tag: str) -> set[int]:
    """Live processes (zombies excluded) whose environment holds `REPRO_PROCESS_TAG=<tag>`."""
    needle = f"{TAG_ENV}={tag}".encode()
    found = set()
    for pid in _pids():
        try:
            environ = (PROC / str(pid) / "environ").read_bytes()
        except OSError:  # another user's process, or gone already
            continue
        if needle in environ.split(b"\0"):
            found.add(pid)
    return found


def members(pgid: int, tag: str) -> set[int]:
    """The tagged processes, plus the whole group `pgid` while one of the tagged is still in it."""
    tagged = tagged_pids(tag)
    groups = {pid: _stat(pid) for pid in _pids()}
    if not any((groups.get(pid) or ("", -1))[1] == pgid for pid in tagged):
        return tagged
    return tagged | {pid for pid, stat in groups.items() if stat is not None and stat[1] == pgid and stat[0] != "Z"}


def _signal(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def sweep(groups: dict[str, tuple[float, int, bool]]) -> None:
    """SIGTERM every member of each tag's launch (grace, pgid, docker), wait up to its grace for them to end,
    then SIGKILL; then remove the containers of the `docker run` launches (their clients' deaths did not stop them)."""
    pending = {tag: members(pgid, tag) for tag, (_, pgid, _) in groups.items()}
    for pids in pending.values():
        _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + max((grace for grace, _, _ in groups.values()), default=0.0)
    while any(pending.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
        pending = {tag: members(groups[tag][1], tag) for tag in pending}
    for pids in pending.values():
        _signal(pids, signal.SIGKILL)
    for tag, (_, _, docker) in groups.items():
        if docker:
            containers.remove(tag)


def main() -> None:
    # Own session (the harness starts it so): a signal to the harness's group does not reach it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # (grace, pgid, is a `docker run`) by tag; a launch's `c` comes between its two `+` lines, which keep it.
    registered: dict[str, tuple[float, int, bool]] = {}
    for line in sys.stdin.buffer:
        op, tag, *rest = line.decode("ascii", errors="replace").split() or ["", ""]
        if op == "+" and len(rest) == 2:
            try:
                grace, pgid = float(rest[0]), int(rest[1])
            except ValueError:
                continue
            registered[tag] = (grace, pgid, tag in registered and registered[tag][2])
        elif op == "c" and tag in registered:
            grace, pgid, _ = registered[tag]
            registered[tag] = (grace, pgid, True)
        elif op == "-":
            registered.pop(tag, None)
    sweep(registered)

if __name__ == "__main__":
    main()
