"""The `repro` command line: thin typer wrappers that parse options and call into the modules that do the work."""

from __future__ import annotations

import atexit
import gc
import os
from pathlib import Path
from typing import Any

import typer
import typer.core

from repro import __version__
from repro.errors import UsageError, run_main
from repro.run.flags import LOAD_FLAGS

USER_PATH = ("run", "report", "gate", "matrix", "sweep", "bisect", "probe", "export", "trace", "reanalyse", "schema", "sim")
"""The order `repro --help` lists the commands in: a user's path from a first run to a culprit, then the tools."""


class _UserPathGroup(typer.core.TyperGroup):
    def list_commands(self, ctx: typer.Context) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda name: USER_PATH.index(name) if name in USER_PATH else len(USER_PATH))


app = typer.Typer(
    name="repro",
    cls=_UserPathGroup,
    help="Reproduce concurrency-dependent tool-call corruption in LLM serving deployments and bisect it to its cause.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
sim_app = typer.Typer(help="The embedded DeepSeek-V4 SGLang simulator.", no_args_is_help=True)
app.add_typer(sim_app, name="sim")
from repro.bisect.cli import bisect_app, probe_command  # noqa: E402 - light: the searches load inside its commands

app.add_typer(bisect_app, name="bisect")
app.command("probe")(probe_command)
trace_app = typer.Typer(help="Trace files: recorded conversations that `repro run --workload X.jsonl` replays.", no_args_is_help=True)
app.add_typer(trace_app, name="trace")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"repro {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    pass


@app.command("report")
def report_command(
    run_dirs: list[Path] = typer.Argument(..., help="Run directories; the first is the reference for comparisons."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="HTML file to write (default with one run: RUN_DIR/report.html)."
    ),
    markdown: Path | None = typer.Option(None, "--markdown", help="Also write a Markdown summary here."),
    junit: Path | None = typer.Option(None, "--junit", help="Also write JUnit XML here."),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence level of every interval."),
    margin: float = typer.Option(0.05, "--margin", help="With several runs: δ, the difference in corruption rate within which runs are practically equivalent (default: 0.05)."),
) -> None:
    """Render one self-contained HTML report (and Markdown / JUnit summaries) from run directories."""
    from repro.report import render_report

    if output is None:
        if len(run_dirs) != 1:
            raise UsageError("report: --output is required with several run directories")
        output = run_dirs[0] / "report.html"
    result = render_report(run_dirs, output, markdown=markdown, junit=junit, confidence=confidence, margin=margin)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        try:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(result.markdown_text)
        except OSError as err:
            raise UsageError(f"GITHUB_STEP_SUMMARY {step_summary}: cannot append ({err.strerror or err})") from None
    for path in (result.html, result.markdown, result.junit):
        if path is not None:
            typer.echo(f"report: wrote {path}")


@app.command("gate")
def gate_command(
    run_dir: Path = typer.Argument(..., help="The run directory to judge."),
    max_corruption_rate: float = typer.Option(
        ..., "--max-corruption-rate", help="Tolerated corruption rate (0 means none may be observed)."
    ),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence of the one-sided bounds and tests."),
    baseline: Path | None = typer.Option(None, "--baseline", help="Fail when worse than this run; pass when better, practically equivalent, or any increase is under --margin."),
    margin: float = typer.Option(0.05, "--margin", help="With --baseline: δ, the difference in corruption rate that does not matter (default: 0.05)."),
    max_timeout_rate: float | None = typer.Option(
        None, "--max-timeout-rate", help="Inconclusive above this share of timed-out sessions (default 0.2)."
    ),
    min_completed: int = typer.Option(20, "--min-completed", help="Inconclusive below this many completed sessions."),
    junit: Path | None = typer.Option(None, "--junit", help="Also write the checks as JUnit XML here."),
    allow_partial: bool = typer.Option(
        False, "--allow-partial", help="Judge an unfinished run (interrupted, crashed) on what it recorded."
    ),
) -> None:
    """Exit 0 (pass), 1 (corruption shown above the limit or the baseline) or 125 (inconclusive)."""
    from repro.run.gate import evaluate, write_junit
    from repro.store.rundir import check_output

    if junit is not None:
        check_output(junit, [run_dir, *([baseline] if baseline else [])], "--junit")
    result = evaluate(
        run_dir,
        max_corruption_rate=max_corruption_rate,
        confidence=confidence,
        baseline=baseline,
        max_timeout_rate=max_timeout_rate,
        min_completed=min_completed,
        allow_partial=allow_partial,
        margin=margin,
    )
    if junit is not None:
        write_junit(result, run_dir, junit)
    for line in result.lines():
        typer.echo(line)
    raise typer.Exit(result.exit_code)


@app.command("run")
@LOAD_FLAGS.into("load")
def run_command(
    base_url: str | None = typer.Option(None, "--base-url", help="OpenAI base URL (…/v1); none: the embedded simulator."),
    sessions: int | None = typer.Option(None, "--sessions", help="Number of sessions (default: 60)."),
    concurrency: int | None = typer.Option(None, "--concurrency", help="Sessions at once (default: all)."),
    name: str | None = typer.Option(None, "--name", help="Run name (default: the workload's)."),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default: reports/<timestamp>-<name>/)."),
    max_corruption_rate: float | None = typer.Option(
        None, "--max-corruption-rate", help="Gate the run: exit 1 unless the rate is shown below this."
    ),
    until_decided: bool | None = typer.Option(
        None, "--until-decided", help="Run in waves of --concurrency; stop once the gate's answer is known (--sessions caps)."
    ),
    confidence: float | None = typer.Option(None, "--confidence", help="Confidence of the gate and the stopping rule (default: 0.95)."),
    baseline: Path | None = typer.Option(None, "--baseline", help="With --until-decided: stop once an increase over this finished run is shown, or shown under --margin."),
    margin: float | None = typer.Option(None, "--margin", help="With --baseline: an increase shown under this passes (default: 0.05)."),
    workers: int | None = typer.Option(None, "--workers", help="Shard the sessions across N workers (default: 1, this process alone)."),
    executor: str | None = typer.Option(None, "--executor", help="With --workers: local processes (default) or ray actors."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="With --executor ray: the cluster (default: RAY_ADDRESS, else a local Ray)."),
    worker_resources: str | None = typer.Option(
        None, "--worker-resources", help='With --executor ray: Ray resources per worker, {"CPU": 1} (default) or a list, one per worker.'
    ),
    report: bool = typer.Option(True, "--report/--no-report", help="Render report.html (default: yes; `repro report` renders it later)."),
    control: list[str] | None = typer.Option(
        None, "--control", help="A control arm of the same tasks, after the run: concurrency-1, "
        "reference=URL[,api-key-env=NAME], or feature-off=NAME (the embedded simulator with hicache, cuda-graph, "
        "overlap-schedule or pd off) (repeatable); control.json says which failing turns fail there too."
    ),
    *,
    load: dict[str, Any],  # LOAD_FLAGS: OptionGroup.into fills it
) -> None:
    """Drive a deployment with concurrent agentic sessions and classify each as clean, corrupt, timeout or error."""
    overrides = {key: value for key, value in locals().items() if key not in ("load", "report", "control")}
    overrides.update({key: value for key, value in load.items() if key != "config"})
    from repro.run.control import parse_control, run_with_controls
    from repro.run.options import RunOptions

    arms = [parse_control(text) for text in control or []]
    result = run_with_controls(RunOptions.from_sources(load["config"], overrides), arms, report=report)
    raise typer.Exit(result.exit_code)


@app.command("matrix")
def matrix_command(
    spec: Path = typer.Argument(..., help="Matrix spec (YAML), e.g. matrices/sim_hicache_bf16.yaml."),
    out: Path | None = typer.Option(None, "--out", help="Matrix directory (default: reports/<timestamp>-matrix-<name>/)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the matrix in --out: keep finished runs, rerun the rest."),
    keep_going: bool = typer.Option(False, "--keep-going", help="Go on after a cell fails to start or confirm (exit 3 at the end)."),
    var: list[str] = typer.Option([], "--var", help="Set a spec variable, NAME=VALUE (repeatable)."),
    cell_reports: bool = typer.Option(True, "--cell-reports/--no-cell-reports", help="Render each run's report.html."),
    executor: str = typer.Option("local", "--executor", help="local: one run after another here; ray: each run a Ray task."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="Ray cluster to use (default: RAY_ADDRESS, else a local Ray)."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print every run's commands, environment (secrets masked), ports, health and confirm "
        "checks, and what --resume would skip; launch nothing, create nothing."
    ),
) -> None:
    """Restart the deployment for every feature combination, run the same load on each, and name the cause."""
    from repro.matrix.runner import run_matrix
    from repro.matrix.spec import parse_assignments

    if dry_run:
        from repro.matrix.dryrun import dry_run as print_plan

        raise typer.Exit(print_plan(spec, out=out, resume=resume, variables=parse_assignments(var), executor=executor))

    result = run_matrix(
        spec, out=out, resume=resume, keep_going=keep_going, cell_reports=cell_reports, variables=parse_assignments(var),
        executor=executor, ray_address=ray_address,
    )
    raise typer.Exit(result.exit_code)


@app.command("sweep")
@LOAD_FLAGS.into("load")
def sweep_command(
    concurrency: str = typer.Option("1,8,16,32,60", "--concurrency", help="Levels: 1,8,16,32,60 or a range 1-64:x2 / 8-64:+8."),
    sessions: int | None = typer.Option(
        None, "--sessions", help="Sessions per level, at least the highest level (default: 60, or --config's)."
    ),
    base_url: str | None = typer.Option(None, "--base-url", help="OpenAI base URL (…/v1); none: one embedded simulator for all levels."),
    spec: Path | None = typer.Option(None, "--spec", help="Launch this matrix spec's deployment (once) for --cell."),
    cell: list[str] = typer.Option([], "--cell", help="With --spec: FACTOR=LEVEL for every factor (repeatable)."),
    var: list[str] = typer.Option([], "--var", help="With --spec: set a spec variable, NAME=VALUE (repeatable)."),
    out: Path | None = typer.Option(None, "--out", help="Sweep directory (default: reports/<timestamp>-sweep/)."),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence of the intervals; 1 minus the tests' alpha."),
    executor: str = typer.Option("local", "--executor", help="local: here; ray: the whole sweep as one Ray task on one node."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="Ray cluster to use (default: RAY_ADDRESS, else a local Ray)."),
    resources: str | None = typer.Option(
        None, "--resources", help="With --executor ray: what the sweep asks of the cluster, JSON, e.g. "
        "'{\"GPU\": 8}' (default: --spec's resources for --cell, else one CPU)."
    ),
    *,
    load: dict[str, Any],  # LOAD_FLAGS: OptionGroup.into fills it
) -> None:
    """Run the same workload at several concurrencies on one deployment; report the corruption onset."""
    from repro.matrix.spec import parse_assignments
    from repro.sweep.options import sweep_load
    from repro.sweep.runner import SpecDeployment, parse_levels, ray_sweep, run_sweep

    if (cell or var) and spec is None:
        raise UsageError("--cell and --var choose a matrix spec's deployment: give --spec too")
    try:
        cells = parse_assignments(cell)
    except UsageError as err:
        raise UsageError(str(err).replace("--var", "--cell", 1)) from None
    target = SpecDeployment(spec, cells, parse_assignments(var)) if spec is not None else None
    levels = parse_levels(concurrency)
    given = sweep_load(sessions=sessions, base_url=base_url, load=load)
    placement = ray_sweep(executor, ray_address=ray_address, resources=resources, base_url=given.base_url, spec=target)
    run_sweep(
        levels, sessions=given.sessions, out=out, base_url=given.base_url, sim_args=given.sim_args, spec=target,
        confidence=confidence, run_options=given.run_options, placement=placement,
    )


@app.command("export")
def export_command(
    run_dir: Path = typer.Argument(..., help="The run directory to export."),
    fmt: str = typer.Option("csv", "--format", help="csv or jsonl."),
    output: Path | None = typer.Option(None, "--output", "-o", help="File to write (default: stdout)."),
) -> None:
    """One row per turn (session, turn, outcome, rules, latencies, tokens) as CSV or JSON lines."""
    from repro.store.export import render, write
    from repro.store.rundir import check_output, load_run

    if fmt not in ("csv", "jsonl"):
        raise UsageError(f"export --format {fmt}: expected csv or jsonl")
    if output is not None:
        check_output(output, [run_dir], "--output")
    write(render(load_run(run_dir), fmt), output)  # type: ignore[arg-type]


@app.command("reanalyse")
def reanalyse_command(
    matrix_dir: Path = typer.Argument(..., help="A matrix directory, recorded by this or any earlier repro."),
    out: Path | None = typer.Option(None, "--out", help="Where to write (default: MATRIX_DIR/reanalysis/)."),
) -> None:
    """Apply this version's analysis to a matrix's finished cells, without rerunning any."""
    from repro.matrix.reanalyse import reanalyse

    analysis, target, version = reanalyse(matrix_dir, out)
    typer.echo(analysis.verdict or "No finished cells: no verdict.")
    made_by = f"repro {version}" if version else "an earlier repro"
    typer.echo(f"reanalyse: cells recorded by {made_by}, analysed by repro {__version__}: {target} "
               "(matrix.json, report.html)")


@app.command("schema")
def schema_command(
    name: str | None = typer.Argument(None, help="Schema to print: run, workload, trace, matrix, manifest, session, summary, …"),
    write: Path | None = typer.Option(None, "--write", help="Write every schema to DIR/<name>.json instead."),
) -> None:
    """Print the JSON Schema of a file repro reads or writes (--write DIR: all of them)."""
    from repro.schemas import SCHEMAS, render, write_all

    if write is not None:
        for path in write_all(write):
            typer.echo(f"schema: wrote {path}")
    elif name is None:
        for entry in SCHEMAS.values():
            typer.echo(f"{entry.name:14} {entry.file}")
    else:
        typer.echo(render(name), nl=False)


@trace_app.command("convert")
def trace_convert(
    log: Path = typer.Argument(..., help="JSON lines of {\"request\": chat request body, \"response\": chat.completion}."),
    output: Path = typer.Option(..., "--output", "-o", help="The trace file to write (.jsonl)."),
) -> None:
    """Rebuild the conversations of an OpenAI request/response log as a trace file."""
    from repro.store.rundir import check_output
    from repro.workload.convert import convert

    check_output(output, [log], "trace convert --output")
    calls, conversations = convert(log, output)
    typer.echo(f"trace convert: {calls} calls, {conversations} conversations: wrote {output}")


@sim_app.command(
    "serve",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def sim_serve(ctx: typer.Context) -> None:
    """Serve the DeepSeek-V4 SGLang simulator (flags with SGLang's names; --help lists them)."""
    from repro.sim.config import parse_flags
    from repro.sim.server import serve

    serve(parse_flags(ctx.args))


def main() -> None:
    """Console entry point (errors and exit codes: repro.errors.run_main)."""
    # Run last at exit: the interpreter's final collection would walk every object of every loaded
    # module (a third of a second once the report's libraries are in) only to free memory that the
    # process hands back to the system anyway. Files and processes are closed before, by their owners.
    atexit.register(gc.freeze)
    run_main(app)
