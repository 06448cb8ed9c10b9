"""Start the simulator as a real subprocess and wait until it answers: for `repro run`, the matrix and tests."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from repro.errors import TargetError
from repro.procs.process import (
    ManagedProcess,
    confirm_listener,
    free_port,
    port_in_use,
    python_module,
    start_process,
    wait_http_ready,
)

EMBEDDED_SIM_ARGS = ("--enable-hierarchical-cache", "--index-k-dtype", "bf16", "--enable-metrics", "--enable-cache-report")
"""The seeds' faulty configuration: HiCache on, bf16 index-K, no index-K gate (the fix flag absent); metrics on."""


class SimHandle:
    """A running simulator: its URLs and its process. A context manager; `stop()` works as well."""

    def __init__(self, process: ManagedProcess, port: int) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.base_url = f"{self.url}/v1"

    def stop(self, timeout: float = 10.0) -> int | None:
        return self.process.stop(timeout=timeout)

    def __enter__(self) -> "SimHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_sim(
    args: Sequence[str] = (),
    *,
    port: int | None = None,
    log_path: Path | None = None,
    ready_timeout: float = 30.0,
) -> SimHandle:
    """Launch `python -m repro.sim serve --host 127.0.0.1 --port P *args` and wait for `/health` to answer 200.

    Raises TargetError (with the log's tail) when the simulator exits or is not ready in time, or when
    the port answers for another process (taken before the launch, or between choosing and binding it).
    """
    if port is not None and (occupant := port_in_use(port)) is not None:
        raise TargetError(f"port {port} is already in use by {occupant}")
    chosen = port if port is not None else free_port()
    cmd = python_module("repro.sim", "serve", "--host", "127.0.0.1", "--port", str(chosen), *args)
    process = start_process(cmd, log_path=log_path)
    handle = SimHandle(process, chosen)
    try:
        wait_http_ready(f"{handle.url}/health", timeout=ready_timeout, process=process)
        confirm_listener(process, chosen)
    except BaseException:
        handle.stop()
        raise
    return handle
