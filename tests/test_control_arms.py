"""Control arms and loop signals end to end: a simulator whose model loops on 5% of long prompts at any
load (`--model-loop-rate`) and whose HiCache race corrupts only under load, on the virtual clock (the
same turns loop and race at any machine load). `repro run --control` must put the loops on the model
and the race on the load; the matrix must blame no server feature for the loops."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import yaml

from repro.matrix.spec import SpecLoader
from repro.sim.launch import SimHandle
from repro.store.loops import compare, count_loops, own_signals
from repro.store.records import FindingRecord, SessionRecord, TurnRecord

ROOT = Path(__file__).resolve().parent.parent
REPRO = [sys.executable, "-c", "from repro.cli import main; main()"]
MODEL = ["--clock", "virtual", "--time-scale", "0.05", "--final-after-turns", "10", "--model-loop-rate", "0.05"]
"""The model: loops on 5% of the prompts after 3 assistant turns, the same turns at any load."""
RACE = ["--enable-hierarchical-cache", "--index-k-dtype", "bf16"]
"""The deployment under test: HiCache with a bf16 index-K, whose race corrupts under load only."""
LOAD = ["--sessions", "24", "--concurrency", "24", "--turns", "14"]


def _turn(index: int, *, finish: str = "tool_calls", verdict: str = "clean", calls: int = 1, tokens: int = 100,
          rules: tuple[str, ...] = ()) -> TurnRecord:
    findings = [FindingRecord(rule=r, field="content", start=0, end=1, excerpt="x", severity="soft") for r in rules]
    return TurnRecord(index=index, status="ok", verdict=verdict, start_s=0.0, finish_reason=finish,  # type: ignore[arg-type]
                      completion_tokens=tokens, tool_calls=["f"] * calls, findings=findings)


def _session(session_id: int, turns: list[TurnRecord]) -> SessionRecord:
    return SessionRecord(session_id=session_id, task="t", outcome="clean", start_s=0.0, end_s=1.0, turns=turns)


def test_loop_signals_are_their_own_class_and_a_control_attributes_each_failing_turn() -> None:
    looping = _turn(3, finish="length", verdict="suspect", calls=0, tokens=1024, rules=("repetition-loop",))
    assert own_signals(looping) == ["length-no-tool", "repeated-span"]
    # Cut by max_tokens while calling a tool is not a loop: the answer was a call.
    assert own_signals(_turn(1, finish="length")) == []
    main = [_session(0, [_turn(0), _turn(1, verdict="corrupt"), _turn(2, tokens=900), looping]),
            _session(1, [_turn(0, verdict="corrupt"), _turn(1)])]
    control = [_session(0, [_turn(0), _turn(1), _turn(2, tokens=100), looping]),
               _session(1, [_turn(0, verdict="corrupt")])]
    got = compare("concurrency-1", "control-concurrency-1", main, control, control_loops=count_loops(control))
    # Session 0: turn 1 corrupt only under load; turn 2 inflated 9x over its control (a loop signal, load
    # only); turn 3 loops in the control too. Session 1: turn 0 corrupt in the control too.
    assert (got.corrupt.load_only, got.corrupt.in_control_too, got.corrupt.unpaired) == (1, 1, 0)
    assert (got.loops.load_only, got.loops.in_control_too, got.loops.unpaired) == (1, 1, 0)
    assert got.loop_counts.by_signal == {"length-no-tool": 1, "repeated-span": 1, "inflation": 1}
    assert got.paired_turns == 5 and got.control_corrupt_turns == 1
    # Without a control there is no inflation to measure: the class holds the turn's own signals only.
    assert count_loops(main).by_signal == {"length-no-tool": 1, "repeated-span": 1}


def test_control_arms_put_the_loops_on_the_model_and_the_race_on_the_load(
    tmp_path: Path, sim_server: Callable[..., SimHandle]
) -> None:
    # The reference: the same model served without the race (the gate on), as an official API would.
    reference = sim_server(*MODEL, *RACE, "--index-k-gate")
    out = tmp_path / "run"
    done = subprocess.run([*REPRO, "run", *LOAD, "--sim-args", " ".join([*MODEL, *RACE]), "--out", str(out),
                           "--control", "concurrency-1", "--control", f"reference={reference.base_url}"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    report = json.loads((out / "control.json").read_text())
    assert report["ignore_eos"] is False
    arms = {arm["arm"]: arm for arm in report["arms"]}
    assert set(arms) == {"concurrency-1", "reference"}
    main_loops = count_loops(_sessions(out))
    assert main_loops.turns >= 3, main_loops  # 5% of the long turns of 24 sessions
    for name, arm in arms.items():
        detail = f"{name}: {arm}"
        # Every loop of the run under test loops in the control too: the model's, not the load's.
        assert arm["loops"]["in_control_too"] == main_loops.turns and arm["loops"]["load_only"] == 0, detail
        # The race corrupts under load only: the control's same turns are clean.
        assert arm["corrupt"]["load_only"] >= 5 and arm["corrupt"]["in_control_too"] == 0, detail
        assert arm["control_corrupt_turns"] == 0, detail
        assert arm["control_loop_counts"]["turns"] == main_loops.turns, detail
        manifest = json.loads((out / arm["path"] / "manifest.json").read_text())
        assert manifest["control"] == name and manifest["ignore_eos"] is False
    assert arms["concurrency-1"]["concurrency"] == 1
    assert json.loads((out / "manifest.json").read_text())["ignore_eos"] is False
    assert "loop turns (not counted as corrupt): " in done.stdout
    html = (out / "report.html").read_text()
    assert "Loop signals and control arms" in html and "fail only under load" in html


def test_a_bad_control_or_ignore_eos_is_a_usage_error_before_anything_runs(tmp_path: Path) -> None:
    for args, words in ((["--control", "concurrency-2"], "expected concurrency-1, reference=URL[,api-key-env=NAME] or feature-off=NAME"),
                        (["--control", "reference=http://127.0.0.1:1/v1,key=X"], "only ,api-key-env=NAME"),
                        (["--control", "concurrency-1", "--pressure", "auto"], "--control with --pressure"),
                        (["--extra-body", '{"ignore_eos": true}'], "ignore_eos is never sent")):
        done = subprocess.run([*REPRO, "run", "--out", str(tmp_path / "never"), *args], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2 and words in done.stderr, done.stderr[-2000:]
        assert not (tmp_path / "never").exists()


def test_the_matrix_blames_no_feature_for_the_models_loops(tmp_path: Path) -> None:
    # The shipped simulator matrix with the race fixed (the gate on) and the model looping: loops in every
    # cell, corruption in none, so no factor is a cause.
    spec: dict[str, Any] = yaml.load((ROOT / "matrices" / "sim_hicache_bf16.yaml").read_text(), Loader=SpecLoader)
    spec["load"] = {**spec["load"], "workload": str(ROOT / "experiments" / "agentic_coding.yaml"), "sessions": 24,
                    "concurrency": 24, "turns": 14}
    spec["variables"] = {**spec.get("variables", {}), "time_scale": "0.05", "final_after": "10", "clock": "virtual"}
    spec["design"] = {**spec.get("design", {}), "seed": 11, "min_completed": 20, "replicates": 1}
    spec["deployment"]["command"] += " --index-k-gate --model-loop-rate 0.05"
    path = tmp_path / "loops.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = subprocess.run([*REPRO, "matrix", str(path), "--out", str(tmp_path / "m"), "--no-cell-reports"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    result = json.loads((tmp_path / "m" / "matrix.json").read_text())
    assert done.returncode in (0, 1), done.stderr[-3000:]
    verdicts = {f["factor"]: f["verdict"] for f in result["factors"]}
    assert all(c["counts"]["corrupt"] == 0 for c in result["cells"]), result["cells"]
    assert all(v in ("no detectable effect", "inconclusive") for v in verdicts.values()), result["verdict"]
    cell_runs = [p.parent for p in (tmp_path / "m").rglob("sessions.jsonl")]
    assert len(cell_runs) == len(result["cells"])
    assert all(count_loops(_sessions(run)).turns >= 1 for run in cell_runs)


def _sessions(run: Path) -> list[SessionRecord]:
    return [SessionRecord.model_validate_json(line) for line in (run / "sessions.jsonl").read_text().splitlines()]
