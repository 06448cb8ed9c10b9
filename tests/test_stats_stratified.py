"""Stratified tests of a common odds ratio: published values, reduction to Fisher, zero cells."""

from __future__ import annotations

import math
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps
from scipy.stats.contingency import odds_ratio

from repro.errors import UsageError
from repro.stats import cmh, compare, stratified_exact_test

# R's `Rabbits` data (penicillin levels as strata) as (cured_none, died_none, cured_delay, died_delay).
RABBITS = [(0, 6, 0, 5), (3, 3, 0, 6), (6, 0, 2, 4), (5, 1, 6, 0), (2, 0, 5, 0)]


def test_exact_test_reproduces_r_mantelhaen_exact() -> None:
    # R: mantelhaen.test(Rabbits, exact = TRUE): S = 16, p = 0.03994, OR 10.36102, CI 1.077401 to 529.8374.
    r = stratified_exact_test(RABBITS)
    assert r.p_value == pytest.approx(0.03994, abs=1e-5)
    assert r.odds_ratio == pytest.approx(10.36102, rel=1e-4)
    assert r.or_low == pytest.approx(1.077401, rel=1e-4)
    # R's root finder stops early on the far upper end, as in fisher.test (622 vs scipy's 626).
    assert r.or_high == pytest.approx(529.8374, rel=0.01)


def test_cmh_reproduces_r_mantelhaen() -> None:
    # R: mantelhaen.test(Rabbits): X-squared = 3.9286, p = 0.04747, OR 7, CI 1.026713 to 47.725133.
    r = cmh(RABBITS)
    assert r.p_value == pytest.approx(0.04747, abs=1e-5)
    assert r.odds_ratio == pytest.approx(7.0)
    assert (r.or_low, r.or_high) == pytest.approx((1.026713, 47.725133), rel=1e-5)
    assert r.notes == ()


@settings(max_examples=40, deadline=None)
@given(st.tuples(*[st.integers(0, 12)] * 4))
def test_one_stratum_is_fishers_exact_test(table: tuple[int, int, int, int]) -> None:
    a, b, c, d = table
    r = stratified_exact_test([table])
    assert r.p_value == pytest.approx(sps.fisher_exact([[a, b], [c, d]]).pvalue, rel=1e-6, abs=1e-12)
    if a + b and c + d and a + c and b + d:
        ref = odds_ratio([[a, b], [c, d]], kind="conditional")
        ci = ref.confidence_interval()
        assert r.odds_ratio == pytest.approx(ref.statistic, rel=1e-5)
        assert (r.or_low, r.or_high) == pytest.approx((ci.low, ci.high), rel=1e-5)
        assert r.or_low <= r.odds_ratio <= r.or_high


def test_stratifying_removes_a_confounded_effect() -> None:
    # Arm a ran mostly with a flag that corrupts; within each level of that flag a and b do the same.
    strata = [(10, 40, 2, 8), (0, 10, 0, 50)]
    pooled = compare(10, 60, 2, 60)
    assert pooled.p_fisher < 0.05
    exact, mh = stratified_exact_test(strata), cmh(strata)
    assert exact.p_value > 0.5 and mh.p_value > 0.5
    assert exact.odds_ratio == pytest.approx(1.0, rel=1e-6) and mh.odds_ratio == pytest.approx(1.0)


def test_uninformative_strata_change_nothing() -> None:
    padded = [*RABBITS, (0, 0, 0, 0), (0, 5, 0, 7), (4, 0, 0, 0), (0, 0, 3, 3)]
    assert stratified_exact_test(padded) == stratified_exact_test(RABBITS)
    assert cmh(padded) == cmh(RABBITS)


def test_zero_cells_fall_back_without_warnings() -> None:
    # Every corrupt session in arm a: the Mantel-Haenszel estimate is infinite and statsmodels'
    # interval divides by zero; the exact interval replaces it.
    strata = [(11, 49, 0, 60), (5, 10, 0, 10)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mh, exact = cmh(strata), stratified_exact_test(strata)
    assert mh.odds_ratio == math.inf and exact.odds_ratio == math.inf
    assert (mh.or_low, mh.or_high) == (exact.or_low, exact.or_high)
    assert exact.or_low > 1 and exact.or_high == math.inf and exact.p_value < 0.001
    assert "exact" in mh.notes[0]
    reverse = stratified_exact_test([(0, 60, 11, 49)])
    assert reverse.odds_ratio == 0.0 and reverse.or_low == 0.0 and reverse.or_high < 1


def test_nothing_to_test() -> None:
    for fn in (stratified_exact_test, cmh):
        r = fn([(0, 0, 0, 0), (0, 5, 0, 5)])
        assert r.p_value == 1.0 and r.odds_ratio is None and r.notes


@pytest.mark.parametrize("tables", [[], [(1, 2, 3)], [(1, 2, 3, -1)], [(1, 2.5, 3, 1)]])
def test_bad_tables_are_usage_errors(tables: list) -> None:
    with pytest.raises(UsageError):
        stratified_exact_test(tables)
