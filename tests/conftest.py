"""Shared fixtures. Keep it small: each engineer's fixtures live in their own test files when they can."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest
from faulty_servers import start_faulty_server
from hypothesis import HealthCheck, settings

from repro.sim.launch import SimHandle, start_sim

QUICK_MODULES = frozenset({
    "test_architecture", "test_bisect_core", "test_client_encoding", "test_dsml_depth", "test_dsml_encoding",
    "test_dsml_formats", "test_dsml_linear", "test_dsml_properties", "test_dsml_raw", "test_dsml_rules",
    "test_dsml_schema", "test_dsml_stream", "test_dsml_turn_rules", "test_help", "test_matrix_analysis",
    "test_matrix_preflight", "test_matrix_spec",
    "test_run_parts", "test_server_parsers", "test_sim_parts", "test_stats_intervals", "test_stats_power",
    "test_stats_sequential", "test_stats_stratified", "test_stats_twosample", "test_store",
})
"""The quick tier (`pytest -m "not slow"`): pure tests that start no server and no process. Every other
module is slow as a whole, so a new module joins the quick tier only by being named here."""
settings.register_profile("any_load", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("any_load")
"""Hypothesis's defaults fail an example slower than 200 ms and a draw slower than its budget: on a loaded
machine that is the machine, not the property. Every test's own settings start from this profile."""
SHARED_GROUPS = {"test_ray_matrix": "ray", "test_ray_run": "ray", "test_ray_search": "ray", "test_matrix_sequential": "ray"}
"""Modules that must not run beside each other under xdist: each starts a Ray cluster of its own."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the slow tier; under xdist keep each module on one worker (its module-scoped servers and
    clusters start once), and the Ray modules on one worker together."""
    for item in items:
        module = Path(str(item.fspath)).stem
        if module not in QUICK_MODULES:
            item.add_marker(pytest.mark.slow)
        item.add_marker(pytest.mark.xdist_group(SHARED_GROUPS.get(module, module)))


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
