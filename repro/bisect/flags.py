"""`repro bisect flags`: which of the settings that differ between a good and a bad configuration make
the corruption appear. The bad configuration is probed first (it must corrupt, and its rate sizes
the later probes), then the good one (it must not), then ddmin over the differences, every test a
sequential probe of the good configuration with a subset of the changes made.

The deployment is the embedded simulator by default (its flags confirmed through `/server_info`),
or `--deploy 'COMMAND ${flags} ${port}'` for any server that serves `/health` on that port.
On Ray (repro.bisect.executor) ddmin's candidates of one step run `--parallel` at a time.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from repro.bisect.ddmin import Outcome, Subset, ddmin
from repro.bisect.executor import LocalProbes, ProbeExecutor
from repro.bisect.journal import Journal, ProbeRecord
from repro.bisect.posterior import ProbePlan
from repro.bisect.probe import SIM_COMMAND, ProbeResult, ProbeSettings, launch_plan
from repro.bisect.search import ProbeRequest, ProbesLost, Search, SearchOutcome
from repro.bisect.settings import Change, Config, apply, command_line, differences, read_config
from repro.errors import UsageError
from repro.matrix.deploy import LaunchPlan
from repro.matrix.spec import Template
from repro.procs.process import free_port
from repro.sim.config import SimConfig, parse_flags, server_info

OUTCOME = {"bad": "fail", "good": "pass", "undecided": "inconclusive", "inconclusive": "inconclusive"}


class _Budget(Exception):
    """The probe budget ran out in the middle of ddmin."""


def sim_expectations(flags: list[str]) -> dict[str, Any]:
    """What the simulator's `/server_info` must show for `flags`: every one of its settings they name."""
    info = server_info(parse_flags(flags, prog="bisect flags (simulator)"))
    named = {token[2:].split("=", 1)[0].replace("-", "_").removeprefix("no_") for token in flags if token.startswith("--")}
    return {key: info[key] for key in named if key in SimConfig.model_fields and key not in ("host", "port")}


@dataclass(frozen=True)
class FlagsJob:
    """A probe of one configuration: the simulator with its flags (confirmed), or the `--deploy` command."""

    config: Config
    deploy: str | None
    ready_timeout: float

    def prepare(self, probe_dir: Path) -> LaunchPlan | ProbeResult:
        flags, env = command_line(self.config)
        port = free_port()
        if self.deploy is None:
            return launch_plan("sim", [*SIM_COMMAND, "--port", str(port), *flags], port, env=env,
                               expect=sim_expectations(flags), ready_timeout=self.ready_timeout)
        values = {"flags": shlex.join(flags), "port": str(port), "python": sys.executable}
        try:
            argv = shlex.split(Template(self.deploy).substitute(values))
        except (KeyError, ValueError) as err:
            raise UsageError(f"--deploy: cannot substitute {err} (known: ${{flags}}, ${{port}}, ${{python}})") from None
        return launch_plan("server", argv, port, env=env, ready_timeout=self.ready_timeout)

    def finish(self, probe_dir: Path) -> None:
        """Nothing to remove: the deployment stopped with the probe."""

    def portable(self) -> FlagsJob:
        return self


def _describe(changes: list[Change], subset: Subset) -> str:
    if not subset:
        return "good configuration"
    if len(subset) == len(changes):
        return "bad configuration"
    return "good + " + ", ".join(f"#{i}" for i in subset)


def bisect_flags(
    good_text: str,
    bad_text: str,
    *,
    settings: ProbeSettings,
    out: Path,
    resume: bool = False,
    deploy: str | None = None,
    max_probes: int = 40,
    ready_timeout: float = 60.0,
    console: Console | None = None,
    executor: ProbeExecutor | None = None,
    parallel: int = 1,
) -> SearchOutcome:
    """Run (or resume) a flag bisection in `out`; see the module docstring. `parallel` ddmin candidates
    run at once on an executor that can (Ray)."""
    console = console or Console(stderr=True, highlight=False, soft_wrap=True)
    good, bad = read_config(good_text, option="--good"), read_config(bad_text, option="--bad")
    changes = differences(good, bad)
    if not changes:
        raise UsageError("--good and --bad hold the same settings: nothing to bisect")
    if deploy is None:
        for config in (good, bad):  # a typo in a flag is a usage error now, not an inconclusive probe later
            sim_expectations(command_line(config)[0])
    setup = {
        "kind": "flags",
        "good": [str(s) for s in good.values()],
        "bad": [str(s) for s in bad.values()],
        "changes": [str(c) for c in changes],
        "deploy": deploy,
        "probe": asdict(settings),
        "max_probes": max_probes,
    }
    executor = executor or LocalProbes()
    with executor.connected():
        search = Search(Journal(out, setup, resume=resume), settings, console, executor)
        return _search(search, good, changes, deploy=deploy, max_probes=max_probes, ready_timeout=ready_timeout,
                       parallel=parallel)


def _search(search: Search, good: Config, changes: list[Change], *, deploy: str | None, max_probes: int,
            ready_timeout: float, parallel: int) -> SearchOutcome:
    settings, setup = search.settings, search.journal.setup
    # A lost probe says nothing about its subset: it is probed again when ddmin asks for it.
    recorded = {tuple(r.subset or ()): r for r in search.records if r.verdict != "lost"}
    everything: Subset = tuple(range(len(changes)))

    def request(subset: Subset, plan: ProbePlan, why: str) -> ProbeRequest:
        return ProbeRequest(_describe(changes, subset), FlagsJob(apply(good, changes, subset), deploy, ready_timeout),
                            plan, why, subset=list(subset))

    def keep(records: list[ProbeRecord]) -> None:
        for record in records:
            if record.verdict != "lost":
                recorded[tuple(record.subset or ())] = record

    def probe(subset: Subset, plan: ProbePlan, why: str) -> str:
        if subset in recorded:
            return recorded[subset].verdict
        if len(search.records) >= max_probes:
            raise _Budget
        record = search.probe(request(subset, plan, why))
        keep([record])
        return record.verdict

    base = {"kind": "flags", "changes": setup["changes"], "good": setup["good"], "bad": setup["bad"]}
    try:
        verdict = probe(everything, settings.bad_end_plan(), "the bad end must corrupt; its rate sizes the later probes")
        if verdict != "bad":
            status = "no_culprit" if verdict == "good" else "stuck"  # fixed probes end good or bad, or inconclusive
            conclusion = (
                "The bad configuration showed no corruption: nothing to bisect (raise --sessions, or check the load)."
                if verdict == "good"
                else f"The bad configuration's probe was inconclusive: {recorded[everything].message}"
            )
            return search.finish({**base, "status": status, "conclusion": conclusion, "found": []})
        bad_record = recorded[everything]
        rate = (bad_record.corrupt + 1) / (bad_record.completed + 2)
        plan = settings.plan(rate, len(changes))
        if probe((), plan, "the good end must not corrupt") == "bad":
            return search.finish({**base, "status": "stuck", "found": [],
                                  "conclusion": "The good configuration corrupts too: the differences do not explain it."})

        def why(subset: Subset) -> str:
            return f"ddmin: {len(subset)} of {len(changes)} changes"

        def test(subset: Subset) -> Outcome:
            if subset == everything:
                return "fail"
            return OUTCOME[probe(subset, plan, why(subset))]  # type: ignore[return-value]

        def ahead(subsets: list[Subset]) -> None:
            """Probe at once the candidates not yet recorded, as many as the budget allows."""
            todo = [s for s in subsets if s not in recorded]  # the bad end (everything) is recorded first
            todo = todo[:max(0, max_probes - len(search.records))]
            if len(todo) > 1:
                keep(search.probe_all([request(s, plan, why(s)) for s in todo]))

        found = ddmin(everything, test, parallel=parallel, ahead=ahead)
    except _Budget:
        failing = sorted((s for s, r in recorded.items() if r.verdict == "bad"), key=len)
        smallest = [str(changes[i]) for i in failing[0]] if failing else []
        return search.finish({**base, "status": "budget", "found": smallest,
                              "conclusion": f"Probe budget ({max_probes}) spent; the smallest failing set so far: "
                                            + ("; ".join(smallest) or "none")})
    except ProbesLost as err:
        return search.lost(base, err)
    named = [str(changes[i]) for i in found]
    # ddmin tested each one alone on the way (a probe that stayed undecided is "not shown to corrupt").
    together = " (only together: none alone was shown to corrupt)" if len(found) > 1 and all(
        recorded.get((i,)) is not None and recorded[(i,)].verdict != "bad" for i in found) else ""
    conclusion = f"The corruption needs {len(found)} of the {len(changes)} changes{together}: " + "; ".join(named)
    return search.finish({**base, "status": "found", "found": named, "found_indices": list(found),
                          "conclusion": conclusion})
