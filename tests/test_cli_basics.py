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


# A command whose Ctrl-C lands while pydantic serialises a Path, as it once did in a matrix cell writing
# its manifest: pydantic turns the KeyboardInterrupt raised in its callback into its own error.
CTRL_C_IN_PYDANTIC = '''
import os, signal
from pathlib import PosixPath
from pydantic import BaseModel
from repro import cli

class Interrupting(PosixPath):
    def __str__(self) -> str:
        os.kill(os.getpid(), signal.SIGINT)
        return super().__str__()

class Options(BaseModel):
    out: PosixPath

@cli.app.command("poke")
def poke() -> None:
    Options(out=Interrupting("/tmp/run")).model_dump(mode="json")

cli.main()
'''


def test_ctrl_c_inside_a_library_callback_is_still_an_interruption() -> None:
    done = subprocess.run([sys.executable, "-c", CTRL_C_IN_PYDANTIC, "poke"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "repro: interrupted"
