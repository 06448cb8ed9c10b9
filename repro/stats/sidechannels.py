"""Silent regressions: did something other than the corruption rate shift between two arms?

Three side channels, each with its own test, two-sided:
- the `finish_reason` mix (stop, tool_calls, length, …) per turn: Fisher's exact test, on a 2 x K table
  by Monte Carlo over tables with the observed margins (seeded, so the same counts give the same p),
  or the chi-square test when every expected count is at least 5;
- output length, one number per session (its mean completion tokens per turn): Mann-Whitney's rank test;
- speculative-decoding acceptance, where the server exports it: accepted against rejected draft tokens
  (vLLM's counters) by Fisher's exact test, or the sampled acceptance-rate gauge (SGLang) by the rank test.

A channel is **shifted** when its Holm-adjusted p over the channels tested is under alpha. Turns of one
session, and draft tokens of one request, are not independent, so those p-values are optimistic: a
shift is a lead to look at, never a verdict on its own.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from repro.stats.intervals import check_level
from repro.stats.multiplicity import holm

MC_RESAMPLES = 9999
SILENT = "silent regression?"
"""The name of a channel that shifted while the corruption verdict did not move: a lead, never a verdict."""


@dataclass(frozen=True)
class ChannelTest:
    """One side channel compared between arm 1 and arm 2."""

    channel: str
    test: str
    pvalue: float | None
    """None: the channel could not be tested (`note` says why)."""
    arm1: str
    arm2: str
    """What each arm showed, in words with the numbers."""
    p_adjusted: float | None = None
    shifted: bool = False
    note: str | None = None


def _mix_text(mix: Mapping[str, int]) -> str:
    total = sum(mix.values())
    if not total:
        return "no turns"
    return ", ".join(f"{key} {value} ({100 * value / total:.0f}%)" for key, value in sorted(mix.items(), key=lambda kv: -kv[1]))


def mix_shift(mix1: Mapping[str, int], mix2: Mapping[str, int], *, channel: str = "finish_reason mix") -> ChannelTest:
    """Do two arms end their turns for the same reasons in the same proportions?"""
    import numpy as np
    from scipy import stats as sps

    keys = sorted(key for key in set(mix1) | set(mix2) if mix1.get(key, 0) + mix2.get(key, 0) > 0)
    text1, text2 = _mix_text(mix1), _mix_text(mix2)
    if not sum(mix1.values()) or not sum(mix2.values()):
        return ChannelTest(channel, "none", None, text1, text2, note="an arm has no turns")
    if len(keys) < 2:
        return ChannelTest(channel, "none", 1.0, text1, text2, note="one value in both arms")
    table = np.array([[mix1.get(key, 0) for key in keys], [mix2.get(key, 0) for key in keys]])
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    if len(keys) == 2:
        return ChannelTest(channel, "Fisher exact", float(sps.fisher_exact(table).pvalue), text1, text2)
    if expected.min() >= 5:
        return ChannelTest(channel, "chi-square", float(sps.chi2_contingency(table, correction=False).pvalue), text1, text2)
    method = sps.MonteCarloMethod(n_resamples=MC_RESAMPLES, rng=0)
    return ChannelTest(channel, f"Fisher exact (Monte Carlo, {MC_RESAMPLES} tables)",
                       float(sps.fisher_exact(table, method=method).pvalue), text1, text2)


def _lengths_text(values: Sequence[float], unit: str) -> str:
    if not values:
        return "none"
    return f"median {statistics.median(values):.4g} {unit} over {len(values)}"


def rank_shift(values1: Sequence[float], values2: Sequence[float], *, channel: str, unit: str) -> ChannelTest:
    """Are the values of one arm shifted against the other's? Mann-Whitney U, two-sided."""
    from scipy import stats as sps

    text1, text2 = _lengths_text(values1, unit), _lengths_text(values2, unit)
    if not values1 or not values2:
        return ChannelTest(channel, "Mann-Whitney U", None, text1, text2, note="an arm has no values")
    if len(set(values1) | set(values2)) < 2:
        return ChannelTest(channel, "Mann-Whitney U", 1.0, text1, text2, note="every value equal")
    p = float(sps.mannwhitneyu(values1, values2, alternative="two-sided").pvalue)
    return ChannelTest(channel, "Mann-Whitney U", p, text1, text2)


def acceptance_counts_shift(accepted1: int, drafted1: int, accepted2: int, drafted2: int) -> ChannelTest:
    """Speculative acceptance from token counters: accepted vs rejected draft tokens, Fisher's exact test."""
    from scipy import stats as sps

    channel = "speculative acceptance"
    text1 = f"{accepted1}/{drafted1} draft tokens accepted" + (f" ({accepted1 / drafted1:.0%})" if drafted1 else "")
    text2 = f"{accepted2}/{drafted2} draft tokens accepted" + (f" ({accepted2 / drafted2:.0%})" if drafted2 else "")
    if not drafted1 or not drafted2:
        return ChannelTest(channel, "Fisher exact", None, text1, text2, note="an arm drafted no tokens")
    table = [[accepted1, accepted2], [drafted1 - accepted1, drafted2 - accepted2]]
    return ChannelTest(channel, "Fisher exact", float(sps.fisher_exact(table).pvalue), text1, text2)


def flag(tests: Sequence[ChannelTest], *, alpha: float = 0.05) -> list[ChannelTest]:
    """Holm-adjust the tested channels' p-values together and mark those under alpha as shifted."""
    check_level(alpha, name="alpha")
    tested = [i for i, test in enumerate(tests) if test.pvalue is not None]
    adjusted = holm([tests[i].pvalue for i in tested]) if tested else []  # type: ignore[misc]
    out = list(tests)
    for i, p in zip(tested, adjusted):
        out[i] = replace(tests[i], p_adjusted=float(p), shifted=float(p) < alpha)
    return out


def finding(test: ChannelTest, *, silent: bool = False) -> str:
    """One channel's finding in a word or three; `silent`: it shifted while the corruption verdict did not
    move, named SILENT."""
    if test.pvalue is None:
        return f"not tested ({test.note})"
    if not test.shifted:
        return "no shift shown"
    return f"SHIFTED: {SILENT}" if silent else "SHIFTED"


def describe(test: ChannelTest, *, silent: bool = False) -> str:
    """One channel in one line: what each arm showed and the test's answer, led by SILENT when `silent`."""
    facts = f"{SILENT + ' ' if silent else ''}{test.channel}: {test.arm1} vs {test.arm2}"
    if test.pvalue is None:
        return f"{facts}: {finding(test)}"
    p = test.p_adjusted if test.p_adjusted is not None else test.pvalue
    return f"{facts}: {finding(test)} ({test.test}, Holm p={p:.2g})"
