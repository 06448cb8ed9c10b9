"""How many sessions: exact power and sample size for comparing two corruption rates, by enumeration.

Power is the probability, under the true rates, of every outcome (k1, k2) whose test rejects. Outcomes
are taken from most to least likely until all but `tolerance` (1e-6) of the probability is covered, so
the power returned is a lower bound within `tolerance` of the exact value.

Boschloo's p-value needs a numerical maximisation per table (scipy, ~40 ms), so each table is first
decided by two cheap certain bounds, calling scipy only in between: the p-value never exceeds Fisher's
one-sided p-value (Fisher's test is valid conditionally, so its size at any nuisance rate is at most
its level), and never falls below the tail probability at any single nuisance rate (it is the maximum
over them), evaluated on a fixed grid for all tables at once. Fisher's two-sided p-value likewise
never falls below the smaller one-sided one, so tables beyond that bound skip scipy too.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal

import numpy as np
from scipy import stats as sps

from repro.errors import UsageError
from repro.stats.intervals import check_level
from repro.stats.twosample import Alternative, arm_table, check_alternative

Test = Literal["boschloo", "fisher"]
TESTS: tuple[str, ...] = ("boschloo", "fisher")
DEFAULT_TOLERANCE = 1e-6
# Largest design enumerated: 1000 sessions per arm. Cost grows fast with n: Boschloo power takes
# ~0.3 s at 60 per arm, ~5 s at 150, ~25 s at 300, ~70 s at 500 (scipy's per-table maximisation).
MAX_PER_ARM = 1000
# scipy's own guard against rounding when it collects the tables at least as extreme as observed.
_SCIPY_TIE = 1 + 1e-13
_NUISANCE_GRID = np.unique(np.concatenate([np.geomspace(1e-4, 0.5, 60), 1 - np.geomspace(1e-4, 0.5, 60)]))


def _p_value(test: str, k1: int, n1: int, k2: int, n2: int, alternative: str) -> float:
    table = arm_table(k1, n1, k2, n2)
    if test == "fisher":
        return float(sps.fisher_exact(table, alternative=alternative).pvalue)
    return float(sps.boschloo_exact(table, alternative=alternative).pvalue)


@lru_cache(maxsize=32)
def _fisher_one_sided(n1: int, n2: int, side: str) -> np.ndarray:
    """Fisher's one-sided p-value of every table, computed as scipy's boschloo_exact does."""
    x1 = np.arange(n1 + 1)[:, None]
    x2 = np.arange(n2 + 1)[None, :]
    if side == "less":
        return sps.hypergeom.cdf(x1, n1 + n2, x1 + x2, n1)
    return sps.hypergeom.cdf(x2, n1 + n2, x1 + x2, n2)


@lru_cache(maxsize=32)
def _boschloo_floor(n1: int, n2: int, side: str) -> np.ndarray:
    """A lower bound of Boschloo's one-sided p-value of every table: its tail probability on a grid of rates."""
    fisher = _fisher_one_sided(n1, n2, side)
    flat = fisher.ravel()
    order = np.argsort(flat, kind="stable")
    # Null probability of the tables at least as extreme, at each grid rate (one rate at a time to
    # keep memory at one table grid), maximised over the grid.
    best = np.zeros(flat.size)
    for rate in _NUISANCE_GRID:
        joint = np.outer(sps.binom.pmf(np.arange(n1 + 1), n1, rate), sps.binom.pmf(np.arange(n2 + 1), n2, rate))
        np.maximum(best, np.cumsum(joint.ravel()[order]), out=best)
    extreme = np.searchsorted(flat[order], flat * _SCIPY_TIE, side="right") - 1
    return best[extreme].reshape(fisher.shape)


def _boschloo_rejects(k1: int, n1: int, k2: int, n2: int, alternative: str, alpha: float) -> bool:
    sides = ("less", "greater") if alternative == "two-sided" else (alternative,)
    factor = 2.0 if alternative == "two-sided" else 1.0
    high = factor * min(_fisher_one_sided(n1, n2, s)[k1, k2] for s in sides)
    low = factor * min(_boschloo_floor(n1, n2, s)[k1, k2] for s in sides)
    # Margins keep rounding in the bounds from deciding a table scipy would decide the other way.
    if high <= alpha * (1 - 1e-9):
        return True
    if low > alpha * (1 + 1e-9):
        return False
    return _p_value("boschloo", k1, n1, k2, n2, alternative) <= alpha


def _fisher_rejects(k1: int, n1: int, k2: int, n2: int, alternative: str, alpha: float) -> bool:
    sides = ("less", "greater") if alternative == "two-sided" else (alternative,)
    # Two-sided, the hypergeometric is unimodal, so the tables no likelier than the observed one
    # include its whole tail away from the mode: the p-value is at least the smaller one-sided p.
    if min(_fisher_one_sided(n1, n2, s)[k1, k2] for s in sides) > alpha * (1 + 1e-9):
        return False
    return _p_value("fisher", k1, n1, k2, n2, alternative) <= alpha


@lru_cache(maxsize=16)
def _decisions(test: str, n1: int, n2: int, alternative: str, alpha: float) -> np.ndarray:
    """The cache of one design's tables, filled as they are asked for: 1 rejects, 0 does not, -1 not yet
    decided. Designs on the same arms (a matrix's factors, power at other rates) share every table decided,
    however many there are; at most (MAX_PER_ARM + 1)^2 bytes a design."""
    return np.full((n1 + 1, n2 + 1), -1, dtype=np.int8)


def _rejecting(test: str, k1: np.ndarray, n1: int, k2: np.ndarray, n2: int, alternative: str,
               alpha: float) -> np.ndarray:
    """Whether the test rejects each table (k1[i], k2[i]), deciding only those not decided before."""
    known = _decisions(test, n1, n2, alternative, alpha)
    decide = _fisher_rejects if test == "fisher" else _boschloo_rejects
    todo = known[k1, k2] < 0
    for a, b in zip(k1[todo].tolist(), k2[todo].tolist()):
        known[a, b] = decide(a, n1, b, n2, alternative, alpha)
    return known[k1, k2] == 1


def rejects(test: Test, k1: int, n1: int, k2: int, n2: int, *, alternative: Alternative, alpha: float) -> bool:
    """Whether the exact test rejects at `alpha` for k1 of n1 against k2 of n2 (scipy only when the bounds cannot tell)."""
    return bool(_rejecting(test, np.array([k1]), n1, np.array([k2]), n2, alternative, alpha)[0])


def _check_design(p1: float, p2: float, alpha: float, test: str, alternative: str) -> None:
    for name, p in (("p1", p1), ("p2", p2)):
        if not 0.0 <= p <= 1.0:
            raise UsageError(f"{name} must be between 0 and 1, got {p}")
    check_level(alpha, name="alpha")
    if test not in TESTS:
        raise UsageError(f"test must be one of {', '.join(TESTS)}, got {test!r}")
    check_alternative(alternative)


def _likely_outcomes(p1: float, n1: int, p2: float, n2: int, tolerance: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The most likely (k1, k2) outcomes covering all but `tolerance` of the probability, with their probabilities.

    An arm's counts less likely than tolerance / (n1 + 1)(n2 + 1) are left out before the two arms are
    joined: every outcome with one of them is less likely than that, and all outcomes that unlikely together
    hold less than `tolerance`, so none would be taken anyway. An arm keeps the counts within several
    standard deviations of its mean: the join and its sort shrink from (n + 1)^2 outcomes to a few thousand."""
    floor = tolerance / ((n1 + 1) * (n2 + 1))
    pmf1, pmf2 = sps.binom.pmf(np.arange(n1 + 1), n1, p1), sps.binom.pmf(np.arange(n2 + 1), n2, p2)
    kept1, kept2 = np.flatnonzero(pmf1 >= floor), np.flatnonzero(pmf2 >= floor)
    joint = np.outer(pmf1[kept1], pmf2[kept2])
    flat = joint.ravel()
    order = np.argsort(flat)[::-1]
    covered = np.cumsum(flat[order])
    keep = order[: int(np.searchsorted(covered, 1.0 - tolerance)) + 1]
    i1, i2 = np.unravel_index(keep, joint.shape)
    return kept1[i1], kept2[i2], flat[keep]


def power_two_proportions(
    p1: float,
    p2: float,
    n1: int,
    n2: int,
    *,
    alpha: float = 0.05,
    test: Test = "boschloo",
    alternative: Alternative = "two-sided",
    tolerance: float = DEFAULT_TOLERANCE,
) -> float:
    """Chance that the exact test at level `alpha` detects the difference when the true rates are p1 and p2.

    Exact up to `tolerance` (the returned value is a lower bound within it), not a normal approximation.
    """
    _check_design(p1, p2, alpha, test, alternative)
    if n1 < 1 or n2 < 1:
        raise UsageError(f"both arms need at least one session, got n1={n1}, n2={n2}")
    if max(n1, n2) > MAX_PER_ARM:
        raise UsageError(f"exact enumeration is limited to {MAX_PER_ARM} sessions per arm, got n1={n1}, n2={n2}")
    if not 0.0 < tolerance < 0.01:
        raise UsageError(f"tolerance must be between 0 and 0.01, got {tolerance}")
    k1, k2, prob = _likely_outcomes(p1, n1, p2, n2, tolerance)
    return min(float(prob[_rejecting(test, k1, n1, k2, n2, alternative, alpha)].sum()), 1.0)


# Exact power saw-tooths in n; how far below the bisection's crossing to look for an earlier one.
SAWTOOTH_WINDOW = 5


def _normal_start(p1: float, p2: float, power: float, alpha: float, alternative: str) -> int:
    """Starting point only: the arcsine normal approximation, which the exact search then corrects."""
    effect = abs(2 * math.asin(math.sqrt(p1)) - 2 * math.asin(math.sqrt(p2)))
    z_alpha = sps.norm.ppf(1 - alpha / 2 if alternative == "two-sided" else 1 - alpha)
    return max(2, math.ceil(((z_alpha + sps.norm.ppf(power)) / effect) ** 2))


def sample_size_two_proportions(
    p1: float,
    p2: float,
    *,
    power: float = 0.8,
    alpha: float = 0.05,
    test: Test = "boschloo",
    alternative: Alternative = "two-sided",
    max_n: int = MAX_PER_ARM,
) -> int:
    """Sessions per arm needed for the exact test to detect p1 vs p2 with the given power.

    Bisection on the exact power from a normal-approximation start, then the SAWTOOTH_WINDOW sizes
    below the crossing are checked too (exact power is not monotone in n) and the smallest that
    reaches the target is returned; a few larger sizes may still fall just short of it.
    """
    _check_design(p1, p2, alpha, test, alternative)
    check_level(power, name="power")
    if not 1 <= max_n <= MAX_PER_ARM:
        raise UsageError(f"max_n must be between 1 and {MAX_PER_ARM}, got {max_n}")
    if p1 == p2:
        raise UsageError(f"p1 and p2 are both {p1}: there is no difference to detect")

    def enough(n: int) -> bool:
        return power_two_proportions(p1, p2, n, n, alpha=alpha, test=test, alternative=alternative) >= power

    n = min(_normal_start(p1, p2, power, alpha, alternative), max_n)
    if enough(n):
        lo, hi = n // 2, n
        while lo >= 1 and enough(lo):
            lo, hi = lo // 2, lo
    else:
        lo, hi = n, min(2 * n, max_n)
        while not enough(hi):
            if hi == max_n:
                raise UsageError(f"more than max_n={max_n} sessions per arm would be needed for power {power}")
            lo, hi = hi, min(2 * hi, max_n)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    earlier = [m for m in range(max(1, hi - SAWTOOTH_WINDOW), hi) if enough(m)]
    return earlier[0] if earlier else hi
