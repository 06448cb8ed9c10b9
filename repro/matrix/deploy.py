"""Launch and tear down one matrix cell's deployment: a single server, several processes (prefill,
decode, router), or an external cluster through setup/teardown hooks; wait for readiness; confirm
that the server answering is the one launched (its port free before, held by it after) and, through
`/server_info`, that it runs the configuration the spec asked for; watch it while the load runs.

`resolve` is pure apart from drawing free ports; `CellDeployment` does the I/O.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import httpx

from repro.errors import TargetError, UsageError
from repro.procs import containers
from repro.procs.logcap import is_capped
from repro.matrix.design import PlannedRun
from repro.matrix.infometrics import info_from_metrics
from repro.matrix.spec import AUTO, Level, MatrixSpec, ProcessSpec, Template, confirmed_value
from repro.procs.process import (
    ManagedProcess,
    confirm_listener,
    free_port,
    one_line,
    PortTakenError,
    port_in_use,
    start_process,
    wait_http_ready,
)
from repro.store.rundir import dump_json
from repro.untrusted import get_bounded, parse_json

PROCESSES_FILE = "processes.json"
"""Written into the cell's log directory as each process starts: name, pid and process group."""
LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1", "::")
WATCH_INTERVAL = 0.1
"""Seconds between two looks at the launched processes while the load runs."""


class ConfirmationError(TargetError):
    """The server's own account of its configuration contradicts the spec: the cell must not count."""


@dataclass(frozen=True)
class ProcessLaunch:
    """One process of a resolved deployment; `argv` is None for an external target we only watch."""

    name: str
    argv: list[str] | None
    env: dict[str, str]
    ready_url: str | None
    info_url: str | None
    expect: dict[str, Any]

    @property
    def local_port(self) -> int | None:
        """The port a launched process serves on this host (from its ready URL), which it must own."""
        if self.argv is None or self.ready_url is None:
            return None
        parts = urlsplit(self.ready_url)
        try:
            port = parts.port
        except ValueError:
            return None
        return port if parts.hostname in LOCAL_HOSTS else None


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start one cell, with variables substituted."""

    deployment: str
    url: str
    """Base URL for the load, without /v1."""
    processes: list[ProcessLaunch]
    ready_timeout: float
    ready_interval: float
    stop_timeout: float
    setup: list[str] | None = None
    teardown: list[str] | None = None
    hook_env: dict[str, str] = field(default_factory=dict)
    hook_timeout: float = 0.0
    flags: list[str] = field(default_factory=list)
    """Every flag of the cell's levels, for the record."""
    log_max_bytes: int | None = None


def run_seed(spec: MatrixSpec, run: PlannedRun) -> int:
    """A stable per-run seed, so a resumed matrix reruns a cell with the seed it would have had."""
    return zlib.crc32(f"{spec.design.seed}:{run.cell.name}:{run.replicate}".encode()) % 1_000_000


def _levels(spec: MatrixSpec, run: PlannedRun) -> list[tuple[str, Level]]:
    return [(factor, spec.factors[factor].level(level)) for factor, level in run.cell.levels]


def _deployment_name(spec: MatrixSpec, levels: list[tuple[str, Level]]) -> str:
    chosen = {(factor, level.deployment) for factor, level in levels if level.deployment is not None}
    names = {name for _, name in chosen}
    if len(names) > 1:
        detail = ", ".join(f"{factor} selects {name!r}" for factor, name in sorted(chosen))
        raise UsageError(f"levels select different deployments in one cell: {detail}")
    return names.pop() if names else next(iter(spec.named_deployments()))


def _applies(level: Level, process: ProcessSpec) -> bool:
    return process.name in level.processes if level.processes is not None else process.features


def resolve(
    spec: MatrixSpec,
    run: PlannedRun,
    *,
    log_dir: Path,
    port_source: Callable[[], int] = free_port,
) -> LaunchPlan:
    """Substitute variables and levels into the deployment of `run`'s cell."""
    levels = _levels(spec, run)
    name = _deployment_name(spec, levels)
    deployment = spec.named_deployments()[name]
    variables = {key: str(port_source()) if value == AUTO else value for key, value in spec.variables.items()}
    # A level's variables may name the spec's own (image: ${bf16_image}): substitute them once.
    declared = dict(variables)
    for _, level in levels:
        variables.update({k: Template(v).safe_substitute(declared) for k, v in level.vars.items()})
    variables.update(
        python=sys.executable,
        cell=run.cell.name,
        replicate=str(run.replicate),
        run_seed=str(run_seed(spec, run)),
        log_dir=str(log_dir),
    )

    def sub(text: str, extra: dict[str, str] | None = None, *, shell: bool = False) -> str:
        """`text` with its variables; in a command (`shell`), each value shell-quoted as bisect quotes it, so
        a value is one word and never code (`extra` holds text already written for the shell: the flags)."""
        values = {k: shlex.quote(v) for k, v in variables.items()} if shell else variables
        try:
            return Template(text).substitute({**values, **(extra or {})})
        except (KeyError, ValueError) as err:
            raise UsageError(f"cannot substitute variables in {text!r}: {err}") from None

    all_flags = [sub(flag) for _, level in levels for flag in level.flags]
    base_env = {key: sub(value) for key, value in deployment.env.items()}
    processes: list[ProcessLaunch] = []
    for proc in deployment.process_specs():
        applying = [level for _, level in levels if _applies(level, proc)]
        command = next((lv.command for lv in reversed(applying) if lv.command is not None), proc.command)
        flags = [sub(flag) for level in applying for flag in level.flags]
        argv = shlex.split(sub(command, {"flags": shlex.join(flags)}, shell=True))
        if "flags" not in Template(command).get_identifiers():
            argv += flags
        env = {**base_env, **{k: sub(v) for k, v in proc.env.items()}}
        expect = dict(proc.confirm)
        for level in applying:
            env.update({k: sub(v) for k, v in level.env.items()})
            expect.update(level.confirm)
        port = sub(str(proc.port)) if proc.port is not None else None
        ready = sub(proc.ready_url) if proc.ready_url else (f"http://127.0.0.1:{port}/health" if port else None)
        if ready is None:
            raise UsageError(f"deployment {name!r}: process {proc.name!r} needs a port or a ready_url")
        info = _info_url(proc.info_url, port, sub)
        processes.append(ProcessLaunch(proc.name, argv, env, ready, info, expect))

    hooks: dict[str, Any] = {}
    if deployment.external is not None:
        ext = deployment.external
        extra = {"flags": shlex.join(all_flags)}
        expect = {k: v for _, level in levels for k, v in level.confirm.items()}
        ready = sub(ext.ready_url) if ext.ready_url else sub(ext.url).rstrip("/") + "/health"
        info = sub(ext.info_url) if ext.info_url is not None else sub(ext.url).rstrip("/") + "/server_info"
        processes.append(ProcessLaunch("external", None, {}, ready, info or None, expect))
        env = {**base_env, **{k: sub(v) for _, level in levels for k, v in level.env.items()}}
        hooks = dict(
            setup=["bash", "-c", sub(ext.setup, extra, shell=True)],
            teardown=["bash", "-c", sub(ext.teardown, extra, shell=True)],
            hook_env={**env, "REPRO_FLAGS": shlex.join(all_flags), "REPRO_CELL": run.cell.name},
            hook_timeout=ext.hook_timeout,
        )
        url = sub(ext.url)
    elif deployment.url is not None:
        url = sub(deployment.url)
    else:
        last = deployment.process_specs()[-1]
        if last.port is None:
            raise UsageError(f"deployment {name!r}: give url, or a port on process {last.name!r}")
        url = f"http://127.0.0.1:{sub(str(last.port))}"
    return LaunchPlan(
        deployment=name,
        url=url.rstrip("/"),
        processes=processes,
        ready_timeout=deployment.ready.timeout,
        ready_interval=deployment.ready.interval,
        stop_timeout=deployment.stop_timeout,
        flags=all_flags,
        log_max_bytes=deployment.log_max_bytes,
        **hooks,
    )


def _info_url(given: str | None, port: str | None, sub: Callable[[str], str]) -> str | None:
    if given is not None:
        return sub(given) or None
    return f"http://127.0.0.1:{port}/server_info" if port else None


def _same(expected: Any, actual: Any) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected is actual
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        return float(expected) == float(actual)
    if expected is None or actual is None:
        return expected is actual
    return str(expected) == str(actual)


def mismatches(expect: dict[str, Any], info: dict[str, Any]) -> list[str]:
    """What `/server_info` shows differently from what the spec asked for, one phrase per key."""
    found = []
    for key, expected in expect.items():
        present, actual = confirmed_value(info, key)
        if not present:
            found.append(f"{key} is absent, the spec asked for {expected!r}")
        elif not _same(expected, actual):
            found.append(f"{key} is {actual!r}, the spec asked for {expected!r}")
    return found


SERVER_INFO_BYTES = 16 * 1024 * 1024
"""Most bytes read of /server_info (SGLang's is a few KB): an endless answer must neither hang the cell nor fill memory."""


def fetch_server_info(url: str, *, timeout: float = 10.0) -> dict[str, Any] | None:
    """The server's configuration from `url` (or the older /get_server_info beside it); None when it has neither.

    A Prometheus exposition (an `info_url` ending in /metrics, for vLLM) gives its `*_info` metrics' labels
    (repro.matrix.infometrics).
    """
    candidates = [url]
    if url.endswith("/server_info"):
        candidates.append(url[: -len("/server_info")] + "/get_server_info")
    with httpx.Client(timeout=timeout, trust_env=False) as client:
        for candidate in candidates:
            try:
                status, body = get_bounded(client, candidate, max_bytes=SERVER_INFO_BYTES, timeout_s=timeout)
            except httpx.HTTPError as err:
                raise TargetError(f"{candidate}: cannot read the server configuration: {type(err).__name__}") from None
            except ValueError as err:
                raise TargetError(f"{candidate}: cannot read the server configuration: {err}") from None
            if status == 404:
                continue
            if status != 200:
                return None
            try:
                data = parse_json(body)
            except ValueError:
                # Not JSON: a Prometheus /metrics (vLLM's info_url), whose *_info labels are the configuration.
                return info_from_metrics(body.decode("utf-8", errors="replace"))
            return data if isinstance(data, dict) else None
    return None


@dataclass
class Confirmation:
    """What each process reported (every expected key matched, or the cell did not start)."""

    server_info: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """What could not be checked, such as a port held by a process the harness may not inspect."""


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass(frozen=True)
class ProcessExit:
    """A launched process that ended while the cell's load ran."""

    name: str
    code: int | None
    tail: str

    def message(self, cell: str) -> str:
        tail = f"; its output ends with: {self.tail}" if self.tail else ""
        return f"cell {cell}: {self.name} {_describe_exit(self.code)} while the load ran{tail}"


class ExitWatch:
    """A context manager: while it is open, the first launched process to end is noted in `exit`
    and the rest of the deployment is stopped at once, so the load's requests fail fast instead of
    waiting out their timeouts on a half-dead deployment."""

    def __init__(self, deployment: "CellDeployment", interval: float = WATCH_INTERVAL) -> None:
        self.deployment = deployment
        self.interval = interval
        self.exit: ProcessExit | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"watch-{deployment.cell}", daemon=True)

    def _look(self) -> bool:
        """Whether a launched process has ended; if so, note it and stop the others."""
        procs = self.deployment.launched()
        dead = next(((name, proc) for name, proc in procs if not proc.alive), None)
        if dead is None:
            return False
        name, proc = dead
        self.exit = ProcessExit(name, proc.returncode, one_line(proc.log_tail(10)))
        for _, other in reversed(procs):
            other.stop(self.deployment.plan.stop_timeout)
        return True

    def _watch(self) -> None:
        while not self._done.wait(self.interval):
            if self._look():
                return

    def __enter__(self) -> "ExitWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        if self.exit is None:
            # A death since the last look (the load may have ended, or failed, because of it).
            self._look()


class CellDeployment:
    """A context manager: entering launches the cell and confirms it, leaving tears everything down."""

    def __init__(self, plan: LaunchPlan, log_dir: Path, *, cell: str) -> None:
        self.plan = plan
        self.log_dir = Path(log_dir)
        self.cell = cell
        self._procs: list[tuple[str, ManagedProcess]] = []
        """Live processes, stopped at teardown."""
        self._started: list[dict[str, Any]] = []
        self._set_up = False

    def __enter__(self) -> Confirmation:
        return self.start()

    def start(self) -> Confirmation:
        """Launch and confirm the cell; on any failure, what was started is stopped before the error leaves."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def launched(self) -> list[tuple[str, ManagedProcess]]:
        """The deployment's own server processes (hooks excluded), by name."""
        names = {launch.name for launch in self.plan.processes if launch.argv is not None}
        return [(name, proc) for name, proc in self._procs if name in names]

    def log_notes(self) -> list[str]:
        """A note for each log that reached the cap (`log_max_bytes`) and lost its middle."""
        return [
            f"{entry['name']}.log reached the cap of {self.plan.log_max_bytes} bytes: its start and its latest "
            f"output are kept ({entry['name']}.log, {entry['name']}.log.tail*)"
            for entry in self._started
            if is_capped(self.log_dir / f"{entry['name']}.log")
        ]

    def watch(self) -> ExitWatch:
        """Watch the launched processes while the load runs (see ExitWatch)."""
        return ExitWatch(self)

    def _record(self, name: str, proc: ManagedProcess) -> None:
        # Written before waiting on anything, so a post-mortem (or a test) can find every group we own.
        self._procs.append((name, proc))
        self._started.append(
            {"name": name, "pid": proc.pid, "pgid": proc.pgid, "argv": proc.argv, "container": proc.container}
        )
        dump_json(self.log_dir / PROCESSES_FILE, self._started)

    def _run_hook(self, name: str, argv: list[str]) -> None:
        proc = start_process(
            argv,
            log_path=self.log_dir / f"{name}.log",
            env=self.plan.hook_env,
            grace=self.plan.stop_timeout,
            log_max_bytes=self.plan.log_max_bytes,
        )
        self._record(name, proc)
        try:
            proc.popen.wait(timeout=self.plan.hook_timeout)
        except subprocess.TimeoutExpired:
            proc.stop(self.plan.stop_timeout)
            raise TargetError(f"cell {self.cell}: {name} hook still running after {self.plan.hook_timeout:g}s")
        if proc.returncode != 0:
            tail = one_line(proc.log_tail(5))
            raise TargetError(
                f"cell {self.cell}: {name} hook exited with code {proc.returncode}" + (f": {tail}" if tail else "")
            )

    def _start(self) -> Confirmation:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.plan.setup:
            self._set_up = True
            self._run_hook("setup", self.plan.setup)
        for launch in self.plan.processes:
            occupant = port_in_use(launch.local_port) if launch.local_port is not None else None
            if occupant is not None:
                # Readiness would succeed against the occupant and the cell would measure it.
                raise PortTakenError(
                    f"cell {self.cell}: {launch.name}: port {launch.local_port} is already in use by {occupant}; "
                    "stop it or choose another port"
                )
        waiting: list[tuple[ProcessLaunch, ManagedProcess | None]] = []
        for launch in self.plan.processes:
            if launch.argv is None:
                waiting.append((launch, None))
                continue
            proc = start_process(
                launch.argv,
                log_path=self.log_dir / f"{launch.name}.log",
                env=launch.env,
                grace=self.plan.stop_timeout,
                log_max_bytes=self.plan.log_max_bytes,
            )
            self._record(launch.name, proc)
            waiting.append((launch, proc))
        deadline = time.monotonic() + self.plan.ready_timeout
        for launch, proc in waiting:
            assert launch.ready_url is not None
            try:
                wait_http_ready(
                    launch.ready_url,
                    timeout=max(0.0, deadline - time.monotonic()),
                    interval=self.plan.ready_interval,
                    process=proc,
                )
            except TargetError as err:
                # A server that died while another process listens on its port lost the port to it.
                taken = proc is not None and not proc.alive and launch.local_port is not None and port_in_use(launch.local_port)
                raise (PortTakenError if taken else TargetError)(
                    f"cell {self.cell}: {launch.name}: {one_line(str(err))} "
                    f"(ready timeout {self.plan.ready_timeout:g}s for the whole deployment)"
                    + (f"; port {launch.local_port} is held by {taken}" if taken else "")
                ) from None
        notes = self._check_owners(waiting)
        result = self._confirm()
        # /server_info may have come from an occupant while the launched server was dying.
        self._check_owners(waiting)
        result.notes = notes
        return result

    def _check_owners(self, launched: list[tuple[ProcessLaunch, ManagedProcess | None]]) -> list[str]:
        notes = []
        for launch, proc in launched:
            if proc is None or launch.local_port is None:
                continue
            try:
                note = confirm_listener(proc, launch.local_port)
            except TargetError as err:
                kind = PortTakenError if isinstance(err, PortTakenError) else ConfirmationError
                raise kind(f"cell {self.cell}: {launch.name}: {one_line(str(err))}") from None
            if note:
                notes.append(f"{launch.name}: {note}")
        return notes

    def _confirm(self) -> Confirmation:
        result = Confirmation()
        for launch in self.plan.processes:
            info = fetch_server_info(launch.info_url) if launch.info_url else None
            result.server_info[launch.name] = info
            if info is None:
                if launch.expect:
                    # An unconfirmed configuration must not be analysed as if it were the one asked for.
                    raise ConfirmationError(
                        f"cell {self.cell}: {launch.name} has no /server_info, so {', '.join(launch.expect)} "
                        "cannot be confirmed; remove `confirm` from the spec to run it unconfirmed"
                    )
                continue
            wrong = mismatches(launch.expect, info)
            if wrong:
                raise ConfirmationError(
                    f"cell {self.cell}: {launch.name} does not run the configuration asked for: {'; '.join(wrong)}"
                )
        return result

    def stop(self) -> None:
        """Stop every process (routers first, as they were started last), then run the teardown hook."""
        procs, self._procs = self._procs, []
        for _, proc in reversed(procs):
            proc.stop(self.plan.stop_timeout)
        if self._set_up and self.plan.teardown:
            self._set_up = False
            try:
                self._run_hook("teardown", self.plan.teardown)
            finally:
                for _, proc in self._procs:
                    proc.stop(self.plan.stop_timeout)
                self._procs = []


def describe(plan: LaunchPlan) -> dict[str, Any]:
    """The resolved launch, for the cell's record (environment values are left out: they may hold secrets)."""
    return {
        "deployment": plan.deployment,
        "url": plan.url,
        "flags": plan.flags,
        "processes": [
            {"name": p.name, "argv": p.argv, "env_keys": sorted(p.env), "expect": p.expect} for p in plan.processes
        ],
    }


def processes_file(log_dir: Path) -> list[dict[str, Any]]:
    """The processes a cell started (for tests and post-mortems)."""
    path = Path(log_dir) / PROCESSES_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else []


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_stale(log_dir: Path, *, timeout: float = 10.0) -> list[str]:
    """Stop the process groups a killed harness left behind for this cell; returns their names.

    A group is only signalled while its leader still runs the recorded command line, so a reused
    process id is never hit. A container the entry launched (`docker run`) is removed by its label.
    """
    stopped = []
    for entry in processes_file(log_dir):
        if entry.get("container") and containers.remove(str(entry["container"])):
            stopped.append(f"{entry['name']} (container)")
        pgid, argv = int(entry["pgid"]), entry.get("argv")
        try:
            cmdline = Path(f"/proc/{pgid}/cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        if argv is None or [part.decode(errors="replace") for part in cmdline] != argv:
            continue
        os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
        stopped.append(str(entry["name"]))
    return stopped
