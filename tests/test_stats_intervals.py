"""One-rate statistics: Clopper–Pearson, Wilson, upper bounds, timeout bounds and the inconclusive rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from repro.errors import UsageError
from repro.stats import assess_inconclusive, clopper_pearson, timeout_bounds, upper_bound, wilson


def test_worked_upper_bounds_of_statistics_md() -> None:
    assert upper_bound(0, 60) == pytest.approx(0.0487, abs=5e-4)
    assert upper_bound(0, 60) == pytest.approx(1 - 0.05 ** (1 / 60), rel=1e-12)
    # Certifying "below 2%" with no corruption needs 149 clean sessions, and 148 is not enough.
    assert upper_bound(0, 149) < 0.02 <= upper_bound(0, 148)


def test_upper_bound_with_corruption_matches_the_one_sided_exact_bound() -> None:
    # The one-sided 95% bound is the upper end of the two-sided 90% interval.
    assert upper_bound(3, 60) == pytest.approx(clopper_pearson(3, 60, 0.90).high, rel=1e-9)
    assert upper_bound(60, 60) == 1.0


def test_clopper_pearson_published_value() -> None:
    # Brown, Cai & DasGupta style check: 0/10 gives [0, 1 - 0.025**(1/10)] = [0, 0.3085].
    ci = clopper_pearson(0, 10)
    assert ci.low == 0.0 and ci.high == pytest.approx(0.30850, abs=1e-5)
    ci = clopper_pearson(11, 60)
    assert (ci.low, ci.high) == pytest.approx((0.0952, 0.3044), abs=1e-4)
    assert ci.estimate == pytest.approx(11 / 60) and ci.method == "clopper-pearson"


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 2000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
       st.sampled_from([0.8, 0.9, 0.95, 0.99, 0.999]))
def test_clopper_pearson_and_upper_bound_agree_with_scipys_root_finding(kn: tuple[int, int], confidence: float) -> None:
    # The bounds are beta quantiles here; scipy.stats finds the same bounds by solving the binomial tails.
    k, n = kn
    exact = sps.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    ci = clopper_pearson(k, n, confidence)
    assert (ci.low, ci.high) == pytest.approx((exact.low, exact.high), abs=1e-9)
    one_sided = sps.binomtest(k, n, alternative="less").proportion_ci(confidence_level=confidence, method="exact")
    assert upper_bound(k, n, confidence) == pytest.approx(one_sided.high, abs=1e-9)


def test_wilson_published_value() -> None:
    # Newcombe (1998), example 81/263: Wilson 95% interval 0.2553 to 0.3662.
    ci = wilson(81, 263)
    assert (ci.low, ci.high) == pytest.approx((0.2553, 0.3662), abs=1e-4)


def test_no_observations_gives_the_whole_unit_interval() -> None:
    for fn in (clopper_pearson, wilson):
        ci = fn(0, 0)
        assert ci.estimate is None and (ci.low, ci.high) == (0.0, 1.0)
    assert upper_bound(0, 0) == 1.0


@pytest.mark.parametrize(("k", "n", "confidence"), [(-1, 5, 0.95), (6, 5, 0.95), (1, -1, 0.95), (1, 5, 1.0), (1, 5, 0.0), (1.5, 5, 0.95)])
def test_bad_counts_are_usage_errors(k: int, n: int, confidence: float) -> None:
    with pytest.raises(UsageError):
        clopper_pearson(k, n, confidence)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 400), data=st.data(), confidence=st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_intervals_are_ordered_inside_unit_and_contain_the_estimate(n: int, data: st.DataObject, confidence: float) -> None:
    k = data.draw(st.integers(0, n))
    cp, wi = clopper_pearson(k, n, confidence), wilson(k, n, confidence)
    for ci in (cp, wi):
        assert 0.0 <= ci.low <= ci.estimate <= ci.high <= 1.0
    # The one-sided bound at the same confidence is tighter than the two-sided upper end.
    assert upper_bound(k, n, confidence) <= cp.high + 1e-12
    # A one-sided bound only ever gets tighter with more clean evidence.
    assert upper_bound(k, n + 1, confidence) <= upper_bound(k, n, confidence) + 1e-12


def _exact_coverage(interval, p: float, n: int) -> float:
    ks = np.arange(n + 1)
    intervals = [interval(int(k), n) for k in ks]
    inside = np.array([ci.low <= p <= ci.high for ci in intervals])
    return float(sps.binom.pmf(ks, n, p)[inside].sum())


@pytest.mark.parametrize(("p", "n"), [(0.01, 60), (0.12, 60), (0.02, 149), (0.3, 25), (0.5, 40)])
def test_clopper_pearson_coverage_is_at_least_nominal(p: float, n: int) -> None:
    # Exact coverage (every outcome weighted by its probability) and a seeded simulation both agree.
    assert _exact_coverage(clopper_pearson, p, n) >= 0.95
    rng = np.random.default_rng(1234)
    draws = rng.binomial(n, p, size=2000)
    cache = {k: clopper_pearson(k, n) for k in set(draws.tolist())}
    hits = np.mean([cache[k].low <= p <= cache[k].high for k in draws.tolist()])
    assert hits >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / 2000)


def test_wilson_coverage_can_dip_below_nominal_where_clopper_pearson_does_not() -> None:
    # Why Clopper–Pearson is the reported interval: Wilson undercovers for small p.
    assert _exact_coverage(wilson, 0.002, 60) < 0.95 <= _exact_coverage(clopper_pearson, 0.002, 60)


def test_timeout_bounds_bracket_the_rate() -> None:
    worst, best = timeout_bounds(corrupt=2, clean=40, timeout=18)
    assert worst.estimate == pytest.approx(20 / 60) and best.estimate == pytest.approx(2 / 60)
    assert worst.low > best.low and worst.high > best.high
    assert "corrupt" in worst.method and "clean" in best.method
    with pytest.raises(UsageError, match="timeout"):
        timeout_bounds(1, 1, -1)


def test_mostly_timeouts_is_never_zero_corruption() -> None:
    # The seed's first HiCache-off run: 0 corrupt, 26 clean, 34 timed out.
    verdict = assess_inconclusive(clean=26, corrupt=0, timeout=34)
    assert verdict.inconclusive
    assert "34 of 60 sessions (57%) timed out (limit 20%)" in verdict.reasons
    assert any("disagree" in r and "any corruption" in r for r in verdict.reasons)


def test_too_few_completed() -> None:
    verdict = assess_inconclusive(clean=10, corrupt=2, timeout=0, error=48)
    assert verdict.reasons == ["only 12 of 60 sessions completed (minimum 20)"]


def test_threshold_disagreement_names_the_threshold() -> None:
    # 149 clean certify "below 2%" in the best case; two timeouts as corrupt break the certificate.
    assert not assess_inconclusive(clean=149, corrupt=0, timeout=0, threshold=0.02).inconclusive
    verdict = assess_inconclusive(clean=149, corrupt=0, timeout=2, threshold=0.02)
    assert verdict.reasons == [
        "worst case (timeouts corrupt) and best case (timeouts clean) disagree about the 2% threshold"
    ]


def test_clear_corruption_with_a_few_timeouts_is_conclusive() -> None:
    # Both cases agree that there is corruption, and the timeouts are under the limit.
    assert assess_inconclusive(clean=49, corrupt=11, timeout=3).inconclusive is False
    # Both cases agree the rate is not certifiably below 2%.
    assert assess_inconclusive(clean=49, corrupt=11, timeout=3, threshold=0.02).inconclusive is False


def test_assess_rejects_bad_arguments() -> None:
    with pytest.raises(UsageError, match="error"):
        assess_inconclusive(1, 1, 1, -2)
    with pytest.raises(UsageError, match="threshold"):
        assess_inconclusive(1, 1, 1, threshold=2.0)


def test_every_public_name_is_importable_from_repro_stats() -> None:
    import repro.stats

    names = """Interval clopper_pearson wilson upper_bound timeout_bounds Inconclusive assess_inconclusive
        Comparison compare newcombe_difference holm benjamini_hochberg power_two_proportions sample_size_two_proportions
        SequentialDecision paired_sequential sprt_single confidence_sequence bisect_probe_sessions
        StratifiedResult stratified_exact_test cmh
        EquivalenceResult equivalence sessions_to_decide ChannelTest mix_shift rank_shift acceptance_counts_shift""".split()
    assert sorted(names) == sorted(repro.stats.__all__)
    assert all(hasattr(repro.stats, name) for name in names)
