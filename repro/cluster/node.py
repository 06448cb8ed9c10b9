"""Where this process runs: the host name, and the Ray node id when it runs in a Ray task or actor.

Recorded in each run's manifest and each matrix run's progress record, so a fault that only one
machine shows (a driver, a GPU, a NIC) can be told from one a feature causes.
"""

from __future__ import annotations

import socket
import sys


def where() -> dict[str, str]:
    """`{"hostname": ...}`, plus `ray_node_id` inside a Ray worker (Ray is never imported here)."""
    node = {"hostname": socket.gethostname()}
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        context = ray.get_runtime_context()
        if context.worker.mode == ray.WORKER_MODE:
            node["ray_node_id"] = context.get_node_id()
    return node


def describe(node: dict[str, str] | None) -> str | None:
    """`HOST`, or `HOST (Ray node ID)`, for a report or a terminal line; None when where it ran is unknown."""
    if not node:
        return None
    ray_node = node.get("ray_node_id")
    return node.get("hostname", "unknown host") + (f" (Ray node {ray_node})" if ray_node else "")
