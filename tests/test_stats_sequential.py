"""Sequential stopping: paired SPRT, single-arm SPRT, the confidence sequence, and the probe size for bisection."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from repro.errors import UsageError
from repro.stats import (
    bisect_probe_sessions,
    clopper_pearson,
    confidence_sequence,
    paired_sequential,
    sprt_single,
)


def test_probe_sessions_of_statistics_md() -> None:
    assert bisect_probe_sessions(0.12, 1000, 0.05) == 42
    # The defining property: a bad commit slips through all ceil(log2 C) probes with chance <= delta,
    # and one session fewer would not be enough.
    for p_bad, commits, delta in [(0.12, 1000, 0.05), (0.3, 50, 0.01), (0.02, 3, 0.1)]:
        k, steps = bisect_probe_sessions(p_bad, commits, delta), math.ceil(math.log2(commits))
        assert steps * (1 - p_bad) ** k <= delta < steps * (1 - p_bad) ** (k - 1)


@pytest.mark.parametrize(("args", "match"), [((0.0, 100), "p_bad"), ((0.1, 1), "commits"), ((0.1, 10, 1.5), "delta")])
def test_probe_sessions_rejects_bad_arguments(args: tuple, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        bisect_probe_sessions(*args)


def test_paired_decisions() -> None:
    assert paired_sequential(7, 0).decision == "a_worse"
    assert paired_sequential(0, 7).decision == "b_worse"
    assert paired_sequential(3, 3).decision == "no_difference"
    assert paired_sequential(2, 0).decision == "continue"
    assert paired_sequential(2, 0, pairs=300, max_n=300).decision == "inconclusive"
    # Without `pairs`, the cap counts discordant pairs; a decision reached at the cap stands.
    assert paired_sequential(1, 1, max_n=2).decision == "inconclusive"
    assert paired_sequential(7, 0, pairs=500, max_n=300).decision == "a_worse"
    # One-sided: B being worse is no evidence that A is.
    assert paired_sequential(0, 7, two_sided=False).decision == "no_difference"
    d = paired_sequential(5, 0, two_sided=False)
    assert d.decision == "a_worse" and d.upper == pytest.approx(math.log(0.9 / 0.05))
    assert d.lower < 0 < d.llr


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"p1": 0.4}, "p1"), ({"p0": 0.95}, "p0"), ({"alpha": 0.0}, "alpha"), ({"max_n": 0}, "max_n"), ({"beta": 1.0}, "beta")],
)
def test_paired_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        paired_sequential(1, 1, **kwargs)
    with pytest.raises(UsageError, match="discordant_b"):
        paired_sequential(1, -1)


def _simulate_pairs(rate_a: float, rate_b: float, reps: int, seed: int) -> tuple[dict[str, float], float]:
    """Run the paired procedure pair by pair until it stops; share of each decision and mean pairs used."""
    rng = np.random.default_rng(seed)
    cap = 300
    decisions: dict[str, int] = {}
    used = []
    for _ in range(reps):
        a_corrupt = rng.random(cap) < rate_a
        b_corrupt = rng.random(cap) < rate_b
        only_a = np.cumsum(a_corrupt & ~b_corrupt)
        only_b = np.cumsum(b_corrupt & ~a_corrupt)
        # The decision can only change on a discordant pair, or at the cap.
        looks = [*np.flatnonzero(a_corrupt != b_corrupt), cap - 1]
        for i in looks:
            d = paired_sequential(int(only_a[i]), int(only_b[i]), pairs=int(i) + 1, max_n=cap)
            if d.decision != "continue":
                break
        decisions[d.decision] = decisions.get(d.decision, 0) + 1
        used.append(int(i) + 1)
    return {k: v / reps for k, v in decisions.items()}, float(np.mean(used))


def test_paired_sequential_power_and_false_positives_by_simulation() -> None:
    found, pairs = _simulate_pairs(0.12, 0.01, reps=600, seed=11)
    assert found.get("a_worse", 0) >= 0.9 and found.get("b_worse", 0) == 0
    assert pairs < 120  # the fixed design needs ~70 per arm for 80% power
    # With no difference the false-positive rate stays within Wald's bound alpha/(1-beta).
    null, _ = _simulate_pairs(0.12, 0.12, reps=600, seed=12)
    wrong = null.get("a_worse", 0) + null.get("b_worse", 0)
    assert wrong <= 0.05 / 0.9 + 3 * math.sqrt(0.056 * 0.944 / 600)


def test_single_arm_sprt() -> None:
    assert sprt_single(0, 60, 0.02, 0.12).decision == "accept_p0"
    assert sprt_single(5, 20, 0.02, 0.12).decision == "accept_p1"
    assert sprt_single(1, 10, 0.02, 0.12).decision == "continue"
    assert sprt_single(1, 10, 0.02, 0.12, max_n=10).decision == "inconclusive"
    with pytest.raises(UsageError, match="differ"):
        sprt_single(1, 10, 0.1, 0.1)
    with pytest.raises(UsageError, match="p1"):
        sprt_single(1, 10, 0.1, 1.0)


def test_single_arm_sprt_error_rates_by_simulation() -> None:
    rng = np.random.default_rng(5)

    def wrong_share(true_rate: float, wrong: str) -> float:
        count = 0
        for _ in range(800):
            k = 0
            for n, corrupt in enumerate(rng.random(400) < true_rate, start=1):
                k += int(corrupt)
                d = sprt_single(k, n, 0.02, 0.12, max_n=400).decision
                if d != "continue":
                    break
            count += d == wrong
        return count / 800

    assert wrong_share(0.02, "accept_p1") <= 0.05 / 0.9 + 0.025
    assert wrong_share(0.12, "accept_p0") <= 0.1 / 0.95 + 0.03


def test_confidence_sequence_contains_the_fixed_n_interval_and_is_about_1_5_times_wider() -> None:
    for n in (1, 2, 5, 10, 30, 60):
        for k in range(n + 1):
            cs, cp = confidence_sequence(k, n), clopper_pearson(k, n)
            assert cs.low <= cp.low + 1e-9 and cp.high <= cs.high + 1e-9
            assert cs.low <= cs.estimate <= cs.high
    ratio = (lambda cs, cp: (cs.high - cs.low) / (cp.high - cp.low))(confidence_sequence(11, 60), clopper_pearson(11, 60))
    assert 1.3 < ratio < 1.7
    empty = confidence_sequence(0, 0)
    assert empty.estimate is None and (empty.low, empty.high) == (0.0, 1.0)
    assert empty.method == "beta-binomial mixture CS" and empty.confidence == 0.95
    with pytest.raises(UsageError, match="prior"):
        confidence_sequence(1, 2, prior=(0.0, 1.0))


@pytest.mark.parametrize("rate", [0.02, 0.12])
def test_confidence_sequence_is_valid_at_every_look_by_simulation(rate: float) -> None:
    # Look after every session up to 150: the CS may exclude the true rate at some look in at most
    # alpha of the runs; the fixed-n Clopper-Pearson interval, looked at as often, fails far more.
    rng = np.random.default_rng(3)
    paths = np.cumsum(rng.random((1000, 150)) < rate, axis=1)
    n = np.broadcast_to(np.arange(1, 151), paths.shape)
    seen = np.unique(np.stack([paths.ravel(), n.ravel()], axis=1), axis=0)
    low, high = np.zeros((151, 151)), np.ones((151, 151))
    for k, m in seen:
        cs = confidence_sequence(int(k), int(m))
        low[k, m], high[k, m] = cs.low, cs.high
    cs_failures = np.mean(((rate < low[paths, n]) | (rate > high[paths, n])).any(axis=1))
    slack = 3 * math.sqrt(0.05 * 0.95 / 1000)
    assert cs_failures <= 0.05 + slack
    n = np.arange(1, 151)
    cp_low = np.where(paths > 0, sps.beta.ppf(0.025, paths, n - paths + 1), 0.0)
    cp_high = np.where(paths < n, sps.beta.isf(0.025, paths + 1, n - paths), 1.0)
    cp_failures = np.mean(((rate < cp_low) | (rate > cp_high)).any(axis=1))
    assert cp_failures > 0.05 + slack > cs_failures
