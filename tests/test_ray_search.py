"""`repro bisect` and `repro sweep` with `--executor ray` on Ray's own two-node test cluster (one machine,
loopback only): real `repro` processes, real Ray tasks launching real simulators on the nodes."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from proc_helpers import marked_pids, pids_where, wait_for
from ray_cluster import Cluster, Commands, commands, interrupt_when, lose_node_b, two_nodes
from run_builders import run_main

from repro.bisect.simrepo import BUILD, DEPLOY, build_repo
from repro.procs.process import free_port

LOAD = ["--sessions", "16", "--turns", "14"]
# Long sessions: HiCache with the bf16 index-K corrupts about half the sessions at 16 at once; on the virtual
# clock, so each probe's and level's count is its seed's at any machine load.
COMMON = "--clock virtual --time-scale 0.05 --final-after-turns 10"

pytestmark = pytest.mark.slow
PER_TEST_TIMEOUT_S = 300  # pyproject's; a wait that long only bounds a run without pytest-timeout
# A whole search, probe after probe: its work is fixed (the virtual clock's counts), its time the
# machine's. Measured here: 25-75 s at load 14, 255-265 s at load 25 (two busy loops beside other work), so
# the budget is twice pyproject's.
SEARCH_TIMEOUT = pytest.mark.timeout(2 * PER_TEST_TIMEOUT_S)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Cluster, dict[str, str]]]:
    """Two Ray nodes on this machine with one CPU each: `node_a` (the head) and `node_b`, each with its own
    custom resource. Two one-CPU probes at once therefore run one on each node. Fast health checks: the
    last test kills node_b."""
    yield from two_nodes()


@pytest.fixture
def repro() -> Iterator[Commands]:
    """`repro ARGS` as a process; one still running when the test ends is interrupted (its Ray tasks with it)."""
    yield from commands()


def finish(proc: subprocess.Popen[bytes], log: Path) -> int:
    """`proc`'s exit code. No budget of its own: how long a search takes is the machine's load, so pytest's
    per-test timeout bounds it (and the `repro` fixture then interrupts the command)."""
    try:
        return proc.wait(timeout=2 * PER_TEST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(log.read_text()[-3000:]) from None


def test_bad_executor_combinations_are_one_line_and_make_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "never"
    flags = ["bisect", "flags", "--good", "--tp 8", "--bad", "--tp 4", "--out", str(out)]
    commits = ["bisect", "commits", "--repo", str(tmp_path), "--good", "a", "--bad", "b", "--deploy", "x",
               "--out", str(out)]
    sweep = ["sweep", "--concurrency", "1,4", "--out", str(out)]
    cases = [
        ([*flags, "--parallel", "2"], "--parallel 2 needs --executor ray"),
        ([*flags, "--resources", '{"GPU": 1}'], "--resources needs --executor ray"),
        ([*flags, "--ray-address", "127.0.0.1:1"], "--ray-address needs --executor ray"),
        ([*flags, "--executor", "ray", "--parallel", "0"], "--parallel must be at least 1"),
        ([*flags, "--executor", "ray", "--resources", "GPU=1"], "--resources 'GPU=1': not JSON"),
        ([*flags, "--executor", "ray", "--resources", '{"GPU": -1}'], "'GPU' must be a number >= 0"),
        ([*flags, "--executor", "nope"], "--executor 'nope': expected one of local, ray"),
        ([*commits, "--executor", "ray", "--ray-address", f"127.0.0.1:{free_port()}"], "nothing answers there"),
        ([*sweep, "--executor", "ray", "--base-url", "http://127.0.0.1:1/v1"], "--base-url names a running server"),
        ([*sweep, "--resources", '{"GPU": 1}'], "--resources needs --executor ray"),
        ([*sweep, "--executor", "ray", "--resources", "[1]"], "expected a JSON object"),
    ]
    for args, expected in cases:
        code, stdout, err = run_main(capsys, *args)
        assert code == 2 and expected in err and err.count("\n") == 1, (args, stdout, err)
        assert not out.exists()


# First of the cluster's tests, and the cheapest: pytest's per-test timeout counts the cluster's start in it.
def test_sigint_cancels_the_probes_and_leaves_no_server(cluster: tuple[Cluster, dict[str, str]], repro: Commands, tmp_path: Path) -> None:
    made, _ = cluster
    mark = uuid.uuid4().hex
    out = tmp_path / "bisect"
    # Slow sessions: the probes are still serving when the interrupt comes.
    good = f"--time-scale 1 --index-k-dtype fp8 / REPRO_TEST_MARK={mark}"
    bad = f"--time-scale 1 --enable-hierarchical-cache --tp 4 / REPRO_TEST_MARK={mark}"
    proc = repro(["bisect", "flags", "--good", good, "--bad", bad, "--out", str(out), "--sessions", "8",
                  "--executor", "ray", "--ray-address", made.address], tmp_path / "log")
    code = interrupt_when(proc, lambda: len(marked_pids(mark)) >= 1, "the bad end's server to serve")
    assert code == 130, (tmp_path / "log").read_text()[-3000:]
    wait_for(lambda: not marked_pids(mark), 120, "every server the probes launched to end")
    log = (tmp_path / "log").read_text()
    assert "cancelling 1 Ray task(s)" in log and "repro: interrupted" in log and "Traceback" not in log
    assert not (out / "probes.jsonl").exists()


@SEARCH_TIMEOUT
def test_commit_bisection_runs_two_probes_at_once_and_names_the_culprit(
    cluster: tuple[Cluster, dict[str, str]], repro: Commands, tmp_path: Path
) -> None:
    made, nodes = cluster
    shas = build_repo(tmp_path / "repo", commits=5, culprit=2)
    out = tmp_path / "bisect"
    proc = repro(["bisect", "commits", "--repo", str(tmp_path / "repo"), "--good", shas[0], "--bad", "main",
                  "--build", BUILD, "--deploy", DEPLOY, "--out", str(out), *LOAD,
                  "--executor", "ray", "--ray-address", made.address, "--parallel", "2"], tmp_path / "log")
    assert finish(proc, tmp_path / "log") == 0, (tmp_path / "log").read_text()[-3000:]
    state = json.loads((out / "bisect.json").read_text())
    # The culprit the local executor names on the same repository (tests/test_bisect_commits.py).
    assert state["status"] == "found" and state["found"][0].startswith(f"2 {shas[2][:10]}")
    probes = state["probes"]
    assert probes[0]["index"] == 4 and probes[0]["why"].startswith("the bad end")  # alone: it must corrupt first
    assert any(p["why"].startswith("quantile 1/3 of the posterior") for p in probes)
    # Each probe ran on a node of the cluster, and two at once ran on both (one CPU each).
    assert {p["node"]["ray_node_id"] for p in probes} == set(nodes.values())
    for probe in probes:
        manifest = json.loads((out / "probes" / probe["run_dirs"][0] / "manifest.json").read_text())
        assert manifest["node"]["ray_node_id"] == probe["node"]["ray_node_id"]
        assert not (out / "probes" / probe["run_dirs"][0]).parent.joinpath("src").exists()
    assert all(abs(sum(p["posterior"]) - 1) < 1e-9 for p in probes)
    assert nodes["node_b"] in (out / "report.md").read_text()


@SEARCH_TIMEOUT
def test_flag_bisection_probes_on_the_node_named_and_a_lost_probe_is_rerun_on_resume(
    cluster: tuple[Cluster, dict[str, str]], repro: Commands, tmp_path: Path
) -> None:
    made, nodes = cluster
    mark = uuid.uuid4().hex
    good = f"{COMMON} --index-k-dtype fp8 --tp 8 / REPRO_TEST_MARK={mark}"
    bad = f"{COMMON} --enable-hierarchical-cache --index-k-dtype bf16 --tp 8 / REPRO_TEST_MARK={mark}"
    out = tmp_path / "bisect"
    # One round a probe: a clean probe stays undecided, which ddmin reads as "not shown to fail".
    args = ["bisect", "flags", "--good", good, "--bad", bad, "--out", str(out), *LOAD, "--max-rounds", "1",
            "--good-rate", "0.02", "--executor", "ray", "--ray-address", made.address]
    # No node has `nowhere`: the first probe is lost, and the search stops (exit 3) for --resume.
    lost = repro([*args, "--resources", '{"nowhere": 1}'], tmp_path / "lost.log")
    assert finish(lost, tmp_path / "lost.log") == 3, (tmp_path / "lost.log").read_text()[-3000:]
    state = json.loads((out / "bisect.json").read_text())
    (probe,) = state["probes"]
    assert state["status"] == "lost" and probe["verdict"] == "lost" and probe["node"] is None
    assert "no live node of the cluster has the resources" in probe["message"]

    # Resumed on node_b, two probes at once (half of node_b's resource each).
    resumed = repro([*args, "--resume", "--resources", '{"node_b": 0.5}', "--parallel", "2"], tmp_path / "resume.log")
    assert finish(resumed, tmp_path / "resume.log") == 0, (tmp_path / "resume.log").read_text()[-3000:]
    state = json.loads((out / "bisect.json").read_text())
    # The set the local executor finds (tests/test_bisect_flags.py): HiCache and the bf16 index-K, together,
    # each alone probed at once with the other.
    assert state["status"] == "found" and state["found_indices"] == [0, 1] and "only together" in state["conclusion"]
    probes = state["probes"]
    assert probes[0]["verdict"] == "lost" and probes[1]["subset"] == [0, 1] and probes[1]["verdict"] == "bad"
    assert sorted(p["subset"] for p in probes[3:]) == [[0], [1]]
    assert sorted(p["number"] for p in probes) == list(range(1, len(probes) + 1))
    assert all(p["node"]["ray_node_id"] == nodes["node_b"] for p in probes[1:])
    report = (out / "report.md").read_text()
    assert nodes["node_b"] in report and "| lost |" in report
    assert "1 probe(s) already recorded" in (tmp_path / "resume.log").read_text()
    assert not marked_pids(mark)


def test_sweep_on_a_node_finds_the_local_onset(cluster: tuple[Cluster, dict[str, str]], repro: Commands, tmp_path: Path) -> None:
    made, nodes = cluster
    # A small device pool: more evictions and load-backs, so 16 at once corrupt a third or more of the
    # sessions, and one at a time none (the virtual clock's counts, the same on the node and here).
    sweep = ["sweep", "--concurrency", "1,16", "--sessions", "16", "--seed", "3", "--sim-args",
             f"{COMMON} --enable-hierarchical-cache --index-k-dtype bf16 --max-total-tokens 32000"]
    on_ray = repro([*sweep, "--out", str(tmp_path / "ray"), "--executor", "ray", "--ray-address", made.address,
                    "--resources", '{"node_b": 1}'], tmp_path / "ray.log")
    local = repro([*sweep, "--out", str(tmp_path / "local")], tmp_path / "local.log")
    assert finish(on_ray, tmp_path / "ray.log") == 0, (tmp_path / "ray.log").read_text()[-3000:]
    assert finish(local, tmp_path / "local.log") == 0, (tmp_path / "local.log").read_text()[-3000:]
    results = {name: json.loads((tmp_path / name / "sweep.json").read_text()) for name in ("ray", "local")}
    assert results["ray"]["onset"] == results["local"]["onset"] == 16
    assert results["ray"]["node"]["ray_node_id"] == nodes["node_b"] and "ray_node_id" not in results["local"]["node"]
    # Both levels ran against one server on that node: one base URL, one node in their manifests.
    manifests = [json.loads((tmp_path / "ray" / level / "manifest.json").read_text()) for level in ("c001", "c016")]
    assert len({m["target"]["base_url"] for m in manifests}) == 1
    assert {m["node"]["ray_node_id"] for m in manifests} == {nodes["node_b"]}
    assert nodes["node_b"] in (tmp_path / "ray" / "sweep.md").read_text()
    assert "sweep: concurrency 16: 16 sessions" in (tmp_path / "ray.log").read_text()


def _pids_running_with(argument: str) -> set[int]:
    """Processes with `argument` among their command-line arguments (on any node of the one-machine cluster)."""
    return pids_where("cmdline", lambda cmdline: argument.encode() in cmdline.split(b"\0"))


def _slow_sweep_on_node_b(repro: Commands, made: Cluster, seed: str, out: Path, log: Path) -> subprocess.Popen[bytes]:
    """A 3-level sweep pinned to node_b; its control level takes ~15 s (real-time sessions), the next two
    together about as long again."""
    return repro(["sweep", "--concurrency", "1,2,4", "--sessions", "4", "--out", str(out), "--executor", "ray",
                  "--ray-address", made.address, "--resources", '{"node_b": 1}',
                  "--sim-args", f"--time-scale 1 --final-after-turns 3 --seed {seed}"], log)


def _control_level_back(out: Path) -> bool:
    return (out / "c001" / "summary.json").exists()


def _control_level_kept(out: Path, node: str) -> None:
    """The control level is whole, from `node`; the level cut short stayed in the task's scratch directory."""
    assert len((out / "c001" / "sessions.jsonl").read_text().splitlines()) == 4
    assert json.loads((out / "c001" / "manifest.json").read_text())["node"]["ray_node_id"] == node
    assert not (out / "c002").exists() and not (out / "sweep.json").exists()


def test_sweep_cut_short_keeps_the_levels_that_came_back(cluster: tuple[Cluster, dict[str, str]], repro: Commands, tmp_path: Path) -> None:
    made, nodes = cluster
    seed = str(10**9 + uuid.uuid4().int % 10**9)  # this sweep's simulator, told apart by its command line
    out = tmp_path / "sweep"
    proc = _slow_sweep_on_node_b(repro, made, seed, out, tmp_path / "log")
    code = interrupt_when(proc, lambda: _control_level_back(out), "the control level to come back")
    assert code == 130, (tmp_path / "log").read_text()[-3000:]
    log = (tmp_path / "log").read_text()
    assert f"sweep interrupted at concurrency 2; the finished levels' runs are kept in {out}" in log, log[-3000:]
    assert "cancelling 1 Ray task(s)" in log and "Traceback" not in log
    _control_level_kept(out, nodes["node_b"])
    wait_for(lambda: not _pids_running_with(seed), 120, "the sweep's simulator to end")


def test_sweep_no_node_can_take_fails_in_one_line(cluster: tuple[Cluster, dict[str, str]], repro: Commands, tmp_path: Path) -> None:
    made, _ = cluster
    out = tmp_path / "sweep"
    proc = repro(["sweep", "--concurrency", "1,2", "--sessions", "2", "--out", str(out), "--executor", "ray",
                  "--ray-address", made.address, "--resources", '{"nowhere": 1}'], tmp_path / "log")
    assert finish(proc, tmp_path / "log") == 3
    log = (tmp_path / "log").read_text()
    assert ("sweep stopped: no live node of the cluster has the resources asked for, for 10s; resources "
            "{'nowhere': 1.0}; no level had finished") in log, log[-3000:]
    assert "Traceback" not in log and not (out / "sweep.json").exists()


def test_sweep_on_a_lost_node_keeps_the_levels_that_came_back(cluster: tuple[Cluster, dict[str, str]], repro: Commands, tmp_path: Path) -> None:
    # Last in the module: it kills node_b.
    made, nodes = cluster
    seed = str(10**9 + uuid.uuid4().int % 10**9)
    out = tmp_path / "sweep"
    proc = _slow_sweep_on_node_b(repro, made, seed, out, tmp_path / "log")
    code = lose_node_b(made, proc, lambda: _control_level_back(out), "the control level to come back", 120)
    assert code == 3, (tmp_path / "log").read_text()[-3000:]
    log = (tmp_path / "log").read_text()
    assert "sweep stopped: the Ray task ended before it finished (" in log, log[-3000:]
    assert f"the finished levels' runs are kept in {out}" in log and "Traceback" not in log
    _control_level_kept(out, nodes["node_b"])
    wait_for(lambda: not _pids_running_with(seed), 120, "the sweep's simulator to end with its node")
