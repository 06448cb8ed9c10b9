"""benchmarks/peers.py without its peers: the help, bad options, and a small repro-only run (installs nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "peers.py"


def _peers(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REPRO_PEERS_CACHE": str(cache)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=env)


def test_help_names_the_peers_option(tmp_path: Path) -> None:
    done = _peers("--help", cache=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "--peers" in done.stdout and "--levels" in done.stdout


def test_an_unknown_peer_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = _peers("--peers", "locust", cache=tmp_path)
    assert done.returncode == 2
    assert "unknown peer 'locust'" in done.stderr and "Traceback" not in done.stderr


def test_repro_alone_runs_counts_the_servers_chunks_and_installs_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    done = _peers("--peers", "none", "--levels", "3", "--turns", "2", "--chunks", "4", "--interval", "0.02",
                  "--ttft", "0.1", "--work", str(tmp_path / "work"), cache=cache)
    assert done.returncode == 0, done.stdout + done.stderr
    # 3 sessions x 2 turns x 4 content chunks, as the server counted them.
    assert "repro at     3 streams: 24 chunks" in done.stdout
    assert "| | repro |" in done.stdout and "| most paced streams held" in done.stdout
    assert not cache.exists()


def test_a_peer_that_cannot_be_installed_is_one_line_and_repro_keeps_its_row(tmp_path: Path) -> None:
    cache = tmp_path / "not-a-directory"
    cache.write_text("")  # no venv can be made under it: the install fails at once, before any download
    done = _peers("--peers", "guidellm", "--levels", "2", "--turns", "1", "--chunks", "2", "--interval", "0.02",
                  "--ttft", "0.1", cache=cache)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "guidellm 0.8.1: not run: uv could not be installed" in done.stdout
    assert "| | repro | guidellm 0.8.1 |" in done.stdout
    # Whether repro held 2 streams depends on the machine's load; that the peer has no figure does not.
    held = next(line for line in done.stdout.splitlines() if line.startswith("| most paced streams held"))
    assert held.endswith("| n/a |")
    assert "Traceback" not in done.stdout + done.stderr
