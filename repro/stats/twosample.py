"""Two configurations (A/B): is one corruption rate different from the other, and by how much?

Arms are the columns of the 2x2 table, as scipy's Boschloo test expects: [[k1, k2], [n1-k1, n2-k2]].
Passing arms as rows instead silently tests something else (11/60 vs 0/60 would give p=2.4e-4 instead of
the correct 3.3e-4, docs/statistics.md's worked example).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from scipy import stats as sps
from scipy.stats.contingency import odds_ratio as _odds_ratio
from statsmodels.stats.proportion import confint_proportions_2indep

from repro.errors import UsageError
from repro.stats.intervals import check_counts, check_level

Alternative = Literal["two-sided", "less", "greater"]
ALTERNATIVES: tuple[str, ...] = ("two-sided", "less", "greater")


@dataclass(frozen=True)
class Comparison:
    """Arm 1 (k1 of n1) against arm 2 (k2 of n2).

    `difference` is rate1 - rate2 with Newcombe's hybrid-score interval; the odds ratio is the
    conditional maximum-likelihood estimate with its exact interval (both intervals two-sided at
    `confidence` whatever the alternative). "greater" means the alternative rate1 > rate2.
    Undefined quantities are None (an empty arm has no rate; 0 of n in both arms has no odds ratio);
    `notes` says why a p-value was replaced by 1.0 or a quantity is missing.
    """

    rate1: float | None
    rate2: float | None
    difference: float | None
    diff_low: float | None
    diff_high: float | None
    odds_ratio: float | None
    or_low: float | None
    or_high: float | None
    p_boschloo: float
    p_fisher: float
    alternative: str
    confidence: float = 0.95
    notes: tuple[str, ...] = ()


def check_alternative(alternative: str) -> None:
    """Reject an alternative hypothesis scipy would not understand."""
    if alternative not in ALTERNATIVES:
        raise UsageError(f"alternative must be one of {', '.join(ALTERNATIVES)}, got {alternative!r}")


def arm_table(k1: int, n1: int, k2: int, n2: int) -> list[list[int]]:
    """The 2x2 table with one column per arm (corrupt row first)."""
    return [[k1, k2], [n1 - k1, n2 - k2]]


def newcombe_difference(k1: int, n1: int, k2: int, n2: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """Newcombe's hybrid-score interval for rate1 - rate2 (two-sided); both arms need n > 0.

    On its own because it is cheap where compare() is not: callers that have their p-value from
    another test (the matrix's stratified one) want the effect's interval without Boschloo's seconds.
    """
    low, high = confint_proportions_2indep(k1, n1, k2, n2, compare="diff", method="newcomb", alpha=1 - confidence)
    # Its sums of Wilson bounds can land a rounding error past ±1 (27/27 vs 0/1 gives 1.0000000000000002).
    return max(-1.0, float(low)), min(1.0, float(high))


def compare(
    k1: int,
    n1: int,
    k2: int,
    n2: int,
    *,
    alternative: Alternative = "two-sided",
    confidence: float = 0.95,
) -> Comparison:
    """Do two corruption rates differ? Boschloo's exact test (primary) and Fisher's beside it, with effect sizes."""
    check_counts(k1, n1, what="k1")
    check_counts(k2, n2, what="k2")
    check_alternative(alternative)
    check_level(confidence)
    notes: list[str] = []
    table = arm_table(k1, n1, k2, n2)
    if n1 == 0 or n2 == 0:
        empty = "arm 1" if n1 == 0 else "arm 2"
        if n1 == 0 and n2 == 0:
            empty = "both arms"
        notes.append(f"{empty} had no completed sessions: nothing to compare, p-values set to 1.0")
        return Comparison(
            rate1=k1 / n1 if n1 else None,
            rate2=k2 / n2 if n2 else None,
            difference=None,
            diff_low=None,
            diff_high=None,
            odds_ratio=None,
            or_low=None,
            or_high=None,
            p_boschloo=1.0,
            p_fisher=1.0,
            alternative=alternative,
            confidence=confidence,
            notes=tuple(notes),
        )

    p_boschloo = float(sps.boschloo_exact(table, alternative=alternative).pvalue)
    if math.isnan(p_boschloo):
        notes.append("Boschloo's p-value was undefined for this table; set to 1.0")
        p_boschloo = 1.0
    p_fisher = float(sps.fisher_exact(table, alternative=alternative).pvalue)
    diff_low, diff_high = newcombe_difference(k1, n1, k2, n2, confidence=confidence)
    odds = _odds_ratio(table, kind="conditional")
    estimate = float(odds.statistic)
    or_ci = odds.confidence_interval(confidence_level=confidence, alternative="two-sided")
    if math.isnan(estimate):
        notes.append("no variation in outcome (every session corrupt or every one clean): odds ratio undefined")
    return Comparison(
        rate1=k1 / n1,
        rate2=k2 / n2,
        difference=k1 / n1 - k2 / n2,
        diff_low=diff_low,
        diff_high=diff_high,
        odds_ratio=None if math.isnan(estimate) else estimate,
        or_low=None if math.isnan(estimate) else float(or_ci.low),
        or_high=None if math.isnan(estimate) else float(or_ci.high),
        p_boschloo=p_boschloo,
        p_fisher=p_fisher,
        alternative=alternative,
        confidence=confidence,
        notes=tuple(notes),
    )
