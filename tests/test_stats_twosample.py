"""A/B comparisons and multiplicity corrections against docs/statistics.md and published values."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.errors import UsageError
from repro.stats import benjamini_hochberg, compare, holm, newcombe_difference


def test_worked_example_of_statistics_md() -> None:
    c = compare(11, 60, 0, 60)
    assert c.p_fisher == pytest.approx(5.9e-4, rel=0.01)
    assert c.difference == pytest.approx(0.18, abs=0.005)
    assert (c.diff_low, c.diff_high) == pytest.approx((0.085, 0.299), abs=5e-4)
    # docs/statistics.md: two-sided 3.3e-4, one-sided 1.66e-4. The often quoted 2.4e-4 is scipy's answer for
    # the transposed table (arms as rows); with arms as columns, as scipy documents, the two-sided p is twice
    # the one-sided one, which an independent grid search over the nuisance rate reproduces (1.655e-4).
    assert c.p_boschloo == pytest.approx(3.31e-4, rel=0.01)
    assert compare(11, 60, 0, 60, alternative="greater").p_boschloo == pytest.approx(1.655e-4, rel=0.01)
    assert c.p_boschloo < c.p_fisher
    assert c.odds_ratio == float("inf") and c.or_low == pytest.approx(2.863, abs=1e-3)
    assert c.notes == ()


def test_direction_of_one_sided_alternatives() -> None:
    assert compare(11, 60, 0, 60, alternative="less").p_boschloo == pytest.approx(1.0)
    assert compare(0, 60, 11, 60, alternative="less").p_fisher < 0.001


def test_boschloo_published_value_from_scipy_docs() -> None:
    # scipy's example table [[74, 31], [43, 32]]: arm 1 is 74 of 117, arm 2 is 31 of 63; p = 0.0355.
    assert compare(74, 117, 31, 63, alternative="greater").p_boschloo == pytest.approx(0.0355, abs=1e-4)


def test_fisher_and_exact_odds_ratio_on_the_tea_tasting_table() -> None:
    # R's fisher.test(matrix(c(3, 1, 1, 3), 2)): p = 0.4857, OR 6.408, 95% CI 0.2117 to ~622.
    c = compare(3, 4, 1, 4)
    assert c.p_fisher == pytest.approx(0.4857, abs=1e-4)
    assert c.odds_ratio == pytest.approx(6.408, abs=1e-3)
    assert c.or_low == pytest.approx(0.2117, abs=1e-3)
    assert c.or_high == pytest.approx(622, rel=0.01)


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        # Newcombe (1998), Statistics in Medicine 17:873, Table II, method 10.
        ((56, 70, 48, 80), (0.0524, 0.3339)),
        ((9, 10, 3, 10), (0.1705, 0.8090)),
        ((6, 7, 2, 7), (0.0582, 0.8062)),
        ((5, 56, 0, 29), (-0.0381, 0.1926)),
    ],
)
def test_newcombe_published_intervals(counts: tuple[int, int, int, int], expected: tuple[float, float]) -> None:
    c = compare(*counts)
    assert (c.diff_low, c.diff_high) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(
    ("counts", "note"),
    [((0, 60, 0, 60), "odds ratio undefined"), ((60, 60, 60, 60), "odds ratio undefined"),
     ((0, 0, 3, 60), "arm 1 had no completed"), ((0, 0, 0, 0), "both arms")],
)
def test_degenerate_tables_give_results_and_say_why(counts: tuple[int, int, int, int], note: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = compare(*counts)
    assert c.p_boschloo == 1.0 and c.p_fisher == 1.0
    assert c.odds_ratio is None
    assert any(note in n for n in c.notes)


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="k2"):
        compare(1, 10, 11, 10)
    with pytest.raises(UsageError, match="alternative"):
        compare(1, 10, 1, 10, alternative="bigger")  # type: ignore[arg-type]


@settings(max_examples=15, deadline=None)
@given(n1=st.integers(1, 40), n2=st.integers(1, 40), data=st.data())
def test_comparison_properties(n1: int, n2: int, data: st.DataObject) -> None:
    k1, k2 = data.draw(st.integers(0, n1)), data.draw(st.integers(0, n2))
    c = compare(k1, n1, k2, n2)
    assert 0.0 <= c.p_boschloo <= 1.0 and 0.0 <= c.p_fisher <= 1.0
    # One-sided, Boschloo is uniformly at least as powerful: never a larger p-value than Fisher's (up
    # to its optimiser). Two-sided it may be larger: scipy doubles the smaller one-sided p for Boschloo
    # but sums the tables no likelier than observed for Fisher.
    one_sided = compare(k1, n1, k2, n2, alternative="greater")
    assert one_sided.p_boschloo <= one_sided.p_fisher + 1e-6
    assert -1.0 <= c.diff_low <= c.difference <= c.diff_high <= 1.0
    swapped = compare(k2, n2, k1, n1)
    assert swapped.p_fisher == pytest.approx(c.p_fisher)
    assert (swapped.diff_low, swapped.diff_high) == pytest.approx((-c.diff_high, -c.diff_low), abs=1e-9)


def test_the_difference_interval_stays_within_minus_one_and_one() -> None:
    # A case hypothesis found: statsmodels' bound was 1.0000000000000002.
    assert newcombe_difference(27, 27, 0, 1) == pytest.approx((0.19683255422718404, 1.0)) and compare(27, 27, 0, 1).diff_high == 1.0
    assert newcombe_difference(0, 1, 27, 27)[0] == -1.0


def test_holm_and_benjamini_hochberg_by_hand() -> None:
    p = [0.01, 0.04, 0.03, 0.005]
    # Holm: sorted p times 4, 3, 2, 1, made monotone: 0.02, 0.03, 0.06, max(0.04, 0.06).
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # BH: sorted p times 4/rank, made monotone from the top: 0.02, 0.02, 0.04, 0.04.
    assert benjamini_hochberg(p) == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert holm([]) == [] and benjamini_hochberg([]) == []
    with pytest.raises(ValueError, match="p-value 1"):
        holm([0.1, 1.5])
    with pytest.raises(ValueError, match="p-value 0"):
        benjamini_hochberg([float("nan")])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12))
def test_adjusted_p_values_are_no_smaller_and_bh_no_larger_than_holm(p: list[float]) -> None:
    h, b = holm(p), benjamini_hochberg(p)
    for raw, hp, bp in zip(p, h, b):
        assert raw <= bp + 1e-12 and bp <= hp + 1e-12 and hp <= 1.0


# Few examples: statsmodels, the independent reference, runs gc.collect() on every call (~0.2 s with scipy loaded).
@settings(max_examples=8, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12))
def test_holm_agrees_with_statsmodels(p: list[float]) -> None:
    from statsmodels.stats.multitest import multipletests

    assert holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]), abs=1e-12)
