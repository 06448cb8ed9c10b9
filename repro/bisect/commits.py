"""`repro bisect commits`: the first bad commit of a range, by Bayesian search on a flaky signal.

The bad end is probed first (it must corrupt; its counts start the model of the bad rate), then
every next commit is the one whose probe is expected to teach most about the culprit
(repro.bisect.posterior), each probe sized by the SPRT or the fixed bisection size. A commit whose
build or start fails, or whose sessions mostly time out, is inconclusive and never probed again; a
probe that reached its cap undecided still counts, and its commit may be probed again.
The search stops when one commit holds `--confidence` of the posterior, when "no culprit" does,
or when the budget runs out, and then names the posterior's likeliest commits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from rich.console import Console

from repro.bisect.gitrepo import Commit, checkout, commit_range, prepare, remove_checkout
from repro.bisect.journal import Journal, ProbeRecord
from repro.bisect.posterior import (
    Model,
    Observation,
    Posterior,
    ProbePlan,
    Stop,
    information_gain,
    next_commit,
    posterior,
    should_stop,
)
from repro.bisect.probe import ProbeSettings
from repro.bisect.search import Search, SearchOutcome
from repro.errors import UsageError


def _observations(records: list[ProbeRecord]) -> list[Observation]:
    return [Observation(r.index, r.corrupt, r.completed) for r in records
            if r.verdict != "inconclusive" and r.index is not None]


@dataclass(frozen=True)
class Next:
    """Probe commit `index` with `plan`, for the reason `why` (the decision trail)."""

    index: int
    plan: ProbePlan
    why: str


@dataclass(frozen=True)
class Ended:
    """The search is over: `stop` says why (None: the bad end itself could not be probed)."""

    stop: Stop | None
    posterior: Posterior


def decide(
    commits: int,
    records: Sequence[ProbeRecord],
    model: Model,
    settings: ProbeSettings,
    *,
    confidence: float,
    max_probes: int,
    max_sessions: int,
) -> Next | Ended:
    """The search's next step from the probes so far (pure: the command and the benchmark share it).

    The bad end comes first, a fixed probe of up to two rounds; a commit with an inconclusive probe is
    never chosen again.
    """
    post = posterior(commits, _observations(records), model)
    bad_end = [r for r in records if r.index == commits - 1]
    if not bad_end:
        plan = ProbePlan("fixed", settings.round_sessions, 2 * settings.round_sessions,
                         max(0.5, settings.min_bad_rate), settings.good_rate, settings.alpha, settings.beta)
        return Next(commits - 1, plan, "the bad end: it must corrupt, and its rate starts the model")
    if all(r.verdict == "inconclusive" for r in bad_end):
        return Ended(None, post)
    plan = settings.plan(post.bad_rate, commits)
    skip = frozenset(r.index for r in records if r.verdict == "inconclusive" and r.index is not None)
    nxt = next_commit(post, plan.round_sessions, model.good_rate, skip)
    sessions = sum(r.clean + r.corrupt + r.timeout + r.error for r in records)
    stop = should_stop(post, confidence=confidence, probes=len(records), sessions=sessions,
                       max_probes=max_probes, max_sessions=max_sessions, stuck=nxt is None)
    if stop is not None or nxt is None:
        return Ended(stop, post)
    gain = information_gain(post, plan.round_sessions, model.good_rate)[nxt]
    best, p_best = post.top(1)[0]
    why = (f"P(bad) = {post.bad_probability()[nxt]:.2f}, expected gain {gain:.2f} bits; "
           f"leader #{best} at {p_best:.2f}, bad rate ~{post.bad_rate:.1%}")
    return Next(nxt, plan, why)


def _conclusion(stop: Stop, post: Posterior, commits: list[Commit], confidence: float) -> str:
    if stop.reason == "found" and stop.commit is not None:
        commit = commits[stop.commit]
        return (f"First bad commit: {commit.sha} ({commit.subject}), P = {stop.probability:.3f}; "
                f"estimated bad rate {post.bad_rate:.1%}.")
    if stop.reason == "no_culprit":
        return (f"No commit of the range is to blame (P = {stop.probability:.3f}): the bad end does not "
                "reproduce the corruption at the least rate looked for.")
    best = ", ".join(f"{commits[i].sha[:10]} ({p:.2f})" for i, p in post.top(3))
    why = {"budget": "the probe or session budget ran out",
           "stuck": "the doubt left is on commits whose probes were inconclusive"}
    return f"No commit holds {confidence:.2f} of the posterior ({why[stop.reason]}); likeliest: {best}."


def bisect_commits(
    repo: Path,
    good: str,
    bad: str,
    *,
    deploy: str,
    settings: ProbeSettings,
    out: Path,
    build: str | None = None,
    resume: bool = False,
    confidence: float = 0.95,
    max_probes: int = 30,
    max_sessions: int = 3000,
    none_prior: float = 0.05,
    build_timeout: float = 1800.0,
    ready_timeout: float = 120.0,
    console: Console | None = None,
) -> SearchOutcome:
    """Run (or resume) a commit bisection in `out`; see the module docstring."""
    if not 0.5 < confidence < 1.0:
        raise UsageError(f"--confidence must be between 0.5 and 1, got {confidence}")
    console = console or Console(stderr=True, highlight=False, soft_wrap=True)
    repo = Path(repo).resolve()
    commits = commit_range(repo, good, bad)
    model = Model(good_rate=settings.good_rate, min_bad_rate=settings.min_bad_rate, none_prior=none_prior)
    n = len(commits)
    setup = {
        "kind": "commits",
        "repo": str(repo),
        "commits": [c.sha for c in commits],
        "deploy": deploy,
        "build": build,
        "probe": asdict(settings),
        "confidence": confidence,
        "max_probes": max_probes,
        "max_sessions": max_sessions,
        "none_prior": none_prior,
    }
    search = Search(Journal(out, setup, resume=resume), settings, console)

    def after(records: list[ProbeRecord]) -> list[float]:
        post = posterior(n, _observations(records), model)
        return [*map(float, post.culprit), post.none]

    def probe(index: int, plan: ProbePlan, why: str) -> ProbeRecord:
        commit = commits[index]

        def launch(probe_dir: Path):
            src = probe_dir / "src"
            checkout(repo, commit.sha, src)
            return prepare(deploy=deploy, build=build, rev=commit.sha, src=src, probe_dir=probe_dir,
                           build_timeout=build_timeout, ready_timeout=ready_timeout)

        try:
            return search.probe(commit.label(index), launch, plan, why=why, index=index, posterior=after)
        finally:
            for leftover in search.journal.path.glob("probes/*/src"):
                remove_checkout(leftover)

    base = {"kind": "commits", "commits": [c.label(i) for i, c in enumerate(commits)]}
    while True:
        step = decide(n, search.records, model, settings, confidence=confidence, max_probes=max_probes,
                      max_sessions=max_sessions)
        if isinstance(step, Ended):
            break
        probe(step.index, step.plan, step.why)
    if step.stop is None:
        bad_end = [r for r in search.records if r.index == n - 1]
        return search.finish({**base, "status": "stuck", "found": [], "top": [],
                              "conclusion": f"The bad end could not be probed: {bad_end[-1].message}"})
    stop, post = step.stop, step.posterior
    top = [{"label": commits[i].label(i), "probability": p} for i, p in post.top(5)]
    found = [commits[stop.commit].label(stop.commit)] if stop.reason == "found" and stop.commit is not None else []
    return search.finish({**base, "status": stop.reason, "found": found, "top": top, "none": post.none,
                          "bad_rate": post.bad_rate, "conclusion": _conclusion(stop, post, commits, confidence)})
