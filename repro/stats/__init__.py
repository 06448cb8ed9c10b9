"""The statistics layer: pure functions over outcome counts, returning frozen result objects.

Every name is importable from `repro.stats`; the submodules group them by question (one rate, two
rates, many tests, power, sequential stopping, strata).
"""

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
from repro.stats.stratified import StratifiedResult, cmh, stratified_exact_test
from repro.stats.twosample import Comparison, compare
from repro.stats.verdict import Inconclusive, assess_inconclusive

__all__ = [
    "Comparison",
    "Inconclusive",
    "Interval",
    "SequentialDecision",
    "StratifiedResult",
    "assess_inconclusive",
    "benjamini_hochberg",
    "bisect_probe_sessions",
    "clopper_pearson",
    "cmh",
    "compare",
    "confidence_sequence",
    "holm",
    "paired_sequential",
    "power_two_proportions",
    "sample_size_two_proportions",
    "sprt_single",
    "stratified_exact_test",
    "timeout_bounds",
    "upper_bound",
    "wilson",
]
