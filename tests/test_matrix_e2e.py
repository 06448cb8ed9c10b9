"""`repro matrix` end to end: real `repro matrix` processes launching real simulator processes per cell.

The simulator matrix must name HiCache as a cause (and bf16 index-K as its amplifier whenever HiCache
corrupted without it), over several design seeds; Ctrl-C and errors must leave no process behind;
SIGKILL must lose no finished cell.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from repro.matrix.spec import SpecLoader

from proc_helpers import group_gone, pid_gone, wait_for

ROOT = Path(__file__).resolve().parent.parent
SIM_SPEC = ROOT / "matrices" / "sim_hicache_bf16.yaml"
PD_SPEC = ROOT / "matrices" / "sim_pd_hicache.yaml"
REPRO = [sys.executable, "-c", "from repro.cli import main; main()"]

pytestmark = pytest.mark.slow


def sim_spec(tmp_path: Path, name: str, **changes: Any) -> Path:
    """The shipped simulator matrix with some sections changed, written beside the test."""
    spec = yaml.load(SIM_SPEC.read_text(encoding="utf-8"), Loader=SpecLoader)
    spec["load"]["workload"] = str(ROOT / "experiments" / "agentic_coding.yaml")
    for section, values in changes.items():
        spec[section] = {**spec.get(section, {}), **values}
    if spec["load"].get("pressure"):
        # A small device pool that a few short sessions overflow: HiCache loads back, so its cells count.
        spec["deployment"]["command"] += f" --max-total-tokens {SMALL_POOL}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([*REPRO, *args], stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)


def launched_groups(matrix: Path) -> list[int]:
    return [entry["pgid"] for f in matrix.glob("logs/*/processes.json") for entry in json.loads(f.read_text())]


def progress(matrix: Path) -> list[dict[str, Any]]:
    file = matrix / "progress.jsonl"
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


SMALL_POOL = 16_000
TINY = {"sessions": 4, "concurrency": 4, "turns": 3, "pressure": "auto"}
"""A few short sessions, sized (`pressure`) to overflow the simulator's device pool so that HiCache-on cells exercise it."""
ONE = {"replicates": 1}


QUICK = {"sessions": 24, "concurrency": 24, "turns": 14}
QUICK_SIM = {"time_scale": "0.1", "final_after": "12", "clock": "virtual"}
"""The verdicts below rest on counts of corrupt sessions: the virtual clock makes them the seed's."""


def null_factor_spec(tmp_path: Path) -> Path:
    """HiCache against the host-tier write policy, which the simulator's race does not depend on at all."""
    path = sim_spec(tmp_path, "null", load=QUICK, variables=QUICK_SIM,
                    design={"seed": 44, "min_completed": 20, "replicates": 1, "alpha": 0.01,
                            "baseline": {"hicache": "off", "write_policy": "write_through"}})
    spec = yaml.load(path.read_text(), Loader=SpecLoader)
    spec["factors"] = {
        "hicache": spec["factors"]["hicache"],
        "write_policy": {"label": "write policy", "levels": {
            policy: {"flags": f"--hicache-write-policy {policy}", "confirm": {"hicache_write_policy": policy}}
            for policy in ("write_through", "write_back")
        }},
    }
    spec["deployment"]["command"] += " --index-k-dtype bf16"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def test_sim_matrix_names_hicache_a_cause_and_no_factor_without_effect_over_several_seeds(tmp_path: Path) -> None:
    # Three design seeds (run order and simulator seeds) and the null-factor matrix at once: the
    # HiCache-off cells mostly wait on the simulated clock, so the matrices overlap well on two cores.
    seeds = [11, 22, 33]
    specs = {
        f"m{seed}": sim_spec(tmp_path, f"seed{seed}", load=QUICK, variables=QUICK_SIM,
                             design={"seed": seed, "min_completed": 20, "replicates": 1})
        for seed in seeds
    }
    specs["null"] = null_factor_spec(tmp_path)
    procs = {
        name: start(["matrix", str(spec), "--out", str(tmp_path / name), "--no-cell-reports"], tmp_path / f"{name}.log")
        for name, spec in specs.items()
    }
    for name, proc in procs.items():
        assert proc.wait(timeout=400) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]

    null = json.loads((tmp_path / "null" / "matrix.json").read_text())
    verdicts = {f["factor"]: f["verdict"] for f in null["factors"]}
    assert verdicts["hicache"] == "causes", null["verdict"]
    assert verdicts["write_policy"] in ("no detectable effect", "inconclusive"), null["verdict"]
    assert "write policy write_back (vs write_through):" in null["verdict"]
    for word in ("causes", "widens", "reduces"):
        assert f"write policy write_back (vs write_through) {word}" not in null["verdict"]
    for seed in seeds:
        matrix = tmp_path / f"m{seed}"
        result = json.loads((matrix / "matrix.json").read_text())
        hicache, index_k = result["factors"]
        cells = {(c["levels"]["hicache"], c["levels"]["index_k"]): c["counts"] for c in result["cells"]}
        detail = f"seed {seed}: {result['verdict']} cells={cells}"
        assert hicache["verdict"] == "causes", detail
        assert result["verdict"].startswith("HiCache on (vs off) causes corruption"), detail
        assert cells[("off", "fp8")]["corrupt"] == cells[("off", "bf16")]["corrupt"] == 0, detail
        if cells[("on", "fp8")]["corrupt"]:
            # HiCache corrupts without bf16 too: bf16 is the amplifier, measured within HiCache on.
            assert index_k["verdict"] == "widens" and index_k["conditional"]["within"] == "HiCache on", detail
            assert "index-K bf16 (vs fp8) widens it: with HiCache on" in result["verdict"], detail
        else:
            # No corruption without bf16 either: the data cannot rank the two, and the matrix says so.
            assert index_k["verdict"] == "causes", detail
            assert "acts only together with index-K bf16" in result["verdict"], detail
        for cell in result["cells"]:
            assert cell["confirmed"]["server"] == {
                "enable_hierarchical_cache": cell["levels"]["hicache"] == "on",
                "index_k_dtype": cell["levels"]["index_k"],
            }
        for record in progress(matrix):
            info = record["server_info"]["server"]
            assert info["enable_hierarchical_cache"] is (record["cell"]["hicache"] == "on")
            assert info["index_k_dtype"] == record["cell"]["index_k"]
        assert all(group_gone(g) for g in launched_groups(matrix))
        assert (matrix / "report.html").exists() and (matrix / "junit.xml").exists()


@pytest.mark.timeout(600)
def test_sim_pd_matrix_tells_the_corruption_cause_from_the_wedge_cause(tmp_path: Path) -> None:
    # The seeds' two faults at once: HiCache corrupts, PD disaggregation wedges. Neither may be blamed
    # for the other's outcome, though wedged sessions end before they could show corruption.
    # On the virtual clock, so the counts behind both verdicts are the seeds' at any machine load. A healthy
    # stream there pauses while the engine waits for a lagging session, which on a loaded machine can pass the
    # spec's 5 s stall timeout: the copy's 30 s, beyond the engine's 20 s patience,
    # lets only the wedges stall.
    spec = yaml.load(PD_SPEC.read_text(encoding="utf-8"), Loader=SpecLoader)
    spec["load"]["stall_timeout"] = 30
    spec_path = tmp_path / "pd.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    proc = start(["matrix", str(spec_path), "--out", str(tmp_path / "m"), "--no-cell-reports", "--var", "clock=virtual",
                  "--var", "waiting_timeout=1e9", "--var", "patience=20"], tmp_path / "m.log")
    assert proc.wait(timeout=560) == 0, (tmp_path / "m.log").read_text()[-3000:]
    matrix = json.loads((tmp_path / "m" / "matrix.json").read_text())
    corruption = {f["factor"]: f["verdict"] for f in matrix["factors"]}
    wedges = {f["factor"]: f for f in matrix["wedges"]}
    assert corruption["hicache"] == "causes", matrix["verdict"]
    assert corruption["pd"] not in ("causes", "widens"), matrix["verdict"]
    assert wedges["pd"]["verdict"] == "causes" and wedges["pd"]["reference"]["k"] == 0, matrix["verdict"]
    assert wedges["hicache"]["verdict"] != "causes", matrix["verdict"]
    assert "PD disaggregation on (vs off) raises wedged streams" in matrix["verdict"]


def test_sigint_mid_cell_stops_every_process_and_keeps_what_finished(tmp_path: Path) -> None:
    spec = sim_spec(tmp_path, "int", load={**TINY, "sessions": 40, "concurrency": 2, "turns": 18}, design=ONE)
    matrix = tmp_path / "m"
    proc = start(["matrix", str(spec), "--out", str(matrix), "--no-cell-reports"], tmp_path / "m.log")
    try:
        wait_for(lambda: any(matrix.glob("cells/*/sessions.jsonl")), 180, "the first cell's load to start")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, (tmp_path / "m.log").read_text()[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    groups = [proc.pid, *launched_groups(matrix)]
    assert len(groups) >= 2
    wait_for(lambda: all(group_gone(g, timeout=0) for g in groups), 120, "every process group to end")
    assert "interrupted" in (tmp_path / "m.log").read_text()
    assert (matrix / "matrix.json").exists() and progress(matrix) == []


def test_resume_after_sigkill_loses_no_finished_cell(tmp_path: Path) -> None:
    spec = sim_spec(tmp_path, "kill", load=TINY, design=ONE,
                    variables={"time_scale": "0", "final_after": "2", "clock": "virtual"})
    matrix = tmp_path / "m"
    proc = start(["matrix", str(spec), "--out", str(matrix), "--no-cell-reports"], tmp_path / "m.log")
    try:
        wait_for(lambda: len(progress(matrix)) >= 1 and len(list(matrix.glob("logs/*/processes.json"))) >= 2, 90,
             "one finished cell and the next launched")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finished = {r["key"]: r for r in progress(matrix)}
    stamps = {key: (matrix / "cells" / key / "summary.json").stat().st_mtime_ns for key in finished}
    resumed = start(["matrix", str(spec), "--out", str(matrix), "--resume", "--no-cell-reports"], tmp_path / "r.log")
    assert resumed.wait(timeout=180) == 0, (tmp_path / "r.log").read_text()[-2000:]
    for key, stamp in stamps.items():
        assert (matrix / "cells" / key / "summary.json").stat().st_mtime_ns == stamp, f"{key} was rerun"
    result = json.loads((matrix / "matrix.json").read_text())
    assert result["runs"] == {"planned": 4, "finished": 4, "failed": 0}
    assert sum(c["counts"]["clean"] + c["counts"]["corrupt"] for c in result["cells"]) == 16
    assert not list(matrix.glob("cells/*/report.html"))  # --no-cell-reports
    assert all(group_gone(g) for g in launched_groups(matrix))


def test_configuration_mismatch_stops_the_matrix_with_exit_3_and_nothing_running(tmp_path: Path) -> None:
    # The seeds' lost days: a cell that claims HiCache is on, launched without the flag.
    spec = sim_spec(tmp_path, "lie", load=TINY, design=ONE, variables={"time_scale": "0", "final_after": "2"})
    data = yaml.load(spec.read_text(), Loader=SpecLoader)
    data["factors"]["hicache"]["levels"]["on"]["flags"] = []
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    matrix = tmp_path / "m"
    done = subprocess.run([*REPRO, "matrix", str(spec), "--out", str(matrix), "--no-cell-reports"],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert done.returncode == 3, done.stderr[-2000:]
    failed = [r for r in progress(matrix) if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["cell"]["hicache"] == "on"
    assert "enable_hierarchical_cache is False, the spec asked for True" in failed[0]["message"]
    assert "Traceback" not in done.stderr
    assert all(group_gone(g) for g in launched_groups(matrix))
    json.loads((matrix / "matrix.json").read_text())
    going = subprocess.run([*REPRO, "matrix", str(spec), "--out", str(tmp_path / "k"), "--keep-going"],
                           capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert going.returncode == 3, going.stderr[-2000:]
    records = progress(tmp_path / "k")
    assert sorted(r["status"] for r in records) == ["failed", "failed", "finished", "finished"]
    page = (tmp_path / "k" / "report.html").read_text()
    for record in records:
        if record["status"] == "finished":
            assert (tmp_path / "k" / record["run_dir"] / "report.html").exists()
            assert f'href="{record["run_dir"]}/report.html"' in page


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"design": {"replicates": 0}}, "design.replicates: Input should be greater than or equal to 1"),
        ({"load": {"sesions": 3}}, "load.sesions: Extra inputs are not permitted"),
    ],
)
def test_malformed_spec_fails_with_the_field_named_and_exit_2(tmp_path: Path, change: dict, expected: str) -> None:
    spec = sim_spec(tmp_path, "bad", **change)
    done = subprocess.run([*REPRO, "matrix", str(spec), "--out", str(tmp_path / "m")], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"repro: error: {spec}:") and expected in line
    assert not (tmp_path / "m").exists()


def test_resume_needs_a_matrix_directory(tmp_path: Path) -> None:
    done = subprocess.run([*REPRO, "matrix", str(SIM_SPEC), "--resume"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 2 and "--resume needs --out" in done.stderr


def test_a_server_dying_mid_cell_fails_the_cell_with_its_exit_and_output_and_resume_reruns_it(tmp_path: Path) -> None:
    # Long enough sessions that the first ends while the others still run; few, so the resume is quick.
    spec = sim_spec(tmp_path, "die", load={**TINY, "sessions": 6, "concurrency": 2, "turns": 18}, design=ONE)
    matrix = tmp_path / "m"
    proc = start(["matrix", str(spec), "--out", str(matrix), "--no-cell-reports"], tmp_path / "m.log")
    try:
        wait_for(lambda: any(f.read_text() for f in matrix.glob("cells/*/sessions.jsonl")), 90, "the first cell's load")
        (running,) = [d.name for d in matrix.glob("cells/*") if (d / "sessions.jsonl").exists()]
        (server,) = json.loads((matrix / "logs" / running / "processes.json").read_text())
        os.kill(server["pid"], signal.SIGKILL)
        assert proc.wait(timeout=90) == 3, (tmp_path / "m.log").read_text()[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    (record,) = progress(matrix)
    assert record["key"] == running and record["status"] == "failed"
    assert record["message"].startswith(
        f"cell {running}: server was killed by SIGKILL while the load ran; its output ends with: "
    )
    assert not (matrix / "cells" / running).exists() and (matrix / record["run_dir"] / "sessions.jsonl").exists()
    result = json.loads((matrix / "matrix.json").read_text())
    assert result["runs"]["failed"] == 1 and result["runs"]["finished"] == 0
    assert "excluded from the analysis" in (tmp_path / "m.log").read_text()
    assert "Excluded from the analysis" in (matrix / "report.html").read_text()
    assert all(group_gone(g) for g in launched_groups(matrix))

    resumed = start(["matrix", str(spec), "--out", str(matrix), "--resume", "--no-cell-reports"], tmp_path / "r.log")
    assert resumed.wait(timeout=400) == 0, (tmp_path / "r.log").read_text()[-2000:]
    result = json.loads((matrix / "matrix.json").read_text())
    assert result["runs"] == {"planned": 4, "finished": 4, "failed": 0}
    assert (matrix / "cells" / running / "summary.json").exists()


def test_sigkill_of_the_matrix_stops_its_servers_even_those_that_left_the_group(tmp_path: Path) -> None:
    spec = sim_spec(tmp_path, "detach", load={**TINY, "sessions": 40, "concurrency": 2, "turns": 18}, design=ONE)
    data = yaml.load(spec.read_text(), Loader=SpecLoader)
    # A launcher that puts the server in a session of its own, as daemonising launch scripts do.
    data["deployment"]["command"] = (
        f"bash -c 'setsid {data['deployment']['command']} ${{flags}} & echo $! > ${{log_dir}}/server.pid; wait'"
    )
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    matrix = tmp_path / "m"
    proc = start(["matrix", str(spec), "--out", str(matrix), "--no-cell-reports"], tmp_path / "m.log")
    try:
        wait_for(lambda: any(f.read_text() for f in matrix.glob("cells/*/sessions.jsonl")), 90, "the first cell's load")
        (pidfile,) = matrix.glob("logs/*/server.pid")
        server = int(pidfile.read_text())
        assert not pid_gone(server)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        wait_for(lambda: pid_gone(server) and all(group_gone(g, timeout=0) for g in launched_groups(matrix)), 120,
             "every server process to end")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_cell_whose_port_another_server_answers_fails_and_is_not_analysed(tmp_path: Path) -> None:
    from repro.sim.launch import start_sim

    occupant = start_sim(["--time-scale", "0", "--enable-hierarchical-cache"], log_path=tmp_path / "occupant.log")
    try:
        spec = sim_spec(tmp_path, "busy", load=TINY, design=ONE, variables={"port": str(occupant.port)})
        matrix = tmp_path / "m"
        done = subprocess.run([*REPRO, "matrix", str(spec), "--out", str(matrix), "--keep-going", "--no-cell-reports"],
                              capture_output=True, text=True, timeout=180, cwd=ROOT)
    finally:
        occupant.stop()
    assert done.returncode == 3, done.stderr[-2000:]
    records = progress(matrix)
    assert len(records) == 4 and all(r["status"] == "failed" for r in records)
    assert all(f"port {occupant.port} is already in use by pid {occupant.process.pid}" in r["message"] for r in records)
    result = json.loads((matrix / "matrix.json").read_text())
    assert result["runs"] == {"planned": 4, "finished": 0, "failed": 4} and result["factors"] == []
    assert "4 run(s) failed and are excluded from the analysis" in done.stderr
    assert "Excluded from the analysis" in (matrix / "report.html").read_text()
    assert "Failed runs, excluded from the analysis" in (matrix / "report.md").read_text()


def test_sequential_sim_matrix_stops_when_decided_and_starts_no_more_servers(tmp_path: Path) -> None:
    spec = sim_spec(tmp_path, "seq", load=QUICK, variables=QUICK_SIM,
                    design={"seed": 11, "min_completed": 20, "replicates": 2, "sequential": True})
    matrix = tmp_path / "m"
    proc = start(["matrix", str(spec), "--out", str(matrix), "--no-cell-reports"], tmp_path / "m.log")
    assert proc.wait(timeout=300) == 0, (tmp_path / "m.log").read_text()[-3000:]
    result = json.loads((matrix / "matrix.json").read_text())
    spent = result["sequential"]
    detail = f"{result['verdict']} {spent}"
    assert result["factors"][0]["verdict"] == "causes" and result["alpha"] == 0.025, detail
    records = progress(matrix)
    assert spent["server_starts"] == len(records) <= spent["fixed_server_starts"] == 8, detail
    assert spent["sessions"] == sum(sum(r["counts"].values()) for r in records) < spent["fixed_sessions"] == 192
    # Each round starts a cell's server once at most, and a later round only cells the first left undecided.
    rounds = [look["runs"] for look in spent["looks"]]
    assert len(rounds[0]) == 4 and all(len(set(k.rsplit("-r", 1)[0] for k in keys)) == len(keys) for keys in rounds)
    if spent["rounds"] == 1:
        assert spent["stopped"] == "every factor decided after round 1 of at most 2" and len(records) == 4, detail
    markdown = (matrix / "report.md").read_text()
    assert "Sequential design: at most 2 rounds" in markdown and f"Stopped: {spent['stopped']}." in markdown
    assert "Sequential design" in (matrix / "report.html").read_text()
    assert all(group_gone(g) for g in launched_groups(matrix))


def test_a_sequential_matrix_resumes_at_the_round_it_was_in(tmp_path: Path) -> None:
    # No corruption at all (no simulated time on a virtual clock, whatever the load): nothing is decided, so
    # round 2 runs every cell again.
    spec = sim_spec(tmp_path, "seqkill", load=TINY, variables={"time_scale": "0", "final_after": "2", "clock": "virtual"},
                    design={"replicates": 2, "sequential": True})
    matrix = tmp_path / "m"
    proc = start(["matrix", str(spec), "--out", str(matrix), "--no-cell-reports"], tmp_path / "m.log")
    try:
        wait_for(lambda: len(progress(matrix)) >= 4 and bool(list(matrix.glob("logs/*-r2/processes.json"))), 120,
                 "round 1 finished and round 2 launched")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    first = {r["key"]: (matrix / "cells" / r["key"] / "summary.json").stat().st_mtime_ns
             for r in progress(matrix) if r["key"].endswith("-r1")}
    assert len(first) == 4
    resumed = start(["matrix", str(spec), "--out", str(matrix), "--resume", "--no-cell-reports"], tmp_path / "r.log")
    assert resumed.wait(timeout=180) == 0, (tmp_path / "r.log").read_text()[-2000:]
    for key, stamp in first.items():
        assert (matrix / "cells" / key / "summary.json").stat().st_mtime_ns == stamp, f"{key} was rerun"
    spent = json.loads((matrix / "matrix.json").read_text())["sequential"]
    assert spent["rounds"] == 2 and spent["server_starts"] == 8 and spent["sessions"] == 32
    assert spent["looks"][0]["next_cells"] and spent["looks"][1]["next_cells"] == []
    assert spent["stopped"].startswith("reached the cap of 2 rounds"), spent
    assert all(group_gone(g) for g in launched_groups(matrix))
