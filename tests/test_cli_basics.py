"""The repro command itself: version, help, and the one-line error contract."""

import subprocess
import sys


def run_repro(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from repro.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_version_prints_and_exits_zero() -> None:
    done = run_repro("--version")
    assert done.returncode == 0
    assert done.stdout.startswith("repro ")


def test_unknown_command_is_a_usage_error_without_traceback() -> None:
    done = run_repro("no-such-command")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "no-such-command" in done.stderr
