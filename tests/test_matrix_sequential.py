"""The sequential matrix's round and stop logic on hand-made counts: alpha split over the looks, which
cells an undecided verdict still needs, which runs a round holds, and what was spent against the fixed design;
and a sequential matrix of the simulator run in rounds on a real Ray cluster, looking as the local executor does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from repro.matrix import sequential
from repro.matrix.analysis import CellRun
from repro.matrix.design import cells, plan
from repro.matrix.spec import MatrixSpec, SpecLoader

from test_matrix_analysis import Outcomes, hicache_story, make_spec


def round_one(spec: MatrixSpec, outcomes: Outcomes) -> list[CellRun]:
    """The finished runs of round 1 (replicate 1 of every cell)."""
    runs = []
    for run in sequential.round_runs(plan(spec), 1, cells(spec)):
        counts = outcomes(run.cell.as_dict())
        runs.append(CellRun(key=run.key, cell=run.cell.as_dict(), replicate=run.replicate, order=run.order,
                            status="finished", counts=counts, run_dir=f"cells/{run.key}"))
    return runs


def look(spec: MatrixSpec, runs: list[CellRun]):  # noqa: ANN201 - MatrixAnalysis
    return sequential.look(spec, runs, [c.as_dict() for c in cells(spec)], len(plan(spec)))


def test_rounds_take_one_replicate_of_the_needed_cells_in_plan_order() -> None:
    spec = make_spec(["hicache", "index_k"], design={"replicates": 3, "sequential": True, "seed": 5})
    everything = plan(spec)
    second = sequential.round_runs(everything, 2, cells(spec)[1:])
    assert [r.replicate for r in second] == [2, 2, 2]
    assert [r.order for r in second] == sorted(r.order for r in second)
    assert cells(spec)[0] not in {r.cell for r in second}
    assert sequential.look_spec(spec).design.alpha == spec.design.alpha / 3


def test_a_clear_story_is_decided_after_one_round_at_the_split_alpha() -> None:
    def story(cell: dict[str, str]) -> dict[str, int]:  # the simulator's shape: 1 of 30 with fp8, 15 with bf16
        corrupt = 0 if cell["hicache"] == "off" else (1 if cell["index_k"] == "fp8" else 15)
        return {"clean": 30 - corrupt, "corrupt": corrupt, "timeout": 0, "error": 0}

    spec = make_spec(["hicache", "index_k"], design={"replicates": 2, "sequential": True})
    runs = round_one(spec, story)
    # The seeds' milder shape (3 against 11 of 30) does not widen at 0.025 yet: round 2 runs the HiCache-on cells.
    milder = round_one(spec, hicache_story)
    assert [c.level("hicache") for c in sequential.needed_cells(spec, look(spec, milder), cells(spec), milder)] == ["on", "on"]
    analysis = look(spec, runs)
    assert analysis.alpha == 0.025  # 0.05 over two looks
    assert {e.factor: e.verdict for e in analysis.factors} == {"hicache": "causes", "index_k": "widens"}
    assert sequential.undecided(analysis) == []
    assert sequential.needed_cells(spec, analysis, cells(spec), runs) == []
    spent = sequential.record(spec, [sequential.RoundLook(1, [r.key for r in runs], {}, [], [])], runs, 8,
                              interrupted=False)
    assert (spent.sessions, spent.fixed_sessions) == (4 * 30, 0)  # make_spec's load names no session count
    assert (spent.server_starts, spent.fixed_server_starts, spent.saved["server_starts"]) == (4, 8, 0.5)
    assert spent.stopped == "every factor decided after round 1 of at most 2"


def test_an_undecided_factor_keeps_only_the_cells_a_decided_cause_does_not_rule_out() -> None:
    # HiCache causes; index-K does nothing (3 of 30 corrupt either way with HiCache on).
    def story(cell: dict[str, str]) -> dict[str, int]:
        corrupt = 0 if cell["hicache"] == "off" else 3
        return {"clean": 30 - corrupt, "corrupt": corrupt, "timeout": 0, "error": 0}

    spec = make_spec(["hicache", "index_k"], design={"replicates": 3, "sequential": True})
    runs = round_one(spec, story)
    analysis = look(spec, runs)
    verdicts = {e.factor: e.verdict for e in analysis.factors}
    assert verdicts["index_k"] not in sequential.DECIDED
    needed = sequential.needed_cells(spec, analysis, cells(spec), runs)
    # The HiCache-off cells showed no corruption: index-K's stratified test learns nothing there.
    if verdicts["hicache"] == "causes":
        assert {c.level("hicache") for c in needed} == {"on"} and len(needed) == 2
    else:  # 6 of 60 against 0 of 60 at 0.05 / 3: HiCache undecided too, so every cell is still needed
        assert len(needed) == 4
    # Had a HiCache-off cell corrupted once, those cells would carry information and stay.
    def leaky(cell: dict[str, str]) -> dict[str, int]:
        counts = story(cell)
        if cell == {"hicache": "off", "index_k": "bf16"}:
            counts.update(clean=29, corrupt=1)
        return counts

    runs = round_one(spec, leaky)
    assert len(sequential.needed_cells(spec, look(spec, runs), cells(spec), runs)) == 4


def test_the_record_says_why_it_stopped() -> None:
    spec = make_spec(["hicache"], design={"replicates": 3, "sequential": True})
    spec = spec.model_copy(update={"load": {"sessions": 30}})
    runs = round_one(spec, lambda cell: {"clean": 30, "corrupt": 0, "timeout": 0, "error": 0})
    first = sequential.RoundLook(1, [r.key for r in runs], {}, ["hicache on vs off"], ["hicache-off", "hicache-on"])
    last = sequential.RoundLook(3, [r.key for r in runs], {}, ["hicache on vs off"], [])
    capped = sequential.record(spec, [first, last], runs, 6, interrupted=False)
    assert capped.stopped.startswith("reached the cap of 3 rounds with 1 comparison(s) not decided")
    assert (capped.sessions, capped.fixed_sessions, capped.saved["sessions"]) == (60, 180, 1 - 60 / 180)
    assert sequential.record(spec, [first], runs, 6, interrupted=True).stopped == "interrupted in round 2"
    assert sequential.record(spec, [first], runs, 6, interrupted=False).stopped.startswith("a run of round 2 failed")
    lines = sequential.summary_lines(capped.__dict__ | {"looks": [first.__dict__, last.__dict__]})
    assert lines[0].startswith("Sequential design: at most 3 rounds; Bonferroni over the rounds' looks")
    assert "each look at alpha 0.0167" in lines[0]
    assert lines[-2].startswith("Spent 2 round(s), 60 sessions and 2 server starts, against 180 sessions and 6 starts")


def test_causes_that_act_only_together_stay_open_in_the_cells_that_can_rank_them() -> None:
    # No corruption yet with fp8: HiCache and bf16 both "cause" it, together; one corrupt session with
    # only one of them in a later round would make the other the cause and this one its amplifier, so
    # the next round runs the two cells with exactly one of them, not the control nor the cell with both.
    def story(cell: dict[str, str]) -> dict[str, int]:
        corrupt = 15 if cell == {"hicache": "on", "index_k": "bf16"} else 0
        return {"clean": 30 - corrupt, "corrupt": corrupt, "timeout": 0, "error": 0}

    spec = make_spec(["hicache", "index_k"], design={"replicates": 2, "sequential": True})
    runs = round_one(spec, story)
    analysis = look(spec, runs)
    assert {e.factor: e.verdict for e in analysis.factors} == {"hicache": "causes", "index_k": "causes"}
    assert len(sequential.undecided(analysis)) == 2 and sequential.together(analysis) == analysis.factors
    after = sequential.after_round(spec, 1, sequential.round_runs(plan(spec), 1, cells(spec)), runs,
                                   [c.as_dict() for c in cells(spec)], 8, cells(spec))
    assert after.decided == {}
    assert sorted(after.next_cells) == ["hicache-off_index_k-bf16", "hicache-on_index_k-fp8"]
    last = sequential.after_round(spec, 2, [], runs, [c.as_dict() for c in cells(spec)], 8, cells(spec))
    assert last.next_cells == []  # the cap: no round 3


def test_a_factor_that_reduces_corruption_keeps_every_cell_of_causes_acting_together() -> None:
    # The same two causes acting together, and overlap off cutting their corruption: the rate is not
    # monotone in the factors, so a cell with both causes off is not known to be the least likely to
    # corrupt, and every cell in their arms runs again.
    def story(cell: dict[str, str]) -> dict[str, int]:
        corrupt = 0
        if cell["hicache"] == "on" and cell["index_k"] == "bf16":
            corrupt = 20 if cell["overlap"] == "on" else 1
        return {"clean": 30 - corrupt, "corrupt": corrupt, "timeout": 0, "error": 0}

    spec = make_spec(["hicache", "index_k", "overlap"], design={"replicates": 2, "sequential": True})
    runs = round_one(spec, story)
    analysis = look(spec, runs)
    assert {e.factor: e.verdict for e in analysis.factors} == {
        "hicache": "causes", "index_k": "causes", "overlap": "reduces"}
    assert len(sequential.together(analysis)) == 2
    assert len(sequential.needed_cells(spec, analysis, cells(spec), runs)) == 8


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
# Two whole sequential matrices, one on a Ray cluster: their own waits (420 s) already outlast pyproject's
# 300 s, which a loaded CI machine overran.
@pytest.mark.timeout(600)
def test_a_sequential_matrix_runs_in_rounds_on_ray_with_the_local_looks(tmp_path: Path) -> None:
    # Ray's own one-node test cluster, bound to loopback (the switch is read when ray is imported).
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    spec = yaml.load((ROOT / "matrices" / "sim_hicache_bf16.yaml").read_text(encoding="utf-8"), Loader=SpecLoader)
    # Tiny runs: nothing can be decided from 4 sessions a cell, so both rounds run every cell, on either executor.
    spec["load"].update({"workload": str(ROOT / "experiments" / "agentic_coding.yaml"),
                         "sessions": 4, "concurrency": 4, "turns": 3, "pressure": "auto"})
    spec["design"].update({"replicates": 2, "seed": 3, "sequential": True})
    # The virtual clock: both executors' cells count the same, so their looks agree at any machine load.
    spec["variables"]["clock"] = "virtual"
    # A device pool these few sessions overflow, so that HiCache-on cells exercise it and count.
    spec["deployment"]["command"] += " --max-total-tokens 16000"
    spec["resources"] = {"run": {"CPU": 1}}
    path = tmp_path / "seq.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    made = cluster_utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "object_store_memory": 80 * 1024 * 1024, "include_dashboard": False,
        "node_ip_address": "127.0.0.1"})
    procs = {}
    try:
        for name, extra in (("ray", ["--executor", "ray", "--ray-address", made.address]), ("local", [])):
            with open(tmp_path / f"{name}.log", "wb") as log:
                procs[name] = subprocess.Popen(
                    [sys.executable, "-c", "from repro.cli import main; main()", "matrix", str(path),
                     "--out", str(tmp_path / name), "--no-cell-reports", *extra],
                    stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        for name, proc in procs.items():
            assert proc.wait(timeout=420) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=120)
        made.shutdown()
    ray_log = (tmp_path / "ray.log").read_text()
    assert ray_log.count("round ") >= 2 and ray_log.count("Ray executor: 4 run(s) submitted") == 2, ray_log[-3000:]
    spent = {name: json.loads((tmp_path / name / "matrix.json").read_text())["sequential"] for name in procs}
    assert spent["ray"]["rounds"] == spent["local"]["rounds"] == 2
    assert spent["ray"]["looks"] == spent["local"]["looks"]
    assert spent["ray"]["looks"][0]["next_cells"] and spent["ray"]["stopped"] == spent["local"]["stopped"]
    records = [json.loads(line) for line in (tmp_path / "ray" / "progress.jsonl").read_text().splitlines()]
    assert sorted(r["replicate"] for r in records) == [1, 1, 1, 1, 2, 2, 2, 2]
    assert all(r["status"] == "finished" and r["node"]["ray_node_id"] for r in records)
