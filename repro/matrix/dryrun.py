"""`repro matrix SPEC --dry-run`: every run of the plan as it would launch (commands, environment with
secrets masked, ports, health and confirm checks, the load, what `--resume` would skip), and nothing
launched, no directory made.

The launches are the runner's own (`deploy.resolve`, `containers.labelled`), so what is printed is what
would run; only the launch id of each `docker run` label and `auto` ports are chosen anew at launch.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path
from typing import TextIO

from repro.errors import EXIT_OK, UsageError
from repro.matrix.cell import CELLS, LOGS
from repro.matrix.deploy import LaunchPlan, ProcessLaunch, resolve
from repro.matrix.design import PlannedRun, plan
from repro.matrix.preflight import check_cells, missing_programs
from repro.matrix.runner import check_directory, finished_summary
from repro.matrix.spec import AUTO, MatrixSpec, read_spec
from repro.procs.containers import labelled
from repro.store.paths import default_dir

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
"""Names whose values are never printed: environment variables and spec variables alike."""
MASK = "****"
MIN_MASKED = 4
"""Shorter secret values are hidden where they are named, not searched for in commands (a 1-character
value would mask every such character)."""


class _Masker:
    """Hides secret values: those of secret-named variables, wherever they were substituted."""

    def __init__(self, values: list[str]) -> None:
        self.values = sorted({v for v in values if len(v) >= MIN_MASKED}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self.values:
            text = text.replace(value, MASK)
        return text

    def env(self, env: dict[str, str]) -> str:
        if not env:
            return "(the harness's own)"
        shown = [f"{k}={MASK if SECRET_NAME.search(k) else self(v)}" for k, v in sorted(env.items())]
        return "the harness's own, plus " + " ".join(shown)


def _secrets(spec: MatrixSpec, launches: list[LaunchPlan]) -> list[str]:
    found = [str(v) for k, v in spec.variables.items() if SECRET_NAME.search(k)]
    for factor in spec.factors.values():
        for level in factor.levels.values():
            assert level is not None
            found += [v for k, v in level.vars.items() if SECRET_NAME.search(k)]
    for launch in launches:
        for env in [launch.hook_env, *(p.env for p in launch.processes)]:
            found += [v for k, v in env.items() if SECRET_NAME.search(k)]
    key_env = spec.load.get("api_key_env")
    if isinstance(key_env, str) and os.environ.get(key_env):
        found.append(os.environ[key_env])
    return found


def _resume_states(spec: MatrixSpec, runs: list[PlannedRun], path: Path, resume: bool,
                   workload: str) -> dict[str, str]:
    """What `--resume` would do with each run (or, without it, why nothing is skipped); UsageError where the
    real run would refuse the directory."""
    check_directory(spec, path, resume=resume, workload=workload)
    if not resume:
        return {run.key: "run (a new matrix directory: nothing to skip)" for run in runs}
    states = {}
    for run in runs:
        run_dir = path / CELLS / run.key
        if finished_summary(run_dir) is not None:
            states[run.key] = f"skip: finished ({CELLS}/{run.key}/summary.json)"
        elif run_dir.exists() or (path / LOGS / run.key).exists():
            states[run.key] = (f"run again: unfinished (its {CELLS}/ and {LOGS}/ directories moved aside, "
                               "anything it left running stopped)")
        else:
            states[run.key] = "run: not started yet"
    return states


def _port(launch: ProcessLaunch, auto_ports: bool) -> str:
    port = launch.local_port
    if port is None:
        return "—"
    return f"{port} (auto: a free port is chosen anew at launch)" if auto_ports else str(port)


def _process_lines(launch: ProcessLaunch, plan_: LaunchPlan, mask: _Masker, auto_ports: bool) -> list[str]:
    lines = [f"  {launch.name}:"]
    if launch.argv is not None:
        argv, container = labelled(launch.argv, "<launch-id>", "<harness-pid>")
        lines.append(f"    command: {mask(shlex.join(argv))}")
        lines.append(f"    environment: {mask.env(launch.env)}")
        lines.append(f"    port: {_port(launch, auto_ports)}")
        stop = f"SIGTERM to its process group, SIGKILL after {plan_.stop_timeout:g}s"
        if container is not None:
            stop += "; then its container is removed (docker rm -f, by its repro.run label)"
        lines.append(f"    stop: {stop}")
    if launch.ready_url:
        lines.append(f"    health: GET {mask(launch.ready_url)} until it answers 200 (every {plan_.ready_interval:g}s; "
                     f"{plan_.ready_timeout:g}s for the whole deployment)")
    if launch.expect:
        keys = ", ".join(f"{k} = {v!r}" for k, v in launch.expect.items())
        lines.append(f"    confirm: GET {mask(launch.info_url or '(no info_url)')} must show {keys}")
    elif launch.info_url:
        lines.append(f"    configuration recorded from: GET {mask(launch.info_url)} (nothing to confirm)")
    return lines


def _run_lines(spec: MatrixSpec, run: PlannedRun, total: int, launch: LaunchPlan, state: str,
               mask: _Masker, auto_ports: bool, executor: str) -> list[str]:
    levels = ", ".join(f"{factor}={level}" for factor, level in run.cell.levels)
    lines = [f"[{run.order + 1}/{total}] cell {run.cell.name} replicate {run.replicate} ({levels})",
             f"  --resume: {state}",
             f"  deployment: {launch.deployment}; flags: {mask(shlex.join(launch.flags)) or '(none)'}"]
    if launch.setup:
        lines.append(f"  setup hook: {mask(launch.setup[-1])} (within {launch.hook_timeout:g}s)")
        lines.append(f"  hook environment: {mask.env(launch.hook_env)}")
    for process in launch.processes:
        lines += _process_lines(process, launch, mask, auto_ports)
    if launch.teardown:
        lines.append(f"  teardown hook: {mask(launch.teardown[-1])}")
    seed = int(spec.load.get("seed", 0)) + run.replicate - 1
    lines.append(f"  load: {mask(launch.url)}/v1, seed {seed}")
    for factor, level in run.cell.levels:
        chosen = spec.factors[factor].level(level)
        for condition in chosen.exercise:
            lines.append(f"  exercised when: {condition} ({factor}={level})")
        if not chosen.confirm:
            lines.append(f"  not confirmed: {factor}={level} (the level has no confirm keys: the server is not asked)")
    if executor == "ray":
        lines.append(f"  resources (--executor ray): {spec.resources.for_cell(run.cell.as_dict())}")
    return lines


def _header(spec: MatrixSpec, runs: list[PlannedRun], path: Path, executor: str, mask: _Masker) -> list[str]:
    design = spec.design
    cells = len({run.cell for run in runs})
    load = " ".join(f"{k}={mask(str(v))}" for k, v in spec.load.items() if k != "api_key_env") or "(repro run's defaults)"
    rounds = ", sequential: in rounds, later rounds only for cells still needed" if design.sequential else ""
    lines = [
        f"matrix {spec.name}: {cells} cells x {design.replicates} replicate(s) = {len(runs)} runs, in this order "
        f"(design seed {design.seed}{rounds})",
        f"matrix directory: {path} (--dry-run: nothing created, nothing launched)",
        f"executor: {executor}" + (" (every run on this machine)" if executor == "local" else " (each run a Ray task)"),
        f"load of every run: {load}",
    ]
    key_env = spec.load.get("api_key_env")
    if isinstance(key_env, str):
        state = "set" if os.environ.get(key_env) else "NOT set"
        lines.append(f"api key: read from ${key_env} ({state} here; its value is never shown)")
    return lines


def dry_run(
    spec_path: Path,
    *,
    out: Path | None = None,
    resume: bool = False,
    variables: dict[str, str] | None = None,
    executor: str = "local",
    stream: TextIO | None = None,
) -> int:
    """Print the plan of `repro matrix` with these arguments; exit code 0, UsageError as the real run would."""
    stream = stream or sys.stdout
    if resume and out is None:
        raise UsageError("--resume needs --out: the matrix directory to continue")
    source = read_spec(spec_path, variables)
    spec = source.spec
    checked = check_cells(source)  # the same faults the real run refuses, first
    path = out or default_dir("matrix", spec.name)
    runs = plan(spec)
    launches = {run.key: resolve(spec, run, log_dir=path / LOGS / run.key) for run in runs}
    mask = _Masker(_secrets(spec, list(launches.values())))
    states = _resume_states(spec, runs, path, resume, checked.workload_sha256)
    auto_ports = AUTO in spec.variables.values()
    lines = _header(spec, runs, path, executor, mask)
    for run in runs:
        lines.append("")
        lines += _run_lines(spec, run, len(runs), launches[run.key], states[run.key], mask, auto_ports, executor)
    # Under Ray the commands run on other nodes: this machine's PATH says nothing about theirs.
    missing = missing_programs(source, launches) if executor == "local" else []
    if missing:
        lines.append("")
        lines += [f"would fail here: {line}" for line in missing]
    skipped = sum(state.startswith("skip") for state in states.values())
    lines += ["", f"{len(runs) - skipped} run(s) would launch, {skipped} skipped as finished; nothing was started."]
    stream.write("\n".join(lines) + "\n")
    return EXIT_OK
