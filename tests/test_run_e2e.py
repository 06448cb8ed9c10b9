"""`repro run` end to end over real HTTP: against the simulator and against purpose-built faulty servers."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from rich.console import Console
from run_builders import run

from repro.errors import EXIT_INTERRUPTED, TargetError, UsageError
from repro.procs.process import free_port
from repro.run.options import RunOptions
from repro.run.runner import execute_run
from repro.sim.launch import SimHandle
from repro.store.rundir import load_run

ROOT = Path(__file__).resolve().parent.parent


def test_small_run_against_the_sim_matches_its_fault_log(
    sim_server: Callable[..., SimHandle], tmp_path: Path
) -> None:
    faults = tmp_path / "faults.jsonl"
    # The virtual clock: the faults (and so whether any is visible) are the seed's, not the machine's load.
    sim = sim_server("--enable-hierarchical-cache", "--index-k-dtype", "bf16", "--enable-metrics", "--clock", "virtual",
                     "--fault-log", str(faults))
    # 60 sessions: the load at which the simulator's race fires in 15-20% of sessions (the seeds' setting).
    result, screen = run(tmp_path / "run", base_url=sim.base_url, sessions=60, timeout=120, name="small")
    assert result.exit_code == 0
    loaded = load_run(result.path)
    manifest, summary = loaded.manifest, loaded.summary
    assert summary is not None and summary == result.summary
    assert manifest.name == "small" and manifest.ended_at is not None
    assert manifest.target == {"base_url": sim.base_url, "model": manifest.target["model"], "embedded": False}
    assert manifest.server_info is not None and manifest.server_info.get("enable_hierarchical_cache") is True
    assert manifest.workload["name"] == "agentic_coding" and len(manifest.workload["sha256"]) == 64
    assert manifest.options["sessions"] == 60

    assert len(loaded.sessions) == 60 == summary.sessions
    assert sorted(s.session_id for s in loaded.sessions) == list(range(60))
    assert set(summary.counts) == {"clean", "corrupt", "timeout", "error", "interrupted"}
    assert summary.counts["clean"] + summary.counts["corrupt"] == 60
    rate = summary.corruption_rate
    assert rate.n == 60 and rate.k == summary.counts["corrupt"] and rate.method == "clopper-pearson"
    assert 0 <= rate.ci_low <= rate.ci_high <= 1
    assert set(summary.latency) == {"ttft_s", "e2e_s", "queue_s", "max_gap_s", "session_s"}
    assert summary.loop_lag is not None and summary.loop_lag.count > 0
    assert summary.turns == sum(len(s.turns) for s in loaded.sessions) > 60

    # Every turn: a response id, timings, server accounting; every non-clean turn: its exact bytes on disk.
    for session in loaded.sessions:
        assert f"REPRO-0-{session.session_id:04d}" in session.task
        for turn in session.turns:
            assert turn.status == "ok" and turn.request_id and turn.e2e_s is not None and turn.ttft_s is not None
            assert turn.prompt_tokens and turn.http_status == 200
            if turn.verdict != "clean":
                assert turn.raw_path and (result.path / turn.raw_path).stat().st_size > 0

    # The harness's verdicts agree with the simulator's fault log, session by session and turn by turn: the
    # run judged the raw text too (`both`, the default), so every injected fault counts; the parsed verdict
    # alone finds the faults the simulator's parser let through (the log's "visible" ones).
    records = [json.loads(line) for line in faults.read_text().splitlines() if line.strip()]
    assert records and all(r["raw_verdict"] == "corrupt" for r in records)
    assert manifest.observe is not None and manifest.observe["mode"] == "both"
    logged = {r["request_id"] for r in records}
    visible = {r["request_id"] for r in records if r["parser_effect"] == "visible"}
    assert visible, "the simulator's parser let no fault through: nothing to compare"
    for session in loaded.sessions:
        hit = {turn.request_id for turn in session.turns} & logged
        assert (session.outcome == "corrupt") == bool(hit), (session.session_id, hit)
        assert {turn.request_id for turn in session.turns if turn.verdict == "corrupt"} == hit
        assert {turn.request_id for turn in session.turns if turn.parsed_verdict == "corrupt"} == hit & visible

    metrics = (result.path / "metrics.csv").read_text().splitlines()
    assert metrics[0] == "elapsed_s,metric,labels,value"
    assert any(line.split(",")[1] == "sglang:num_requests_total" for line in metrics[1:])
    assert "corruption rate (completed)" in screen and str(result.path) in screen
    assert "<html" in (result.path / "report.html").read_text()


def test_leaked_markup_is_corrupt_and_the_session_goes_on(faulty: str, tmp_path: Path) -> None:
    result, _ = run(tmp_path / "run", base_url=f"{faulty}/leak/v1", sessions=2, turns=6)
    sessions = load_run(result.path).sessions
    assert [s.outcome for s in sessions] == ["corrupt", "corrupt"]
    for session in sessions:
        assert session.first_corrupt_turn == 0 and session.finished
        assert [t.verdict for t in session.turns][:2] == ["corrupt", "clean"] and len(session.turns) > 2
        assert session.rules and session.turns[0].findings
        raw = (result.path / session.turns[0].raw_path).read_bytes()  # type: ignore[operator]
        assert b"\\uff5cDSML\\uff5c" in raw  # the server's JSON escapes the fullwidth bars
    assert result.summary.corruption_rate.k == 2


def test_gate_at_the_end_of_a_run(faulty: str, tmp_path: Path) -> None:
    failed, screen = run(tmp_path / "bad", base_url=f"{faulty}/leak/v1", sessions=3, max_corruption_rate=0.05)
    assert failed.exit_code == 1 and "gate: FAIL (exit 1)" in screen
    stored = load_run(failed.path).summary
    assert stored is not None and stored.gate is not None and stored.gate["status"] == "fail"
    thin, _ = run(tmp_path / "thin", base_url=f"{faulty}/good/v1", sessions=3, max_corruption_rate=0.05)
    assert thin.exit_code == 125  # 3 clean sessions cannot show a rate below 5%


def test_concurrency_cap_ramp_up_and_live_view(faulty: str, tmp_path: Path) -> None:
    screen = io.StringIO()
    options = RunOptions.parse(
        {"out": tmp_path / "run", "base_url": f"{faulty}/slow:0.02/v1", "sessions": 6, "concurrency": 2, "ramp_up": 0.6}
    )
    result = execute_run(options, console=Console(file=screen, force_terminal=True, width=150), live=True)
    sessions = sorted(load_run(result.path).sessions, key=lambda s: s.session_id)
    assert [s.outcome for s in sessions] == ["clean"] * 6
    # Starts are spread over the ramp-up: session i is never started before i * 0.6 / 6 seconds.
    assert all(s.start_s >= i * 0.1 - 0.01 for i, s in enumerate(sessions))
    # Never more than two sessions at once.
    events = sorted([(s.start_s, 1) for s in sessions] + [(s.end_s, -1) for s in sessions])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak == 2
    assert "Sessions" in screen.getvalue()


def test_session_budget_gives_timeouts_with_clean_turn_counts(faulty: str, tmp_path: Path) -> None:
    # 5 chunks 0.5 s apart: at least 2.5 s a turn, so a 6 s budget ends a 4-turn session early, and leaves a
    # loaded machine 3.5 s to spare on the first turn.
    result, _ = run(tmp_path / "run", base_url=f"{faulty}/slow:0.5/v1", sessions=3, concurrency=3, timeout=6)
    sessions = load_run(result.path).sessions
    for session in sessions:
        assert session.outcome == "timeout" and not session.wedged
        assert session.clean_turns >= 1
        assert session.clean_turns == sum(1 for t in session.turns if t.verdict == "clean")
        assert session.turns[-1].status == "timeout"
        assert session.error is not None and session.error.startswith("session budget of 6s used up")
    summary = result.summary
    assert summary.counts["timeout"] == 3 and summary.corruption_rate.n == 0
    assert summary.worst_case is not None and summary.worst_case.n == 3
    assert summary.inconclusive


def test_stalled_stream_marks_the_session_wedged(faulty: str, tmp_path: Path) -> None:
    # The first turn streams whole at once, the second stops after a chunk: a budget only the stop exceeds.
    result, _ = run(tmp_path / "run", base_url=f"{faulty}/stall/v1", sessions=2, stall_timeout=5)
    for session in load_run(result.path).sessions:
        assert (session.outcome, session.wedged, session.clean_turns) == ("timeout", True, 1)
        assert session.turns[-1].status == "stalled"
    assert result.summary.wedged == 2


@pytest.mark.parametrize("mode", ["http500", "malformed", "reset"])
def test_server_failures_are_errors(faulty: str, tmp_path: Path, mode: str) -> None:
    result, _ = run(tmp_path / "run", base_url=f"{faulty}/{mode}/v1", sessions=2)
    sessions = load_run(result.path).sessions
    assert [s.outcome for s in sessions] == ["error", "error"]
    assert all(s.error and (result.path / s.turns[0].raw_path).exists() for s in sessions)  # type: ignore[operator]
    assert result.summary.counts["clean"] == result.summary.counts["corrupt"] == 0


def test_target_problems_are_target_errors(faulty: str, tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="unreachable"):
        run(tmp_path / "a", base_url=f"http://127.0.0.1:{free_port()}/v1")
    with pytest.raises(TargetError, match="serves no model"):
        run(tmp_path / "b", base_url=f"{faulty}/nomodels/v1")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x").write_text("taken")
    with pytest.raises(UsageError, match="not an empty directory"):
        run(tmp_path / "c", base_url=f"{faulty}/good/v1")


def repro_cli(*args: str, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", "from repro.cli import main; main()", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_cli_errors_are_one_line_with_exit_codes(faulty: str, tmp_path: Path) -> None:
    cases = [
        (["--base-url", f"http://127.0.0.1:{free_port()}/v1"], 3, "unreachable"),
        (["--base-url", f"{faulty}/nomodels/v1"], 3, "serves no model"),
        (["--sessions", "0"], 2, "sessions"),
        (["--extra-body", "{nope"], 2, "extra_body"),
        (["--base-url", f"{faulty}/good/v1", "--api-key-env", "REPRO_TEST_UNSET_KEY"], 2, "REPRO_TEST_UNSET_KEY"),
    ]
    for args, code, words in cases:
        proc = repro_cli("run", "--out", str(tmp_path / "never"), *args)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == code, err
        assert "Traceback" not in err and err.count("\n") == 1 and words in err


def test_sigint_keeps_finished_sessions_and_writes_the_summary(faulty: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "REPRO_TEST_KEY": "sk-secret-value"}
    args = ["run", "--base-url", f"{faulty}/slow:0.1/v1", "--sessions", "8", "--concurrency", "2", "--out", str(out)]
    proc = repro_cli(*args, "--api-key-env", "REPRO_TEST_KEY", env=env)
    sessions_file = out / "sessions.jsonl"
    deadline = time.monotonic() + 180
    while not (sessions_file.exists() and sessions_file.read_text().count("\n") >= 1):
        assert proc.poll() is None and time.monotonic() < deadline, "no session finished in time"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, err
    loaded = load_run(out)
    assert loaded.summary is not None and loaded.summary.interrupted and loaded.summary.inconclusive
    outcomes = [s.outcome for s in loaded.sessions]
    assert "clean" in outcomes and "interrupted" in outcomes and len(outcomes) < 8
    assert loaded.summary.counts["interrupted"] == outcomes.count("interrupted")
    interrupted = next(s for s in loaded.sessions if s.outcome == "interrupted")
    assert interrupted.turns[-1].status == "interrupted"
    assert loaded.manifest.options["api_key_env"] == "REPRO_TEST_KEY"
    assert not any(b"sk-secret-value" in path.read_bytes() for path in out.rglob("*") if path.is_file())
