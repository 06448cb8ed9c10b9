"""`repro bisect flags|commits` and `repro probe`: typer wrappers that read options and call the searches.

Imports of the search modules happen inside the commands: scipy and matplotlib take seconds to load.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from repro.bisect.ranges import check_at_least, check_probability, check_probe_options, check_template
from repro.errors import UsageError
from repro.option_groups import OptionGroup
from repro.run.flags import LOAD_FLAGS
from repro.store.paths import default_dir

if TYPE_CHECKING:
    from repro.bisect.probe import ProbeSettings

bisect_app = typer.Typer(
    help="Find the commit or the settings that make the corruption appear, with probes sized for a flaky signal.",
    no_args_is_help=True,
)

_LOAD_KEYS = ("concurrency", "turns", "timeout", "turn_timeout", "stall_timeout", "workload")


def probe_settings(
    *,
    config: Path | None,
    load: dict[str, Any],
    sessions: int | None,
    max_rounds: int,
    mode: str,
    alpha: float,
    beta: float,
    good_rate: float,
    min_bad_rate: float,
    seed: int,
) -> ProbeSettings:
    """The probes' settings from the command line; `--config` is a `repro run` YAML whose load options
    apply. A round has `sessions` sessions, else the load options' `sessions`, else DEFAULT_SESSIONS."""
    from repro.bisect.probe import ProbeSettings
    from repro.run.options import RunOptions

    if mode not in ("sequential", "fixed"):
        raise UsageError(f"--probe must be sequential or fixed, got {mode!r}")
    check_probe_options(sessions=sessions, max_rounds=max_rounds, alpha=alpha, beta=beta, good_rate=good_rate,
                        min_bad_rate=min_bad_rate)
    options = RunOptions.from_sources(config, {k: v for k, v in load.items() if v is not None})
    if sessions is None:
        sessions = options.sessions if "sessions" in options.model_fields_set else DEFAULT_SESSIONS
    kept = options.model_dump(mode="json", exclude={"base_url", "sessions", "seed", "out", "name", "sim_args",
                                                     "max_corruption_rate"}, exclude_defaults=True)
    if options.base_url is not None or options.sim_args:
        raise UsageError("--config: base_url and sim_args are the bisection's to choose; remove them")
    return ProbeSettings(load=kept, round_sessions=sessions, max_rounds=max_rounds,
                         mode=mode,  # type: ignore[arg-type]
                         alpha=alpha, beta=beta, good_rate=good_rate, min_bad_rate=min_bad_rate, seed=seed)


SESSIONS = typer.Option(None, "--sessions", help="Sessions per probe round, run at --concurrency (default: 32).")
DEFAULT_SESSIONS = 32
MAX_ROUNDS = typer.Option(3, "--max-rounds", help="Rounds a sequential probe may run before it ends undecided.")
LOAD = OptionGroup(
    sessions=(int | None, SESSIONS),
    seed=(int, typer.Option(0, "--seed", help="Seed of the probes' session tasks.")),
    concurrency=(int | None, typer.Option(None, "--concurrency", help="Sessions at once (default: all of a round).")),
) | LOAD_FLAGS.only(
    "turns", "timeout", "turn_timeout", "stall_timeout", "workload", "config",
    # Only its load options apply: base_url and sim_args are the bisection's (probe_settings refuses them).
    config="A `repro run` options YAML whose load options apply; the command line wins.",
) | OptionGroup(
    alpha=(float, typer.Option(0.05, "--alpha", help="A probe's chance of calling a good target bad.")),
    beta=(float, typer.Option(0.05, "--beta", help="A probe's chance of calling a bad target good.")),
    good_rate=(float, typer.Option(0.001, "--good-rate", help="Corruption rate assumed of a good target (the flaky side).")),
    ready_timeout=(float, typer.Option(60.0, "--ready-timeout", help="Seconds a deployment may take to answer /health.")),
)
"""How a probe runs its load and decides: every command that probes takes these."""
SEARCH = OptionGroup(
    out=(Path | None, typer.Option(None, "--out", help="Bisect directory (default: reports/<timestamp>-bisect-<kind>/).")),
    resume=(bool, typer.Option(False, "--resume", help="Continue the bisection in --out, keeping every recorded probe.")),
    probe=(str, typer.Option("sequential", "--probe", help="sequential (Wald's SPRT over rounds) or fixed (one sized round).")),
    min_bad_rate=(float, typer.Option(0.02, "--min-bad-rate", help="Least corruption rate the bad end is taken to show.")),
    executor=(str, typer.Option("local", "--executor", help="local: probes one after another here; ray: each probe a Ray task.")),
    ray_address=(str | None, typer.Option(None, "--ray-address", help="Ray cluster to use (default: RAY_ADDRESS, else a local Ray).")),
    parallel=(int, typer.Option(1, "--parallel", help="With --executor ray: probes run at once when the search has independent ones.")),
)
"""A whole search's directory, its probes' bad-side rate and where they run: `bisect flags` and `bisect commits`."""


def _settings(
    options: dict[str, Any], *, max_rounds: int, mode: str, min_bad_rate: float, load: dict[str, Any] | None = None
) -> ProbeSettings:
    """probe_settings from a command's LOAD (and SEARCH) values; `load` holds values that come first."""
    given = {**(load or {}), **{k: v for k, v in options.items() if k in _LOAD_KEYS and v is not None}}
    return probe_settings(config=options["config"], load=given, sessions=options["sessions"], max_rounds=max_rounds,
                          mode=mode, alpha=options["alpha"], beta=options["beta"], good_rate=options["good_rate"],
                          min_bad_rate=min_bad_rate, seed=options["seed"])


@bisect_app.command("flags")
@(LOAD | SEARCH).into("options")
def flags_command(
    good: str = typer.Option(..., "--good", help="The good configuration: 'FLAGS / ENV' (or @FILE)."),
    bad: str = typer.Option(..., "--bad", help="The bad configuration: 'FLAGS / ENV' (or @FILE)."),
    deploy: str | None = typer.Option(
        None, "--deploy", help="Server command with ${flags} and ${port} (default: the embedded simulator)."
    ),
    max_probes: int = typer.Option(40, "--max-probes", help="Probe budget."),
    max_rounds: int = MAX_ROUNDS,
    resources: str | None = typer.Option(
        None, "--resources", help="With --executor ray: what each probe asks of the cluster, JSON, e.g. '{\"GPU\": 8}'."
    ),
    *,
    options: dict[str, Any],  # LOAD and SEARCH: OptionGroup.into fills it
) -> None:
    """Delta debugging over the settings that differ: the minimal set that makes the corruption appear."""
    from repro.bisect.executor import probe_executor
    from repro.bisect.flags import bisect_flags

    out, resume, parallel = options["out"], options["resume"], options["parallel"]
    if resume and out is None:
        raise UsageError("--resume needs --out: the bisect directory to continue")
    check_at_least("--max-probes", max_probes)
    check_template("--deploy", deploy, FLAGS_DEPLOY_VARIABLES)
    settings = _settings(options, max_rounds=max_rounds, mode=options["probe"], min_bad_rate=options["min_bad_rate"])
    runner = probe_executor(options["executor"], ray_address=options["ray_address"], parallel=parallel,
                            resources=resources)
    result = bisect_flags(good, bad, settings=settings, out=out or default_dir("bisect", "flags"), resume=resume,
                          deploy=deploy, max_probes=max_probes, ready_timeout=options["ready_timeout"], executor=runner,
                          parallel=parallel)
    raise typer.Exit(result.exit_code)


FLAGS_DEPLOY_VARIABLES = ("flags", "port", "python")
COMMIT_BUILD_VARIABLES = ("rev", "src", "python")
COMMIT_DEPLOY_VARIABLES = (*COMMIT_BUILD_VARIABLES, "port")
DEPLOY_HELP = "Server command, run in the commit's checkout, with ${rev}, ${port}, ${src} and ${python}."
BUILD = typer.Option(None, "--build", help="Build command run in the checkout first; failing makes the probe inconclusive.")
BUILD_TIMEOUT = typer.Option(1800.0, "--build-timeout", help="Seconds a build may take.")


@bisect_app.command("commits")
@(LOAD | SEARCH).into("options")
def commits_command(
    repo: Path = typer.Option(Path("."), "--repo", help="The git repository."),
    good: str = typer.Option(..., "--good", help="A commit without the corruption (with --find-fix: the later end)."),
    bad: str = typer.Option(..., "--bad", help="A later commit with it (first-parent descendant of --good; "
                            "with --find-fix: the older end)."),
    find_fix: bool = typer.Option(
        False, "--find-fix", help="Name the first good commit after a bad range (the fix): --bad is the older end."
    ),
    deploy: str | None = typer.Option(None, "--deploy", help=DEPLOY_HELP),
    matrix_deployment: Path | None = typer.Option(
        None, "--matrix-deployment", help="Deploy as this matrix spec deploys a cell, with its variables rev and src set."
    ),
    matrix_cell: str | None = typer.Option(
        None, "--matrix-cell", help="The spec's cell to deploy, FACTOR=LEVEL,... (default: its baseline)."
    ),
    build: str | None = BUILD,
    confidence: float = typer.Option(0.95, "--confidence", help="Stop when one commit holds this much of the posterior."),
    max_sessions: int = typer.Option(3000, "--max-sessions", help="Session budget of the whole search."),
    max_probes: int = typer.Option(30, "--max-probes", help="Probe budget."),
    max_rounds: int = typer.Option(
        1, "--max-rounds", help="Rounds per probe; 1: the posterior decides where to look again, more: each probe an SPRT."
    ),
    build_timeout: float = BUILD_TIMEOUT,
    resources: str | None = typer.Option(
        None, "--resources", help="With --executor ray: what each probe asks of the cluster, JSON, e.g. "
        "'{\"GPU\": 8}' (default: --matrix-deployment's resources for its cell, else one CPU)."
    ),
    *,
    options: dict[str, Any],  # LOAD and SEARCH: OptionGroup.into fills it
) -> None:
    """Bayesian search for the first bad commit (or with --find-fix the fixing one): each probe deploys a commit and
    runs the load on it."""
    from repro.bisect.commits import bisect_commits
    from repro.bisect.executor import probe_executor
    from repro.bisect.matrixdeploy import load_deployment

    out, resume, parallel = options["out"], options["resume"], options["parallel"]
    if resume and out is None:
        raise UsageError("--resume needs --out: the bisect directory to continue")
    if (deploy is None) == (matrix_deployment is None):
        raise UsageError("give exactly one of --deploy, --matrix-deployment")
    check_at_least("--max-probes", max_probes)
    check_template("--deploy", deploy, COMMIT_DEPLOY_VARIABLES)
    check_template("--build", build, COMMIT_BUILD_VARIABLES)
    matrix = load_deployment(matrix_deployment, matrix_cell) if matrix_deployment is not None else None
    # A matrix spec's load section comes first; the command line's load options win over it.
    settings = _settings(options, max_rounds=max_rounds, mode=options["probe"], min_bad_rate=options["min_bad_rate"],
                         load=matrix[0].load if matrix else None)
    spec_resources = matrix[0].resources.for_cell(matrix[1].as_dict()) if matrix else None
    runner = probe_executor(options["executor"], ray_address=options["ray_address"], parallel=parallel,
                            resources=resources, spec_resources=spec_resources)
    result = bisect_commits(repo, good, bad, deploy=deploy, matrix=matrix, settings=settings,
                            out=out or default_dir("bisect", "commits"), build=build, resume=resume,
                            confidence=confidence, max_probes=max_probes, max_sessions=max_sessions,
                            build_timeout=build_timeout, ready_timeout=options["ready_timeout"], executor=runner,
                            parallel=parallel, find_fix=find_fix)
    raise typer.Exit(result.exit_code)


@LOAD.into("options")
def probe_command(
    deploy: str = typer.Option(..., "--deploy", help=DEPLOY_HELP.replace("the commit's checkout", "--src")),
    bad_rate: float = typer.Option(..., "--bad-rate", help="Corruption rate of a bad commit (measure the bad end first)."),
    commits: int = typer.Option(100, "--commits", help="Commits in the range: sizes a fixed probe."),
    src: Path = typer.Option(Path("."), "--src", help="The checkout to probe (git bisect run's working tree)."),
    build: str | None = BUILD,
    out: Path | None = typer.Option(
        None, "--out", help="Probe directory (default: reports/<UTC timestamp>-bisect-probe-<the first 10 characters "
        "of --src's HEAD>/, under the current directory)."
    ),
    max_rounds: int = MAX_ROUNDS,
    probe: str = typer.Option("fixed", "--probe", help="fixed (one round sized for the range) or sequential (SPRT)."),
    delta: float = typer.Option(0.05, "--delta", help="Fixed: chance that a bad commit passes every probe of the range."),
    build_timeout: float = BUILD_TIMEOUT,
    *,
    options: dict[str, Any],  # LOAD: OptionGroup.into fills it
) -> None:
    """One probe for `git bisect run`: exit 0 good, 1 bad, 125 inconclusive or undecided (skip); anything else aborts.

    A fixed probe calls a commit bad at its first corrupt session and good after
    ceil(ln(delta / ceil(log2 commits)) / ln(1 - bad_rate)) clean ones. git's loop trusts every answer
    for good: one bad commit that passes by chance, or one good commit that corrupts once, sends the
    search the wrong way for good. `repro bisect commits` keeps a posterior over the commits instead,
    re-probes where the evidence is thin and names a commit only at --confidence.
    """
    import dataclasses
    import subprocess

    from rich.console import Console

    from repro.bisect.gitrepo import prepare
    from repro.bisect.probe import ProbeResult, describe, run_probe
    from repro.errors import (
        EXIT_FAILED,
        EXIT_INCONCLUSIVE,
        EXIT_INTERNAL,
        EXIT_INTERRUPTED,
        EXIT_OK,
        ReproError,
    )

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        src = src.resolve()
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=60)
        rev = head.stdout.strip() if head.returncode == 0 else "unknown"
        check_probability("--bad-rate", bad_rate, one_allowed=True)
        check_probability("--delta", delta)
        check_template("--deploy", deploy, COMMIT_DEPLOY_VARIABLES)
        check_template("--build", build, COMMIT_BUILD_VARIABLES)
        settings = _settings(options, max_rounds=max_rounds, mode=probe, min_bad_rate=options["good_rate"] * 2)
        settings = dataclasses.replace(settings, delta=delta)
        plan = settings.plan(bad_rate, commits)
        path = out or default_dir("bisect", f"probe-{rev[:10]}")
        if path.exists() and any(path.iterdir()):
            raise UsageError(f"--out {path}: exists and is not empty")
        path.mkdir(parents=True, exist_ok=True)
        prepared = prepare(deploy=deploy, build=build, rev=rev, src=src, probe_dir=path,
                           build_timeout=build_timeout, ready_timeout=options["ready_timeout"])
        console.print(f"probe {rev[:10]}: {plan.mode}, {plan.round_sessions} sessions a round, up to {plan.max_sessions}")
        if isinstance(prepared, ProbeResult):
            result = prepared
            console.print(f"  {describe(result)}")
        else:
            result = run_probe(prepared, plan, settings.load, path, seed=options["seed"], console=console)
    except ReproError as err:
        # git bisect reads 1-127 (but 125) as "bad": a usage error must abort the bisection instead.
        if err.exit_code != EXIT_INTERRUPTED:
            err.exit_code = EXIT_INTERNAL
        raise
    raise typer.Exit({"good": EXIT_OK, "bad": EXIT_FAILED}.get(result.verdict, EXIT_INCONCLUSIVE))
