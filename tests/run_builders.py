"""Run directories built the way `repro run` writes them, for the report, gate and browser tests.

manifest, sessions.jsonl, raw SSE bytes of every non-clean turn, summary.json and metrics.csv, all
through RunWriter; and `run_main`, which runs the `repro` CLI in this process.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from repro.cli import main
from repro.run.finish import RunResult
from repro.run.runner import execute_run
from repro.run.options import RunOptions
from repro.store.records import (
    Exercise,
    FindingRecord,
    Manifest,
    RateEstimate,
    SessionRecord,
    Summary,
    TurnRecord,
)
from repro.store.rundir import Run, RunWriter, load_run

SENTINEL = "｜DSML｜"
LEAK = f'Let me check.\n\n<{SENTINEL}tool_calls>\n<{SENTINEL}invoke name="get_weather">'


def sse(content: str, *, pieces: int = 4) -> bytes:
    """A streamed chat completion whose content deltas concatenate to `content`."""
    step = max(1, len(content) // pieces)
    chunks = [content[i : i + step] for i in range(0, len(content), step)] or [""]
    lines = [
        "data: " + json.dumps({"id": "cmpl-1", "choices": [{"index": 0, "delta": {"content": c}}]}) + "\n\n"
        for c in chunks
    ]
    lines.append('data: {"id": "cmpl-1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n')
    lines.append("data: [DONE]\n\n")
    return "".join(lines).encode("utf-8")


def make_run(
    path: Path,
    *,
    name: str = "run",
    clean: int = 0,
    corrupt: int = 0,
    timeout: int = 0,
    error: int = 0,
    leak: str = LEAK,
    options: dict | None = None,
    metrics: str | None = None,
    summary: bool = True,
    task: str = "weather",
    exercised: Exercise | None = None,
) -> Path:
    """Write a run directory with the given outcome counts; corrupt sessions carry `leak` in turn 1's content."""
    writer = RunWriter(path)
    writer.write_manifest(
        Manifest(
            name=name,
            run_id=f"{name}-id",
            command=["repro", "run"],
            options=options or {},
            workload={"name": "agentic", "path": "experiments/agentic.yaml", "sha256": "0" * 64},
            target={"base_url": "http://127.0.0.1:9/v1", "model": "deepseek-v4", "embedded": False},
            started_at="2026-11-29T12:00:00Z",
            ended_at="2026-11-29T12:05:00Z" if summary else None,
        )
    )
    outcomes = ["clean"] * clean + ["corrupt"] * corrupt + ["timeout"] * timeout + ["error"] * error
    for sid, outcome in enumerate(outcomes):
        start = 0.5 * sid
        turns = [
            TurnRecord(index=0, status="ok", verdict="clean", start_s=start, ttft_s=0.2 + 0.01 * sid,
                       e2e_s=1.0 + 0.02 * sid, chunks=5, finish_reason="tool_calls", tool_calls=["get_weather"])
        ]
        extra: dict = {}
        if outcome == "corrupt":
            start_at = leak.index(SENTINEL) if SENTINEL in leak else 0
            raw = writer.write_raw(sid, 1, sse(leak))
            turns.append(TurnRecord(
                index=1, status="ok", verdict="corrupt", start_s=start + 1.1, ttft_s=0.3, e2e_s=1.5,
                finish_reason="stop", request_id=f"req-{sid}", raw_path=raw,
                findings=[FindingRecord(rule="sentinel", field="content", start=start_at,
                                        end=start_at + len(SENTINEL), excerpt=leak[start_at:start_at + 20],
                                        severity="hard")],
            ))
            extra = {"first_corrupt_turn": 1, "rules": ["sentinel"]}
        elif outcome == "timeout":
            raw = writer.write_raw(sid, 1, b'data: {"choices": [{"index": 0, "delta": {"content": "Let"}}]}\n\n')
            turns.append(TurnRecord(index=1, status="timeout", start_s=start + 1.1, raw_path=raw,
                                    error="session budget ran out"))
        elif outcome == "error":
            raw = writer.write_raw(sid, 1, b'{"error": "overloaded"}', suffix="json")
            turns.append(TurnRecord(index=1, status="error", start_s=start + 1.1, http_status=503, raw_path=raw,
                                    error="HTTP 503"))
        else:
            turns.append(TurnRecord(index=1, status="ok", verdict="clean", start_s=start + 1.1, ttft_s=0.25,
                                    e2e_s=1.2, finish_reason="stop"))
        writer.append_session(SessionRecord(
            session_id=sid, task=task, outcome=outcome, start_s=start, end_s=start + 3.0, turns=turns,
            finished=outcome == "clean", clean_turns=1 if outcome != "clean" else 2,
            wedged=outcome == "timeout", error=turns[-1].error, **extra,
        ))
    if summary:
        n = clean + corrupt
        writer.write_summary(Summary(
            sessions=len(outcomes),
            counts={"clean": clean, "corrupt": corrupt, "timeout": timeout, "error": error, "interrupted": 0},
            wedged=timeout,
            corruption_rate=RateEstimate(k=corrupt, n=n, estimate=corrupt / n if n else None, ci_low=0.0,
                                         ci_high=1.0, method="clopper-pearson"),
            duration_s=0.5 * len(outcomes) + 3.0,
            exercised=exercised,
        ))
    writer.close()
    if metrics is not None:
        (path / "metrics.csv").write_text(metrics, encoding="utf-8")
    return path


METRICS_CSV = "t_s,metric,labels,value\n" + "".join(
    f"{t},sglang:num_running_reqs,,{t % 7}\n{t},sglang:load_back_tokens_total,,{100 * t}\n" for t in range(30)
)


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`repro ARGS` in this process (the imports are paid once): exit code, stdout, stderr."""
    capsys.readouterr()
    old = sys.argv
    sys.argv = ["repro", *args]
    try:
        main()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 1
    finally:
        sys.argv = old
    out, err = capsys.readouterr()
    return code, out, err


def run(out: Path, *, report: bool = True, **options: Any) -> tuple[RunResult, str]:
    """A run in this process, its table captured: the result and what it printed (`report=False`: no report.html)."""
    screen = io.StringIO()
    result = execute_run(
        RunOptions.parse({"out": out, **options}), console=Console(file=screen, width=150), live=False, report=report
    )
    return result, screen.getvalue()


def assert_every_shard_cut_short(out: Path, planned: int) -> None:
    """A 2-worker run interrupted mid-load: its summary says so, and both workers' sessions in flight came back
    (ids of both parities were cut short), each session recorded once."""
    loaded = load_run(out)
    assert loaded.summary is not None and loaded.summary.interrupted
    outcomes = [s.outcome for s in loaded.sessions]
    assert "interrupted" in outcomes and len(outcomes) < planned
    assert {s.session_id % 2 for s in loaded.sessions if s.outcome == "interrupted"} == {0, 1}
    assert len({s.session_id for s in loaded.sessions}) == len(outcomes)


def assert_worker_1_lost(out: Path) -> Run:
    """A 2-worker run of 8 sessions whose worker 1 was lost with every session in flight: its sessions (odd
    ids) are errors naming it, worker 0's finished clean, and the run is interrupted and inconclusive."""
    loaded = load_run(out)
    by_id = {s.session_id: s for s in loaded.sessions}
    assert sorted(by_id) == list(range(8))
    assert all(by_id[i].outcome == "error" and "worker 1" in (by_id[i].error or "") for i in (1, 3, 5, 7))
    assert all(by_id[i].outcome == "clean" for i in (0, 2, 4, 6))
    assert loaded.summary is not None and loaded.summary.interrupted and loaded.summary.inconclusive
    return loaded

