"""For the Ray benchmarks: Ray's two-node test cluster on loopback, and a `repro` command timed as a process.

The nodes are as in the tests (tests/ray_cluster.py): one CPU and 80 MB of object store each, custom
resources `node_a` (the head) and `node_b`, so work can be pinned to either.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep Ray on loopback (docs/cluster.md)

from ray.cluster_utils import Cluster  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NODE = dict(num_cpus=1, object_store_memory=80 * 1024 * 1024, include_dashboard=False, node_ip_address="127.0.0.1")


@contextlib.contextmanager
def two_nodes() -> Iterator[Cluster]:
    """The cluster, both nodes up; shut down after the block."""
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "resources": {"node_a": 1}})
    try:
        cluster.add_node(**NODE, resources={"node_b": 1})
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def timed_repro(out: Path, *args: str) -> float:
    """Wall seconds of `repro ARGS` run from the project root, its output in OUT.log; exits when it fails."""
    start = time.perf_counter()
    with open(out.with_suffix(".log"), "wb") as log:
        command = [sys.executable, "-c", "from repro.cli import main; main()", *args]
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    if code != 0:
        raise SystemExit(f"repro {args[0]} into {out.name} exited {code}; see {out.with_suffix('.log')}")
    return time.perf_counter() - start
