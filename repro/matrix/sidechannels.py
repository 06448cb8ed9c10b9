"""The matrix's side channels: each factor's level against its baseline on the finish_reason mix, output
length and speculative acceptance, with each arm's cells' sessions pooled (replicates included).

The tests are repro.report.sidechannels' (those of `repro report` and `repro gate`); the matrix Holm-adjusts
their p-values over every channel of every comparison at the design's alpha. A channel that shifted while
the factor's corruption verdict did not move (not causes, widens or reduces) is named "silent regression?":
a lead to look at, never a verdict (turns of one session are not independent, so the p-values are optimistic).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Sequence

from repro.matrix.analysis import MOVED, CellRun, FactorChannels, MatrixAnalysis
from repro.report.sidechannels import Channels, channel_tests, channels_of
from repro.stats.sidechannels import describe, flag
from repro.store.rundir import DamagedRun, read_sessions
from repro.untrusted import printable


def pooled(parts: Sequence[Channels]) -> Channels:
    """Several runs' channels as one arm's. Acceptance counters only when every run exported them (a sum
    over some runs would compare unlike arms); sampled acceptance likewise."""
    mix: Counter[str] = Counter()
    for part in parts:
        mix.update(part.finish_reasons)
    counted = bool(parts) and all(part.drafted is not None for part in parts)
    sampled = bool(parts) and all(part.accept_samples for part in parts)
    return Channels(
        finish_reasons=dict(mix),
        lengths=[length for part in parts for length in part.lengths],
        accepted=sum(part.accepted or 0 for part in parts) if counted else None,
        drafted=sum(part.drafted or 0 for part in parts) if counted else None,
        accept_samples=[x for part in parts for x in part.accept_samples or []] if sampled else None,
    )


def add_side_channels(analysis: MatrixAnalysis, root: Path, runs: Sequence[CellRun]) -> MatrixAnalysis:
    """Fill `analysis.side_channels`: one comparison per factor level against its baseline, as `factors` has.

    Each finished run's records are read once (a run is in one arm of every factor); a run whose records
    cannot be read back is left out, and the notes say so (its counts still count in the corruption tests)."""
    read: dict[str, Channels | None] = {}
    for run in runs:
        if run.status != "finished" or not run.run_dir:
            continue
        path = Path(root) / run.run_dir
        try:
            read[run.key] = channels_of(read_sessions(path), path)
        except DamagedRun as err:
            read[run.key] = None
            analysis.notes.append(f"side channels: {run.key} left out: {err}")
    arms: dict[tuple[str, str], Channels] = {}

    def arm_of(factor: str, level: str) -> Channels:
        """The pooled channels of every run read whose cell has `factor` at `level`."""
        if (factor, level) not in arms:
            arms[factor, level] = pooled([channels for run in runs if run.cell.get(factor) == level
                                          if (channels := read.get(run.key)) is not None])
        return arms[factor, level]

    found = [
        FactorChannels(effect.factor, effect.level, effect.baseline, effect.label, effect.verdict,
                       channel_tests(arm_of(effect.factor, effect.level), arm_of(effect.factor, effect.baseline)))
        for effect in analysis.factors
    ]
    # Holm once more over the whole family: every channel of every comparison.
    flat = flag([test for comparison in found for test in comparison.tests], alpha=analysis.alpha)
    for comparison in found:
        comparison.tests, flat = flat[:len(comparison.tests)], flat[len(comparison.tests):]
        comparison.silent = [] if comparison.corruption in MOVED else [t.channel for t in comparison.tests if t.shifted]
    analysis.side_channels = found
    return analysis


def summary_lines(analysis: MatrixAnalysis) -> list[str]:
    """For the terminal: every shifted channel in words (marked when corruption did not move), or one line
    saying none shifted."""
    shifted = [(comparison, test) for comparison in analysis.side_channels for test in comparison.tests if test.shifted]
    if not shifted:
        tested = sum(test.pvalue is not None for comparison in analysis.side_channels for test in comparison.tests)
        return [f"side channels: no shift shown ({tested} channel tests over {len(analysis.side_channels)} "
                f"comparisons, Holm-adjusted)"] if analysis.side_channels else []
    # A finish_reason is the server's text: no control character of it reaches the terminal.
    return [printable(f"side channels: {comparison.label}: {describe(test, silent=test.channel in comparison.silent)}")
            for comparison, test in shifted]
