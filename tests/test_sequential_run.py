"""`repro run --until-decided`: waves, the anytime-valid stopping rule, and `repro gate` replaying its looks.

The end-to-end tests drive the embedded simulator: with the index-K gate (the fix) the run passes early,
in the seeds' configuration it fails early; both spend fewer sessions than the cap.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from proc_helpers import poll, wait_for
from repro.errors import EXIT_INTERRUPTED
from repro.run.gate import evaluate
from repro.store.records import SessionRecord
from repro.run.stopping import BaselineRule, StoppingRule, replay, waves_of
from repro.store.rundir import load_run
from run_builders import make_run, run, run_main


def test_rule_fails_on_a_shown_excess_and_passes_only_with_enough_completed() -> None:
    rule = StoppingRule(limit=0.05, confidence=0.95)
    assert rule.look(12, 40, 40).decision == "fail"
    assert rule.look(2, 40, 40).decision is None
    # 0 of 200 puts the sequence under 5%; the same bound from fewer completed sessions is not enough.
    assert rule.look(0, 200, 200).decision == "pass" and rule.look(0, 150, 150).decision is None
    loose = StoppingRule(limit=0.6, confidence=0.95, min_completed=20)
    assert loose.look(0, 12, 12).high < 0.6 and loose.look(0, 12, 12).decision is None
    assert loose.look(0, 20, 20).decision == "pass"
    # Stricter confidence, wider sequence: what 95% decides, 99.9% may not.
    assert StoppingRule(limit=0.05, confidence=0.999).look(9, 40, 40).decision is None
    assert rule.look(9, 40, 40).decision == "fail"


def _record(sid: int, outcome: str) -> SessionRecord:
    return SessionRecord(session_id=sid, task="t", outcome=outcome, start_s=0.0, end_s=1.0, turns=[])  # type: ignore[arg-type]


def test_replay_groups_waves_by_session_id_and_stops_at_the_first_decision() -> None:
    outcomes = ["corrupt"] * 8 + ["clean"] * 2 + ["clean"] * 10 + ["clean"] * 10
    shuffled = [_record(sid, outcome) for sid, outcome in reversed(list(enumerate(outcomes)))]
    waves = waves_of(shuffled, 10)
    assert [[r.session_id for r in wave] for wave in waves] == [list(range(i, i + 10)) for i in (0, 10, 20)]
    looks = replay(StoppingRule(limit=0.1), waves)
    assert len(looks) == 1 and looks[0].decision == "fail" and (looks[0].corrupt, looks[0].completed) == (8, 10)


def test_until_decided_needs_a_limit_and_waves(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_main(capsys, "run", "--until-decided", "--sessions", "20", "--concurrency", "5",
                            "--out", str(tmp_path / "a"))
    assert code == 2 and "--until-decided needs --max-corruption-rate" in err and "Traceback" not in err
    code, _, err = run_main(capsys, "run", "--until-decided", "--max-corruption-rate", "0.1", "--sessions", "20",
                            "--out", str(tmp_path / "b"))
    assert code == 2 and "--until-decided needs --concurrency below --sessions" in err
    code, _, err = run_main(capsys, "run", "--until-decided", "--baseline", str(tmp_path / "nowhere"),
                            "--sessions", "20", "--concurrency", "5", "--out", str(tmp_path / "c"))
    assert code == 2 and "--baseline: " in err and "not a run directory" in err
    code, _, err = run_main(capsys, "run", "--baseline", str(tmp_path / "nowhere"), "--out", str(tmp_path / "d"))
    assert code == 2 and "--baseline needs --until-decided" in err
    assert not any((tmp_path / name).exists() for name in "abcd")


def test_gate_fix_passes_early_and_the_gate_replays_the_decision(tmp_path: Path) -> None:
    # With the index-K gate the simulator never corrupts; 0 of 60 puts the 95% sequence under 15%.
    result, screen = run(tmp_path / "fixed", sim_args="--index-k-gate", sessions=180, concurrency=60,
                         until_decided=True, max_corruption_rate=0.15, timeout=120)
    assert result.exit_code == 0, screen
    stop = result.summary.stopping
    assert stop is not None and stop.decision == "pass" and stop.sessions < stop.cap == 180
    assert stop.sessions == result.summary.sessions == len(load_run(result.path).sessions)
    assert stop.looks == stop.sessions // 60 and stop.high < 0.15
    assert f"stopping: PASS after {stop.sessions} of 180 sessions" in screen
    gate = evaluate(result.path, max_corruption_rate=0.15)
    assert gate.exit_code == 0 and result.summary.gate is not None and result.summary.gate["status"] == "pass"
    finished = next(c for c in gate.checks if c.name == "finished")
    assert finished.status == "pass" and "stopped when decided (pass)" in finished.line
    # A stricter limit on the same records: the replayed sequence does not lie under 1%, so no pass.
    assert evaluate(result.path, max_corruption_rate=0.01).exit_code == 125
    html = (result.path / "report.html").read_text()
    assert "Stopping rule:" in html and f"after {stop.sessions} of 180 sessions" in html


def test_seeds_configuration_fails_early(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "seeds"
    code, stdout, err = run_main(capsys, "run", "--sessions", "240", "--concurrency", "60", "--until-decided",
                                 "--max-corruption-rate", "0.02", "--timeout", "120", "--out", str(out),
                                 "--sim-args", "--clock virtual")
    assert code == 1, stdout + err
    summary = load_run(out).summary
    assert summary is not None and summary.stopping is not None
    stop = summary.stopping
    assert stop.decision == "fail" and stop.sessions < 240 and stop.low > 0.02
    assert "stopping: FAIL after" in stdout
    # `repro gate` on the records reaches the run's verdict; so does a fixed-design reading of a
    # made-up run of the same counts that recorded every planned session (the check that differs).
    code, stdout, _ = run_main(capsys, "gate", str(out), "--max-corruption-rate", "0.02")
    assert code == 1 and "finished: ok: stopped when decided (fail)" in stdout and "looks replayed" in stdout
    partial = make_run(tmp_path / "cut", clean=stop.sessions - 1, options={"sessions": 240})
    assert evaluate(partial, max_corruption_rate=0.02).exit_code == 125


def test_baseline_rule_spends_alpha_over_its_looks() -> None:
    rule = BaselineRule(baseline_corrupt=0, baseline_completed=60, max_looks=3, confidence=0.99)
    # 9 of 60 against 0 of 60: Boschloo p = 0.0008, under 0.01 / 3.
    assert rule.look(9, 60, 60).decision == "fail"
    # 6 of 60: p = 0.009 would pass a single test at 0.01, not one look of three.
    six = rule.look(6, 60, 60)
    assert six.decision is None and six.p_value is not None and 0.01 / 3 < six.p_value < 0.01
    assert "neither an increase nor one under 5 points" in rule.describe(six)
    # No corruption in 200 against none in 60: the increase is shown under 5 points.
    clean = BaselineRule(baseline_corrupt=0, baseline_completed=60, max_looks=2, confidence=0.95).look(0, 200, 200)
    assert clean.decision == "pass" and clean.high < 0.05


def test_until_decided_against_a_baseline_fails_hicache_early(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # The baseline: a finished run with HiCache off, where the simulator never corrupts (60 clean sessions).
    off = make_run(tmp_path / "off", name="off", clean=60, options={"sessions": 60})
    code, stdout, err = run_main(capsys, "run", "--sessions", "180", "--concurrency", "60", "--until-decided",
                                 "--baseline", str(off), "--timeout", "120", "--out", str(tmp_path / "on"),
                                 "--sim-args", "--clock virtual")
    assert code == 1, stdout + err
    stop = load_run(tmp_path / "on").summary.stopping
    assert stop is not None and stop.decision == "fail" and stop.sessions < 180 and stop.baseline == "off"
    assert "an increase is shown" in stop.reason and "each look at 0.0167 = 0.05/3" in stop.reason
    code, stdout, _ = run_main(capsys, "gate", str(tmp_path / "on"), "--max-corruption-rate", "0.5",
                               "--baseline", str(off))
    assert code == 1 and "baseline: FAIL: looks replayed" in stdout


def test_ctrl_c_between_waves_saves_the_summary(tmp_path: Path) -> None:
    # A large baseline makes the look between two waves take a while (Boschloo over 20 against 1000), so
    # the SIGINT sent once the first wave is recorded lands while the rule looks, before the second starts.
    base = make_run(tmp_path / "off", name="off", clean=1000, options={"sessions": 1000})
    out = tmp_path / "on"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from repro.cli import main; main()", "run", "--sessions", "60", "--concurrency", "20",
         "--until-decided", "--baseline", str(base), "--sim-args", "--index-k-gate", "--turns", "2",
         "--timeout", "60", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines = out / "sessions.jsonl"
    try:
        assert poll(lambda: (lines.exists() and lines.read_text().count("\n") >= 20) or proc.poll() is not None,
                    timeout=120), "the first wave did not finish in time"
        proc.send_signal(signal.SIGINT)
        stdout, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED, stdout + err
    assert "Traceback" not in err and "repro: interrupted" not in err, err
    summary = load_run(out).summary
    assert summary is not None and summary.interrupted
    assert summary.stopping is not None and summary.stopping.decision == "undecided"
    assert "interrupted before a decision" in summary.stopping.reason
    # Stopped between the waves: the second never started, so nothing was cut short.
    assert len(load_run(out).sessions) == 20 and summary.stopping.looks == 1
    assert (out / "report.html").exists()


def test_ctrl_c_once_decided_keeps_the_decision(tmp_path: Path) -> None:
    # The seeds' configuration fails a 2% limit at its first look. The SIGINT goes out once the run has
    # printed its decision ("stopping: FAIL ...", just before it writes summary.json): it must finish
    # saving and stay a decided, failed run, not an interrupted one.
    out, screen = tmp_path / "seeds", tmp_path / "stdout.txt"
    with screen.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from repro.cli import main; main()", "run", "--sessions", "240",
             "--concurrency", "60", "--until-decided", "--max-corruption-rate", "0.02", "--timeout", "120",
             "--out", str(out), "--sim-args", "--clock virtual"],
            stdout=sink, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        wait_for(lambda: "stopping: FAIL" in screen.read_text() or proc.poll() is not None, 120, "the decision")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, screen.read_text() + err  # the gate's FAIL, not 130
    # The signal reached the run while it saved (the handler said so), not after it had ended.
    assert "repro: stopping: saving summary.json and report.html" in err, err
    summary = load_run(out).summary
    assert summary is not None and not summary.interrupted
    assert summary.stopping is not None and summary.stopping.decision == "fail"
    assert summary.stopping.reason.startswith("decided at look 1:")
    assert summary.gate is not None and summary.gate["status"] == "fail"
    assert "gate: FAIL (exit 1)" in screen.read_text() and (out / "report.html").exists()
