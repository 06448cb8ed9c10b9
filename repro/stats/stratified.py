"""One flag controlling for the others: tests of a common odds ratio across strata (the other flags' cells).

Tables are (corrupt_a, clean_a, corrupt_b, clean_b), one per stratum; an odds ratio above 1 means arm a
corrupts more. Strata where one arm is empty or the outcome never varies carry no information about
the odds ratio: both tests below ignore them, exactly (they add nothing to either statistic).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy import stats as sps
from scipy.special import logsumexp
from statsmodels.stats.contingency_tables import StratifiedTable

from repro.errors import UsageError

Table = tuple[int, int, int, int]

EXACT_METHOD = "exact conditional (stratified)"
CMH_METHOD = "Cochran-Mantel-Haenszel"
# Relative tolerance for "no likelier than observed", as scipy's fisher_exact uses.
_TIE_TOLERANCE = 1 + 1e-7


@dataclass(frozen=True)
class StratifiedResult:
    """A common odds ratio across strata (arm a against arm b), its interval and the p-value of OR = 1.

    `odds_ratio` and its interval are None when no stratum carries information; `notes` says why, or
    which fallback was used.
    """

    p_value: float
    odds_ratio: float | None
    or_low: float | None
    or_high: float | None
    method: str
    confidence: float = 0.95
    notes: tuple[str, ...] = ()


def _informative(tables: Sequence[Table]) -> list[Table]:
    if len(tables) == 0:
        raise UsageError("at least one stratum table is needed")
    kept: list[Table] = []
    for i, table in enumerate(tables):
        if len(table) != 4 or any(int(x) != x or x < 0 for x in table):
            raise UsageError(
                f"stratum {i} must be four counts (corrupt_a, clean_a, corrupt_b, clean_b) >= 0, got {table!r}"
            )
        a, b, c, d = (int(x) for x in table)
        if a + b and c + d and a + c and b + d:
            kept.append((a, b, c, d))
    return kept


def _null_distribution(tables: Sequence[Table]) -> tuple[np.ndarray, np.ndarray]:
    """Support and probabilities of sum(corrupt_a) under OR = 1, given every stratum's margins."""
    low, pmf = 0, np.array([1.0])
    for a, b, c, d in tables:
        n_a, n_b, corrupt = a + b, c + d, a + c
        lo, hi = max(0, corrupt - n_b), min(corrupt, n_a)
        pmf = np.convolve(pmf, sps.hypergeom.pmf(np.arange(lo, hi + 1), n_a + n_b, corrupt, n_a))
        low += lo
    return np.arange(low, low + len(pmf)), pmf


def _tilted(support: np.ndarray, logf: np.ndarray, log_or: float) -> np.ndarray:
    w = logf + log_or * support
    return np.exp(w - logsumexp(w))


def _solve_log_or(fn, target_sign_at_low: float) -> float:
    """Root of a monotone function of log OR, bracketing outward from 0."""
    span = 1.0
    while span < 1e4:
        lo, hi = -span, span
        if np.sign(fn(lo)) == target_sign_at_low and np.sign(fn(hi)) == -target_sign_at_low:
            return float(optimize.brentq(fn, lo, hi, xtol=1e-12))
        span *= 2
    raise ArithmeticError("odds ratio root not bracketed")


def stratified_exact_test(tables: Sequence[Table], confidence: float = 0.95) -> StratifiedResult:
    """Does arm a corrupt more or less than arm b once the other flags are held fixed? Exact and conditional.

    Conditions on every stratum's margins, so the null distribution of sum(corrupt_a) is the
    convolution of the strata's hypergeometric distributions; the two-sided p-value sums the outcomes
    no likelier than the observed one (Fisher's rule, which this reduces to for one stratum). The
    estimate is the conditional maximum-likelihood common odds ratio, with the exact interval.
    """
    kept = _informative(tables)
    if not kept:
        return StratifiedResult(1.0, None, None, None, EXACT_METHOD, confidence,
                                ("no stratum has both arms and both outcomes: nothing to test",))
    support, pmf = _null_distribution(kept)
    observed = sum(t[0] for t in kept)
    at = observed - int(support[0])
    p_value = float(min(1.0, pmf[pmf <= pmf[at] * _TIE_TOLERANCE].sum()))
    logf = np.log(np.maximum(pmf, np.finfo(float).tiny))
    tail = (1 - confidence) / 2

    def mean_minus_observed(log_or: float) -> float:
        return float(_tilted(support, logf, log_or) @ support - observed)

    def upper_tail(log_or: float) -> float:  # P(S >= observed) - tail, increasing in log OR
        return float(_tilted(support, logf, log_or)[at:].sum() - tail)

    def lower_tail(log_or: float) -> float:  # P(S <= observed) - tail, decreasing in log OR
        return float(_tilted(support, logf, log_or)[: at + 1].sum() - tail)

    at_min, at_max = observed == support[0], observed == support[-1]
    estimate = 0.0 if at_min else math.inf if at_max else math.exp(_solve_log_or(mean_minus_observed, -1.0))
    low = 0.0 if at_min else math.exp(_solve_log_or(upper_tail, -1.0))
    high = math.inf if at_max else math.exp(_solve_log_or(lower_tail, 1.0))
    return StratifiedResult(p_value, estimate, low, high, EXACT_METHOD, confidence)


def cmh(tables: Sequence[Table], confidence: float = 0.95) -> StratifiedResult:
    """The large-sample version of the stratified question: Cochran–Mantel–Haenszel, continuity-corrected.

    statsmodels' StratifiedTable divides by zero on uninformative strata and when the Mantel–Haenszel
    odds ratio is 0 or infinite (every corrupt session in one arm): uninformative strata are dropped
    (exactly), and in the 0/infinite case the interval falls back to the exact conditional one.
    """
    kept = _informative(tables)
    if not kept:
        return StratifiedResult(1.0, None, None, None, CMH_METHOD, confidence,
                                ("no stratum has both arms and both outcomes: nothing to test",))
    arrays = [np.array([[a, b], [c, d]], dtype=float) for a, b, c, d in kept]
    table = StratifiedTable(arrays)
    test = table.test_null_odds(correction=True)
    p_value = float(test.pvalue)
    ad = sum(a * d / (a + b + c + d) for a, b, c, d in kept)
    bc = sum(b * c / (a + b + c + d) for a, b, c, d in kept)
    if ad > 0 and bc > 0:
        estimate = float(table.oddsratio_pooled)
        low, high = (float(x) for x in table.oddsratio_pooled_confint(alpha=1 - confidence))
        return StratifiedResult(p_value, estimate, low, high, CMH_METHOD, confidence)
    exact = stratified_exact_test(kept, confidence)
    return StratifiedResult(
        p_value, 0.0 if ad == 0 else math.inf, exact.or_low, exact.or_high, CMH_METHOD, confidence,
        ("Mantel-Haenszel odds ratio is 0 or infinite: interval from the exact conditional test",),
    )
