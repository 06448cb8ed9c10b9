"""`repro matrix --executor ray` on Ray's own two-node test cluster (one machine, loopback only)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from proc_helpers import marked_pids, wait_for
from ray_cluster import NODE_ARGS, NODES_UP_S, ROOT, Cluster, interrupt_when, lose_node_b, repro, two_nodes
from run_builders import run_main

from repro.errors import UsageError
from repro.matrix.spec import ResourcesSpec, SpecLoader, load_spec
from repro.procs.process import free_port
from repro.cluster.rayutil import task_options

SIM_SPEC = ROOT / "matrices" / "sim_hicache_bf16.yaml"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Cluster, dict[str, str]]]:
    """Two Ray nodes on this machine, `node_a` (the head) and `node_b`, each with its own custom resource."""
    # node_a takes both its runs at once; node_b one at a time, so a lost node_b leaves one of its runs
    # pending with no node to take it.
    yield from two_nodes(num_cpus=2)


def spec_file(tmp_path: Path, name: str, mark: str, **load: Any) -> Path:
    """The shipped simulator matrix with tiny sessions, HiCache-off cells pinned to node_a and -on to node_b."""
    spec = yaml.load(SIM_SPEC.read_text(encoding="utf-8"), Loader=SpecLoader)
    spec["load"].update({"workload": str(ROOT / "experiments" / "agentic_coding.yaml"),
                         "sessions": 4, "concurrency": 4, "turns": 3, "pressure": "auto", **load})
    spec["design"]["replicates"] = 1
    # The virtual clock: the same seeds give the same counts on a node and here, so the same verdicts, at any load.
    spec["variables"]["clock"] = "virtual"
    # A device pool these few sessions overflow, so that HiCache-on cells exercise it and count.
    spec["deployment"]["command"] += " --max-total-tokens 16000"
    spec["deployment"]["env"] = {"REPRO_TEST_MARK": mark}
    spec["resources"] = {"run": {"CPU": 1}, "levels": {"hicache": {"off": {"node_a": 1}, "on": {"node_b": 1}}}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def test_resources_become_ray_task_options() -> None:
    spec = ResourcesSpec.model_validate({"run": {"CPU": 2, "GPU": 8}, "levels": {"tp": {"8": {"h100": 1, "GPU": 0}}}})
    asked = spec.for_cell({"tp": "8", "other": "x"})
    assert asked == {"CPU": 2, "GPU": 8, "h100": 1}
    assert task_options(asked) == {"num_cpus": 2, "num_gpus": 8, "resources": {"h100": 1}}
    assert task_options(spec.for_cell({"tp": "4"})) == {"num_cpus": 2, "num_gpus": 8}


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({"levels": {"nope": {"on": {"x": 1}}}}, "resources.levels.nope: no factor named 'nope'"),
        ({"levels": {"hicache": {"maybe": {"x": 1}}}}, "factor 'hicache' has no level 'maybe'"),
        ({"run": {"GPU": -1}}, "resources.run.GPU"),
    ],
)
def test_a_bad_resources_section_is_one_line_naming_it(resources: dict, expected: str, tmp_path: Path) -> None:
    spec = yaml.load(SIM_SPEC.read_text(encoding="utf-8"), Loader=SpecLoader)
    spec["load"]["workload"] = str(ROOT / "experiments" / "agentic_coding.yaml")
    spec["resources"] = resources
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    with pytest.raises(UsageError) as caught:
        load_spec(path)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_bad_executor_options_are_one_line_and_make_no_matrix_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "never"
    cases = [
        (["--executor", "slurm"], "--executor 'slurm': expected one of local, ray"),
        (["--ray-address", "127.0.0.1:6379"], "--ray-address needs --executor ray"),
        (["--executor", "ray", "--ray-address", "nonsense"], "expected HOST:PORT"),
        (["--executor", "ray", "--ray-address", f"127.0.0.1:{free_port()}"], "nothing answers there"),
    ]
    for args, expected in cases:
        code, _, err = run_main(capsys, "matrix", str(SIM_SPEC), "--out", str(out), *args)
        assert code == 2 and expected in err and err.count("\n") == 1, err
        assert not out.exists()


def test_cells_run_on_the_nodes_their_resources_name_with_the_local_verdicts(
    cluster: tuple[Cluster, dict[str, str]], tmp_path: Path
) -> None:
    made, nodes = cluster
    mark = uuid.uuid4().hex
    spec = spec_file(tmp_path, "ray", mark)
    on_ray = repro(["matrix", str(spec), "--out", str(tmp_path / "ray"), "--no-cell-reports",
                    "--executor", "ray", "--ray-address", made.address], tmp_path / "ray.log")
    local = repro(["matrix", str(spec), "--out", str(tmp_path / "local"), "--no-cell-reports"], tmp_path / "local.log")
    try:
        assert on_ray.wait(timeout=240) == 0, (tmp_path / "ray.log").read_text()[-3000:]
        assert local.wait(timeout=240) == 0, (tmp_path / "local.log").read_text()[-3000:]
    finally:
        for proc in (on_ray, local):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=120)

    records = [json.loads(line) for line in (tmp_path / "ray" / "progress.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(r["status"] == "finished" for r in records)
    for record in records:
        expected = nodes["node_a" if record["cell"]["hicache"] == "off" else "node_b"]
        assert record["node"]["ray_node_id"] == expected, record["key"]
        run_dir = tmp_path / "ray" / record["run_dir"]
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert manifest["node"]["ray_node_id"] == expected
        assert (tmp_path / "ray" / "logs" / record["key"] / "processes.json").exists()
        local_sessions = (tmp_path / "local" / record["run_dir"] / "sessions.jsonl").read_text().splitlines()
        ray_sessions = (run_dir / "sessions.jsonl").read_text().splitlines()
        assert sorted((s["session_id"], s["task"]) for s in map(json.loads, ray_sessions)) == sorted(
            (s["session_id"], s["task"]) for s in map(json.loads, local_sessions)
        )
    analyses = [json.loads((tmp_path / name / "matrix.json").read_text()) for name in ("ray", "local")]
    verdicts = [{f["factor"]: f["verdict"] for f in analysis["factors"]} for analysis in analyses]
    assert verdicts[0] == verdicts[1] and set(verdicts[0]) == {"hicache", "index_k"}
    # What the tasks printed names the runs' directories in the matrix directory, not on the nodes.
    assert f"Run directory: {tmp_path / 'ray' / 'cells'}" in (tmp_path / "ray.log").read_text()
    # The matrix report names the node of every run.
    assert nodes["node_b"][:12] in (tmp_path / "ray" / "report.html").read_text()
    assert not marked_pids(mark)


def test_sigint_cancels_every_task_and_leaves_no_server(cluster: tuple[Cluster, dict[str, str]], tmp_path: Path) -> None:
    made, _ = cluster
    mark = uuid.uuid4().hex
    spec = spec_file(tmp_path, "int", mark, sessions=40, concurrency=2, turns=18)
    proc = repro(["matrix", str(spec), "--out", str(tmp_path / "m"), "--no-cell-reports",
                  "--executor", "ray", "--ray-address", made.address], tmp_path / "m.log")
    # Both nodes serving: a server with the mark per node.
    code = interrupt_when(proc, lambda: len(marked_pids(mark)) >= 2, "a server on each node")
    assert code == 130, (tmp_path / "m.log").read_text()[-3000:]
    wait_for(lambda: not marked_pids(mark), 120, "every server the tasks launched to end")
    assert "interrupted" in (tmp_path / "m.log").read_text()
    assert (tmp_path / "m" / "matrix.json").exists()
    assert not (tmp_path / "m" / "progress.jsonl").exists() or all(
        json.loads(line)["status"] == "finished" for line in (tmp_path / "m" / "progress.jsonl").read_text().splitlines()
    )
    # The cluster is fine afterwards: nothing holds its CPUs.
    wait_for(lambda: ray_cpus_free(made.address) == 3, 120, "the cluster's CPUs to be free again")


def ray_cpus_free(address: str) -> float:
    probe = subprocess.run(
        [sys.executable, "-c",
         f"import ray; ray.init(address={address!r}, logging_level='ERROR'); print(ray.available_resources().get('CPU', 0))"],
        capture_output=True, text=True, timeout=60,
    )
    return float(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 and probe.stdout.strip() else -1.0


# A matrix, a lost node and a resume: their waits alone (240 s and more) outlast pyproject's 300 s, which a
# loaded CI machine overran.
@pytest.mark.timeout(600)
def test_a_lost_node_fails_only_its_runs_and_resume_completes_them(
    cluster: tuple[Cluster, dict[str, str]], tmp_path: Path
) -> None:
    # Last in the module: it kills node_b (and starts a new one for the resume).
    made, nodes = cluster
    mark = uuid.uuid4().hex
    spec = spec_file(tmp_path, "lost", mark, sessions=4, concurrency=2, turns=10)
    matrix = tmp_path / "m"
    args = ["matrix", str(spec), "--out", str(matrix), "--no-cell-reports", "--keep-going",
            "--executor", "ray", "--ray-address", made.address]
    proc = repro(args, tmp_path / "m.log")
    code = lose_node_b(made, proc, lambda: len(marked_pids(mark)) >= 2, "a server on each node", 240)
    assert code == 3, (tmp_path / "m.log").read_text()[-3000:]
    records = [json.loads(line) for line in (matrix / "progress.jsonl").read_text().splitlines()]
    by_status = {r["key"]: r["status"] for r in records}
    assert {k for k, s in by_status.items() if s == "failed"} == {k for k in by_status if k.startswith("hicache-on")}
    assert all(r["node"]["ray_node_id"] == nodes["node_a"] for r in records if r["status"] == "finished")
    messages = sorted(r["message"] for r in records if r["status"] == "failed")
    assert "no live node of the cluster has the resources" in messages[0]  # queued behind the lost run
    assert "the Ray task ended without a result (NodeDiedError" in messages[1]
    # The killed node's servers were swept by their launcher's reaper.
    wait_for(lambda: not marked_pids(mark), 120, "the lost node's servers to end")

    replacement = made.add_node(**{**NODE_ARGS, "num_cpus": 2}, resources={"node_b": 1})
    made.wait_for_nodes(timeout=NODES_UP_S)
    resumed = repro([*args, "--resume"], tmp_path / "resume.log")
    assert resumed.wait(timeout=240) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    final = {}
    for line in (matrix / "progress.jsonl").read_text().splitlines():
        record = json.loads(line)
        final[record["key"]] = record
    assert len(final) == 4 and all(r["status"] == "finished" for r in final.values())
    assert {r["node"]["ray_node_id"] for k, r in final.items() if k.startswith("hicache-on")} == {replacement.node_id}
    assert not marked_pids(mark)
