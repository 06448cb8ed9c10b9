"""Is one configuration worse, better, practically equivalent to another within a margin, or is it too early to say?

Two one-sided tests (TOST) by interval inclusion, exact: the difference of the corruption rates
(arm 1 minus arm 2) is bracketed by the ends of each arm's two-sided Clopper-Pearson interval at
1 - alpha, `[low1 - high2, high1 - low2]`. The chance that the true difference lies above `high` is at
most P(rate1 > high1) + P(rate2 < low2) = alpha/2 + alpha/2, and the same below `low`; so calling the
arms "practically equivalent" when the whole bracket lies within ±margin is wrong (at a true difference
of ±margin or beyond) with chance at most alpha. It is wider than Newcombe's interval, and never covers
less than it claims.

Timeouts enter as the worst case: a timed-out session's outcome is unknown, so each end of the bracket
counts the timeouts as whichever outcome moves it away from equivalence (the upper end counts arm 1's
timeouts corrupt and arm 2's clean, over all started sessions, and the lower end the reverse). With no
timeouts this is the bracket over completed sessions. Errors observed nothing and are left out.

"worse" and "better" keep the two-sided Boschloo test on completed sessions (repro.stats.twosample).
A difference that is significant and still within ±margin is "practically equivalent" (a note says
so): the margin is the difference the user declared irrelevant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from repro.errors import UsageError
from repro.stats.intervals import check_counts, check_level, check_nonnegative

DEFAULT_MARGIN = 0.05
"""δ: the absolute difference in corruption rate below which two configurations are practically the same."""
EquivalenceVerdict = Literal["worse", "better", "practically equivalent", "inconclusive"]
METHOD = "TOST by interval inclusion: Clopper-Pearson bracket, timeouts as the worst case"
MAX_PROJECTED = 1_000_000
"""Per-arm sessions beyond which the projection gives up (the observed difference sits on the margin)."""


@dataclass(frozen=True)
class EquivalenceResult:
    """Arm 1 against arm 2 in four words, with the numbers that decided it.

    `low`/`high` bracket rate1 - rate2 (an interval of coverage at least 1 - 2 alpha; each side is a
    one-sided test at alpha). `noninferior`: the increase is shown under the margin (high < margin),
    which is what a gate asks of a run against its baseline. `sessions_to_decide`: for an inconclusive
    verdict, the completed sessions per arm at which the observed rates would decide it (None when
    decided, or when no count up to MAX_PROJECTED would).
    """

    verdict: EquivalenceVerdict
    difference: float | None
    low: float
    high: float
    margin: float
    confidence: float
    pvalue: float
    """Two-sided Boschloo p of any difference (completed sessions)."""
    noninferior: bool
    sessions_to_decide: int | None
    method: str = METHOD
    notes: tuple[str, ...] = ()


def check_margin(margin: float) -> None:
    """Reject a margin that is not a difference of rates strictly between 0 and 1."""
    if not 0.0 < margin < 1.0:
        raise UsageError(f"margin must be strictly between 0 and 1 (a difference in corruption rate), got {margin}")


def _ends(k: int, n: int, confidence: float) -> tuple[float, float]:
    """The two-sided Clopper-Pearson interval's ends, as repro.stats.intervals.clopper_pearson gives them.

    By scipy's inverse incomplete beta: a projection computes thousands of them, and the pure-Python
    quantile there (which spares a run's summary the scipy import) takes milliseconds each.
    """
    from scipy.special import betaincinv

    if n == 0:
        return 0.0, 1.0
    tail = (1.0 - confidence) / 2
    low = 0.0 if k == 0 else float(betaincinv(k, n - k + 1, tail))
    high = 1.0 if k == n else float(betaincinv(k + 1, n - k, 1.0 - tail))
    return low, high


def bracket(k1: int, n1: int, k2: int, n2: int, *, timeout1: int = 0, timeout2: int = 0,
            confidence: float = 0.95) -> tuple[float, float]:
    """(low, high) bounds of rate1 - rate2, timeouts counted the way that widens each end.

    `n` counts completed sessions (clean + corrupt); timeouts are added to the denominators here.
    """
    check_counts(k1, n1, what="k1")
    check_counts(k2, n2, what="k2")
    check_nonnegative(timeout1=timeout1, timeout2=timeout2)
    check_level(confidence)
    m1, m2 = n1 + timeout1, n2 + timeout2
    high = _ends(k1 + timeout1, m1, confidence)[1] - _ends(k2, m2, confidence)[0]
    low = _ends(k1, m1, confidence)[0] - _ends(k2 + timeout2, m2, confidence)[1]
    return low, high


def _decides(k1: int, k2: int, n: int, margin: float, confidence: float) -> bool:
    # The projection's stand-in for "decided": the bracket is inside the margin, or it excludes 0 (a
    # difference the exact test, which is never less powerful than the bracket, would show too).
    low, high = bracket(k1, n, k2, n, confidence=confidence)
    return (low > -margin and high < margin) or low > 0 or high < 0


def sessions_to_decide(rate1: float, rate2: float, *, margin: float = DEFAULT_MARGIN, confidence: float = 0.95,
                       start: int = 1) -> int | None:
    """Completed sessions per arm at which rates `rate1` and `rate2`, observed as such, would decide.

    The smallest n >= start where round(rate * n) corrupt of n in each arm gives an equivalence bracket
    within ±margin or one that excludes 0; None if no n up to MAX_PROJECTED does.
    """
    check_margin(margin)
    for name, rate in (("rate1", rate1), ("rate2", rate2)):
        if not 0.0 <= rate <= 1.0:
            raise UsageError(f"{name} must be between 0 and 1, got {rate}")

    def decided(n: int) -> bool:
        return _decides(round(rate1 * n), round(rate2 * n), n, margin, confidence)

    n = max(1, start)
    if decided(n):
        return n
    # Doubling, then bisection: rounding makes "decided" not quite monotone in n; the answer is an estimate.
    low = n
    while not decided(n):
        low = n
        n *= 2
        if n > MAX_PROJECTED:
            return None
    high = n
    while high - low > 1:
        mid = (low + high) // 2
        if decided(mid):
            high = mid
        else:
            low = mid
    return high


def equivalence(
    k1: int,
    n1: int,
    k2: int,
    n2: int,
    *,
    timeout1: int = 0,
    timeout2: int = 0,
    margin: float = DEFAULT_MARGIN,
    confidence: float = 0.95,
    pvalue: float | None = None,
) -> EquivalenceResult:
    """The four-way verdict of arm 1 (k1 corrupt of n1 completed) against arm 2.

    `pvalue`: a two-sided p of any difference already computed (the report's Boschloo); computed
    here when None. Worse/better need p < alpha = 1 - confidence.
    """
    check_margin(margin)
    low, high = bracket(k1, n1, k2, n2, timeout1=timeout1, timeout2=timeout2, confidence=confidence)
    notes: list[str] = []
    if pvalue is None:
        if n1 and n2:
            from repro.stats.twosample import compare  # statsmodels loads only when a p is needed here

            pvalue = compare(k1, n1, k2, n2, confidence=confidence).p_boschloo
        else:
            pvalue = 1.0
    difference = k1 / n1 - k2 / n2 if n1 and n2 else None
    alpha = 1 - confidence
    significant = pvalue < alpha and difference is not None and difference != 0
    verdict: EquivalenceVerdict
    projected = None
    if low > -margin and high < margin:
        verdict = "practically equivalent"
        if significant:
            notes.append(f"the difference is significant (p={pvalue:.2g}) but within the ±{margin:g} margin")
    elif significant:
        verdict = "worse" if difference > 0 else "better"  # type: ignore[operator]
    else:
        verdict = "inconclusive"
        if n1 and n2:
            start = max(n1, n2)
            projected = sessions_to_decide(k1 / n1, k2 / n2, margin=margin, confidence=confidence, start=start)
            if projected == start and (timeout1 or timeout2):
                projected = None
                notes.append("the completed sessions alone would decide it: the timeouts keep it open")
    if timeout1 or timeout2:
        notes.append(f"timeouts ({timeout1} and {timeout2}) counted as the worst case in the bracket")
    return EquivalenceResult(verdict, difference, low, high, margin, confidence, float(pvalue),
                             high < margin, projected, notes=tuple(notes))


def describe(result: EquivalenceResult) -> str:
    """The verdict in one line with its numbers, as report, gate and matrix print it."""
    bounds = f"[{100 * result.low:+.1f}, {100 * result.high:+.1f}] points"
    margin = f"±{100 * result.margin:g} points"
    alpha = f"{1 - result.confidence:.2g}"
    if result.verdict == "practically equivalent":
        text = f"practically equivalent: the difference lies in {bounds}, within the {margin} margin (TOST, alpha {alpha})"
    elif result.verdict in ("worse", "better"):
        text = f"{result.verdict}: Boschloo p={result.pvalue:.2g}, difference in {bounds}"
    else:
        if result.sessions_to_decide is not None:
            need = f"; about {result.sessions_to_decide} completed sessions per arm would decide it at the observed rates"
        elif result.difference is None:
            need = "; no completed sessions to project from"
        elif any("timeouts keep it open" in note for note in result.notes):
            need = ""
        else:
            need = "; no sample size decides it at the observed rates (the difference sits on the margin)"
        text = f"inconclusive at the {margin} margin: the difference lies in {bounds}{need}"
    return text + "".join(f"; {note}" for note in result.notes)
