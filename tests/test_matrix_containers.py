"""Docker deployments: `--dry-run` launches nothing, and a launched container is removed on every exit of the
harness, a SIGKILL included. A fake `docker` first on PATH (tests/fake_docker.py) records the calls and keeps
the containers' state; its containers, like real ones, outlive a killed client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fake_docker
from proc_helpers import poll, wait_for
from repro.procs.containers import LABEL
from repro.procs.process import start_process

ROOT = Path(__file__).resolve().parent.parent
REPRO = [sys.executable, "-c", "from repro.cli import main; main()"]

# A container that ignores SIGTERM (a server slower to shut down than the grace): only `docker rm -f` ends it.
STUBBORN = ["bash", "-c", "trap '' TERM; sleep 300"]


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake docker's directory, first on PATH for this test and the processes it starts."""
    directory = fake_docker.install(tmp_path / "fakebin")
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ['PATH']}")
    yield directory
    for container in fake_docker.running(directory):  # never leave a stray "container" process behind
        try:
            os.killpg(container["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_dry_run_of_the_shipped_docker_matrix_launches_nothing(docker: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [*REPRO, "matrix", str(ROOT / "matrices" / "hicache_bf16.yaml"), "--var", "model_path=/models/DeepSeek-V4",
         "--var", "gpus=0,1,2,3,4,5,6,7", "--dry-run"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    commands = [line for line in done.stdout.splitlines() if line.strip().startswith("command: docker run")]
    assert len(commands) == 8
    assert sum("local/sglang:dsv4-bf16-indexk" in line for line in commands) == 4
    assert sum("--enable-hierarchical-cache" in line for line in commands) == 4
    assert all(f"--label '{LABEL}=<launch-id>'" in line for line in commands)
    assert fake_docker.calls(docker) == []
    assert not (tmp_path / "reports").exists()


def test_stopping_a_docker_launch_removes_its_container(docker: Path, tmp_path: Path) -> None:
    proc = start_process(["docker", "run", "--rm", "fake/image", *STUBBORN], log_path=tmp_path / "d.log", grace=1.0)
    wait_for(lambda: len(fake_docker.running(docker)) == 1, 120, "the container to run")
    [container] = fake_docker.running(docker)
    assert container["labels"][LABEL] == proc.tag
    proc.stop(timeout=1.0)
    assert fake_docker.running(docker) == []
    assert ["ps", "-aq", "--filter", f"label={LABEL}={proc.tag}"] in fake_docker.calls(docker)


def test_a_sigkill_of_a_matrix_that_launched_a_container_leaves_none_running(docker: Path, tmp_path: Path) -> None:
    spec = tmp_path / "docker.yaml"
    spec.write_text(textwrap.dedent("""\
        name: docker-kill
        variables: {port: auto}
        factors:
          hicache:
            levels:
              off: {}
              on: {flags: --enable-hierarchical-cache}
        deployment:
          command: docker run --rm --init --name repro-${cell} fake/image bash -c 'trap "" TERM; sleep 300'
          port: ${port}
          ready: {timeout: 600, interval: 0.5}
          stop_timeout: 1
        load: {sessions: 2, concurrency: 2, turns: 2}
        """), encoding="utf-8")
    out = tmp_path / "m"
    harness = subprocess.Popen([*REPRO, "matrix", str(spec), "--out", str(out), "--no-cell-reports"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # The server never answers its ready URL: the harness waits on it, the container running.
        assert poll(lambda: len(fake_docker.running(docker)) == 1 or harness.poll() is not None, timeout=60)
        assert harness.poll() is None, "the matrix ended before it could be killed"
        os.killpg(harness.pid, signal.SIGKILL)
        harness.wait(timeout=10)
        wait_for(lambda: fake_docker.running(docker) == [], 60, "the reaper to remove the container")
        assert any(call[:2] == ["rm", "-f"] for call in fake_docker.calls(docker))
    finally:
        if harness.poll() is None:
            harness.kill()
    # The killed run is not finished: a resume would run it again, and the dry run says so without launching.
    before = len(fake_docker.calls(docker))
    shown = subprocess.run([*REPRO, "matrix", str(spec), "--out", str(out), "--resume", "--dry-run"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "--resume: run again: unfinished" in shown.stdout
    assert len(fake_docker.calls(docker)) == before
