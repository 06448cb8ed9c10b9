"""`repro run --executor ray --workers N` on Ray's own two-node test cluster (one machine, loopback only)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Iterator

import pytest
from faulty_servers import sessions_seen
from proc_helpers import pids_where, wait_for
from ray_cluster import Cluster, lose_node_b, repro, two_nodes
from rich.console import Console
from run_builders import assert_every_shard_cut_short, assert_worker_1_lost, run_main

from repro.errors import EXIT_INTERNAL, EXIT_INTERRUPTED
from repro.run.options import RunOptions
from repro.run.rayshards import off_machine
from repro.run.runner import execute_run
from repro.store.rundir import load_run

PINNED = '[{"node_a": 1}, {"node_b": 1}]'
"""Worker 0 on node_a, worker 1 on node_b."""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Cluster, dict[str, str]]]:
    """Two Ray nodes on this machine, `node_a` (the head) and `node_b`, each with its own custom resource."""
    yield from two_nodes()


def actor_pids() -> set[int]:
    """Ray worker processes serving a shard actor (Ray titles them `ray::ShardActor...`)."""
    return pids_where("cmdline", lambda cmdline: cmdline.startswith(b"ray::ShardActor"))


def test_a_loopback_target_is_refused_only_when_a_node_is_on_another_machine() -> None:
    assert off_machine("127.0.0.1", "127.0.0.1", ["127.0.0.1", "127.0.0.1"]) == []
    assert off_machine("localhost", "10.0.0.1", ["10.0.0.1", "10.0.0.7", "10.0.0.7"]) == ["10.0.0.7"]
    assert off_machine("gpu-node", "10.0.0.1", ["10.0.0.7"]) == []  # not on loopback: the user's call


def test_bad_ray_options_are_one_line_and_make_no_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "never"
    cases = [
        (["--executor", "ray"], "--executor ray needs --workers N"),
        (["--executor", "slurm", "--workers", "2"], "executor: Input should be 'local' or 'ray'"),
        (["--ray-address", "127.0.0.1:6379", "--workers", "2"], "--ray-address needs --executor ray"),
        (["--worker-resources", "{}", "--workers", "2"], "worker_resources: expected a JSON object"),
        (["--executor", "ray", "--workers", "2", "--worker-resources", '{"CPU": -1}'], "resource 'CPU'"),
        (["--executor", "ray", "--workers", "2", "--worker-resources", '[{"CPU": 1}]'], "2 expected, 1 given"),
        (["--executor", "ray", "--workers", "2", "--ray-address", "nonsense"], "expected HOST:PORT"),
    ]
    for args, expected in cases:
        code, _, err = run_main(capsys, "run", "--out", str(out), *args)
        assert code == 2 and expected in err and err.count("\n") == 1, err
        assert not out.exists()


def test_a_request_no_node_has_is_refused_before_the_run(
    cluster: tuple[Cluster, dict[str, str]], faulty: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made, _ = cluster
    out = tmp_path / "never"
    code, _, err = run_main(capsys, "run", "--base-url", f"{faulty}/good/v1", "--out", str(out), "--workers", "2",
                            "--executor", "ray", "--ray-address", made.address, "--worker-resources", '{"gpu_x": 1}')
    assert code == 2 and "no live node of the cluster has what worker 0 asks for (gpu_x=1)" in err, err
    assert err.count("\n") == 1 and not out.exists()


def test_ray_workers_play_the_same_sessions_as_local_workers_on_the_nodes_asked(
    cluster: tuple[Cluster, dict[str, str]], faulty: str, tmp_path: Path
) -> None:
    made, nodes = cluster
    # leak-every:3 corrupts every third session by its id, whatever the timing: outcomes are per session.
    common = ["--base-url", f"{faulty}/leak-every:3/v1", "--sessions", "12", "--turns", "3", "--seed", "5",
              "--workers", "2"]
    on_ray = repro(["run", *common, "--out", str(tmp_path / "ray"), "--executor", "ray",
                    "--ray-address", made.address, "--worker-resources", PINNED], tmp_path / "ray.log")
    local = execute_run(RunOptions.parse({"base_url": f"{faulty}/leak-every:3/v1", "sessions": 12, "turns": 3,
                                          "seed": 5, "workers": 2, "out": tmp_path / "local"}),
                        console=Console(file=open(os.devnull, "w")), live=False, report=False)
    try:
        assert on_ray.wait(timeout=180) == 0, (tmp_path / "ray.log").read_text()[-3000:]
    finally:
        if on_ray.poll() is None:
            on_ray.kill()
    a, b = load_run(local.path), load_run(tmp_path / "ray")

    def identity(run: object) -> list[tuple[int, str, str]]:
        return sorted((s.session_id, s.task, s.outcome) for s in run.sessions)  # type: ignore[attr-defined]

    assert identity(b) == identity(a)
    assert {outcome for _, _, outcome in identity(b)} == {"clean", "corrupt"}
    assert b.summary is not None and b.summary.sessions == 12 and not b.summary.interrupted
    assert len(b.summary.worker_loop_lag) == 2 and all(p.count > 0 for p in b.summary.worker_loop_lag)
    # Each worker ran on the node its resource names, and the manifest and the report say so.
    places = b.manifest.workers
    assert [(p.index, p.node.get("ray_node_id"), p.lost) for p in places] == [
        (0, nodes["node_a"], None), (1, nodes["node_b"], None)]
    assert not a.manifest.workers[0].node.get("ray_node_id")  # local processes: a host name only
    report = (tmp_path / "ray" / "report.html").read_text()
    assert f"worker 1 on {places[1].node['hostname']} (Ray node {nodes['node_b']})" in report
    # Kept raw responses (the corrupt turns') name files the driver wrote.
    kept = [turn.raw_path for s in b.sessions for turn in s.turns if turn.raw_path]
    assert kept and all((tmp_path / "ray" / path).is_file() for path in kept)
    wait_for(lambda: not actor_pids(), 120, "the run's actors to end")


def test_sigint_stops_the_actors_and_keeps_every_session(
    cluster: tuple[Cluster, dict[str, str]], faulty: str, tmp_path: Path
) -> None:
    made, _ = cluster
    out = tmp_path / "run"
    proc = repro(["run", "--base-url", f"{faulty}/slow:0.1/v1", "--sessions", "12", "--concurrency", "4",
                  "--workers", "2", "--executor", "ray", "--ray-address", made.address,
                  "--worker-resources", PINNED, "--out", str(out)], tmp_path / "run.log")
    sessions_file = out / "sessions.jsonl"
    try:
        wait_for(lambda: sessions_file.exists() and sessions_file.read_text().count("\n") >= 2, 120,
                 "two sessions to finish")
        assert len(actor_pids()) == 2
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == EXIT_INTERRUPTED, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    wait_for(lambda: not actor_pids(), 120, "every actor process to end")
    assert_every_shard_cut_short(out, 12)


def test_a_lost_node_turns_its_sessions_in_flight_into_errors_and_the_run_ends(
    cluster: tuple[Cluster, dict[str, str]], faulty: str, tmp_path: Path
) -> None:
    # Last in the module: it kills node_b.
    made, nodes = cluster
    mode = "slow:0.3~lost"  # 1.5 s a turn: every session is in flight when the node goes
    out = tmp_path / "run"
    proc = repro(["run", "--base-url", f"{faulty}/{mode}/v1", "--sessions", "8", "--turns", "4",
                  "--workers", "2", "--executor", "ray", "--ray-address", made.address,
                  "--worker-resources", PINNED, "--out", str(out)], tmp_path / "run.log")
    code = lose_node_b(made, proc, lambda: len(sessions_seen(faulty, mode)) == 8, "every session's first turn", 120)
    assert code == EXIT_INTERNAL, (tmp_path / "run.log").read_text()[-3000:]
    log = (tmp_path / "run.log").read_text()
    assert "run incomplete: 1 of 2 workers lost (worker 1 (" in log, log[-3000:]
    loaded = assert_worker_1_lost(out)  # node_b's sessions were in flight; node_a's finished
    lost = [p for p in loaded.manifest.workers if p.lost]
    assert [(p.index, p.node["ray_node_id"]) for p in lost] == [(1, nodes["node_b"])]
    assert "worker 1 on" in (out / "report.html").read_text()
    wait_for(lambda: not actor_pids(), 120, "the surviving actor to end")
