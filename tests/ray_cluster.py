"""Ray's own multi-node test cluster on this machine, for the `--executor ray` tests: two nodes bound to
loopback, `node_a` (the head) and `node_b`, each with a custom resource of its name so work can be
pinned to either; and a `repro` command started as a real process with its output in a log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from proc_helpers import wait_for

# A cluster bound to loopback only: without this, Ray resolves 127.0.0.1 to the machine's outward address.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REPRO = [sys.executable, "-c", "from repro.cli import main; main()"]
NODE_ARGS = dict(num_cpus=1, object_store_memory=80 * 1024 * 1024, include_dashboard=False, node_ip_address="127.0.0.1")
FAST_HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
"""Health checks every 0.5 s: a killed node is known dead in seconds, not half a minute."""
NODES_UP_S = 240
"""How long the two nodes may take to register: only whether they do is the question."""


def two_nodes(**head: Any) -> Iterator[tuple[Cluster, dict[str, str]]]:
    """For a module-scoped fixture: the cluster and the node ids by name; `head` overrides the head's NODE_ARGS."""
    head_args = {**NODE_ARGS, **head, "resources": {"node_a": 1}, "_system_config": FAST_HEALTH}
    # Ray's own waits for a node to register are 30 s each; a loaded machine takes longer: one wait here.
    made = Cluster(initialize_head=True, head_node_args={**head_args, "wait": False})
    try:
        worker = made.add_node(**NODE_ARGS, resources={"node_b": 1}, wait=False)
        made.wait_for_nodes(timeout=NODES_UP_S)
        yield made, {"node_a": made.head_node.node_id, "node_b": worker.node_id}
    finally:
        made.shutdown()


def repro(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`repro ARGS` as a process of its own (run from the project root), stdout and stderr into `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen([*REPRO, *args], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def ended(proc: subprocess.Popen[bytes], grace: float = 120) -> None:
    """Ctrl-C to `proc` if it still runs (a `repro` command cancels its Ray tasks on it), killed if it
    outlives `grace` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


class Commands:
    """The `repro` commands one test starts. Any still running when the test ends (it failed, or pytest's
    per-test timeout fired) is interrupted and its log's tail printed: a command left running holds the
    cluster's CPUs, and every later test of the module would then wait behind its Ray tasks."""

    def __init__(self) -> None:
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def __call__(self, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        proc = repro(args, log)
        self.started.append((proc, log))
        return proc

    def close(self) -> None:
        for proc, log in self.started:
            if proc.poll() is None:
                print(f"still running at the test's end, interrupted: repro {' '.join(proc.args[3:])}\n"
                      f"{log.read_text(errors='replace')[-3000:]}")
                ended(proc)


def commands() -> Iterator[Commands]:
    """For a function-scoped fixture: a `Commands` closed when the test ends, however it ends."""
    started = Commands()
    try:
        yield started
    finally:
        started.close()


def interrupt_when(proc: subprocess.Popen[bytes], ready: Callable[[], bool], what: str, timeout: float = 120) -> int:
    """Once `ready()` (`what`, waited for up to 180 s), Ctrl-C to `proc`: its exit code within `timeout`
    seconds. A `proc` still running when this fails is killed."""
    try:
        wait_for(lambda: ready() or proc.poll() is not None, 180, what)
        proc.send_signal(signal.SIGINT)
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()


def lose_node_b(made: Cluster, proc: subprocess.Popen[bytes], ready: Callable[[], bool], what: str, timeout: float) -> int:
    """Once `ready()` (`what`, waited for up to 180 s), kill node_b (no grace) while `proc` runs: `proc`'s
    exit code within `timeout` seconds. A `proc` still running when this fails gets a SIGINT."""
    try:
        wait_for(lambda: ready() or proc.poll() is not None, 180, what)
        (worker,) = made.worker_nodes
        made.remove_node(worker, allow_graceful=False)
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
