"""How long `render_report` takes on a large run (not a test: prints numbers).

Builds a run directory of N sessions (default 1000, 12 turns each, 15% corrupt, 5% timed out) with
RunWriter, then times loading plus rendering, and prints the HTML size.
Usage: .venv/bin/python benchmarks/report_speed.py [N]
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

from repro.store.records import FindingRecord, Manifest, SessionRecord, TurnRecord
from repro.report import render_report
from repro.store.rundir import RunWriter

LEAK = "Checking now.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"read_file\">" + " filler" * 200


def build(path: Path, sessions: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    writer = RunWriter(path)
    writer.write_manifest(Manifest(name="bench", run_id="bench", command=["bench"], options={},
                                   workload={"name": "bench"}, target={"base_url": "http://127.0.0.1:9/v1"},
                                   started_at="2026-01-01T00:00:00Z"))
    body = "".join("data: " + json.dumps({"choices": [{"delta": {"content": LEAK[i:i + 16]}}]}) + "\n\n"
                   for i in range(0, len(LEAK), 16)).encode()
    for sid in range(sessions):
        roll, start = rng.random(), rng.uniform(0, 600)
        outcome = "corrupt" if roll < 0.15 else "timeout" if roll < 0.20 else "clean"
        turns, t = [], start
        for index in range(12):
            turn = TurnRecord(index=index, status="ok", verdict="clean", start_s=t, ttft_s=rng.uniform(0.1, 3),
                              e2e_s=rng.uniform(1, 12))
            if outcome == "corrupt" and index == 11:
                offset = LEAK.index("｜DSML｜")
                turn = turn.model_copy(update={"verdict": "corrupt", "raw_path": writer.write_raw(sid, index, body),
                                               "findings": [FindingRecord(rule="sentinel", field="content",
                                                                          start=offset, end=offset + 6,
                                                                          excerpt="｜DSML｜", severity="hard")]})
            turns.append(turn)
            t += turn.e2e_s or 1.0
        writer.append_session(SessionRecord(session_id=sid, task="bench", outcome=outcome, start_s=start, end_s=t,
                                            turns=turns, clean_turns=11 if outcome != "clean" else 12,
                                            rules=["sentinel"] if outcome == "corrupt" else []))
    writer.close()


def main() -> None:
    sessions = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        started = time.perf_counter()
        build(run, sessions)
        built = time.perf_counter()
        result = render_report([run], Path(tmp) / "report.html")
        done = time.perf_counter()
        print(f"sessions={sessions} turns={12 * sessions} build_s={built - started:.2f} "
              f"render_s={done - built:.2f} html_bytes={result.html.stat().st_size}")


if __name__ == "__main__":
    main()
