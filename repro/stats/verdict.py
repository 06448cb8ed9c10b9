"""The inconclusive rule: when a configuration's counts are too thin or too timeout-ridden to judge."""

from __future__ import annotations

from dataclasses import dataclass, field

from repro.errors import UsageError
from repro.stats.intervals import check_level, check_nonnegative, upper_bound

MIN_COMPLETED = 20
"""Fewer completed sessions than this and the counts are inconclusive (docs/statistics.md)."""
MAX_TIMEOUT_FRACTION = 0.2
"""More of all sessions than this timed out and the counts are inconclusive."""


@dataclass(frozen=True)
class Inconclusive:
    """Whether a configuration's counts support no verdict, and why, in plain words with the numbers."""

    inconclusive: bool
    reasons: list[str] = field(default_factory=list)


def _percent(x: float) -> str:
    return f"{100 * x:.3g}%"


def assess_inconclusive(
    clean: int,
    corrupt: int,
    timeout: int,
    error: int = 0,
    *,
    min_completed: int = MIN_COMPLETED,
    max_timeout_fraction: float = MAX_TIMEOUT_FRACTION,
    threshold: float | None = None,
    confidence: float = 0.95,
    interrupted: int = 0,
) -> Inconclusive:
    """Can these counts support a verdict? Inconclusive when any of three things holds.

    1. Fewer than `min_completed` sessions completed (clean + corrupt).
    2. More than `max_timeout_fraction` of all sessions (errors included) timed out.
    3. The worst case (every timeout corrupt) and the best case (every timeout clean) reach different
       conclusions: with a `threshold`, whether the one-sided upper bound at `confidence` falls under
       it; without one, whether there was any corruption at all (so 0 corrupt with some timeouts is
       never read as "no corruption").

    `interrupted` sessions (cut short by a Ctrl-C) are counted among those saved, in the first reason only:
    they are neither completed nor a share of the timeouts.
    """
    check_nonnegative(clean=clean, corrupt=corrupt, timeout=timeout, error=error, interrupted=interrupted)
    if min_completed < 0:
        raise UsageError(f"min_completed must be at least 0, got {min_completed}")
    if not 0.0 <= max_timeout_fraction <= 1.0:
        raise UsageError(f"max_timeout_fraction must be between 0 and 1, got {max_timeout_fraction}")
    if threshold is not None:
        check_level(threshold, name="threshold")
    check_level(confidence)

    total = clean + corrupt + timeout + error
    completed = clean + corrupt
    reasons: list[str] = []
    if completed < min_completed:
        cut = f", {interrupted} interrupted" if interrupted else ""
        reasons.append(f"only {completed} of {total + interrupted} sessions completed{cut} (minimum {min_completed})")
    if total and timeout / total > max_timeout_fraction:
        reasons.append(
            f"{timeout} of {total} sessions ({timeout / total:.0%}) timed out "
            f"(limit {_percent(max_timeout_fraction)})"
        )
    judged = corrupt + clean + timeout
    if threshold is not None:
        worst_under = upper_bound(corrupt + timeout, judged, confidence) < threshold
        best_under = upper_bound(corrupt, judged, confidence) < threshold
        if worst_under != best_under:
            reasons.append(
                "worst case (timeouts corrupt) and best case (timeouts clean) disagree about the "
                f"{_percent(threshold)} threshold"
            )
    elif corrupt == 0 and timeout > 0:
        reasons.append(
            "worst case (timeouts corrupt) and best case (timeouts clean) disagree about whether "
            f"there is any corruption (0 corrupt, {timeout} timed out)"
        )
    return Inconclusive(bool(reasons), reasons)
