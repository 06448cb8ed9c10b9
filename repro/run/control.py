"""`repro run --control`: control arms of the same tasks, recorded in the run directory, and what they say.

After the run under test, each control arm runs the same tasks (same workload, seed, sessions and
turns) as a run of its own in a sub-directory, then every failing turn of the run under test is set
beside the control's same turn (repro.store.loops) and control.json is written:

- `concurrency-1`: the same target (the embedded simulator is started again with the same flags),
  one session at a time: no load;
- `reference=URL[,api-key-env=NAME]`: an OpenAI-compatible reference endpoint (the model's official
  API, say) at the run's concurrency; its model is the first of its /v1/models, its key the
  variable named (never the run's own key: that one belongs to the target);
- `feature-off=NAME`: the embedded simulator started again with that feature switched off
  (repro.run.features), at the run's concurrency. A turn that fails with the feature off too is not
  that feature's doing. Against a URL repro cannot restart the server: refused (use `repro matrix`).

A control arm is never gated and never stops early: it is evidence for the run, not a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from repro.errors import EXIT_INTERRUPTED, UsageError
from repro.run.display import say
from repro.run.finish import RunResult, write_report
from repro.run.features import FEATURES_OFF, confirmed_off
from repro.run.options import RunOptions
from repro.run.runner import execute_run
from repro.store.loops import CONTROL_JSON, ControlReport, compare, describe
from repro.store.rundir import dump_json, load_run, read_sessions

CONCURRENCY_1 = "concurrency-1"
REFERENCE = "reference"
FEATURE_OFF = "feature-off"


@dataclass(frozen=True)
class ControlArm:
    """One `--control` value: its kind, for a reference its URL and key variable, for feature-off the feature."""

    kind: str
    base_url: str | None = None
    api_key_env: str | None = None
    feature: str | None = None

    @property
    def directory(self) -> str:
        return f"control-{self.kind}" + (f"-{self.feature}" if self.feature else "")


def parse_control(text: str) -> ControlArm:
    """`concurrency-1`, `reference=URL[,api-key-env=NAME]` or `feature-off=NAME`; UsageError naming what is wrong."""
    if text == CONCURRENCY_1:
        return ControlArm(CONCURRENCY_1)
    kind, eq, rest = text.partition("=")
    if kind == FEATURE_OFF and eq:
        if rest not in FEATURES_OFF:
            raise UsageError(f"--control {text!r}: unknown feature; expected one of {', '.join(FEATURES_OFF)}")
        return ControlArm(FEATURE_OFF, feature=rest)
    if kind != REFERENCE or not eq or not rest:
        raise UsageError(f"--control {text!r}: expected {CONCURRENCY_1}, {REFERENCE}=URL[,api-key-env=NAME] "
                         f"or {FEATURE_OFF}=NAME")
    url, _, extra = rest.partition(",")
    key_env = None
    if extra:
        name, eq, value = extra.partition("=")
        if name != "api-key-env" or not eq or not value:
            raise UsageError(f"--control {text!r}: after the URL only ,api-key-env=NAME may follow")
        key_env = value
    return ControlArm(REFERENCE, base_url=url, api_key_env=key_env)


def control_options(options: RunOptions, run_dir: Path, arm: ControlArm) -> RunOptions:
    """The control arm's options: the run's tasks and load shape, no gate, no early stop, its own directory."""
    # Only what was given carries over: an option checked against another (--margin needs --baseline) goes with it.
    data = options.model_dump(exclude_unset=True)
    for key in ("out", "name", "max_corruption_rate", "until_decided", "baseline", "margin"):
        data.pop(key, None)
    data.update(out=run_dir / arm.directory, name=f"{run_dir.name}-{arm.directory}")
    if arm.kind == CONCURRENCY_1:
        data.update(concurrency=1, workers=1, executor="local")
        for key in ("ray_address", "worker_resources"):
            data.pop(key, None)
    elif arm.kind == FEATURE_OFF:
        if options.base_url is not None:
            raise UsageError(f"--control {FEATURE_OFF}={arm.feature}: repro cannot restart the server at --base-url "
                             f"with the feature off; compare it on and off with `repro matrix` (a factor whose "
                             f"levels carry the flags)")
        data.update(sim_args=[*options.sim_args, *FEATURES_OFF[arm.feature or ""].flags])
    else:
        for key in ("model", "api_key_env", "sim_args"):
            data.pop(key, None)
        data.update(base_url=arm.base_url, **({"api_key_env": arm.api_key_env} if arm.api_key_env else {}))
    return RunOptions.parse(data, source=f"--control {arm.kind}")


def run_with_controls(options: RunOptions, arms: list[ControlArm], *, report: bool) -> RunResult:
    """`repro run [--control …]`: the run under test, then its control arms, then report.html with both.
    The exit code is the run under test's; an interrupted run gets no control arm."""
    if arms and options.pressure is not None:
        # --pressure sizes each session's document for the sessions at once and the target's pool: a control
        # arm would get other prompts than the run under test, and pairing its turns would mean nothing.
        raise UsageError("--control with --pressure: each arm would size its own prompts; put the document size "
                         "--pressure chose (its 'pressure:' line) in the workload's context_tokens instead")
    for arm in arms:  # a bad --control fails before the run, not after it
        control_options(options, Path("control-check"), arm)
    console = Console()
    result = execute_run(options, console=console, report=report and not arms)
    if not arms or result.exit_code == EXIT_INTERRUPTED:
        return result
    run_controls(options, result, arms, console)
    if report:
        write_report(result.path, console)
    return result


def run_controls(options: RunOptions, result: RunResult, arms: list[ControlArm], console: Console) -> ControlReport:
    """Run every control arm after the run under test, compare, write control.json and say what it found."""
    run_dir = result.path
    main = read_sessions(run_dir)
    report = ControlReport()
    for arm in arms:
        arm_options = control_options(options, run_dir, arm)
        say(console, f"control {arm.kind}: the same {options.sessions} sessions, {_where(arm)}")
        ran = execute_run(arm_options, console=console, live=False, report=False, control=arm.kind)
        assert ran.summary.loops is not None  # a run's summary always counts its loop signals
        done = load_run(ran.path)
        comparison = compare(arm.kind, arm.directory, main, done.sessions, control_loops=ran.summary.loops,
                             base_url=arm.base_url, concurrency=arm_options.concurrency or arm_options.sessions)
        if arm.feature is not None:
            feature = FEATURES_OFF[arm.feature]
            comparison = comparison.model_copy(update={
                "feature": arm.feature, "feature_label": feature.label, "flags": list(feature.flags),
                "feature_off_confirmed": confirmed_off(feature, done.manifest.server_info)})
        report.arms.append(comparison)
        dump_json(run_dir / CONTROL_JSON, report.model_dump(mode="json"))
    for comparison in report.arms:
        for line in describe(comparison):
            say(console, line)
    return report


def _where(arm: ControlArm) -> str:
    if arm.kind == CONCURRENCY_1:
        return "one at a time"
    if arm.feature is not None:
        return f"{FEATURES_OFF[arm.feature].label} off ({' '.join(FEATURES_OFF[arm.feature].flags)})"
    return f"on {arm.base_url}"

