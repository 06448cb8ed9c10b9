"""Zeller's delta debugging (ddmin) with three-valued tests: a minimal failure-inducing set of changes.

The changes are the settings in which a bad configuration differs from a good one; a test applies a
subset of them to the good configuration and answers "fail" (the corruption appeared), "pass", or
"inconclusive" (the probe could not tell: Zeller's unresolved outcome, treated as "not shown to fail").
The result is 1-minimal among resolved tests: removing any one change from it no longer failed.
Pairs that only fail together are found because ddmin also tests complements.

Pure: `test` is called with a sorted tuple of change indices and may come from a cache (the journal),
which is how an interrupted search resumes without repeating a probe.
"""

from __future__ import annotations

from typing import Callable, Literal, Sequence

Outcome = Literal["fail", "pass", "inconclusive"]
Subset = tuple[int, ...]


def _split(items: Subset, parts: int) -> list[Subset]:
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return [part for part in out if part]


def ddmin(changes: Sequence[int], test: Callable[[Subset], Outcome]) -> Subset:
    """A 1-minimal failing subset of `changes`, assuming the whole set fails (the caller checks that).

    With a monotone test (fails iff the subset holds some fixed set S), the result is exactly S.
    """
    current: Subset = tuple(sorted(changes))
    parts = 2
    while len(current) >= 2:
        subsets = _split(current, parts)
        reduced = False
        for subset in subsets:
            if test(subset) == "fail":
                current, parts, reduced = subset, 2, True
                break
        # With two parts each complement is the other part, already tested.
        if not reduced and len(subsets) > 2:
            for subset in subsets:
                complement = tuple(i for i in current if i not in subset)
                if test(complement) == "fail":
                    current, parts, reduced = complement, max(parts - 1, 2), True
                    break
        if not reduced:
            if parts >= len(current):
                break
            parts = min(len(current), parts * 2)
    return current
