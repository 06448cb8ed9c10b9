"""Stopping early: Wald's sequential tests, a confidence sequence, and the session count of a bisection probe.

Each function reads the counts so far and says whether to stop; callers run one more session (or pair)
and ask again. Every sequential procedure has a hard cap `max_n` and answers "inconclusive" at it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from scipy import optimize
from scipy.special import betaln

from repro.errors import UsageError
from repro.stats.intervals import Interval, check_counts, check_level, check_nonnegative

Decision = Literal["a_worse", "b_worse", "no_difference", "accept_p1", "accept_p0", "continue", "inconclusive"]


@dataclass(frozen=True)
class SequentialDecision:
    """Where a sequential test stands: its log-likelihood ratio against the two stopping boundaries."""

    decision: Decision
    llr: float
    upper: float
    lower: float


def _check_sequential(alpha: float, beta: float, max_n: int) -> None:
    check_level(alpha, name="alpha")
    check_level(beta, name="beta")
    if max_n < 1:
        raise UsageError(f"max_n must be at least 1, got {max_n}")


def _wald_boundaries(alpha: float, beta: float) -> tuple[float, float]:
    return math.log((1 - beta) / alpha), math.log(beta / (1 - alpha))


def paired_sequential(
    discordant_a: int,
    discordant_b: int,
    *,
    pairs: int | None = None,
    p1: float = 0.9,
    p0: float = 0.5,
    alpha: float = 0.05,
    beta: float = 0.1,
    max_n: int = 300,
    two_sided: bool = True,
) -> SequentialDecision:
    """Paired A/B: which arm corrupts more, judged from the pairs where exactly one session was corrupt.

    Among discordant pairs, A is the corrupt one with probability p0 = 1/2 when the arms do not
    differ, whatever the base rate. Two Wald SPRTs run side by side, "A is the corrupt one with
    probability p1" and "B is, with p1", each at alpha/2 so the false-positive rate stays near alpha;
    `llr` is the larger of the two ratios. With `two_sided=False` only "A is worse" is tested, at
    alpha (for a suspect feature switched on in A). p1 = 0.9 fits 12% vs 1%
    (0.12*0.99 / (0.12*0.99 + 0.88*0.01) = 0.93) with a margin. "no_difference" means the data
    favour 1/2 over p1, not that the arms are equal. The cap counts `pairs` when given (all pairs run
    so far), else discordant pairs.
    """
    check_nonnegative(discordant_a=discordant_a, discordant_b=discordant_b)
    _check_sequential(alpha, beta, max_n)
    if not 0.0 < p0 < p1 < 1.0:
        raise UsageError(f"need 0 < p0 < p1 < 1 (p0 = 0.5 is 'no difference'), got p0={p0}, p1={p1}")
    upper, lower = _wald_boundaries(alpha / 2 if two_sided else alpha, beta)
    favour, against = math.log(p1 / p0), math.log((1 - p1) / (1 - p0))
    llr_a = discordant_a * favour + discordant_b * against
    llr_b = discordant_b * favour + discordant_a * against
    llr = max(llr_a, llr_b) if two_sided else llr_a
    if llr >= upper:
        decision: Decision = "a_worse" if llr_a >= llr_b else "b_worse"
    elif llr <= lower:
        decision = "no_difference"
    elif (pairs if pairs is not None else discordant_a + discordant_b) >= max_n:
        decision = "inconclusive"
    else:
        decision = "continue"
    return SequentialDecision(decision, llr, upper, lower)


def sprt_single(
    k: int,
    n: int,
    p0: float,
    p1: float,
    alpha: float = 0.05,
    beta: float = 0.1,
    *,
    max_n: int = 1000,
) -> SequentialDecision:
    """One arm against a known rate: is the corruption rate p0 or p1? Wald's SPRT on k corrupt in n.

    "accept_p1" means the data favour p1 with error rates alpha (wrongly choosing p1) and beta
    (wrongly choosing p0); "accept_p0" the reverse.
    """
    check_counts(k, n)
    _check_sequential(alpha, beta, max_n)
    for name, p in (("p0", p0), ("p1", p1)):
        if not 0.0 < p < 1.0:
            raise UsageError(f"{name} must be strictly between 0 and 1, got {p}")
    if p0 == p1:
        raise UsageError(f"p0 and p1 must differ, both are {p0}")
    upper, lower = _wald_boundaries(alpha, beta)
    llr = k * math.log(p1 / p0) + (n - k) * math.log((1 - p1) / (1 - p0))
    if llr >= upper:
        decision: Decision = "accept_p1"
    elif llr <= lower:
        decision = "accept_p0"
    elif n >= max_n:
        decision = "inconclusive"
    else:
        decision = "continue"
    return SequentialDecision(decision, llr, upper, lower)


CS_METHOD = "beta-binomial mixture CS"


def confidence_sequence(
    k: int, n: int, *, alpha: float = 0.05, prior: tuple[float, float] = (1.0, 1.0)
) -> Interval:
    """An interval for the rate that stays valid however often it is looked at (all n at once).

    The set of rates p whose beta-binomial mixture likelihood ratio is below 1/alpha; by Ville's
    inequality the chance that it ever excludes the true rate, at any n, is at most alpha.
    """
    check_counts(k, n)
    check_level(alpha, name="alpha")
    a, b = prior
    if a <= 0 or b <= 0:
        raise UsageError(f"prior must be two positive numbers, got {prior!r}")
    if n == 0:
        return Interval(None, 0.0, 1.0, CS_METHOD, 1 - alpha)
    # log of (mixture likelihood * alpha) that p's own likelihood must exceed to stay in the set.
    bar = betaln(a + k, b + n - k) - betaln(a, b) + math.log(alpha)

    def margin(p: float) -> float:
        loglik = (k * math.log(p) if k else 0.0) + ((n - k) * math.log1p(-p) if n - k else 0.0)
        return loglik - bar

    mle = k / n
    low = 0.0 if k == 0 else float(optimize.brentq(margin, 1e-300, mle, xtol=1e-14))
    high = 1.0 if k == n else float(optimize.brentq(margin, mle, 1 - 1e-16, xtol=1e-14))
    return Interval(mle, low, high, CS_METHOD, 1 - alpha)


def bisect_probe_sessions(p_bad: float, commits: int, delta: float = 0.05) -> int:
    """Clean sessions a bisection probe needs before calling a commit good.

    With a bug that corrupts a fraction p_bad of sessions on bad commits and never on good ones, a
    bad commit passes k clean sessions with chance (1 - p_bad)**k; spread delta over the
    ceil(log2(commits)) probes of the bisection: k = ceil(ln(delta / steps) / ln(1 - p_bad)).
    """
    if not 0.0 < p_bad < 1.0:
        raise UsageError(f"p_bad must be strictly between 0 and 1, got {p_bad}")
    if commits < 2:
        raise UsageError(f"commits must be at least 2 for a bisection, got {commits}")
    check_level(delta, name="delta")
    steps = math.ceil(math.log2(commits))
    return math.ceil(math.log(delta / steps) / math.log1p(-p_bad))
