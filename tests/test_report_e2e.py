"""End to end: a real `repro run` against the embedded simulator, then `repro report` and `repro gate` on its directory.

Whether this small run corrupts depends on timing, so the assertions tie the report and the gate to
what the run itself recorded (sessions.jsonl, summary.json), whichever way it went.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from run_builders import run_main

pytestmark = pytest.mark.slow


def test_run_then_report_and_gate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", "from repro.cli import main; main()", "run", "--sessions", "20",
         "--concurrency", "20", "--turns", "4", "--out", str(run)],
        capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    sessions = [json.loads(line) for line in (run / "sessions.jsonl").read_text(encoding="utf-8").splitlines()]
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    corrupt = [s for s in sessions if s["outcome"] == "corrupt"]
    completed = sum(1 for s in sessions if s["outcome"] in ("clean", "corrupt"))
    assert summary["counts"]["corrupt"] == len(corrupt)

    code, out, err = run_main(capsys, "report", str(run), "--markdown", str(tmp_path / "s.md"))
    assert code == 0, err
    html = (run / "report.html").read_text(encoding="utf-8")
    assert html.count('class="session corrupt-session"') == len(corrupt)
    assert "Server metrics: " in html  # the run scraped the simulator's /metrics
    if corrupt:
        assert f"CORRUPT: {len(corrupt)} of {completed} completed sessions" in html
        assert "<mark>" in html and "raw bytes: raw/" in html
    else:
        assert "CORRUPT" not in html

    code, out, _ = run_main(capsys, "gate", str(run), "--max-corruption-rate", "0", "--min-completed", "10")
    lines = out.splitlines()
    # The simulator has HiCache and CUDA graphs on: the gate says whether the load made them act.
    assert [line.split(":")[0] for line in lines] == ["finished", "evidence", "exercised", "corruption-rate", "gate"]
    idle = [f for f in summary["exercised"]["features"] if f["status"] == "not exercised"]
    thin = completed < 10 or summary["counts"]["timeout"] > 0 or idle
    assert code == (1 if corrupt else 125 if thin else 0)
