"""Which way a commit search looks: the first bad commit after a good range (a regression), or with
`--find-fix` the first good commit after a bad range (the fix). Pure functions.

Both run the one search of repro.bisect.commits, whose posterior (repro.bisect.posterior) assumes
the commits from the culprit on are bad. A fix search runs it over the range newest first: there
the good (fixed) end is index 0 and the old, bad end the last, and the search's culprit is the
newest commit that still corrupts; the fix is the commit after it in history. Probe records keep
the search's indexes (what `--resume` reads back); labels, the result and the plot speak history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

Direction = Literal["regression", "fix"]


@dataclass(frozen=True)
class Searched:
    """A range in history order (oldest first) as one direction's search sees it."""

    direction: Direction
    commits: int

    def history(self, index: int) -> int:
        """The history index (0 = oldest) of the search's commit `index`."""
        return index if self.direction == "regression" else self.commits - 1 - index

    def named(self, culprit: int) -> int:
        """The history index of the commit a search whose culprit is `culprit` names: the first bad
        commit, or the fix (the first good commit, the one after the newest bad one)."""
        return culprit if self.direction == "regression" else self.commits - culprit

    def in_history(self, culprit: Sequence[float]) -> list[float]:
        """P(named commit = h) for every history index h, from the search's P(culprit = c)."""
        if self.direction == "regression":
            return [float(p) for p in culprit]
        return [0.0, *(float(culprit[self.commits - h]) for h in range(1, self.commits))]


WORDS = {
    "regression": {"searched": "the first bad commit after a good range", "named": "First bad commit",
                   "probability": "P(first bad)", "old": "--good", "new": "--bad"},
    "fix": {"searched": "the first good commit after a bad range (--find-fix)", "named": "Fixing commit",
            "probability": "P(fixes it)", "old": "--bad", "new": "--good"},
}
"""How the terminal and the reports name what each direction looks for, and which option names the
range's older end."""
