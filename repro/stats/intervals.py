"""Intervals for one corruption rate: Clopper–Pearson, Wilson, the one-sided upper bound, timeout bounds."""

from __future__ import annotations

from dataclasses import dataclass, replace

from scipy import stats as sps

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


def _binomial_ci(k: int, n: int, confidence: float, method: str, label: str) -> Interval:
    check_counts(k, n)
    check_level(confidence)
    if n == 0:
        return Interval(None, 0.0, 1.0, label, confidence)
    ci = sps.binomtest(k, n).proportion_ci(confidence_level=confidence, method=method)
    return Interval(k / n, float(ci.low), float(ci.high), label, confidence)


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> Interval:
    """Exact two-sided interval for k corrupt in n: its coverage is never below `confidence`."""
    return _binomial_ci(k, n, confidence, "exact", "clopper-pearson")


def wilson(k: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson score interval: shorter than Clopper–Pearson, coverage near (not always at least) nominal."""
    return _binomial_ci(k, n, confidence, "wilson", "wilson")


def upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """The rate we can rule out from above: one-sided Clopper–Pearson bound (0/n gives 1 - alpha**(1/n))."""
    check_counts(k, n)
    check_level(confidence)
    if n == 0:
        return 1.0
    if k == 0:
        # Closed form, exact where the root-finder would only be close.
        return 1.0 - (1.0 - confidence) ** (1.0 / n)
    ci = sps.binomtest(k, n, alternative="less").proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.high)


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
