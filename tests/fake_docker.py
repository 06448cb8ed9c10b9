"""A stand-in for the `docker` command line, for tests: records every call and keeps a container state.

`install(directory)` writes an executable `docker` there (put that directory first on PATH). Every call is
appended to `calls.jsonl` in the directory; containers live in `containers.json`:

- `docker run [options] IMAGE [COMMAND…]`: records a running container (its labels, its name) and runs
  COMMAND as its "container process" (sleeps when there is none): in a session of its own, without the
  client's environment, and the client waits for it, proxying SIGTERM to it. As with a real container,
  it outlives its client: if the client is killed, the container stays running in the state until
  `docker rm -f` removes it. When COMMAND ends, `--rm` removes it.
- `docker ps [-a] [-q] [--filter label=K[=V]]…`: the running containers' ids that carry every label.
- `docker rm -f ID…`: kills the container's process and removes it.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
VALUE_OPTIONS = {"--name", "--gpus", "--network", "--ipc", "-v", "--volume", "--label", "-l", "-e", "--env", "-p",
                 "--publish", "--shm-size", "--entrypoint", "-w", "--workdir", "-u", "--user"}


def install(directory: Path) -> Path:
    """Write the fake `docker` into `directory`; returns it (prepend it to PATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "docker"
    script.write_text(
        f'#!/bin/sh\nFAKE_DOCKER_DIR={directory} exec {sys.executable} {HERE / "fake_docker.py"} "$@"\n', encoding="utf-8"
    )
    script.chmod(0o755)
    return directory


def calls(directory: Path) -> list[list[str]]:
    """Every recorded call's arguments, in order."""
    path = directory / "calls.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def running(directory: Path) -> list[dict[str, Any]]:
    """The containers that are running now."""
    path = directory / "containers.json"
    state = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    return [c for c in state.values() if c["status"] == "running"]


@contextmanager
def _state(directory: Path) -> Iterator[dict[str, Any]]:
    with open(directory / "containers.lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = directory / "containers.json"
        state = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        yield state
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state), encoding="utf-8")
        tmp.replace(path)


def _run(directory: Path, args: list[str]) -> int:
    labels: dict[str, str] = {}
    name, remove, index = None, False, 0
    while index < len(args) and args[index].startswith("-"):
        option, _, inline = args[index].partition("=")
        if option in VALUE_OPTIONS:
            value = inline if inline else args[index + 1]
            index += 1 if inline else 2
            if option in ("--label", "-l"):
                key, _, label_value = value.partition("=")
                labels[key] = label_value
            elif option == "--name":
                name = value
        else:
            remove = remove or option == "--rm"
            index += 1
    command = args[index + 1:] or ["sleep", "3600"]
    cid = uuid.uuid4().hex[:12]
    # A container is not the client's child: its own session, none of the client's environment.
    env = {k: v for k, v in os.environ.items() if k != "REPRO_PROCESS_TAG"}
    child = subprocess.Popen(command, start_new_session=True, env=env)
    with _state(directory) as state:
        state[cid] = {"id": cid, "name": name, "labels": labels, "pid": child.pid, "status": "running"}
    # A signal the client lives to receive is proxied to the container (docker's sig-proxy).
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    code = child.wait()
    with _state(directory) as state:
        if remove or state[cid]["status"] == "removed":
            state[cid]["status"] = "removed"
        else:
            state[cid]["status"] = "exited"
    return code


def _ps(directory: Path, args: list[str]) -> int:
    wanted = [args[i + 1].removeprefix("label=") for i, a in enumerate(args) if a == "--filter"]
    with _state(directory) as state:
        for container in state.values():
            if container["status"] != "running":
                continue
            labels = container["labels"]
            if all((w.partition("=")[0] in labels) if "=" not in w else labels.get(w.partition("=")[0]) == w.partition("=")[2]
                   for w in wanted):
                print(container["id"])
    return 0


def _rm(directory: Path, args: list[str]) -> int:
    with _state(directory) as state:
        for cid in (a for a in args if not a.startswith("-")):
            container = state.get(cid)
            if container is None:
                continue
            try:
                os.killpg(container["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
            container["status"] = "removed"
    return 0


def main() -> int:
    directory = Path(os.environ["FAKE_DOCKER_DIR"])
    args = sys.argv[1:]
    with open(directory / "calls.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(args) + "\n")
    if args[:1] == ["run"]:
        return _run(directory, args[1:])
    if args[:1] == ["ps"]:
        return _ps(directory, args[1:])
    if args[:1] == ["rm"]:
        return _rm(directory, args[1:])
    print(f"fake docker: {args[:1]} is not faked", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
