"""A short run's fixed cost: where the CPU of a 20-session `repro run` goes, from process start to exit.

Each measured run is a fresh `repro run --base-url … --sessions 20` process (its own interpreter, as
a user's), against benchmarks/fast_stream_server.py on loopback (a separate process, restarted per
run, so its CPU is not counted). The run's process is this script in `--child` mode: it times the
phases by wrapping the runner's phase functions and `builtins.__import__`, then calls `repro.cli`.

Printed per phase, CPU seconds (user + system, median of the repeats), and of it the CPU spent in
import statements:
- start-up: interpreter start, the CLI's imports and option parsing, up to `execute_run`;
- target probe: `/v1/models`, `/server_info` and the raw-text probe (`resolve_target`, `_observe`);
- load: the sessions themselves (`_drive`);
- summary: `summary.json`, the gate, the final table (`_save` without the report);
- report: `report.html` (`_report`);
- other: the rest of `execute_run` (the run directory, the manifest);
- exit: the rest of the process's CPU (interpreter shutdown);
then the process's total CPU (from `wait4`, children included), the fixed CPU (total − load), the
wall time and the time from the process's start to the first chat request on the wire (stamped by
the server when it arrives).

`--probe` also measures one bisection probe (`repro probe`, a fixed probe of 16 sessions, the docs'
smallest round) and `--matrix` one matrix (matrices/sim_hicache_bf16.yaml cut to the HiCache factor:
2 cells of 32 sessions, one launch each, cell reports on, the docs' smallest cell), both against the
simulator at `--time-scale 0`; printed as total CPU (children included: the simulator too) per probe
and per cell.

`--against REV` checks REV out in a temporary git worktree and measures it in the same invocation,
runs alternating (PYTHONPATH selects the tree; this script's own tree for the other), and prints the
ratios this/REV. Phases missing in REV's runner are shown as "-". Each tree's modules are compiled
to bytecode first, as an installed package's are (with PYTHONDONTWRITEBYTECODE set, a checkout's
would otherwise be compiled from source in every run).

Usage: `python benchmarks/fixed_cost.py [--sessions 20] [--repeats 5] [--against main] [--probe] [--matrix]
[-- EXTRA RUN ARGS]`.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SERVER = HERE / "fast_stream_server.py"
PHASES = ("start-up", "target probe", "load", "summary", "report", "other")
# The functions that bound each phase (module, attribute, phase), in the single-module runner and in
# the runner split into phase modules; whichever exist are wrapped. `_save`/`finish` hold the report.
WRAPPED = (
    ("repro.run.runner", "resolve_target", "target probe"),
    ("repro.run.runner", "_observe", "target probe"),
    ("repro.run.runner", "_drive", "load"),
    ("repro.run.runner", "_save", "summary"),
    ("repro.run.runner", "_report", "report"),
    ("repro.run.target", "resolve_target", "target probe"),
    ("repro.run.plan", "observe_plan", "target probe"),
    ("repro.run.drive", "drive", "load"),
    ("repro.run.finish", "finish", "summary"),
    ("repro.run.finish", "_report", "report"),
)


# ---- the measured process ----------------------------------------------------------------------------

def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Meter:
    """CPU per phase (exclusive: a nested phase's CPU is not its parent's) and CPU inside imports."""

    def __init__(self) -> None:
        self.cpu = dict.fromkeys(PHASES, 0.0)
        self.imports = dict.fromkeys(PHASES, 0.0)
        self.stack = ["start-up"]
        self.mark = _cpu()
        self.import_depth = 0
        self.found: list[str] = []

    def switch(self, phase: str | None) -> None:
        now = _cpu()
        self.cpu[self.stack[-1]] += now - self.mark
        self.mark = now
        if phase is None:
            self.stack.pop()
        else:
            self.stack.append(phase)

    @contextlib.contextmanager
    def phase(self, phase: str) -> Iterator[None]:
        self.switch(phase)
        try:
            yield
        finally:
            self.switch(None)

    def hook_imports(self) -> None:
        real = builtins.__import__

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.import_depth:
                return real(*args, **kwargs)
            self.import_depth += 1
            start = _cpu()
            try:
                return real(*args, **kwargs)
            finally:
                self.import_depth -= 1
                self.imports[self.stack[-1]] += _cpu() - start

        builtins.__import__ = timed

    def wrap(self) -> None:
        import asyncio
        import importlib

        for module_name, attr, phase in WRAPPED:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            fn = getattr(module, attr, None)
            if fn is None or hasattr(fn, "_phase"):
                continue
            self.found.append(attr)
            wrapped = self._async(fn, phase) if asyncio.iscoroutinefunction(fn) else self._sync(fn, phase)
            wrapped._phase = phase  # type: ignore[attr-defined]
            # Every module that imported the function by name calls it through its own global.
            for loaded in list(sys.modules.values()):
                if getattr(loaded, "__name__", "").startswith("repro") and getattr(loaded, attr, None) is fn:
                    setattr(loaded, attr, wrapped)

    def _sync(self, fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self.phase(phase):
                return fn(*args, **kwargs)
        return wrapped

    def _async(self, fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self.phase(phase):
                return await fn(*args, **kwargs)
        return wrapped


def child(out: str, args: list[str]) -> None:
    """Run `repro ARGS` in this process, phases timed; write them to `out` at exit."""
    meter = _Meter()  # the interpreter's own start-up is already in the first mark: counted as start-up
    meter.cpu["start-up"] = meter.mark
    meter.hook_imports()
    import atexit

    from repro.cli import main

    meter.wrap()

    import repro.run.runner as runner

    execute_run = runner.execute_run

    def entered(*a: Any, **k: Any) -> Any:
        meter.switch("other")  # what the CLI calls: start-up ends here; what is not a phase below is other
        return execute_run(*a, **k)

    runner.execute_run = entered

    @atexit.register
    def write() -> None:  # registered last, run first: the rest of the exit is in wait4's total only
        meter.switch(None)
        import repro

        Path(out).write_text(json.dumps({"cpu": meter.cpu, "imports": meter.imports, "found": meter.found,
                                         "repro": repro.__file__}))

    sys.argv = ["repro", *args]
    main()


# ---- the driver ---------------------------------------------------------------------------------------

def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _server(stamp: Path) -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "--port", str(port), "--interval", "0",
                             "--first-request-file", str(stamp)], stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        import urllib.request

        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("fast_stream_server did not start")
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def measure(tree: Path, sessions: int, extra: list[str], scratch: Path) -> dict[str, Any]:
    """One run of `repro run` from `tree`: phases, total CPU (children included), wall, first request."""
    from _child import run_child  # not at the top: --child mode runs under -P, without this directory on sys.path

    scratch.mkdir(parents=True, exist_ok=True)
    stamp, phases = scratch / "first-request", scratch / "phases.json"
    stamp.unlink(missing_ok=True)
    with _server(stamp) as base_url:
        args = ["run", "--base-url", base_url, "--sessions", str(sessions), "--out", str(scratch / "run"), *extra]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        started = time.time()
        # -P as a user's console script: the working directory is not on the import path.
        ended = run_child([sys.executable, "-P", str(Path(__file__).resolve()), "--child", str(phases), "--", *args],
                          env=env, cwd=scratch)
        if ended.code != 0:
            raise SystemExit(f"repro run from {tree} exited {ended.code}: {ended.err.strip()[-500:]}")
    data = json.loads(phases.read_text())
    if not data["repro"].startswith(str(tree)):
        raise SystemExit(f"the run imported {data['repro']}, not the tree {tree}")
    total = ended.cpu_s
    first = float(stamp.read_text()) - started if stamp.exists() else float("nan")
    return {"cpu": data["cpu"], "imports": data["imports"], "found": data["found"], "total": total,
            "fixed": total - data["cpu"]["load"], "wall": ended.wall_s, "first_request": first}


SIM_DEPLOY = "${python} -m repro.sim serve --host 127.0.0.1 --port ${port} --time-scale 0"
MATRIX_SPEC = """name: fixed-cost
variables: {port: auto}
factors:
  hicache:
    levels:
      off: {confirm: {enable_hierarchical_cache: false}}
      on: {flags: --enable-hierarchical-cache, confirm: {enable_hierarchical_cache: true}}
deployment:
  command: ${python} -m repro.sim serve --host 127.0.0.1 --port ${port} --time-scale 0 --seed ${run_seed}
  port: ${port}
load: {workload: WORKLOAD, sessions: 32, concurrency: 32, turns: 18}
design: {type: full, replicates: 1, seed: 1, baseline: {hicache: "off"}}
"""
MATRIX_CELLS = 2


def measure_command(tree: Path, args: list[str], scratch: Path, ok: tuple[int, ...] = (0,)) -> float:
    """Total CPU (children included) of `repro ARGS` run from `tree`."""
    from _child import run_child  # as in measure()

    scratch.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    ended = run_child([sys.executable, "-P", "-c", "from repro.cli import main; main()", *args], env=env, cwd=scratch)
    if ended.code not in ok:
        raise SystemExit(f"repro {args[0]} from {tree} exited {ended.code}: {ended.err.strip()[-500:]}")
    return ended.cpu_s


def measure_probe(tree: Path, scratch: Path) -> float:
    args = ["probe", "--deploy", SIM_DEPLOY, "--bad-rate", "0.3", "--commits", "2", "--sessions", "16",
            "--src", str(scratch), "--out", str(scratch / "probe")]
    return measure_command(tree, args, scratch, ok=(0, 1, 125))


def measure_matrix(tree: Path, scratch: Path) -> float:
    scratch.mkdir(parents=True, exist_ok=True)
    spec = scratch / "matrix.yaml"
    spec.write_text(MATRIX_SPEC.replace("WORKLOAD", str(tree / "experiments" / "agentic_coding.yaml")))
    return measure_command(tree, ["matrix", str(spec), "--out", str(scratch / "matrix")], scratch, ok=(0, 1, 125)) / MATRIX_CELLS


@contextlib.contextmanager
def _worktree(rev: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="repro-fixed-cost-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(path), rev], check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False)


def _median(runs: list[dict[str, Any]], *keys: str) -> float:
    values = []
    for run in runs:
        value: Any = run
        for key in keys:
            value = value[key]
        values.append(value)
    return statistics.median(values)


def _table(label: str, runs: list[dict[str, Any]]) -> dict[str, float]:
    found = set(runs[0]["found"])
    print(f"{label} (median of {len(runs)} runs; CPU seconds, of it in imports)")
    figures: dict[str, float] = {}
    for phase in PHASES:
        known = phase in ("start-up", "other") or any(attr in found for _, attr, p in WRAPPED if p == phase)
        if not known:
            print(f"  {phase:<13} -")
            continue
        cpu, imports = _median(runs, "cpu", phase), _median(runs, "imports", phase)
        figures[phase] = cpu
        print(f"  {phase:<13} {cpu:7.3f}  ({imports:.3f} in imports)")
    exit_cpu = statistics.median(run["total"] - sum(run["cpu"].values()) for run in runs)
    print(f"  {'exit':<13} {exit_cpu:7.3f}")
    for key, name in (("total", "total CPU"), ("fixed", "fixed CPU"), ("wall", "wall"),
                      ("first_request", "to 1st request")):
        figures[key] = _median(runs, key)
        print(f"  {name:<13} {figures[key]:7.3f}{' s' if key in ('wall', 'first_request') else ''}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--against", metavar="REV", help="also measure this git revision; print ratios")
    parser.add_argument("--probe", action="store_true", help="also CPU per bisection probe")
    parser.add_argument("--matrix", action="store_true", help="also CPU per matrix cell")
    parser.add_argument("extra", nargs="*", help="more `repro run` options (after --)")
    options = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, Python {sys.version.split()[0]}")
    with contextlib.ExitStack() as stack:
        trees = {"this tree": ROOT}
        if options.against:
            trees[options.against] = stack.enter_context(_worktree(options.against))
        for tree in trees.values():
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "repro"), str(tree / "dsml_checker")],
                           check=True, stdout=subprocess.DEVNULL)
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="repro-fixed-cost-")))
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
        extras = {"probe": measure_probe if options.probe else None, "matrix cell": measure_matrix if options.matrix else None}
        extra_cpu: dict[str, dict[str, list[float]]] = {label: {name: [] for name, f in extras.items() if f} for label in trees}
        for repeat in range(options.repeats):  # alternating, so a change of the machine's load hits both
            for index, (label, tree) in enumerate(trees.items()):
                runs[label].append(measure(tree, options.sessions, options.extra, scratch / f"{index}-{repeat}"))
                for name, measure_extra in extras.items():
                    if measure_extra is not None:
                        extra_cpu[label][name].append(measure_extra(tree, scratch / f"{index}-{repeat}-{name}"))
        figures = {label: _table(label, found) for label, found in runs.items()}
        for label, measured in extra_cpu.items():
            for name, values in measured.items():
                figures[label][name] = statistics.median(values)
                print(f"{label}: CPU per {name} {figures[label][name]:.3f} s (median of {len(values)})")
    if options.against:
        this, other = figures["this tree"], figures[options.against]
        print(f"ratio this tree / {options.against}")
        extra_keys = [name for name in ("probe", "matrix cell") if name in this]
        for key in ("fixed", "total", "first_request", *extra_keys, *(p for p in PHASES if p in this and p in other)):
            print(f"  {key:<13} {this[key] / other[key]:7.2f}x" if other[key] else f"  {key:<13} -")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[4:] if sys.argv[3:4] == ["--"] else sys.argv[3:])
    else:
        main()
