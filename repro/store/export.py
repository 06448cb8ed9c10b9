"""`repro export`: one row per turn of a run directory, as CSV or JSON lines, for pandas and spreadsheets."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Any, Literal

from repro.errors import UsageError
from repro.store.records import SessionRecord, TurnRecord
from repro.store.rundir import Run
from repro.untrusted import csv_cell

ExportFormat = Literal["csv", "jsonl"]

COLUMNS = (
    "session_id", "task", "outcome", "session_rules", "turn", "status", "verdict", "parsed_verdict", "raw_verdict",
    "rules", "start_s", "queue_s", "ttft_s", "e2e_s", "max_gap_s", "chunks", "http_status", "finish_reason",
    "prompt_tokens", "completion_tokens", "cached_tokens", "tool_calls", "request_id", "error", "raw_path",
)
"""The export's columns, in order: the session's identity and outcome, then the turn's."""


def _rules(turn: TurnRecord) -> list[str]:
    """The hard rules that fired on the turn, on either verdict or in what the parse lost, first seen first."""
    found: list[str] = []
    for finding in (*turn.findings, *turn.raw_findings, *turn.lost_findings):
        if finding.severity == "hard" and finding.rule not in found:
            found.append(finding.rule)
    return found


def turn_rows(sessions: list[SessionRecord]) -> list[dict[str, Any]]:
    """One dict per turn, keyed by COLUMNS, sessions in id order."""
    rows = []
    for session in sorted(sessions, key=lambda s: s.session_id):
        for turn in session.turns:
            rows.append({
                "session_id": session.session_id, "task": session.task, "outcome": session.outcome,
                "session_rules": session.rules, "turn": turn.index, "status": turn.status, "verdict": turn.verdict,
                "parsed_verdict": turn.parsed_verdict, "raw_verdict": turn.raw_verdict, "rules": _rules(turn),
                **{key: getattr(turn, key) for key in COLUMNS[10:] if key != "raw_path"},
                "raw_path": turn.raw_path,
            })
    return rows


def render(run: Run, fmt: ExportFormat) -> str:
    """The run's turns as CSV (lists joined with spaces, text that would start a formula behind a `'`) or
    JSON lines (lists as lists, text as it is)."""
    rows = turn_rows(run.sessions)
    if fmt == "jsonl":
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: csv_cell(" ".join(value) if isinstance(value, list) else value) for key, value in row.items()})
    return out.getvalue()


def write(text: str, output: Path | None) -> None:
    """To the file, or to stdout when there is none."""
    if output is None:
        if sys.stdout is None:  # started with its standard output closed (`>&-`)
            raise UsageError("export: standard output is closed; give -o FILE")
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            raise  # a reader that stopped early (`| head`): the CLI ends quietly, as before
        except OSError as err:
            raise UsageError(f"export: cannot write to standard output: {err.strerror or err}") from None
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as err:
        raise UsageError(f"export -o {output}: cannot write: {err.strerror or err}") from None
