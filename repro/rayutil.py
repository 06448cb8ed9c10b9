"""Ray for repro's executors: is it installed, is the cluster there, connect, ask for resources, node facts.

Shared by `repro matrix --executor ray` (repro.matrix.ray_executor) and `repro run --executor ray`
(repro.rayshards). Ray is imported only inside `connect`: a usage error never waits for it, and
repro works without the `cluster` extra.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import sys
from typing import Any, Iterator

from repro.errors import UsageError

CONNECT_CHECK_S = 10.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
RAY_NAMES = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}
"""Resources Ray takes as task options of their own; any other name is a custom resource."""


def task_options(resources: dict[str, float]) -> dict[str, Any]:
    """Ray task (or actor) options asking for `resources` (names: CPU, GPU, memory, custom ones)."""
    options: dict[str, Any] = {"num_cpus": 0}
    custom: dict[str, float] = {}
    for name, amount in resources.items():
        if name in RAY_NAMES:
            options[RAY_NAMES[name]] = amount
        else:
            custom[name] = amount
    if custom:
        options["resources"] = custom
    return options


def require_ray(address: str | None) -> None:
    """UsageError unless Ray is installed (the `cluster` extra) and something answers at `address`.

    Checked before a run or matrix directory is made; Ray itself is imported only to connect.
    """
    if importlib.util.find_spec("ray") is None:
        raise UsageError("--executor ray needs Ray: pip install 'repro[cluster]'")
    if address and address not in ("auto", "local"):
        _check_reachable(address)


def _check_reachable(address: str) -> None:
    """UsageError at once when nothing answers at HOST:PORT (Ray would retry it for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--ray-address {address}: expected HOST:PORT (the head node's GCS address)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_CHECK_S).close()
    except OSError as err:
        raise UsageError(f"--ray-address {address}: nothing answers there ({err.strerror or err})") from None


def connect(address: str | None) -> tuple[Any, bool]:
    """The `ray` module, connected; True when this call connected it (and should disconnect)."""
    host = (address or "").rpartition(":")[0].strip("[]")
    if host in LOOPBACK and "ray" not in sys.modules:
        # Ray rewrites a loopback address to the machine's outward one before connecting, which a
        # Ray bound to loopback does not answer. This switch (read when ray is imported) keeps loopback.
        os.environ.setdefault(LOCAL_ONLY_ENV, "0")
    import ray
    if ray.is_initialized():
        return ray, False
    try:
        # No address: a one-machine Ray started here and stopped at the end (RAY_ADDRESS is honoured).
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise UsageError(f"--ray-address {address}: cannot connect to Ray: {str(err).splitlines()[0]}") from None
    return ray, True


@contextlib.contextmanager
def connected(address: str | None) -> Iterator[Any]:
    """`connect` for a block: the `ray` module, disconnected at the end when the block connected it."""
    ray, owned = connect(address)
    try:
        yield ray
    finally:
        if owned:
            ray.shutdown()


def fits(asked: dict[str, float], node: dict[str, float]) -> bool:
    """Whether a node with resources `node` (Ray's names) can take a request of `asked` (Ray's names too)."""
    return all(node.get(name, 0.0) >= amount for name, amount in asked.items() if amount > 0)


def alive_nodes(ray: Any) -> list[dict[str, Any]]:
    """`ray.nodes()` entries of the nodes alive now (NodeID, NodeManagerAddress, Resources, ...)."""
    return [node for node in ray.nodes() if node.get("Alive")]
