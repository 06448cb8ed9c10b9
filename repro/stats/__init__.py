"""The statistics layer: pure functions over outcome counts, returning frozen result objects.

Every name is importable from `repro.stats`; the submodules group them by question (one rate, two
rates, many tests, power, sequential stopping, strata). Submodules load on first use, so a command
that only needs an interval does not pay for importing statsmodels.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "intervals": ["Interval", "clopper_pearson", "timeout_bounds", "upper_bound", "wilson"],
    "verdict": ["Inconclusive", "assess_inconclusive"],
    "twosample": ["Comparison", "compare", "newcombe_difference"],
    "multiplicity": ["benjamini_hochberg", "holm"],
    "power": ["power_two_proportions", "sample_size_two_proportions"],
    "sequential": ["SequentialDecision", "bisect_probe_sessions", "confidence_sequence", "paired_sequential", "sprt_single"],
    "stratified": ["StratifiedResult", "cmh", "stratified_exact_test"],
    "equivalence": ["EquivalenceResult", "equivalence", "sessions_to_decide"],
    "sidechannels": ["ChannelTest", "acceptance_counts_shift", "mix_shift", "rank_shift"],
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_HOME_OF)


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'repro.stats' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"repro.stats.{module}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from repro.stats.equivalence import EquivalenceResult, equivalence, sessions_to_decide
    from repro.stats.intervals import Interval, clopper_pearson, timeout_bounds, upper_bound, wilson
    from repro.stats.multiplicity import benjamini_hochberg, holm
    from repro.stats.power import power_two_proportions, sample_size_two_proportions
    from repro.stats.sequential import (
        SequentialDecision,
        bisect_probe_sessions,
        confidence_sequence,
        paired_sequential,
        sprt_single,
    )
    from repro.stats.sidechannels import ChannelTest, acceptance_counts_shift, mix_shift, rank_shift
    from repro.stats.stratified import StratifiedResult, cmh, stratified_exact_test
    from repro.stats.twosample import Comparison, compare, newcombe_difference
    from repro.stats.verdict import Inconclusive, assess_inconclusive
