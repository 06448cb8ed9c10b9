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


def two_nodes(**head: Any) -> Iterator[tuple[Cluster, dict[str, str]]]:
    """For a module-scoped fixture: the cluster and the node ids by name; `head` overrides the head's NODE_ARGS."""
    head_args = {**NODE_ARGS, **head, "resources": {"node_a": 1}, "_system_config": FAST_HEALTH}
    made = Cluster(initialize_head=True, head_node_args=head_args)
    try:
        worker = made.add_node(**NODE_ARGS, resources={"node_b": 1})
        made.wait_for_nodes()
        yield made, {"node_a": made.head_node.node_id, "node_b": worker.node_id}
    finally:
        made.shutdown()


def repro(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`repro ARGS` as a process of its own (run from the project root), stdout and stderr into `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen([*REPRO, *args], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


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
