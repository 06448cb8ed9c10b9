"""The equivalence verdict and the side-channel tests: properties (hypothesis) and values checked by hand."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.errors import UsageError
from repro.stats import clopper_pearson
from repro.stats.equivalence import bracket, describe, equivalence, sessions_to_decide
from repro.stats.sidechannels import acceptance_counts_shift, flag, mix_shift, rank_shift


@st.composite
def arm(draw: st.DrawFn, most: int = 300) -> tuple[int, int]:
    n = draw(st.integers(1, most))
    return draw(st.integers(0, n)), n


@settings(max_examples=150, deadline=None)
@given(arm(), arm(), st.integers(0, 30), st.integers(0, 30))
def test_bracket_holds_the_observed_difference_and_flips_with_the_arms(one: tuple[int, int], two: tuple[int, int],
                                                                       t1: int, t2: int) -> None:
    (k1, n1), (k2, n2) = one, two
    low, high = bracket(k1, n1, k2, n2, timeout1=t1, timeout2=t2)
    assert -1.0 <= low <= k1 / n1 - k2 / n2 + 1e-12 or t1 or t2
    assert low <= high
    assert low <= (k1 + t1) / (n1 + t1) - k2 / (n2 + t2) <= high + 1e-12
    swapped = bracket(k2, n2, k1, n1, timeout1=t2, timeout2=t1)
    assert swapped == pytest.approx((-high, -low), abs=1e-12)


@settings(max_examples=150, deadline=None)
@given(arm(), arm(), st.integers(1, 30), st.floats(0.01, 0.3))
def test_timeouts_never_make_arms_equivalent(one: tuple[int, int], two: tuple[int, int], t: int, margin: float) -> None:
    (k1, n1), (k2, n2) = one, two
    with_timeouts = equivalence(k1, n1, k2, n2, timeout1=t, margin=margin, pvalue=1.0)
    if with_timeouts.verdict == "practically equivalent":
        assert equivalence(k1, n1, k2, n2, margin=margin, pvalue=1.0).verdict == "practically equivalent"


@settings(max_examples=150, deadline=None)
@given(arm(), arm(), st.floats(0.0, 1.0), st.floats(0.01, 0.3))
def test_the_verdict_follows_its_numbers(one: tuple[int, int], two: tuple[int, int], p: float, margin: float) -> None:
    (k1, n1), (k2, n2) = one, two
    result = equivalence(k1, n1, k2, n2, margin=margin, pvalue=p)
    inside = -margin < result.low and result.high < margin
    assert (result.verdict == "practically equivalent") == inside
    assert result.noninferior == (result.high < margin)
    if result.verdict == "worse":
        assert p < 1 - 0.95 and k1 / n1 > k2 / n2
    if result.verdict == "better":
        assert p < 1 - 0.95 and k1 / n1 < k2 / n2
    if result.verdict == "inconclusive":
        assert p >= 1 - 0.95 or k1 / n1 == k2 / n2
        projected = result.sessions_to_decide
        assert projected is None or projected >= max(n1, n2)
    else:
        assert result.sessions_to_decide is None
    assert result.verdict.split()[0] in describe(result)


def test_values_by_hand() -> None:
    # Each end is a difference of 95% Clopper-Pearson ends: 0 of 60 is [0, 5.96%] in each arm.
    low, high = bracket(0, 60, 0, 60)
    assert high == pytest.approx(clopper_pearson(0, 60).high) and low == pytest.approx(-high)
    assert equivalence(0, 60, 0, 60).verdict == "inconclusive"
    # 0 of n clean in both arms decides at the n whose 95% upper bound 1 - 0.025**(1/n) is under 5 points.
    assert equivalence(0, 60, 0, 60).sessions_to_decide == 72 == sessions_to_decide(0.0, 0.0)
    assert 1 - 0.025 ** (1 / 72) < 0.05 <= 1 - 0.025 ** (1 / 71)
    assert equivalence(0, 72, 0, 72).verdict == "practically equivalent"
    # docs/statistics.md's worked example is worse; the reverse is better.
    assert equivalence(11, 60, 0, 60).verdict == "worse"
    assert equivalence(0, 60, 11, 60).verdict == "better"
    # A significant difference inside the margin is equivalent, and says so.
    # (Fisher's p stands in for Boschloo's, which takes minutes at 5,000 per arm.)
    p = float(sps.fisher_exact([[100, 50], [4900, 4950]]).pvalue)
    small = equivalence(100, 5000, 50, 5000, pvalue=p)
    assert small.verdict == "practically equivalent" and p < 0.001 and "significant" in small.notes[0]
    # A difference of exactly the margin is never equivalent; with enough sessions it shows as a difference.
    assert sessions_to_decide(0.10, 0.05) == 446


@pytest.mark.parametrize("margin", [0.0, 1.0, -0.1])
def test_bad_margin_is_a_usage_error(margin: float) -> None:
    with pytest.raises(UsageError, match="margin must be strictly between 0 and 1"):
        equivalence(0, 10, 0, 10, margin=margin)


def test_false_equivalence_at_the_margin_stays_under_alpha() -> None:
    # Monte Carlo, seeded: true rates 6% and 1% (difference = margin 5 points), 200 per arm.
    rng = np.random.default_rng(7)
    draws = 1500
    wrong = sum(
        equivalence(int(rng.binomial(200, 0.06)), 200, int(rng.binomial(200, 0.01)), 200, pvalue=1.0).verdict
        == "practically equivalent"
        for _ in range(draws)
    )
    assert wrong / draws <= 0.05


def test_mix_shift_finds_a_new_finish_reason_and_not_a_same_mix() -> None:
    same = mix_shift({"stop": 80, "tool_calls": 120}, {"stop": 40, "tool_calls": 60})
    assert same.test == "Fisher exact" and same.pvalue == pytest.approx(1.0)
    moved = mix_shift({"stop": 80, "tool_calls": 120, "length": 0}, {"stop": 60, "tool_calls": 100, "length": 40})
    assert moved.test == "chi-square" and moved.pvalue < 1e-6
    rare = mix_shift({"stop": 30, "tool_calls": 30, "length": 0}, {"stop": 30, "tool_calls": 26, "length": 4})
    assert rare.test.startswith("Fisher exact (Monte Carlo") and 0.0 < rare.pvalue < 1.0
    assert mix_shift({"stop": 3}, {"stop": 5}).note == "one value in both arms"
    assert mix_shift({}, {"stop": 5}).pvalue is None


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["stop", "length", "tool_calls", "none"]), st.integers(0, 50), min_size=1),
       st.dictionaries(st.sampled_from(["stop", "length", "tool_calls", "none"]), st.integers(0, 50), min_size=1))
def test_mix_shift_p_is_a_probability(one: dict[str, int], two: dict[str, int]) -> None:
    result = mix_shift(one, two)
    assert result.pvalue is None or 0.0 <= result.pvalue <= 1.0


def test_rank_and_acceptance_shifts_and_holm_flags() -> None:
    lengths = rank_shift([100.0 + i for i in range(30)], [160.0 + i for i in range(30)], channel="output length",
                         unit="tokens")
    assert lengths.pvalue < 1e-6
    assert rank_shift([5.0] * 10, [5.0] * 10, channel="x", unit="u").note == "every value equal"
    accept = acceptance_counts_shift(750, 1000, 250, 1000)
    assert accept.pvalue < 1e-6 and "750/1000 draft tokens accepted (75%)" in accept.arm1
    assert acceptance_counts_shift(0, 0, 5, 10).pvalue is None
    flagged = flag([lengths, mix_shift({"stop": 10, "x": 10}, {"stop": 10, "x": 10}), acceptance_counts_shift(0, 0, 1, 2)])
    assert [t.shifted for t in flagged] == [True, False, False]
    assert flagged[0].p_adjusted == pytest.approx(min(1.0, 2 * lengths.pvalue))
    assert flagged[2].p_adjusted is None
