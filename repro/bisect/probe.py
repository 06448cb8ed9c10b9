"""One probe: start a deployment (the matrix's machinery: readiness, port ownership, `/server_info`
confirmation, a watch on the processes), run load rounds against it until the probe's rule decides
(repro.bisect.posterior.judge_probe), stop it. A deployment that fails to start, dies during the
load, or leaves most sessions timed out makes the probe inconclusive, never good; so does a load whose
target never exercised a feature it turns on (repro.store.exercise): only corruption decides such a probe.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from rich.console import Console
from rich.text import Text

from repro.bisect.posterior import (
    ProbeMode,
    ProbePlan,
    ProbeVerdict,
    fixed_sessions,
    judge_probe,
)
from repro.errors import TargetError
from repro.matrix.deploy import CellDeployment, LaunchPlan, ProcessLaunch
from repro.procs.process import free_port, python_module

SIM_COMMAND = tuple(python_module("repro.sim", "serve", "--host", "127.0.0.1"))


@dataclass(frozen=True)
class ProbeSettings:
    """How every probe of a search runs: the `repro run` options of its load and its stopping rule."""

    load: dict[str, Any]
    """`repro run` options (RunOptions fields) other than the target, the sessions, the seed and the output."""
    round_sessions: int = 32
    max_rounds: int = 3
    mode: ProbeMode = "sequential"
    alpha: float = 0.05
    beta: float = 0.05
    good_rate: float = 0.001
    min_bad_rate: float = 0.02
    delta: float = 0.05
    """Fixed probes: the chance that a bad commit passes every probe of the search."""
    seed: int = 0

    def bad_end_plan(self) -> ProbePlan:
        """The first probe of a search, of the bad end: up to two rounds, bad at the first corruption."""
        return ProbePlan("fixed", self.round_sessions, 2 * self.round_sessions, max(0.5, self.min_bad_rate),
                         self.good_rate, self.alpha, self.beta)

    def plan(self, bad_rate: float, steps: int) -> ProbePlan:
        """The plan of one probe when the bad rate is thought to be `bad_rate`, in a search over `steps` items.

        Sequential: rounds of `round_sessions` until Wald's SPRT decides, at most `max_rounds`.
        Fixed: `repro.stats.bisect_probe_sessions` sessions, in whole rounds (the corruption depends on
        how many sessions run at once, so a round never shrinks), capped at `max_rounds` rounds.
        """
        rate = max(bad_rate, self.min_bad_rate)
        cap = self.round_sessions * self.max_rounds
        if self.mode == "fixed":
            rounds = math.ceil(fixed_sessions(rate, steps, self.delta, cap) / self.round_sessions)
            return ProbePlan("fixed", self.round_sessions, rounds * self.round_sessions, rate, self.good_rate,
                             self.alpha, self.beta)
        return ProbePlan("sequential", self.round_sessions, cap, rate, self.good_rate, self.alpha, self.beta)


@dataclass
class ProbeResult:
    """What a probe counted and concluded; `run_dirs` are relative to the probe's directory's parent."""

    verdict: ProbeVerdict | Literal["lost"]
    """judge_probe's verdict, or "lost": the probe's Ray task ended without a result (its node died)."""
    corrupt: int = 0
    clean: int = 0
    timeout: int = 0
    error: int = 0
    rounds: int = 0
    run_dirs: list[str] = field(default_factory=list)
    message: str | None = None
    duration_s: float = 0.0


class ProbeJob(Protocol):
    """What one probe deploys, wherever it runs (this process or a Ray task on another machine)."""

    def prepare(self, probe_dir: Path) -> LaunchPlan | ProbeResult:
        """Make the deployment ready (a checkout, a build) and plan it, on the machine the probe runs on
        (its ports are that machine's); a ProbeResult when the preparation already failed."""
        ...

    def finish(self, probe_dir: Path) -> None:
        """Remove what the probe needed only while it ran (a checkout)."""
        ...

    def portable(self) -> "ProbeJob":
        """The job with everything it reads from this machine packed in, for a task on another one."""
        ...


def run_job(job: ProbeJob, plan: ProbePlan, load: dict[str, Any], probe_dir: Path, *, seed: int,
            console: Console) -> ProbeResult:
    """One whole probe in `probe_dir`: prepare the job's deployment, run the probe (`run_probe`), clean up."""
    try:
        prepared = job.prepare(probe_dir)
        if isinstance(prepared, ProbeResult):
            console.print(Text(f"  inconclusive: {prepared.message}"))
            return prepared
        return run_probe(prepared, plan, load, probe_dir, seed=seed, console=console)
    finally:
        job.finish(probe_dir)


def launch_plan(
    name: str,
    argv: list[str],
    port: int,
    *,
    env: dict[str, str] | None = None,
    expect: dict[str, Any] | None = None,
    ready_timeout: float = 60.0,
    stop_timeout: float = 10.0,
) -> LaunchPlan:
    """A one-process deployment serving on 127.0.0.1:`port`, confirmed through `/server_info` when `expect` is set."""
    url = f"http://127.0.0.1:{port}"
    process = ProcessLaunch(name, argv, dict(env or {}), f"{url}/health", f"{url}/server_info", dict(expect or {}))
    return LaunchPlan(
        deployment=name,
        url=url,
        processes=[process],
        ready_timeout=ready_timeout,
        ready_interval=0.1,
        stop_timeout=stop_timeout,
    )


def sim_plan(flags: list[str], env: dict[str, str], *, expect: dict[str, Any] | None = None, **kw: Any) -> LaunchPlan:
    """The embedded simulator as a probe's deployment, on a fresh port."""
    port = free_port()
    return launch_plan("sim", [*SIM_COMMAND, "--port", str(port), *flags], port, env=env, expect=expect, **kw)


def run_probe(
    launch: LaunchPlan,
    plan: ProbePlan,
    load: dict[str, Any],
    probe_dir: Path,
    *,
    seed: int,
    console: Console,
) -> ProbeResult:
    """Start `launch`, run rounds of `plan.round_sessions` sessions (the `repro run` options in `load`)
    until `judge_probe` decides, and stop the deployment, also on Ctrl-C (KeyboardInterrupt propagates)."""
    from repro.run.options import RunOptions
    from repro.run.runner import (
        execute_run,  # the load layer: scipy and friends load on first use
    )

    started = time.monotonic()
    result = ProbeResult(verdict="inconclusive")
    deployment = CellDeployment(launch, probe_dir / "logs", cell=probe_dir.name)
    watch = deployment.watch()
    try:
        # Each round's own tables go to load.log: the terminal shows one line per probe.
        with deployment, watch, open(probe_dir / "load.log", "a", encoding="utf-8") as log:
            quiet = Console(file=log, width=120, highlight=False)
            while True:
                result.rounds += 1
                round_dir = probe_dir / f"round-{result.rounds}"
                options = RunOptions.model_validate(
                    {
                        **load,
                        "base_url": f"{launch.url}/v1",
                        "sessions": plan.round_sessions,
                        "out": str(round_dir),
                        "name": f"{probe_dir.name}-round-{result.rounds}",
                        "seed": seed + result.rounds - 1,
                    }
                )
                run = execute_run(options, console=quiet, live=False, report=False)
                if run.summary.interrupted:
                    raise KeyboardInterrupt
                result.run_dirs.append(f"{probe_dir.name}/{round_dir.name}")
                counts = run.summary.counts
                for outcome in ("corrupt", "clean", "timeout", "error"):
                    setattr(result, outcome, getattr(result, outcome) + int(counts.get(outcome, 0)))
                if watch.exit is not None:
                    result.verdict, result.message = "inconclusive", watch.exit.message(probe_dir.name)
                    break
                result.verdict = judge_probe(
                    plan, result.corrupt, result.corrupt + result.clean, result.timeout + result.error
                )
                idle = run.summary.exercised.idle() if run.summary.exercised else []
                if idle and not_decided_by(result.verdict, result.corrupt):
                    result.verdict = "inconclusive"
                    result.message = "; ".join(f.line for f in idle)
                elif result.verdict == "inconclusive":
                    total = result.corrupt + result.clean + result.timeout + result.error
                    result.message = f"{result.timeout + result.error} of {total} sessions timed out or failed"
                elif result.verdict == "undecided":
                    result.message = f"no decision after {plan.max_sessions} sessions"
                if result.verdict != "continue":
                    break
    except TargetError as err:
        result.verdict = "inconclusive"
        result.message = watch.exit.message(probe_dir.name) if watch.exit else str(err)
    result.duration_s = time.monotonic() - started
    console.print(Text(f"  {describe(result)}"))
    return result


def not_decided_by(verdict: ProbeVerdict, corrupt: int) -> bool:
    """Whether a probe whose load left a feature idle is inconclusive: it was to be good (or undecided), or to
    go on without a corrupt session so far (more rounds of the same load would leave it idle too). A bad
    probe stays bad: corruption is evidence whatever the load exercised."""
    return verdict in ("good", "undecided") or (verdict == "continue" and corrupt == 0)


def describe(result: ProbeResult) -> str:
    """One line: the verdict and the counts."""
    counts = f"{result.corrupt} corrupt / {result.corrupt + result.clean} completed"
    extra = f", {result.timeout} timeout, {result.error} error" if result.timeout or result.error else ""
    why = f" ({result.message})" if result.message else ""
    return f"{result.verdict}: {counts}{extra} in {result.rounds} round(s), {result.duration_s:.0f}s{why}"
