"""The run directory: sessions survive a crash, torn tails are skipped, bad files are named."""

from pathlib import Path

import pytest

from repro.errors import UsageError
from repro.store.records import Manifest, RateEstimate, SessionRecord, Summary, TurnRecord
from repro.store.rundir import RunWriter, load_run, read_sessions


def _manifest() -> Manifest:
    return Manifest(
        name="t", run_id="r1", command=["repro", "run"], options={}, workload={"name": "w"},
        target={"base_url": "http://127.0.0.1:1/v1", "model": "m", "embedded": True},
        started_at="2026-11-29T00:00:00Z",
    )


def _session(i: int, outcome: str = "clean") -> SessionRecord:
    turn = TurnRecord(index=0, status="ok", verdict="clean" if outcome == "clean" else "corrupt", start_s=0.0)
    return SessionRecord(session_id=i, task=f"task {i}", outcome=outcome, start_s=0.0, end_s=1.0, turns=[turn])


def test_round_trip(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path / "run")
    writer.write_manifest(_manifest())
    writer.append_session(_session(1))
    writer.append_session(_session(2, "corrupt"))
    rel = writer.write_raw(2, 0, b"data: {}\n\n")
    summary = Summary(
        sessions=2, counts={"clean": 1, "corrupt": 1}, wedged=0,
        corruption_rate=RateEstimate(k=1, n=2, estimate=0.5, ci_low=0.01, ci_high=0.99, method="clopper-pearson"),
    )
    writer.write_summary(summary)
    writer.close()
    run = load_run(tmp_path / "run")
    assert [s.outcome for s in run.sessions] == ["clean", "corrupt"]
    assert run.summary is not None and run.summary.corruption_rate.k == 1
    assert (tmp_path / "run" / rel).read_bytes() == b"data: {}\n\n"


def test_refuses_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(UsageError, match="not an empty directory"):
        RunWriter(tmp_path)


def test_torn_last_line_is_skipped_but_damage_elsewhere_is_named(tmp_path: Path) -> None:
    good = _session(1).model_dump_json()
    (tmp_path / "sessions.jsonl").write_text(good + "\n" + good[: len(good) // 2])
    assert len(read_sessions(tmp_path)) == 1
    (tmp_path / "sessions.jsonl").write_text('{"nope": 1}\n' + good + "\n")
    with pytest.raises(UsageError, match="sessions.jsonl:1"):
        read_sessions(tmp_path)


def test_missing_manifest_is_named(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no manifest.json"):
        load_run(tmp_path)


def test_an_interrupted_summary_counts_the_sessions_it_saved() -> None:
    from repro.store.summary import summarize

    cut = [SessionRecord(session_id=sid, task="t", outcome="interrupted", start_s=0.0, end_s=1.0, turns=[])
           for sid in range(60)]
    summary = summarize(cut, interrupted=True)
    assert summary.sessions == 60 and summary.counts["interrupted"] == 60
    assert summary.inconclusive_reasons[0] == "only 0 of 60 sessions completed, 60 interrupted (minimum 20)"
