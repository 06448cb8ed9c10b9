"""Bayesian bisection over a commit range on a flaky signal: pure functions over probe counts.

Commits are indexed 0 (the known-good end) to N-1 (the known-bad end) in first-parent order. The
hypotheses are "commit c is the first bad one" for c in 1..N-1, plus "none": no commit of the range
changes anything (the bad end does not reproduce). Under culprit c, a commit i >= c corrupts a
session with the unknown bad rate p_bad (a Beta prior cut below at `min_bad_rate`, integrated out,
so every bad-side probe, the bad end's included, teaches the model the rate; the cut is what lets a
clean bad end speak for "none") and a commit i < c with the small `good_rate`
(a corrupt session on a good commit is not impossible, only unlikely: the signal is flaky both ways).

A probe's outcome is its counts (corrupt of completed sessions), also when its own test stopped
undecided at its cap; inconclusive probes (a failed start, too many timeouts) carry no counts.
The next commit to probe is the one whose probe is expected to teach most about the culprit, and a
probe's size comes from `repro.stats.sequential` (Wald's SPRT, or the fixed bisection size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
from scipy.special import betaincc, betaln

from repro.errors import UsageError
from repro.stats.sequential import bisect_probe_sessions, sprt_single

NONE = "none"
"""The hypothesis that no commit of the range is to blame."""


@dataclass(frozen=True)
class Observation:
    """Counts of one conclusive probe of commit `index`: `corrupt` of `completed` sessions."""

    index: int
    corrupt: int
    completed: int


@dataclass(frozen=True)
class Model:
    """The prior: how often a good commit corrupts, the Beta prior of the bad rate and its floor, the
    prior of "none"."""

    good_rate: float = 0.001
    bad_prior: tuple[float, float] = (1.0, 1.0)
    min_bad_rate: float = 0.02
    """The rarest corruption the bad end is taken to show: a rate below it is "no culprit"."""
    none_prior: float = 0.05

    def __post_init__(self) -> None:
        if not 0.0 < self.good_rate < 1.0:
            raise UsageError(f"good rate must be strictly between 0 and 1, got {self.good_rate}")
        if not self.good_rate < self.min_bad_rate < 1.0:
            raise UsageError(f"the least bad rate must lie between the good rate and 1, got {self.min_bad_rate}")
        if min(self.bad_prior) <= 0:
            raise UsageError(f"the bad rate's prior must be two positive numbers, got {self.bad_prior}")
        if not 0.0 <= self.none_prior < 1.0:
            raise UsageError(f"the prior of 'no culprit' must be in [0, 1), got {self.none_prior}")


@dataclass(frozen=True)
class Posterior:
    """P(first bad commit = c) for c in 1..N-1 (`culprit[c]`, with `culprit[0]` = 0) and P(none)."""

    culprit: np.ndarray
    none: float
    bad_rate: float
    """Posterior mean of the bad rate, given that some commit is to blame."""

    @property
    def commits(self) -> int:
        return len(self.culprit)

    def best(self) -> int:
        return int(np.argmax(self.culprit))

    def top(self, k: int = 3) -> list[tuple[int, float]]:
        """The k likeliest culprits, likeliest first (ties by index)."""
        order = sorted(range(1, self.commits), key=lambda i: (-self.culprit[i], i))
        return [(i, float(self.culprit[i])) for i in order[:k]]

    def bad_probability(self) -> np.ndarray:
        """P(commit i is bad) = P(culprit <= i), for every i."""
        return np.cumsum(self.culprit)


def _check(commits: int, observations: Sequence[Observation]) -> None:
    if commits < 2:
        raise UsageError(f"a bisection needs at least 2 commits (a good and a bad end), got {commits}")
    for obs in observations:
        if not 0 <= obs.index < commits:
            raise UsageError(f"probe of commit {obs.index} is outside the range 0..{commits - 1}")
        if not 0 <= obs.corrupt <= obs.completed:
            raise UsageError(
                f"probe of commit {obs.index}: need 0 <= corrupt <= completed, got {obs.corrupt}/{obs.completed}"
            )


def posterior(commits: int, observations: Sequence[Observation], model: Model = Model()) -> Posterior:
    """The posterior over the culprit (and "none") after the given conclusive probes."""
    _check(commits, observations)
    corrupt = np.zeros(commits)
    completed = np.zeros(commits)
    for obs in observations:
        corrupt[obs.index] += obs.corrupt
        completed[obs.index] += obs.completed
    clean = completed - corrupt
    good_ll = corrupt * math.log(model.good_rate) + clean * math.log1p(-model.good_rate)
    # Culprit c: commits before c are good (cumulative good log-likelihood up to c-1), commits from c on
    # share one bad rate, integrated against its Beta prior (suffix sums of their counts).
    good_before = np.concatenate(([0.0], np.cumsum(good_ll)[:-1]))
    bad_k = np.cumsum(corrupt[::-1])[::-1]
    bad_n = np.cumsum(completed[::-1])[::-1]
    a, b = model.bad_prior
    floor = model.min_bad_rate
    post_a, post_b = a + bad_k, b + bad_n - bad_k
    # The Beta integral over [floor, 1] only: log B(a', b') + log P(p > floor | Beta(a', b')).
    with np.errstate(divide="ignore"):
        bad_ll = (betaln(post_a, post_b) + np.log(betaincc(post_a, post_b, floor))
                  - betaln(a, b) - math.log(betaincc(a, b, floor)))
    log_post = np.full(commits, -np.inf)
    spread = (1.0 - model.none_prior) / (commits - 1)
    log_post[1:] = math.log(spread) + good_before[1:] + bad_ll[1:]
    log_none = math.log(model.none_prior) + float(good_ll.sum()) if model.none_prior > 0 else -np.inf
    top = max(float(log_post.max()), log_none)
    weights = np.exp(log_post - top)
    none_weight = math.exp(log_none - top) if log_none > -np.inf else 0.0
    total = float(weights.sum()) + none_weight
    culprit = weights / total
    with np.errstate(divide="ignore", invalid="ignore"):
        means = post_a / (post_a + post_b) * betaincc(post_a + 1, post_b, floor) / betaincc(post_a, post_b, floor)
    means = np.where(np.isfinite(means), np.clip(means, floor, 1.0), floor)
    given_culprit = float(culprit.sum())
    bad_rate = float((culprit * means).sum() / given_culprit) if given_culprit > 0 else floor
    return Posterior(culprit=culprit, none=none_weight / total, bad_rate=bad_rate)


def _entropy(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-300, 1.0)
    q = np.clip(1.0 - p, 1e-300, 1.0)
    return -(p * np.log2(p) + q * np.log2(q))


def information_gain(post: Posterior, sessions: int, good_rate: float) -> np.ndarray:
    """Expected bits learnt about "is commit i bad" by a probe of `sessions` sessions at each commit.

    The probe is reduced to "showed corruption or not": a bad commit shows it with chance
    1 - (1 - p_bad)^n, a good one with 1 - (1 - good_rate)^n; the gain is the mutual information
    between that outcome and the commit's state under the posterior.
    """
    return _gain(np.clip(post.bad_probability(), 0.0, 1.0), post.bad_rate, sessions, good_rate)


def _gain(bad: np.ndarray, bad_rate: float, sessions: int, good_rate: float) -> np.ndarray:
    hit_bad = 1.0 - (1.0 - bad_rate) ** sessions
    hit_good = 1.0 - (1.0 - good_rate) ** sessions
    hit = bad * hit_bad + (1.0 - bad) * hit_good
    return _entropy(hit) - (bad * _entropy(np.array(hit_bad)) + (1.0 - bad) * _entropy(np.array(hit_good)))


MIN_GAIN_SHARE = 0.05
"""A probe expected to teach less than this share of what a probe of an even-odds commit would is not
worth its sessions: the remaining doubt sits on commits that cannot be probed."""


def next_commit(post: Posterior, sessions: int, good_rate: float, skip: frozenset[int] = frozenset()) -> int | None:
    """The commit (1..N-1, not in `skip`) whose probe teaches most; None when every one is skipped or
    none would teach `MIN_GAIN_SHARE` of what a probe of an even-odds commit would.

    Ties go to the commit nearest the posterior median, then to the lower index.
    """
    gain = information_gain(post, sessions, good_rate)
    bad = post.bad_probability()
    candidates = [i for i in range(1, post.commits) if i not in skip]
    if not candidates:
        return None
    best = max(candidates, key=lambda i: (round(float(gain[i]), 9), -abs(float(bad[i]) - 0.5), -i))
    even_odds = float(_gain(np.array([0.5]), post.bad_rate, sessions, good_rate)[0])
    return best if gain[best] >= MIN_GAIN_SHARE * even_odds else None


def spread_commits(
    post: Posterior, count: int, sessions: int, good_rate: float, skip: frozenset[int] = frozenset()
) -> list[int]:
    """`count` commits to probe at once: for j = 1..count, the commit whose P(bad) is nearest
    j / (count + 1), so the probes split the doubt about the culprit into count + 1 even parts as
    bisection's midpoint splits it in two (ties to the lower index).

    Only commits not in `skip` whose probe would teach `MIN_GAIN_SHARE` of what a probe of an
    even-odds commit would are chosen; one commit may be chosen more than once when the doubt sits
    there (two probes of one commit are two independent samples of it). Empty when none qualifies.
    """
    gain = information_gain(post, sessions, good_rate)
    bad = post.bad_probability()
    even_odds = float(_gain(np.array([0.5]), post.bad_rate, sessions, good_rate)[0])
    candidates = [i for i in range(1, post.commits) if i not in skip and gain[i] >= MIN_GAIN_SHARE * even_odds]
    if not candidates:
        return []
    return [min(candidates, key=lambda i: (abs(float(bad[i]) - j / (count + 1)), i)) for j in range(1, count + 1)]


StopReason = Literal["found", "no_culprit", "budget", "stuck"]


@dataclass(frozen=True)
class Stop:
    reason: StopReason
    commit: int | None
    """The named culprit ("found"), else the likeliest one."""
    probability: float


def should_stop(
    post: Posterior,
    *,
    confidence: float,
    probes: int,
    sessions: int,
    max_probes: int,
    max_sessions: int,
    stuck: bool = False,
) -> Stop | None:
    """Whether the search ends now, and why; None to go on."""
    best = post.best()
    if post.culprit[best] >= confidence:
        return Stop("found", best, float(post.culprit[best]))
    if post.none >= confidence:
        return Stop("no_culprit", None, post.none)
    if probes >= max_probes or sessions >= max_sessions:
        return Stop("budget", best, float(post.culprit[best]))
    if stuck:
        return Stop("stuck", best, float(post.culprit[best]))
    return None


ProbeVerdict = Literal["bad", "good", "undecided", "continue", "inconclusive"]
ProbeMode = Literal["sequential", "fixed"]


@dataclass(frozen=True)
class ProbePlan:
    """How one probe is run: rounds of `round_sessions` sessions, at most `max_sessions` in all."""

    mode: ProbeMode
    round_sessions: int
    max_sessions: int
    bad_rate: float
    good_rate: float
    alpha: float = 0.05
    beta: float = 0.05
    max_timeout_share: float = 0.2

    def __post_init__(self) -> None:
        if self.round_sessions < 1 or self.max_sessions < self.round_sessions:
            raise UsageError(
                f"need 1 <= sessions per round <= sessions per probe, got {self.round_sessions} and {self.max_sessions}"
            )
        if not self.good_rate < self.bad_rate < 1.0:
            raise UsageError(f"the bad rate ({self.bad_rate:.3g}) must lie between the good rate and 1")


def fixed_sessions(bad_rate: float, commits: int, delta: float, cap: int) -> int:
    """Sessions of a fixed probe, capped: `bisect_probe_sessions`, with which a bad commit passes every
    probe of the search with chance at most delta."""
    return min(cap, bisect_probe_sessions(bad_rate, max(commits, 2), delta))


def judge_probe(plan: ProbePlan, corrupt: int, completed: int, unfinished: int) -> ProbeVerdict:
    """The probe's verdict after its rounds so far.

    `unfinished` counts timed-out and failed sessions: they prove nothing, and when they exceed
    `max_timeout_share` of the sessions the probe is inconclusive (never "good"). Sequential: Wald's
    SPRT of the good rate against the bad rate, "undecided" at the cap (its counts still count).
    Fixed: bad at any corruption, good once the planned sessions completed clean.
    """
    total = completed + unfinished
    if total and unfinished > plan.max_timeout_share * total:
        return "inconclusive"
    if plan.mode == "fixed":
        if corrupt:
            return "bad"
        if total >= plan.max_sessions:
            return "good" if completed else "inconclusive"
        return "continue"
    decision = sprt_single(
        corrupt, completed, plan.good_rate, plan.bad_rate, plan.alpha, plan.beta, max_n=plan.max_sessions
    ).decision
    if decision == "accept_p1":
        return "bad"
    if decision == "accept_p0":
        return "good"
    if decision == "continue" and total < plan.max_sessions:
        return "continue"
    return "undecided"
