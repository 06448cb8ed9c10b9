"""`repro run --control feature-off=NAME` end to end: the embedded simulator with the HiCache race (corrupts
under load only) and a model that loops on 5% of long prompts at any configuration, on the virtual clock.
The feature-off arm restarts the simulator with HiCache off: the race's turns must be gone there (HiCache's),
the loops must persist (not HiCache's). Against a URL the arm is refused before anything is made."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from repro.store.loops import count_loops
from repro.store.rundir import read_sessions

REPRO = [sys.executable, "-c", "from repro.cli import main; main()"]
MODEL = ["--clock", "virtual", "--time-scale", "0.05", "--final-after-turns", "10", "--model-loop-rate", "0.05"]
RACE = ["--enable-hierarchical-cache", "--index-k-dtype", "bf16"]
LOAD = ["--sessions", "24", "--concurrency", "24", "--turns", "14"]


def test_feature_off_puts_the_race_on_the_feature_and_the_loops_elsewhere(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run([*REPRO, "run", *LOAD, "--sim-args", " ".join([*MODEL, *RACE]), "--out", str(out),
                           "--control", "feature-off=hicache"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    report = json.loads((out / "control.json").read_text())
    [arm] = report["arms"]
    assert (arm["arm"], arm["feature"], arm["flags"]) == ("feature-off", "hicache", ["--no-enable-hierarchical-cache"])
    assert arm["feature_off_confirmed"] is True and arm["concurrency"] == 24, arm
    manifest = json.loads((out / arm["path"] / "manifest.json").read_text())
    assert manifest["control"] == "feature-off" and manifest["server_info"]["enable_hierarchical_cache"] is False
    assert json.loads((out / "manifest.json").read_text())["server_info"]["enable_hierarchical_cache"] is True

    # Truth from the records, not control.json: the run under test corrupts, the arm with HiCache off does not.
    main, control = read_sessions(out), read_sessions(out / arm["path"])
    corrupt_turns = sum(t.verdict == "corrupt" for s in main for t in s.turns)
    assert corrupt_turns >= 5 and not any(t.verdict == "corrupt" for s in control for t in s.turns)
    assert (arm["corrupt"]["load_only"], arm["corrupt"]["in_control_too"]) == (corrupt_turns, 0), arm
    loops = count_loops(main).turns
    assert loops >= 3 and arm["loops"]["in_control_too"] == loops and arm["loops"]["load_only"] == 0, arm

    said = " ".join(done.stdout.split())
    assert f"corrupt turns: {corrupt_turns} gone with HiCache off, 0 with HiCache off too (not HiCache's)" in said
    assert "feature-off=hicache" in (out / "report.html").read_text()


def test_feature_off_is_refused_against_a_url_and_for_an_unknown_feature(tmp_path: Path) -> None:
    for args, words in (
        (["--base-url", "http://127.0.0.1:1/v1", "--control", "feature-off=hicache"], "`repro matrix`"),
        (["--control", "feature-off=turbo"], "unknown feature; expected one of hicache, cuda-graph"),
    ):
        done = subprocess.run([*REPRO, "run", "--out", str(tmp_path / "never"), *args], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2 and words in done.stderr, done.stderr[-2000:]
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not (tmp_path / "never").exists()
