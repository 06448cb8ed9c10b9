"""Docker containers the harness launches: labelled when launched, removed by their label when stopped.

Killing a `docker run` client does not stop its container (only a signal the client lives to proxy does),
so a harness that dies hard would leave an 8-GPU server running. Every `docker run` the harness starts
gets `--label repro.run=<launch tag>` and `--label repro.owner=<harness pid>`; stopping the launch, and
the reaper after a SIGKILL of the harness, remove every container carrying its label
(`docker rm -f`). By hand: `docker ps --filter label=repro.run`.

Standard library only: the reaper imports it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Sequence

LABEL = "repro.run"
"""Carries the launch's tag (REPRO_PROCESS_TAG): one value per launched process."""
OWNER_LABEL = "repro.owner"
"""The harness's process id, for a person reading `docker ps`."""
DOCKER_TIMEOUT = 60.0
"""Seconds one docker command may take before the removal gives up on it."""
_VALUE_OPTIONS = ("--context", "-c", "--host", "-H", "--config", "--log-level", "-l")
"""Docker's global options that take a separate value (before the subcommand)."""


def _run_index(argv: Sequence[str]) -> int | None:
    """Where a `docker [global options] run` / `docker container run` command's own options start; None
    when `argv` is not one."""
    if not argv or os.path.basename(argv[0]) != "docker":
        return None
    index = 1
    while index < len(argv) and argv[index].startswith("-"):
        index += 2 if argv[index] in _VALUE_OPTIONS else 1
    if index < len(argv) and argv[index] == "run":
        return index + 1
    if argv[index:index + 2] == ["container", "run"]:
        return index + 2
    return None


def labelled(argv: Sequence[str], tag: str, owner: int | str) -> tuple[list[str], str | None]:
    """`argv` with the launch's labels when it is a `docker run`, and the label value to remove it by
    (None for any other command, which is left as it is)."""
    at = _run_index(argv)
    if at is None:
        return list(argv), None
    labels = ["--label", f"{LABEL}={tag}", "--label", f"{OWNER_LABEL}={owner}"]
    return [*argv[:at], *labels, *argv[at:]], tag


def _ids(docker: str, tag: str, env: dict[str, str] | None) -> list[str]:
    found = subprocess.run(
        [docker, "ps", "-aq", "--filter", f"label={LABEL}={tag}"],
        capture_output=True, text=True, timeout=DOCKER_TIMEOUT, env=env, check=False,
    )
    return found.stdout.split()


def in_containers(cgroup: str, ids: list[str]) -> bool:
    """Whether a process whose /proc/PID/cgroup reads `cgroup` runs in one of the containers `ids`: docker
    names the container's cgroup after its full id (`/docker/<id>`, `docker-<id>.scope`), which begins with
    the short one `docker ps -q` prints."""
    return any(cid in cgroup for cid in ids if len(cid) >= 12)


def owned(tag: str, pids: set[int]) -> set[int]:
    """Those of `pids` that run inside the container labelled `repro.run=<tag>`: a server in a container
    (its own process tree, none of the launch's environment) holds the port for the launch."""
    docker = shutil.which("docker")
    if docker is None or not pids:
        return set()
    try:
        ids = _ids(docker, tag, None)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    found = set()
    for pid in pids:
        try:
            cgroup = open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace").read()
        except OSError:
            continue
        if in_containers(cgroup, ids):
            found.add(pid)
    return found


def remove(tag: str, *, env: dict[str, str] | None = None) -> list[str]:
    """Remove (`docker rm -f`) every container labelled `repro.run=<tag>`; the ids removed.

    Best effort and bounded: no docker on PATH, or a daemon that does not answer, removes nothing.
    """
    docker = shutil.which("docker", path=(env or os.environ).get("PATH"))
    if docker is None:
        return []
    try:
        ids = _ids(docker, tag, env)
        if ids:
            subprocess.run([docker, "rm", "-f", *ids], capture_output=True, timeout=DOCKER_TIMEOUT, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return ids
