"""Zeller's delta debugging (ddmin) with three-valued tests: a minimal failure-inducing set of changes.

The changes are the settings in which a bad configuration differs from a good one; a test applies a
subset of them to the good configuration and answers "fail" (the corruption appeared), "pass", or
"inconclusive" (the probe could not tell: Zeller's unresolved outcome, treated as "not shown to fail").
The result is 1-minimal among resolved tests: removing any one change from it no longer failed.
Pairs that only fail together are found because ddmin also tests complements.

Pure: `test` is called with a sorted tuple of change indices and may come from a cache (the journal),
which is how an interrupted search resumes without repeating a probe. With `parallel` K > 1, the
candidates of a granularity step (its subsets, then its complements) are handed to `ahead` K at a
time, to be tested at once, before `test` reads them one by one in ddmin's order: the result is the
one-at-a-time search's, at the cost of the tests past the first failing candidate of those K.
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


def _first_failing(
    candidates: list[Subset], test: Callable[[Subset], Outcome], parallel: int,
    ahead: Callable[[list[Subset]], None] | None,
) -> Subset | None:
    """The first candidate whose test fails, testing `parallel` at a time through `ahead` when given."""
    for start in range(0, len(candidates), parallel):
        chunk = candidates[start:start + parallel]
        if ahead is not None and len(chunk) > 1:
            ahead(chunk)
        for candidate in chunk:
            if test(candidate) == "fail":
                return candidate
    return None


def ddmin(
    changes: Sequence[int],
    test: Callable[[Subset], Outcome],
    *,
    parallel: int = 1,
    ahead: Callable[[list[Subset]], None] | None = None,
) -> Subset:
    """A 1-minimal failing subset of `changes`, assuming the whole set fails (the caller checks that).

    With a monotone test (fails iff the subset holds some fixed set S), the result is exactly S.
    `ahead(candidates)` starts up to `parallel` tests at once (see the module docstring).
    """
    current: Subset = tuple(sorted(changes))
    parts = 2
    while len(current) >= 2:
        subsets = _split(current, parts)
        reduced = False
        found = _first_failing(subsets, test, parallel, ahead)
        if found is not None:
            current, parts, reduced = found, 2, True
        # With two parts each complement is the other part, already tested.
        if not reduced and len(subsets) > 2:
            complements = [tuple(i for i in current if i not in subset) for subset in subsets]
            found = _first_failing(complements, test, parallel, ahead)
            if found is not None:
                current, parts, reduced = found, max(parts - 1, 2), True
        if not reduced:
            if parts >= len(current):
                break
            parts = min(len(current), parts * 2)
    return current
