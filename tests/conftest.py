"""Shared fixtures. Keep it small: each engineer's fixtures live in their own test files when they can."""

from __future__ import annotations

from typing import Callable, Iterator

import pytest
from faulty_servers import start_faulty_server

from repro.sim.launch import SimHandle, start_sim


@pytest.fixture
def sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., SimHandle]]:
    """Start simulators as real subprocesses: `sim = sim_server("--enable-hierarchical-cache", ...)`.

    Each call starts one more simulator (its log under a temporary directory); all stop at teardown.
    """
    started: list[SimHandle] = []

    def start(*args: str) -> SimHandle:
        log = tmp_path_factory.mktemp("sim") / "sim.log"
        handle = start_sim(args, log_path=log)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.stop()


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A purpose-built faulty server (tests/faulty_servers.py) for the module; its root URL."""
    proc, root = start_faulty_server(tmp_path_factory.mktemp("faulty") / "server.log")
    yield root
    proc.stop()
