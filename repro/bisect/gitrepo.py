"""The commit side of a bisection: the range in first-parent order, a commit's tree checked out for a
probe, its optional build, and its deployment command (`--deploy` with `${rev}`, `${port}`, `${src}`).

First-parent order: a merge on the main line is one probe target, so a fault brought in by a merged
branch is pinned to its merge commit, as the branch's commits were never deployed on their own.
"""

from __future__ import annotations

import io
import shlex
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from repro.bisect.probe import ProbeResult, launch_plan
from repro.errors import UsageError
from repro.jsonl import numbered_lines
from repro.matrix.deploy import LaunchPlan
from repro.matrix.spec import Template
from repro.procs.process import free_port, one_line, start_process
from repro.untrusted import printable

GIT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str

    def label(self, index: int) -> str:
        return f"{index} {self.sha[:10]} {self.subject}"


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=GIT_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise UsageError("git is not installed (needed to bisect commits)") from None


def _resolve(repo: Path, rev: str, option: str) -> str:
    done = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if done.returncode != 0:
        raise UsageError(f"{option} {rev}: not a commit of {repo}")
    return done.stdout.decode().strip()


def commit_range(repo: Path, good: str, bad: str, names: tuple[str, str] = ("--good", "--bad")) -> list[Commit]:
    """The older commit `good`, then every first-parent commit after it up to `bad`; `names` are the
    options that gave the two ends (a fix search gives the older end as --bad)."""
    if _git(repo, "rev-parse", "--git-dir").returncode != 0:
        raise UsageError(f"--repo {repo}: not a git repository")
    old, new = names
    good_sha, bad_sha = _resolve(repo, good, old), _resolve(repo, bad, new)
    if good_sha == bad_sha:
        raise UsageError(f"{old} and {new} are the same commit: nothing to bisect")
    if _git(repo, "merge-base", "--is-ancestor", good_sha, bad_sha).returncode != 0:
        raise UsageError(f"{old} {good} is not an ancestor of {new} {bad}")
    log = _git(repo, "log", "--first-parent", "--reverse", "--format=%H%x00%s", f"{good_sha}..{bad_sha}")
    later = [line.split("\0", 1) for _, line in numbered_lines(log.stdout.decode(errors="replace"))]
    subject = _git(repo, "log", "-1", "--format=%s", good_sha).stdout.decode(errors="replace").strip()
    # A subject is shown on the terminal and in the reports, never used: its control characters go here.
    commits = [Commit(good_sha, printable(subject)), *(Commit(sha, printable(text)) for sha, text in later)]
    if commits[-1].sha != bad_sha:
        raise UsageError(f"{new} {bad} is not on the first-parent line from {old} {good}")
    return commits


def tree_archive(repo: Path, sha: str) -> bytes:
    """The commit's tree (no .git) as a tar: what a probe on another machine checks out."""
    done = _git(repo, "archive", "--format=tar", sha)
    if done.returncode != 0:
        raise UsageError(f"git archive {sha[:10]} failed: {one_line(done.stderr.decode(errors='replace'))}")
    return done.stdout


def extract(tree: bytes, dest: Path) -> None:
    """A `tree_archive` unpacked into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tree)) as tar:
        tar.extractall(dest, filter="data")


def substitute(command: str, values: dict[str, str], option: str) -> str:
    """`${name}` replaced by the shell-quoted value (a bare `$VAR` is left to the shell)."""
    try:
        return Template(command).substitute({k: shlex.quote(v) for k, v in values.items()})
    except (KeyError, ValueError) as err:
        known = ", ".join(f"${{{k}}}" for k in values)
        raise UsageError(f"{option}: cannot substitute {err} (known: {known})") from None


def prepare(
    *,
    deploy: str | Callable[[], LaunchPlan],
    build: str | None,
    rev: str,
    src: Path,
    probe_dir: Path,
    build_timeout: float,
    ready_timeout: float,
) -> LaunchPlan | ProbeResult:
    """Build the checkout in `src` (when `build` is given) and plan its deployment (a `--deploy`
    command, or a callable such as a matrix spec's cell); a failed build is an inconclusive probe,
    never a good or bad one."""
    values = {"rev": rev, "src": str(src), "python": sys.executable}
    if build:
        log = probe_dir / "build.log"
        proc = start_process(["bash", "-c", f"cd {shlex.quote(str(src))} && {substitute(build, values, '--build')}"],
                             log_path=log)
        try:
            proc.popen.wait(timeout=build_timeout)
        except subprocess.TimeoutExpired:
            proc.stop()
            return ProbeResult("inconclusive", message=f"build still running after {build_timeout:g}s")
        finally:
            proc.stop()
        if proc.returncode != 0:
            tail = one_line(proc.log_tail(3))
            why = f"build exited with code {proc.returncode}" + (f": {tail}" if tail else "")
            return ProbeResult("inconclusive", message=why)
    if callable(deploy):
        return deploy()
    port = free_port()
    command = substitute(deploy, {**values, "port": str(port)}, "--deploy")
    argv = ["bash", "-c", f"cd {shlex.quote(str(src))} && {command}"]
    return launch_plan("server", argv, port, ready_timeout=ready_timeout)


def remove_checkout(src: Path) -> None:
    shutil.rmtree(src, ignore_errors=True)
