"""Many flags tested at once: adjusted p-values that control the family-wise error or the false discovery rate."""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats as sps


def _checked(pvalues: Sequence[float]) -> list[float]:
    # A p-value out of range is the caller's bug, never the user's input: ValueError, not UsageError (exit 2).
    values = [float(p) for p in pvalues]
    for i, p in enumerate(values):
        if math.isnan(p) or not 0.0 <= p <= 1.0:
            raise ValueError(f"p-value {i} must be between 0 and 1, got {p}")
    return values


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values: reject those <= alpha and the chance of any false flag stays <= alpha.

    The step-down by hand: the i-th smallest p times (m - i), made non-decreasing, capped at 1.
    (statsmodels' `multipletests` gives the same values but runs a full gc.collect() on every call,
    seconds in a large process, once per family of a matrix analysis.)
    """
    values = _checked(pvalues)
    m = len(values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(sorted(range(m), key=values.__getitem__)):
        running = max(running, min(1.0, (m - rank) * values[index]))
        adjusted[index] = running
    return adjusted


def benjamini_hochberg(pvalues: Sequence[float]) -> list[float]:
    """Benjamini–Hochberg adjusted p-values: rejecting those <= q keeps the expected share of false flags <= q."""
    values = _checked(pvalues)
    if not values:
        return []
    return [float(p) for p in sps.false_discovery_control(values, method="bh")]
