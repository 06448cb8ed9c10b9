"""`repro export`: a real run's turns, one row each, read back by pandas (CSV) and json (JSON lines)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from repro.store.rundir import load_run
from run_builders import run, run_main


@pytest.fixture(scope="module")
def leaky_run(faulty: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # `leak`: every session's first turn leaks DSML into its content (corrupt); later turns are clean.
    result, _ = run(tmp_path_factory.mktemp("export") / "run", base_url=f"{faulty}/leak~export/v1",
                    sessions=3, turns=3, observe="parsed", report=False)
    return result.path


def test_csv_has_one_row_per_turn_with_the_session_and_its_verdicts(
    capsys: pytest.CaptureFixture[str], leaky_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "turns.csv"
    code, _, err = run_main(capsys, "export", str(leaky_run), "-o", str(out))
    assert code == 0 and err == ""
    table = pd.read_csv(out)
    sessions = load_run(leaky_run).sessions
    assert len(table) == sum(len(s.turns) for s in sessions) == 9
    assert list(table.columns[:6]) == ["session_id", "task", "outcome", "session_rules", "turn", "status"]
    first = table[table["turn"] == 0]
    assert set(first["verdict"]) == {"corrupt"} and all(first["rules"].str.len() > 0)
    assert set(table[table["turn"] > 0]["verdict"]) == {"clean"}
    assert (table["e2e_s"] > 0).all() and (table["prompt_tokens"] > 0).all()
    assert first["raw_path"].notna().all() and table[table["turn"] > 0]["raw_path"].isna().all()


def test_jsonl_keeps_lists_and_goes_to_stdout(capsys: pytest.CaptureFixture[str], leaky_run: Path) -> None:
    code, out, _ = run_main(capsys, "export", str(leaky_run), "--format", "jsonl")
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(rows) == 9
    corrupt = [row for row in rows if row["verdict"] == "corrupt"]
    assert len(corrupt) == 3 and all(isinstance(row["rules"], list) and row["rules"] for row in corrupt)
    assert all(row["session_rules"] == corrupt[0]["session_rules"] for row in corrupt)


def test_bad_format_and_overwriting_a_record_are_refused(capsys: pytest.CaptureFixture[str], leaky_run: Path) -> None:
    code, _, err = run_main(capsys, "export", str(leaky_run), "--format", "xml")
    assert code == 2 and err == "repro: error: export --format xml: expected csv or jsonl\n"
    code, _, err = run_main(capsys, "export", str(leaky_run), "-o", str(leaky_run / "sessions.jsonl"))
    assert code == 2 and "would overwrite the records of run" in err
