"""`repro gate`: pass / fail / inconclusive with the exit codes `git bisect run` and CI read, on real run directories."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import re

import typer
import yaml

from repro.cli import app
from repro.errors import UsageError
from repro.run.gate import evaluate
from run_builders import make_run, run_main


def statuses(result) -> dict[str, str]:
    return {c.name: c.status for c in result.checks}


def check(result, name: str):
    return next(c for c in result.checks if c.name == name)


def test_clean_run_under_the_limit_passes(tmp_path: Path) -> None:
    result = evaluate(make_run(tmp_path / "r", clean=60), max_corruption_rate=0.1)
    assert result.exit_code == 0
    assert statuses(result) == {"finished": "pass", "evidence": "pass", "corruption-rate": "pass"}
    line = check(result, "corruption-rate").line
    assert line.startswith("corruption-rate: PASS: 0 of 60 completed sessions corrupt (0%)")
    assert "below 4.87% (95% upper bound), under the 10% allowed" in line
    assert check(result, "corruption-rate").numbers["upper"] == pytest.approx(1 - 0.05 ** (1 / 60))


def test_rate_shown_above_the_limit_fails(tmp_path: Path) -> None:
    result = evaluate(make_run(tmp_path / "r", clean=49, corrupt=11), max_corruption_rate=0.05)
    assert result.exit_code == 1
    rate = check(result, "corruption-rate")
    assert rate.status == "fail" and rate.numbers["lower"] > 0.05
    assert "11 of 60 completed sessions corrupt (18%)" in rate.line


def test_evidence_of_corruption_wins_over_a_thin_run(tmp_path: Path) -> None:
    # Too few completed and many timeouts, but 6 of 8 corrupt is proof enough that the rate exceeds 5%.
    result = evaluate(make_run(tmp_path / "r", clean=2, corrupt=6, timeout=10), max_corruption_rate=0.05)
    assert statuses(result) == {"finished": "pass", "evidence": "inconclusive", "corruption-rate": "fail"}
    assert result.exit_code == 1


def test_mostly_timeouts_is_inconclusive_never_a_pass(tmp_path: Path) -> None:
    result = evaluate(make_run(tmp_path / "r", clean=26, timeout=34), max_corruption_rate=0.2)
    assert result.exit_code == 125
    assert check(result, "evidence").status == "inconclusive"
    assert "34 of 60 sessions (57%) timed out (limit 20%)" in check(result, "evidence").line
    # Even with a loose timeout limit: counted as corrupt, the 34 timeouts would break the 20% limit.
    looser = evaluate(tmp_path / "r", max_corruption_rate=0.2, max_timeout_rate=0.6)
    assert looser.exit_code == 125 and "disagree about the 20% threshold" in check(looser, "evidence").line


def test_timeout_limit_is_configurable(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", clean=45, timeout=15)
    assert evaluate(run, max_corruption_rate=0.5).exit_code == 125
    assert evaluate(run, max_corruption_rate=0.5, max_timeout_rate=0.3).exit_code == 0


def test_between_the_bounds_asks_for_more_sessions(tmp_path: Path) -> None:
    result = evaluate(make_run(tmp_path / "r", clean=58, corrupt=2), max_corruption_rate=0.05)
    assert result.exit_code == 125
    rate = check(result, "corruption-rate")
    assert rate.status == "inconclusive" and rate.line.endswith("run more sessions")


def test_too_few_completed_is_inconclusive(tmp_path: Path) -> None:
    result = evaluate(make_run(tmp_path / "r", clean=12), max_corruption_rate=0.5, min_completed=20)
    assert result.exit_code == 125
    assert "only 12 of 12 sessions completed (minimum 20)" in check(result, "evidence").line


def test_zero_tolerance_passes_on_none_and_fails_on_one(tmp_path: Path) -> None:
    assert evaluate(make_run(tmp_path / "a", clean=30), max_corruption_rate=0).exit_code == 0
    assert evaluate(make_run(tmp_path / "b", clean=29, corrupt=1), max_corruption_rate=0).exit_code == 1


def test_baseline_increase_fails_even_under_a_loose_limit(tmp_path: Path) -> None:
    base = make_run(tmp_path / "base", name="main", clean=60)
    worse = make_run(tmp_path / "worse", name="pr", clean=49, corrupt=11)
    same = make_run(tmp_path / "same", name="pr2", clean=59, corrupt=1)
    result = evaluate(worse, max_corruption_rate=0.5, baseline=base)
    assert statuses(result) == {"finished": "pass", "evidence": "pass", "corruption-rate": "pass", "baseline": "fail",
                                "side-channels": "pass"}
    assert result.exit_code == 1
    assert check(result, "baseline").numbers["p_boschloo"] < 0.001
    assert check(result, "baseline").numbers["verdict"] == "worse"
    assert "11/60 (18%) vs 0/60 (0%) in baseline 'main'" in check(result, "baseline").line
    # 1 of 60 against 0 of 60 is neither worse nor shown within 5 points: inconclusive, with what would decide.
    thin = check(evaluate(same, max_corruption_rate=0.5, baseline=base), "baseline")
    assert thin.status == "inconclusive" and thin.numbers["sessions_to_decide"] == 142
    assert "about 142 completed sessions per arm would decide it" in thin.line
    # 300 clean against 300 clean: the difference lies within ±5 points, and a wider margin needs fewer.
    big_base, big = make_run(tmp_path / "bb", clean=300), make_run(tmp_path / "b", clean=300)
    line = check(evaluate(big, max_corruption_rate=0.5, baseline=big_base), "baseline").line
    assert line.startswith("baseline: PASS:") and "practically equivalent" in line and "±5 points" in line
    assert evaluate(same, max_corruption_rate=0.5, baseline=base, margin=0.1).exit_code == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_corruption_rate": 1.5}, "--max-corruption-rate must be at least 0 and below 1, got 1.5"),
        ({"max_corruption_rate": 0.1, "confidence": 1.0}, "--confidence must be above 0.5 and below 1"),
        ({"max_corruption_rate": 0.1, "max_timeout_rate": -1}, "--max-timeout-rate must be between 0 and 1"),
        ({"max_corruption_rate": 0.1, "min_completed": 0}, "--min-completed must be at least 1"),
    ],
)
def test_bad_options_are_usage_errors(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        evaluate(tmp_path, **kwargs)


def test_cli_gate_prints_one_line_per_check_and_exits_with_the_code(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", clean=26, timeout=34)
    done = subprocess.run(
        [sys.executable, "-c", "from repro.cli import main; main()", "gate", str(run),
         "--max-corruption-rate", "0.05", "--junit", str(tmp_path / "gate.xml")],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 125, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["finished", "evidence", "corruption-rate", "gate"]
    assert lines[-1] == "gate: INCONCLUSIVE (exit 125)"
    suite = ET.parse(tmp_path / "gate.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "3" and suite.get("skipped") == "2"


def test_cli_gate_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "gate", str(tmp_path / "missing"), "--max-corruption-rate", "0.1")
    assert code == 2 and err.count("\n") == 1 and "not a run directory" in err
    run = make_run(tmp_path / "r", clean=30)
    code, _, err = run_main(capsys, "gate", str(run), "--max-corruption-rate", "2")
    assert code == 2 and err == "repro: error: --max-corruption-rate must be at least 0 and below 1, got 2.0\n"
    code, _, err = run_main(capsys, "gate", str(run))
    assert code == 2 and "--max-corruption-rate" in err and "Traceback" not in err
    code, out, _ = run_main(capsys, "gate", str(run), "--max-corruption-rate", "0.2", "--baseline", str(run),
                            "--margin", "0.2")
    assert code == 0 and out.splitlines()[-1] == "gate: PASS (exit 0)"
    code, _, err = run_main(capsys, "gate", str(run), "--max-corruption-rate", "0.2", "--baseline", str(run),
                            "--margin", "0")
    assert code == 2 and err == "repro: error: --margin must be strictly between 0 and 1, got 0.0\n"


def test_example_ci_job_uses_only_real_commands_and_options() -> None:
    job = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "github-actions.yml").read_text())
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    used = []
    for step in job["jobs"]["repro"]["steps"]:
        script = step.get("run", "")
        for name in re.findall(r"^\s*repro (\w+)", script, re.MULTILINE):
            options = {opt for param in commands[name].params for opt in param.opts}
            for option in re.findall(r"(?<![\w-])--[a-z][a-z-]*", script):
                assert option in options, f"`repro {name}` has no {option}"
            used.append(name)
    assert used == ["run", "report", "gate"]
