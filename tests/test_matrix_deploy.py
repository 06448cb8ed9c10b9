"""Launching matrix cells for real: simulator processes, a PD topology, external hooks, readiness
failures, and `/server_info` confirmation that stops a cell running the wrong configuration."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from proc_helpers import group_gone, poll
from rich.console import Console

from repro.errors import TargetError, UsageError
from repro.matrix.analysis import CellRun, analyse
from repro.matrix.cell import run_cell
from repro.matrix.deploy import (
    CellDeployment,
    ConfirmationError,
    fetch_server_info,
    mismatches,
    processes_file,
    resolve,
)
from repro.matrix.design import cells, plan
from repro.matrix.report import write_reports
from repro.matrix.spec import MatrixSpec
from repro.sim.launch import start_sim

SIM = "${python} -m repro.sim serve --host 127.0.0.1 --port ${port} --time-scale 0"
READY = {"timeout": 120, "interval": 0.05}


def spec_of(factors: dict[str, Any], deployment: dict[str, Any], **extra: Any) -> MatrixSpec:
    spec = MatrixSpec.model_validate(
        {"name": "d", "variables": {"port": "auto", **extra.pop("variables", {})}, "factors": factors,
         "deployment": deployment, **extra}
    )
    assert spec.problems() == []
    return spec


HICACHE = {
    "levels": {
        "off": {"confirm": {"enable_hierarchical_cache": False}},
        "on": {"flags": "--enable-hierarchical-cache", "confirm": {"enable_hierarchical_cache": True}},
    }
}


def run_for(spec: MatrixSpec, **levels: str):
    return next(r for r in plan(spec) if r.cell.as_dict() == levels)


def test_single_server_cell_is_confirmed_and_torn_down(tmp_path: Path) -> None:
    spec = spec_of({"hicache": HICACHE}, {"command": SIM, "port": "${port}", "ready": READY})
    launch = resolve(spec, run_for(spec, hicache="on"), log_dir=tmp_path)
    assert launch.processes[0].argv[-1] == "--enable-hierarchical-cache"
    with CellDeployment(launch, tmp_path, cell="c") as confirmation:
        info = confirmation.server_info["server"]
        assert info is not None and info["enable_hierarchical_cache"] is True
        assert httpx.get(f"{launch.url}/v1/models", timeout=5).status_code == 200
        (entry,) = processes_file(tmp_path)
    assert entry["name"] == "server"
    assert group_gone(entry["pgid"])
    assert "fired up" in (tmp_path / "server.log").read_text()


def test_configuration_mismatch_stops_the_cell_with_key_expected_and_actual(tmp_path: Path) -> None:
    # The seeds' trap: a level that claims HiCache on but launches without the flag.
    lying = {"levels": {"off": {}, "on": {"confirm": {"enable_hierarchical_cache": True}}}}
    spec = spec_of({"hicache": lying}, {"command": SIM, "port": "${port}", "ready": READY})
    launch = resolve(spec, run_for(spec, hicache="on"), log_dir=tmp_path)
    with pytest.raises(ConfirmationError) as info:
        with CellDeployment(launch, tmp_path, cell="hicache-on-r1"):
            pytest.fail("a mismatched cell must not run")
    message = str(info.value)
    assert "hicache-on-r1" in message and "enable_hierarchical_cache is False, the spec asked for True" in message
    assert info.value.exit_code == 3
    assert group_gone(processes_file(tmp_path)[0]["pgid"])


def test_pd_topology_applies_levels_per_process_and_confirms_each(tmp_path: Path) -> None:
    deployment = {
        "processes": [
            {"name": "prefill", "command": SIM.replace("${port}", "${p_port}") + " --disaggregation-mode prefill",
             "port": "${p_port}", "confirm": {"disaggregation_mode": "prefill"}},
            {"name": "decode", "command": SIM.replace("${port}", "${d_port}") + " --disaggregation-mode decode",
             "port": "${d_port}", "confirm": {"disaggregation_mode": "decode"}},
            # A stand-in router: takes no feature flags, so its /server_info must show HiCache off.
            {"name": "router", "command": SIM, "port": "${port}", "features": False,
             "confirm": {"enable_hierarchical_cache": False}},
        ],
        "ready": READY,
    }
    spec = spec_of({"hicache": HICACHE}, deployment, variables={"p_port": "auto", "d_port": "auto"})
    launch = resolve(spec, run_for(spec, hicache="on"), log_dir=tmp_path)
    assert [p.name for p in launch.processes] == ["prefill", "decode", "router"]
    with CellDeployment(launch, tmp_path, cell="pd") as confirmation:
        assert confirmation.server_info["prefill"]["disaggregation_mode"] == "prefill"
        assert confirmation.server_info["decode"]["enable_hierarchical_cache"] is True
        assert confirmation.server_info["router"]["enable_hierarchical_cache"] is False
        assert launch.url.endswith(launch.processes[2].ready_url.rsplit(":", 1)[1].split("/")[0])
        groups = [p["pgid"] for p in processes_file(tmp_path)]
    assert len(groups) == 3 and all(group_gone(g) for g in groups)


def test_process_that_dies_before_ready_names_itself_and_its_output(tmp_path: Path) -> None:
    crash = f"{sys.executable} -c \"import sys; print('no GPU found'); sys.exit(7)\""
    spec = spec_of({"x": {"levels": {"a": {}, "b": {}}}}, {"command": crash, "port": "${port}", "ready": READY})
    launch = resolve(spec, plan(spec)[0], log_dir=tmp_path)
    with pytest.raises(TargetError, match="code 7 before .* its output ends with: | no GPU found"):
        with CellDeployment(launch, tmp_path, cell="c"):
            pass


def test_readiness_timeout_stops_the_group(tmp_path: Path) -> None:
    spec = spec_of(
        {"x": {"levels": {"a": {}, "b": {}}}},
        {"command": "sleep 60", "port": "${port}", "ready": {"timeout": 0.5, "interval": 0.05}},
    )
    launch = resolve(spec, plan(spec)[0], log_dir=tmp_path)
    with pytest.raises(TargetError, match="not ready after .*ready timeout 0.5s"):
        with CellDeployment(launch, tmp_path, cell="c"):
            pass
    assert group_gone(processes_file(tmp_path)[0]["pgid"])


def test_external_hooks_get_the_flags_and_always_tear_down(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    state.mkdir()
    setup = (
        f"echo \"$REPRO_FLAGS\" > {state}/flags; "
        f"nohup {SIM} $REPRO_FLAGS > {state}/sim.log 2>&1 & echo $! > {state}/pid"
    )
    teardown = f"kill $(cat {state}/pid); echo done > {state}/torn-down"
    deployment = {"external": {"setup": setup, "teardown": teardown, "url": "http://127.0.0.1:${port}",
                               "hook_timeout": 20}, "ready": READY}
    spec = spec_of({"hicache": HICACHE}, deployment)
    launch = resolve(spec, run_for(spec, hicache="on"), log_dir=tmp_path / "logs")
    with CellDeployment(launch, tmp_path / "logs", cell="ext") as confirmation:
        assert confirmation.server_info["external"]["enable_hierarchical_cache"] is True
    assert (state / "flags").read_text().strip() == "--enable-hierarchical-cache"
    assert (state / "torn-down").exists()
    pid = int((state / "pid").read_text())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()


def test_failing_setup_hook_is_a_target_error_and_teardown_still_runs(tmp_path: Path) -> None:
    marker = tmp_path / "torn-down"
    deployment = {"external": {"setup": "echo quota exceeded; exit 4", "teardown": f"touch {marker}",
                               "url": "http://127.0.0.1:${port}", "hook_timeout": 20}, "ready": READY}
    spec = spec_of({"hicache": HICACHE}, deployment)
    launch = resolve(spec, plan(spec)[0], log_dir=tmp_path)
    with pytest.raises(TargetError, match="setup hook exited with code 4: quota exceeded"):
        with CellDeployment(launch, tmp_path, cell="ext"):
            pass
    assert marker.exists()


def test_levels_selecting_two_deployments_in_one_cell_is_a_usage_error(tmp_path: Path) -> None:
    spec = MatrixSpec.model_validate(
        {
            "name": "d",
            "factors": {"a": {"levels": {"x": {"deployment": "one"}, "y": {}}},
                        "b": {"levels": {"x": {"deployment": "two"}, "y": {}}}},
            "deployments": {"one": {"command": "true", "port": 1}, "two": {"command": "true", "port": 2}},
        }
    )
    with pytest.raises(UsageError, match="a selects 'one', b selects 'two'"):
        resolve(spec, run_for(spec, a="x", b="x"), log_dir=tmp_path)


def test_level_command_and_vars_replace_the_build(tmp_path: Path) -> None:
    spec = spec_of(
        {"index_k": {"levels": {"fp8": {}, "bf16": {"vars": {"image": "${patched}"}, "env": {"IDX": "bf16"}}}}},
        {"command": "run ${image} --port ${port} ${flags} --tail", "port": "${port}"},
        variables={"image": "upstream", "patched": "local/bf16"},
    )
    launch = resolve(spec, run_for(spec, index_k="bf16"), log_dir=tmp_path, port_source=lambda: 4242)
    assert launch.processes[0].argv == ["run", "local/bf16", "--port", "4242", "--tail"]
    assert launch.processes[0].env == {"IDX": "bf16"}
    assert launch.url == "http://127.0.0.1:4242"


def test_mismatches_compare_types_strictly() -> None:
    info = {"enable_hierarchical_cache": True, "page_size": 256, "kv": {"dtype": "fp8"}}
    assert mismatches({"enable_hierarchical_cache": True, "page_size": 256.0, "kv.dtype": "fp8"}, info) == []
    assert mismatches({"enable_hierarchical_cache": "true"}, info) == [
        "enable_hierarchical_cache is True, the spec asked for 'true'"
    ]
    assert mismatches({"index_k_dtype": "bf16"}, info) == ["index_k_dtype is absent, the spec asked for 'bf16'"]


def test_a_port_answered_by_a_foreign_server_is_refused_before_launch(tmp_path: Path) -> None:
    # The occupant answers /health and even /server_info with the very configuration asked for:
    # only who holds the port tells it apart from the cell's own server.
    occupant = start_sim(["--time-scale", "0", "--enable-hierarchical-cache"], log_path=tmp_path / "occupant.log")
    try:
        spec = spec_of({"hicache": HICACHE}, {"command": SIM, "port": "${port}", "ready": READY},
                       variables={"port": str(occupant.port)})
        launch = resolve(spec, run_for(spec, hicache="on"), log_dir=tmp_path / "cell")
        with pytest.raises(TargetError, match=f"port {occupant.port} is already in use by pid {occupant.process.pid} "):
            with CellDeployment(launch, tmp_path / "cell", cell="c"):
                pytest.fail("a cell must not measure a server it did not start")
        assert processes_file(tmp_path / "cell") == []
        assert occupant.process.alive
    finally:
        occupant.stop()


def test_a_port_taken_after_the_launch_is_caught_by_who_holds_it(tmp_path: Path) -> None:
    # The launched process stays alive but something it does not own (no tag, own session) takes
    # the port, as an occupant that wins the race to bind does.
    pidfile = tmp_path / "occupant.pid"
    command = (f"bash -c 'env -u REPRO_PROCESS_TAG setsid {SIM} --enable-hierarchical-cache & echo $! > {pidfile}; "
               "exec sleep 300'")
    spec = spec_of({"hicache": HICACHE}, {"command": command, "port": "${port}", "ready": READY})
    launch = resolve(spec, run_for(spec, hicache="on"), log_dir=tmp_path)
    try:
        held = r"port \d+ is held by pid \d+ \(.*repro.sim serve.*\), not by the launched bash"
        with pytest.raises(TargetError, match=held):
            with CellDeployment(launch, tmp_path, cell="c"):
                pytest.fail("a cell must not measure a server it did not start")
        assert group_gone(processes_file(tmp_path)[0]["pgid"])
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_a_port_lost_between_its_choice_and_the_bind_is_relaunched_on_a_fresh_one(tmp_path: Path) -> None:
    # The launched command says which port it got and waits; the test takes that port first, as another
    # matrix on the machine can (its own free_port() may return the same number), then lets it go on.
    ports, go = tmp_path / "ports", tmp_path / "go"
    command = f"bash -c 'echo ${{port}} >> {ports}; while [ ! -e {go} ]; do sleep 0.05; done; exec {SIM}'"
    spec = spec_of({"hicache": HICACHE}, {"command": command, "port": "${port}", "ready": READY},
                   load={"sessions": 2, "turns": 2, "timeout": 60})
    taken = threading.Event()
    done = threading.Event()

    def occupy() -> None:
        if poll(lambda: ports.exists() and ports.read_text().strip() != "", timeout=60):
            with socket.create_server(("127.0.0.1", int(ports.read_text().split()[0]))):
                taken.set()
                go.touch()
                done.wait(timeout=120)
        go.touch()

    occupant = threading.Thread(target=occupy)
    occupant.start()
    console = io.StringIO()
    try:
        result = run_cell(spec, run_for(spec, hicache="off"), tmp_path / "m", total=1,
                          console=Console(file=console, width=300), cell_reports=False)
    finally:
        done.set()
        occupant.join(timeout=30)
    assert taken.is_set()
    first, second = map(int, ports.read_text().split())
    assert result.status == "finished", result.message
    assert f"port {first} is held by" in console.getvalue() and "relaunching on fresh ports" in console.getvalue()
    assert second != first and f":{second}" in json.dumps(result.launch)


def test_a_server_without_server_info_leaves_the_cell_unconfirmed_and_failed(tmp_path: Path) -> None:
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "health").write_text("ok")
    server = "${python} -m http.server ${port} --bind 127.0.0.1 --directory " + str(tmp_path / "www")
    spec = spec_of({"hicache": HICACHE}, {"command": server, "port": "${port}", "ready": READY})
    launch = resolve(spec, run_for(spec, hicache="off"), log_dir=tmp_path / "cell")
    with pytest.raises(ConfirmationError, match="server has no /server_info, so enable_hierarchical_cache cannot be "
                                                "confirmed"):
        with CellDeployment(launch, tmp_path / "cell", cell="c"):
            pytest.fail("an unconfirmed configuration must not be measured")
    assert group_gone(processes_file(tmp_path / "cell")[0]["pgid"])


def test_a_server_dying_under_load_is_seen_and_the_rest_of_the_deployment_stopped(tmp_path: Path) -> None:
    deployment = {
        "processes": [
            {"name": "backend", "command": SIM.replace("${port}", "${b_port}"), "port": "${b_port}"},
            {"name": "router", "command": SIM, "port": "${port}", "features": False},
        ],
        "ready": READY,
        "stop_timeout": 5,
    }
    spec = spec_of({"hicache": HICACHE}, deployment, variables={"b_port": "auto"})
    launch = resolve(spec, run_for(spec, hicache="on"), log_dir=tmp_path)
    cell = CellDeployment(launch, tmp_path, cell="c-r1")
    with cell, cell.watch() as watch:
        backend, router = (proc for _, proc in cell.launched())
        os.kill(backend.pid, signal.SIGKILL)
        assert poll(lambda: watch.exit is not None)
        assert poll(lambda: not router.alive)  # stopped at once: the load's requests fail fast
    message = watch.exit.message("c-r1")
    assert message.startswith("cell c-r1: backend was killed by SIGKILL while the load ran; its output ends with: ")
    assert "Uvicorn running" in message or "fired up" in message
    assert all(group_gone(p["pgid"]) for p in processes_file(tmp_path))


def test_a_cells_log_is_capped_as_the_spec_says(tmp_path: Path) -> None:
    chatty = "${python} -c \"[print('x' * 99) for _ in range(50000)]; print('bye')\""
    spec = spec_of({"x": {"levels": {"a": {}, "b": {}}}},
                   {"command": chatty, "port": "${port}", "ready": READY, "log_max_bytes": 100_000})
    run = plan(spec)[0]
    launch = resolve(spec, run, log_dir=tmp_path)
    cell = CellDeployment(launch, tmp_path, cell="c")
    with pytest.raises(TargetError, match=r"exited with code 0 before .* \| bye"):
        with cell:
            pass
    assert sum(f.stat().st_size for f in tmp_path.glob("server.log*")) < 101_000
    assert "[repro: this log is capped at 100000 bytes" in (tmp_path / "server.log").read_text()
    (note,) = cell.log_notes()
    assert note.startswith("server.log reached the cap of 100000 bytes")
    # The matrix report says so beside the run.
    record = CellRun(key=run.key, cell=run.cell.as_dict(), replicate=1, order=0, status="failed", message="m",
                     notes=[note])
    analysis = analyse(spec, [record], [c.as_dict() for c in cells(spec)], 2)
    page = write_reports(tmp_path, analysis, ["x"], [record]).html.read_text()
    assert f"<li>{run.key}: server.log reached the cap of 100000 bytes" in page


def test_an_endless_server_info_is_cut_at_its_bound_and_named(faulty: str) -> None:
    with pytest.raises(TargetError, match="cannot read the server configuration: the answer did not end within 16777216"):
        fetch_server_info(f"{faulty}/endless-side/server_info", timeout=60)
