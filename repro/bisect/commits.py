"""`repro bisect commits`: the first bad commit of a range, by Bayesian search on a flaky signal.

The bad end is probed first (it must corrupt; its counts start the model of the bad rate), then
every next commit is the one whose probe is expected to teach most about the culprit
(repro.bisect.posterior), each probe sized by the SPRT or the fixed bisection size. A commit whose
build or start fails, or whose sessions mostly time out, is inconclusive and never probed again; a
probe that reached its cap undecided still counts, and its commit may be probed again.
The search stops when one commit holds `--confidence` of the posterior, when "no culprit" does,
or when the budget runs out, and then names the posterior's likeliest commits.

With `--parallel K` on Ray (repro.bisect.executor), every step after the bad end probes K commits
at once, at the posterior's K quantiles (repro.bisect.posterior.spread_commits); each result enters
the posterior as independent evidence (counts add up per commit, whatever the order they end in).
A probe lost with its Ray task is no evidence and marks nothing: its commit may be chosen again.

With `--find-fix` the same search runs over the range newest first and names the first good commit
after a bad range (repro.bisect.direction).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from rich.console import Console

from repro.bisect.direction import WORDS, Searched
from repro.bisect.executor import LocalProbes, ProbeExecutor
from repro.bisect.gitrepo import Commit, commit_range, extract, prepare, remove_checkout, tree_archive
from repro.bisect.journal import Journal, ProbeRecord
from repro.bisect.matrixdeploy import commit_launch
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
    spread_commits,
)
from repro.bisect.probe import ProbeResult, ProbeSettings
from repro.bisect.search import ProbeRequest, ProbesLost, Search, SearchOutcome
from repro.errors import UsageError
from repro.matrix.deploy import LaunchPlan
from repro.matrix.design import Cell
from repro.matrix.spec import MatrixSpec


def _observations(records: Sequence[ProbeRecord]) -> list[Observation]:
    return [Observation(r.index, r.corrupt, r.completed) for r in records
            if r.verdict not in ("inconclusive", "lost") and r.index is not None]


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
    searched: Searched | None = None,
) -> Next | Ended:
    """The search's next probe from the probes so far (pure: the command and the benchmark share it).

    The bad end comes first, a fixed probe of up to two rounds; a commit with an inconclusive probe is
    never chosen again.
    """
    step = decide_many(commits, records, model, settings, parallel=1, confidence=confidence,
                       max_probes=max_probes, max_sessions=max_sessions, searched=searched)
    return step if isinstance(step, Ended) else step[0]


def decide_many(
    commits: int,
    records: Sequence[ProbeRecord],
    model: Model,
    settings: ProbeSettings,
    *,
    parallel: int,
    confidence: float,
    max_probes: int,
    max_sessions: int,
    searched: Searched | None = None,
) -> list[Next] | Ended:
    """The search's next probes, up to `parallel` of them to run at once (never past `max_probes`).

    The bad end is probed alone (nothing is worth probing before it is known to corrupt). Then one
    probe: the commit whose probe is expected to teach most (`next_commit`); several: the commits at
    the posterior's quantiles (`spread_commits`). Lost probes count against the budget only.
    `searched` names the leader in the decision trail by its history index (default: a regression search).
    """
    searched = searched or Searched("regression", commits)
    post = posterior(commits, _observations(records), model)
    bad_end = [r for r in records if r.index == commits - 1 and r.verdict != "lost"]
    if not bad_end:
        return [Next(commits - 1, settings.bad_end_plan(), "the bad end: it must corrupt, and its rate starts the model")]
    if all(r.verdict == "inconclusive" for r in bad_end):
        return Ended(None, post)
    plan = settings.plan(post.bad_rate, commits)
    skip = frozenset(r.index for r in records if r.verdict == "inconclusive" and r.index is not None)
    count = max(1, min(parallel, max_probes - len(records)))
    if count == 1:
        nxt = next_commit(post, plan.round_sessions, model.good_rate, skip)
        picks = [] if nxt is None else [nxt]
    else:
        picks = spread_commits(post, count, plan.round_sessions, model.good_rate, skip)
    sessions = sum(r.clean + r.corrupt + r.timeout + r.error for r in records)
    stop = should_stop(post, confidence=confidence, probes=len(records), sessions=sessions,
                       max_probes=max_probes, max_sessions=max_sessions, stuck=not picks)
    if stop is not None or not picks:
        return Ended(stop, post)
    gain = information_gain(post, plan.round_sessions, model.good_rate)
    bad = post.bad_probability()
    best, p_best = post.top(1)[0]
    leader = f"leader #{searched.named(best)} at {p_best:.2f}, bad rate ~{post.bad_rate:.1%}"
    where = [""] if count == 1 else [f"quantile {j}/{count + 1} of the posterior: " for j in range(1, count + 1)]
    return [Next(i, plan, f"{at}P(bad) = {bad[i]:.2f}, expected gain {gain[i]:.2f} bits; {leader}")
            for at, i in zip(where, picks)]


@dataclass(frozen=True)
class CommitJob:
    """A probe of one commit: its tree checked out in the probe's `src/`, built, and deployed (`--deploy`
    or a matrix spec's cell)."""

    repo: Path
    sha: str
    deploy: str | None
    matrix: tuple[MatrixSpec, Cell] | None
    build: str | None
    build_timeout: float
    ready_timeout: float
    tree: bytes | None = None
    """The commit's tree as a tar, packed in for a probe on a machine without the repository."""

    def prepare(self, probe_dir: Path) -> LaunchPlan | ProbeResult:
        src = probe_dir / "src"
        extract(self.tree if self.tree is not None else tree_archive(self.repo, self.sha), src)
        matrix = self.matrix
        how = self.deploy if matrix is None else (
            lambda: commit_launch(*matrix, rev=self.sha, src=src, log_dir=probe_dir / "logs"))
        assert how is not None
        return prepare(deploy=how, build=self.build, rev=self.sha, src=src, probe_dir=probe_dir,
                       build_timeout=self.build_timeout, ready_timeout=self.ready_timeout)

    def finish(self, probe_dir: Path) -> None:
        remove_checkout(probe_dir / "src")

    def portable(self) -> CommitJob:
        return replace(self, tree=tree_archive(self.repo, self.sha))


def _conclusion(stop: Stop, post: Posterior, history: list[Commit], searched: Searched, confidence: float) -> str:
    words = WORDS[searched.direction]
    if stop.reason == "found" and stop.commit is not None:
        commit = history[searched.named(stop.commit)]
        return (f"{words['named']}: {commit.sha} ({commit.subject}), P = {stop.probability:.3f}; "
                f"estimated bad rate {post.bad_rate:.1%}. Searched: {words['searched']}.")
    if stop.reason == "no_culprit":
        return (f"No commit of the range is to blame (P = {stop.probability:.3f}): the bad end does not "
                f"reproduce the corruption at the least rate looked for. Searched: {words['searched']}.")
    best = ", ".join(f"{history[searched.named(i)].sha[:10]} ({p:.2f})" for i, p in post.top(3))
    why = {"budget": "the probe or session budget ran out",
           "stuck": "the doubt left is on commits whose probes were inconclusive"}
    return f"No commit holds {confidence:.2f} of the posterior ({why[stop.reason]}); likeliest: {best}."


def bisect_commits(
    repo: Path,
    good: str,
    bad: str,
    *,
    deploy: str | None,
    settings: ProbeSettings,
    matrix: tuple[MatrixSpec, Cell] | None = None,
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
    executor: ProbeExecutor | None = None,
    parallel: int = 1,
    find_fix: bool = False,
) -> SearchOutcome:
    """Run (or resume) a commit bisection in `out`; see the module docstring. The deployment is the
    `deploy` command or a matrix spec's cell (`matrix`, from repro.bisect.matrixdeploy); `parallel`
    probes run at once on an executor that can (Ray). `find_fix`: `bad` is the older end, `good` a
    later one, and the search names the first good commit after the bad range."""
    if (deploy is None) == (matrix is None):
        raise UsageError("give exactly one of --deploy, --matrix-deployment")
    if not 0.5 < confidence < 1.0:
        raise UsageError(f"--confidence must be between 0.5 and 1, got {confidence}")
    console = console or Console(stderr=True, highlight=False, soft_wrap=True)
    repo = Path(repo).resolve()
    history = commit_range(repo, bad, good, names=("--bad", "--good")) if find_fix else commit_range(repo, good, bad)
    n = len(history)
    searched = Searched("fix" if find_fix else "regression", n)
    commits = history[::-1] if find_fix else history
    model = Model(good_rate=settings.good_rate, min_bad_rate=settings.min_bad_rate, none_prior=none_prior)
    setup = {
        "kind": "commits",
        # Only a fix search records its direction: a regression search's setup reads as before, for --resume.
        **({"direction": "fix"} if find_fix else {}),
        "repo": str(repo),
        "commits": [c.sha for c in commits],
        "deploy": deploy,
        "matrix": None if matrix is None else {"spec": matrix[0].model_dump(mode="json"), "cell": matrix[1].as_dict()},
        "build": build,
        "probe": asdict(settings),
        "confidence": confidence,
        "max_probes": max_probes,
        "max_sessions": max_sessions,
        "none_prior": none_prior,
    }
    executor = executor or LocalProbes()
    with executor.connected():
        search = Search(Journal(out, setup, resume=resume), settings, console, executor)
        console.print(f"Searching {n} commits for {WORDS[searched.direction]['searched']}.")
        base = {"kind": "commits", "direction": searched.direction, "searched": WORDS[searched.direction]["searched"],
                "commits": [c.label(i) for i, c in enumerate(history)]}
        try:
            step = _search(search, commits, searched, model, parallel=parallel, confidence=confidence,
                           max_probes=max_probes,
                           max_sessions=max_sessions,
                           job=lambda sha: CommitJob(repo, sha, deploy, matrix, build, build_timeout, ready_timeout))
        except ProbesLost as err:
            return search.lost(base, err)
    if step.stop is None:
        bad_end = [r for r in search.records if r.index == n - 1 and r.verdict == "inconclusive"]
        return search.finish({**base, "status": "stuck", "found": [], "top": [],
                              "conclusion": f"The bad end could not be probed: {bad_end[-1].message}"})
    stop, post = step.stop, step.posterior
    top = [{"label": history[searched.named(i)].label(searched.named(i)), "probability": p} for i, p in post.top(5)]
    named = searched.named(stop.commit) if stop.commit is not None else None
    found = [history[named].label(named)] if stop.reason == "found" and named is not None else []
    return search.finish({**base, "status": stop.reason, "found": found, "top": top, "none": post.none,
                          "bad_rate": post.bad_rate,
                          "conclusion": _conclusion(stop, post, history, searched, confidence)})


def _search(search: Search, commits: list[Commit], searched: Searched, model: Model, *, parallel: int,
            confidence: float, max_probes: int, max_sessions: int, job: Callable[[str], CommitJob]) -> Ended:
    """Probe step after step until `decide_many` ends the search; `commits` in the search's order."""
    n = len(commits)

    def after(records: list[ProbeRecord]) -> list[float]:
        post = posterior(n, _observations(records), model)
        return [*map(float, post.culprit), post.none]

    while True:
        step = decide_many(n, search.records, model, search.settings, parallel=parallel, confidence=confidence,
                           max_probes=max_probes, max_sessions=max_sessions, searched=searched)
        if isinstance(step, Ended):
            return step
        requests = [ProbeRequest(commits[nxt.index].label(searched.history(nxt.index)), job(commits[nxt.index].sha),
                                 nxt.plan, nxt.why, index=nxt.index) for nxt in step]
        try:
            search.probe_all(requests, posterior=after)
        finally:
            # A checkout left by a probe killed in an earlier attempt (moved aside with its directory).
            for leftover in search.journal.path.glob("probes/*/src"):
                remove_checkout(leftover)
