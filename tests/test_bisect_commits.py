"""`repro bisect commits` and `repro probe` end to end: a real git repository of simulator versions
(repro.bisect.simrepo), real `repro` processes, real simulators; SIGKILL and resume, Ctrl-C, and
`git bisect run` reading `repro probe`'s exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.bisect.gitrepo import commit_range
from repro.bisect.matrixdeploy import commit_launch, load_deployment
from repro.bisect.simrepo import BUILD, DEPLOY, build_repo
from repro.errors import UsageError
from proc_helpers import group_gone

REPRO = [sys.executable, "-c", "from repro.cli import main; main()"]
LOAD = ["--sessions", "16", "--turns", "14"]


def _wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _serving_probe(out: Path) -> tuple[Path, int] | None:
    """The probe directory whose server is up (its processes.json names a live group), if any."""
    for listing in sorted(out.glob("probes/*/logs/processes.json")):
        try:
            entries = json.loads(listing.read_text())
        except ValueError:
            continue
        for entry in entries:
            try:
                os.killpg(entry["pgid"], 0)
            except ProcessLookupError:
                continue
            if any(listing.parent.parent.glob("round-1/manifest.json")):
                return listing.parent.parent, entry["pgid"]
    return None


def test_commit_range_is_first_parent_and_checked(tmp_path: Path) -> None:
    shas = build_repo(tmp_path / "repo", commits=4, culprit=2)
    assert [c.sha for c in commit_range(tmp_path / "repo", shas[0], "main")] == shas
    with pytest.raises(UsageError, match="not an ancestor"):
        commit_range(tmp_path / "repo", shas[2], shas[1])
    with pytest.raises(UsageError, match="not a commit"):
        commit_range(tmp_path / "repo", "nope", "main")
    with pytest.raises(UsageError, match="not a git repository"):
        commit_range(tmp_path, "a", "b")


def test_commit_bisection_steers_around_broken_builds_survives_sigkill_and_resumes(tmp_path: Path) -> None:
    shas = build_repo(tmp_path / "repo", commits=7, culprit=5, broken={2, 3})
    out = tmp_path / "bisect"
    args = [*REPRO, "bisect", "commits", "--repo", str(tmp_path / "repo"), "--good", shas[0], "--bad", "main",
            "--build", BUILD, "--deploy", DEPLOY, "--out", str(out), *LOAD]
    first = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        # Kill the harness while a probe after the bad end has its server up and its load running.
        def later_probe() -> tuple[Path, int] | None:
            found = _serving_probe(out)
            return found if found and not found[0].name.startswith("001-") else None

        probe_dir, pgid = _wait_for(later_probe, 200, "a probe after the bad end to serve")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=30)
    # The reaper stops the server the killed harness left behind.
    assert group_gone(pgid, timeout=120)
    recorded = len((out / "probes.jsonl").read_text().splitlines())
    running = json.loads((out / "bisect.json").read_text())
    assert running["status"] == "running" and len(running["probes"]) == recorded

    done = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{recorded} probe(s) already recorded" in done.stderr
    state = json.loads((out / "bisect.json").read_text())
    assert state["status"] == "found"
    assert state["found"][0].startswith(f"5 {shas[5][:10]}")
    assert state["top"][0]["probability"] >= 0.95
    probes = state["probes"]
    assert probes[0]["index"] == 6 and probes[0]["verdict"] == "bad"
    # A commit that does not build is inconclusive, with the build's words, and never probed twice.
    broken = [p for p in probes if p["index"] in (2, 3)]
    assert broken and all(p["verdict"] == "inconclusive" and "build exited with code 1" in p["message"] for p in broken)
    assert len({p["index"] for p in broken}) == len(broken)
    # Every commit below the culprit that was probed stayed clean (a one-round probe may end undecided:
    # its counts still count); the culprit itself corrupted.
    assert all(p["corrupt"] == 0 and p["verdict"] in ("good", "undecided") for p in probes if p["index"] in (0, 1, 4))
    assert any(p["index"] == 5 and p["verdict"] == "bad" for p in probes)
    # The killed probe's directory was moved aside and the probe rerun (unless the kill came in the
    # instant between its record and its server's end); posteriors are distributions.
    if int(probe_dir.name[:3]) > recorded:
        assert probe_dir.with_name(probe_dir.name + ".partial-1").exists()
    assert all(abs(sum(p["posterior"]) - 1) < 1e-9 for p in probes)
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "drop the index-K gate" in html


def test_find_fix_names_the_commit_that_adds_the_gate(tmp_path: Path) -> None:
    # Commits 0-2 lack the index-K gate (they corrupt on the virtual clock); commit 3 adds it.
    shas = build_repo(tmp_path / "repo", commits=6, culprit=3, fix=True)
    out = tmp_path / "bisect"
    done = subprocess.run([*REPRO, "bisect", "commits", "--repo", str(tmp_path / "repo"), "--find-fix",
                           "--bad", shas[0], "--good", "main", "--build", BUILD, "--deploy", DEPLOY,
                           "--out", str(out), *LOAD], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the first good commit after a bad range (--find-fix)" in done.stderr
    assert f"Fixing commit: {shas[3]}" in done.stderr
    state = json.loads((out / "bisect.json").read_text())
    assert state["direction"] == "fix" and state["found"][0].startswith(f"3 {shas[3][:10]}")
    # The old end is probed first (it must corrupt); labels speak history, indexes the search's order.
    first = state["probes"][0]
    assert first["target"].startswith(f"0 {shas[0][:10]}") and first["index"] == 5 and first["verdict"] == "bad"
    assert all(p["corrupt"] == 0 for p in state["probes"] if int(p["target"].split()[0]) >= 3)
    md = (out / "report.md").read_text()
    assert "Searched: the first good commit after a bad range (--find-fix)." in md and "P(fixes it)" in md
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "the fixing one (the first good one)" in html
    # The ends the other way round are a usage error that names the options as given.
    wrong = subprocess.run([*REPRO, "bisect", "commits", "--repo", str(tmp_path / "repo"), "--find-fix",
                            "--bad", "main", "--good", shas[0], "--deploy", DEPLOY, "--out", str(tmp_path / "w")],
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and f"--bad main is not an ancestor of --good {shas[0]}" in wrong.stderr


def test_git_bisect_run_reads_repro_probe_and_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shas = build_repo(repo, commits=4, culprit=2)
    probe = [*REPRO, "probe", "--deploy", DEPLOY, "--bad-rate", "0.35", "--commits", "4", *LOAD]
    subprocess.run(["git", "-C", str(repo), "bisect", "start", "main", shas[0]], check=True, capture_output=True)
    done = subprocess.run(["git", "-C", str(repo), "bisect", "run", *probe], capture_output=True, text=True,
                          timeout=280, cwd=repo)
    # git probes commit 1 (good: exit 0) and commit 2 (bad: exit 1), whichever order it picks.
    assert f"{shas[2]} is the first bad commit" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    subprocess.run(["git", "-C", str(repo), "bisect", "reset"], check=True, capture_output=True)

    # A usage error must abort `git bisect run` (exit above 127), never read as "bad".
    wrong = subprocess.run([*probe, "--probe", "nope"], capture_output=True, text=True, timeout=60, cwd=repo)
    assert wrong.returncode == 255 and "--probe must be sequential or fixed" in wrong.stderr

    out = tmp_path / "interrupted"
    running = subprocess.Popen([*probe, "--sessions", "64", "--out", str(out)], cwd=repo,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        def serving() -> int | None:
            listing = out / "logs" / "processes.json"
            if not listing.exists() or not (out / "round-1" / "manifest.json").exists():
                return None
            return json.loads(listing.read_text())[0]["pgid"]

        pgid = _wait_for(serving, 120, "the probe's load to start")
        os.kill(running.pid, signal.SIGINT)
        assert running.wait(timeout=60) == 130
    finally:
        if running.poll() is None:
            os.killpg(running.pid, signal.SIGKILL)
            running.wait(timeout=30)
    assert group_gone(pgid, timeout=60)


SPEC = """\
name: sim-versions
variables: {port: auto, rev: "", src: ""}
factors:
  hicache:
    levels:
      off: {flags: --no-enable-hierarchical-cache, confirm: {enable_hierarchical_cache: false}}
      on: {flags: --enable-hierarchical-cache, confirm: {enable_hierarchical_cache: true}}
deployment:
  command: bash -c 'REV=${rev} ${python} -m repro.sim serve --port ${port} $(cat ${src}/sim.flags) ${flags}'
  port: ${port}
load: {sessions: 16, turns: 14}
"""


def test_matrix_deployment_resolves_a_cell_per_commit(tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(SPEC)
    spec, cell = load_deployment(spec_file, "hicache=on")
    assert cell.as_dict() == {"hicache": "on"}
    plan = commit_launch(spec, cell, rev="abc123", src=tmp_path / "src", log_dir=tmp_path / "logs")
    (process,) = plan.processes
    assert process.argv is not None and process.argv[:2] == ["bash", "-c"]
    assert process.argv[2].startswith("REV=abc123 ")
    assert process.argv[2].endswith(f"$(cat {tmp_path / 'src'}/sim.flags) --enable-hierarchical-cache")
    assert process.expect == {"enable_hierarchical_cache": True}
    assert load_deployment(spec_file, None)[1].as_dict() == {"hicache": "off"}
    with pytest.raises(UsageError, match="FACTOR=LEVEL"):
        load_deployment(spec_file, "hicache=maybe")
    spec_file.write_text(SPEC.replace(', src: ""', "").replace("${src}", "/x"))
    with pytest.raises(UsageError, match="declare the variable 'src'"):
        load_deployment(spec_file, None)
