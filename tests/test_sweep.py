"""`repro sweep`: levels, the onset against the concurrency-1 control, the curve, and its outputs.

End to end against a purpose-built server whose corruption does not depend on concurrency (every
fifth session leaks): the sweep must say so and name no onset.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from proc_helpers import poll
from run_builders import run_main

from repro.errors import EXIT_INTERRUPTED, UsageError
from repro.sweep.analysis import LevelResult, analyse
from repro.sweep.runner import parse_levels


def test_levels_lists_and_ranges() -> None:
    assert parse_levels("1,8,16,32,60") == [1, 8, 16, 32, 60]
    assert parse_levels("1-64:x2") == [1, 2, 4, 8, 16, 32, 64]
    assert parse_levels("8-32:+8, 1, 8") == [1, 8, 16, 24, 32]
    for bad in ("", "1", "0,8", "a,b", "8-1", "1-64:x1", "1-9:*2", "1-100000:+1"):
        with pytest.raises(UsageError, match="--concurrency"):
            parse_levels(bad)


def _level(concurrency: int, corrupt: int, clean: int) -> LevelResult:
    rate = corrupt / (corrupt + clean)
    return LevelResult(concurrency=concurrency, run_dir=f"c{concurrency:03d}", sessions=corrupt + clean, clean=clean,
                       corrupt=corrupt, timeout=0, error=0, corruption=(rate, 0.0, 1.0), timeouts=(0.0, 0.0, 0.1))


def test_onset_is_the_lowest_level_shown_above_the_control() -> None:
    levels = [_level(1, 0, 60), _level(8, 0, 60), _level(16, 1, 59), _level(32, 6, 54), _level(60, 10, 50)]
    judged, onset, curve, conclusion = analyse(levels, confidence=0.95)
    # 6 of 60 against 0 of 60: Boschloo p = 0.009, Holm-adjusted 0.028 over the four levels.
    assert onset == 32
    assert [level.above_control for level in judged] == [False, False, False, True, True]
    assert conclusion.startswith(f"onset at concurrency {onset}")
    assert curve.slope is not None and curve.slope > 0 and curve.p is not None and curve.p < 0.05
    assert curve.points[0][1] < 0.02 < 0.1 < curve.points[-1][1]
    # Holm over four levels: a level whose raw p clears alpha may not survive the adjustment.
    assert all(level.p_holm >= level.p_vs_control for level in judged[1:])


def test_flat_rate_has_no_onset_and_names_the_control() -> None:
    levels = [_level(1, 12, 48), _level(8, 11, 49), _level(32, 13, 47)]
    judged, onset, curve, conclusion = analyse(levels, confidence=0.95)
    assert onset is None and not any(level.above_control for level in judged)
    assert conclusion.startswith("no onset") and "does not depend on concurrency" in conclusion
    assert curve.slope is not None and curve.slope_low < 0 < curve.slope_high
    clean = analyse([_level(1, 0, 30), _level(8, 0, 30)], confidence=0.95)
    assert clean[1] is None and clean[2].slope is None and "was clean" in clean[2].note


def test_sweep_against_a_concurrency_independent_fault(
    faulty: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    code, stdout, err = run_main(capsys, "sweep", "--base-url", f"{faulty}/leak-every:5/v1", "--concurrency", "1,4,16",
                                 "--sessions", "20", "--out", str(out))
    assert code == 0, stdout + err
    data = json.loads((out / "sweep.json").read_text())
    assert [level["concurrency"] for level in data["levels"]] == [1, 4, 16]
    # Sessions 0, 5, 10, 15 leak at every level: 20% whatever the concurrency.
    assert [(level["corrupt"], level["clean"]) for level in data["levels"]] == [(4, 16)] * 3
    assert data["onset"] is None and data["control_corrupt"] is True
    assert "does not depend on concurrency" in data["conclusion"] and "sweep: no onset" in stdout
    assert all((out / f"c{c:03d}" / "sessions.jsonl").exists() for c in (1, 4, 16))
    html = (out / "sweep.html").read_text()
    assert "<script" not in html and "data:image/png;base64," in html and "does not depend on concurrency" in html
    assert "| 16 | 20 | 4/20 | 20.0% [" in (out / "sweep.md").read_text()


def test_sweep_escapes_what_it_shows(tmp_path: Path) -> None:
    from repro.sweep.analysis import OnsetCurve, SweepResult
    from repro.sweep.runner import write_outputs

    levels = analyse([_level(1, 0, 20), _level(8, 0, 20)], confidence=0.95)[0]
    result = SweepResult(name="<b>x</b>|y", target="http://h/<script>alert(1)</script>", confidence=0.95,
                         sessions_per_level=20, levels=levels, onset=None,
                         control_corrupt=False, curve=OnsetCurve(None, None, None, None, None, note="<i>n</i>"),
                         conclusion="no onset", started_at="now")
    write_outputs(result, tmp_path)
    html = (tmp_path / "sweep.html").read_text()
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<i>n</i>" not in html
    markdown = (tmp_path / "sweep.md").read_text()
    assert "<b>x</b>" not in markdown and "<script>" not in markdown


def test_sweep_bad_levels_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_main(capsys, "sweep", "--concurrency", "1,zero", "--out", str(tmp_path / "s"))
    assert code == 2 and "--concurrency '1,zero'" in err and not (tmp_path / "s").exists()


def test_sweep_launches_a_matrix_specs_cell_once(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec = Path(__file__).resolve().parent.parent / "matrices" / "sim_hicache_bf16.yaml"
    out = tmp_path / "sweep"
    # On the virtual clock, as every simulator here whose schedule could change an outcome: the seed's at any load.
    code, stdout, err = run_main(capsys, "sweep", "--spec", str(spec), "--cell", "hicache=on", "--cell", "index_k=bf16",
                                 "--var", "clock=virtual", "--concurrency", "1,4", "--sessions", "4", "--out", str(out))
    assert code == 0, stdout + err
    assert "launched cell hicache-on_index_k-bf16" in stdout
    for level in ("c001", "c004"):
        manifest = json.loads((out / level / "manifest.json").read_text())
        info = manifest["server_info"]
        assert info["enable_hierarchical_cache"] is True and info["index_k_dtype"] == "bf16"
        assert manifest["options"]["turns"] == 18  # the spec's load section
    ports = {json.loads((out / level / "manifest.json").read_text())["target"]["base_url"] for level in ("c001", "c004")}
    assert len(ports) == 1  # one deployment for every level
    assert json.loads((out / "sweep.json").read_text())["target"] == "sim-hicache-bf16: cell hicache-on_index_k-bf16"
    code, _, err = run_main(capsys, "sweep", "--spec", str(spec), "--cell", "hicache=maybe", "--cell", "index_k=bf16",
                            "--out", str(tmp_path / "bad"))
    assert code == 2 and "--cell hicache=maybe: not a level of 'hicache'" in err and not (tmp_path / "bad").exists()
    code, _, err = run_main(capsys, "sweep", "--cell", "hicache=on", "--out", str(tmp_path / "bad"))
    assert code == 2 and "give --spec too" in err


def test_sigint_stops_the_sweep_and_keeps_finished_levels(faulty: str, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from repro.cli import main; main()", "sweep", "--base-url", f"{faulty}/slow:0.1/v1",
         "--concurrency", "1,2", "--sessions", "4", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    # Once a session of the second level has finished, the others are in flight (4 sessions, 2 at a time).
    second = out / "c002" / "sessions.jsonl"
    assert poll(lambda: (second.exists() and second.read_text().count("\n") >= 1) or proc.poll() is not None,
                timeout=120), "no session of the second level finished in time"
    proc.send_signal(signal.SIGINT)
    stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, stdout + err
    assert "sweep interrupted at concurrency 2" in err and "Traceback" not in err, stdout + err
    assert (out / "c001" / "summary.json").exists() and not (out / "sweep.json").exists()


def test_sweep_takes_runs_load_options_and_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("sessions: 4\nconcurrency: 2\nturns: 3\nturn_timeout: 50\nstall_timeout: 20\n"
                      "sim_args: '--clock virtual'\n", encoding="utf-8")
    out = tmp_path / "sweep"
    code, stdout, err = run_main(capsys, "sweep", "--config", str(config), "--concurrency", "1,4", "--out", str(out),
                                 "--model", "deepseek-ai/DeepSeek-V4", "--stall-timeout", "25")
    assert code == 0, stdout + err
    for level in (1, 4):
        options = json.loads((out / f"c{level:03d}" / "manifest.json").read_text())["options"]
        # The level's own concurrency (not the config's 2), the config's load, the command line over the config.
        assert (options["concurrency"], options["sessions"], options["turns"]) == (level, 4, 3)
        assert (options["turn_timeout"], options["stall_timeout"]) == (50.0, 25.0)
        assert options["model"] == "deepseek-ai/DeepSeek-V4"
    assert "--clock virtual" in json.loads((out / "sweep.json").read_text())["target"]
    # Each level shows the run's own view: its final table, ending with the level's run directory.
    assert stdout.count("Run directory: ") == 2 and "Sessions" in stdout


def test_sweep_refuses_a_level_above_its_sessions(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, stdout, err = run_main(capsys, "sweep", "--concurrency", "1,60", "--sessions", "30",
                                 "--out", str(tmp_path / "s"))
    assert code == 2 and not (tmp_path / "s").exists()
    assert err.strip().count("\n") == 0 and "--sessions 30 is below concurrency 60" in err, err
    config = tmp_path / "gate.yaml"
    config.write_text("max_corruption_rate: 0.1\n", encoding="utf-8")
    code, _, err = run_main(capsys, "sweep", "--config", str(config), "--concurrency", "1,2", "--sessions", "2",
                            "--out", str(tmp_path / "s"))
    assert code == 2 and "max_corruption_rate is a single run's option" in err and not (tmp_path / "s").exists()
