"""Intervals for one corruption rate: Clopper–Pearson, Wilson, the one-sided upper bound, timeout bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from repro.errors import UsageError


@dataclass(frozen=True)
class Interval:
    """A rate with its interval. `estimate` is None when there were no observations (then [0, 1])."""

    estimate: float | None
    low: float
    high: float
    method: str
    confidence: float


def check_counts(k: int, n: int, *, what: str = "k") -> None:
    """Reject counts that cannot describe k successes in n trials, naming the bad argument."""
    if int(k) != k or int(n) != n:
        raise UsageError(f"counts must be whole numbers, got {what}={k}, n={n}")
    if n < 0:
        raise UsageError(f"n must be at least 0, got {n}")
    if not 0 <= k <= n:
        raise UsageError(f"{what} must be between 0 and n={n}, got {k}")


def check_nonnegative(**counts: int) -> None:
    """Reject a negative count, naming it (the first one, in the order given)."""
    for name, value in counts.items():
        if value < 0:
            raise UsageError(f"{name} must be at least 0, got {value}")


def check_level(value: float, *, name: str = "confidence") -> None:
    """Reject a confidence or alpha that is not strictly between 0 and 1."""
    if not 0.0 < value < 1.0:
        raise UsageError(f"{name} must be strictly between 0 and 1, got {value}")


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, eps = 1e-300, 1e-16
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def _beta_cdf(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b): P(X <= x) for X ~ Beta(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    # The fraction converges fast on this side of the mean; the other side is its mirror image.
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _continued_fraction(a, b, x) / a
    return 1.0 - front * _continued_fraction(b, a, 1.0 - x) / b


def _beta_quantile(q: float, a: float, b: float) -> float:
    """The x with I_x(a, b) = q, by bisection to the last bit (the cdf rises monotonically in x)."""
    low, high = 0.0, 1.0
    for _ in range(2000):
        mid = (low + high) / 2
        if mid in (low, high):
            break
        if _beta_cdf(mid, a, b) < q:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> Interval:
    """Exact two-sided interval for k corrupt in n: its coverage is never below `confidence`.

    Its ends are beta quantiles (the binomial's tails P(X >= k) and P(X <= k) are incomplete beta
    functions of the rate), computed here: scipy.stats costs a second to import, scipy.special a third
    of one, and every run's summary draws this interval.
    """
    check_counts(k, n)
    check_level(confidence)
    if n == 0:
        return Interval(None, 0.0, 1.0, "clopper-pearson", confidence)
    alpha = (1.0 - confidence) / 2
    low = 0.0 if k == 0 else _beta_quantile(alpha, k, n - k + 1)
    high = 1.0 if k == n else _beta_quantile(1.0 - alpha, k + 1, n - k)
    return Interval(k / n, low, high, "clopper-pearson", confidence)


def wilson(k: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson score interval: shorter than Clopper–Pearson, coverage near (not always at least) nominal."""
    check_counts(k, n)
    check_level(confidence)
    if n == 0:
        return Interval(None, 0.0, 1.0, "wilson", confidence)
    from scipy import stats as sps  # a second to import: only for the few callers of this interval

    ci = sps.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return Interval(k / n, float(ci.low), float(ci.high), "wilson", confidence)


def upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """The rate we can rule out from above: one-sided Clopper–Pearson bound (0/n gives 1 - alpha**(1/n))."""
    check_counts(k, n)
    check_level(confidence)
    if n == 0:
        return 1.0
    if k == 0:
        # Closed form, exact where the root-finder would only be close.
        return 1.0 - (1.0 - confidence) ** (1.0 / n)
    return 1.0 if k == n else _beta_quantile(confidence, k + 1, n - k)


def timeout_bounds(corrupt: int, clean: int, timeout: int, confidence: float = 0.95) -> tuple[Interval, Interval]:
    """(worst, best): Clopper–Pearson intervals counting every timeout as corrupt, then every one as clean.

    A timeout proves neither outcome; the true rate over all sessions that were started lies between
    what these two bracket.
    """
    check_nonnegative(corrupt=corrupt, clean=clean, timeout=timeout)
    n = corrupt + clean + timeout
    worst = clopper_pearson(corrupt + timeout, n, confidence)
    best = clopper_pearson(corrupt, n, confidence)
    return (
        replace(worst, method="clopper-pearson, timeouts as corrupt"),
        replace(best, method="clopper-pearson, timeouts as clean"),
    )
