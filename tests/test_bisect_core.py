"""The pure decisions of `repro bisect`: the commit posterior, the next probe, the stop rule, the probe
verdict, ddmin, and the journal that lets a bisection resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.bisect.commits import Ended, decide, decide_many
from repro.bisect.ddmin import ddmin
from repro.bisect.direction import Searched
from repro.bisect.journal import PROBES, Journal, ProbeRecord
from repro.bisect.posterior import (
    Model,
    Observation,
    ProbePlan,
    judge_probe,
    next_commit,
    posterior,
    should_stop,
    spread_commits,
)
from repro.bisect.probe import ProbeSettings
from repro.errors import UsageError

observations = st.lists(
    st.tuples(st.integers(0, 15), st.integers(0, 40), st.integers(0, 40)).map(
        lambda t: Observation(t[0], min(t[1], t[2]), max(t[1], t[2]))
    ),
    max_size=12,
)


@given(observations)
def test_posterior_is_a_distribution(obs: list[Observation]) -> None:
    post = posterior(16, obs)
    assert post.culprit[0] == 0.0
    assert np.all(post.culprit >= 0)
    assert post.culprit.sum() + post.none == pytest.approx(1.0)
    assert 0.0 < post.bad_rate < 1.0


@given(observations, st.integers(1, 15), st.integers(1, 10))
def test_corruption_at_a_commit_makes_it_likelier_bad(obs: list[Observation], index: int, corrupt: int) -> None:
    before = posterior(16, obs).bad_probability()[index]
    # Only corrupt sessions: mixed counts may lower the estimated bad rate and with it this probability.
    after = posterior(16, [*obs, Observation(index, corrupt, corrupt)]).bad_probability()[index]
    assert after >= before - 1e-12


def _search(commits: int, culprit: int, *, rate: float = 0.5, sessions: int = 20, max_probes: int = 40) -> tuple:
    """A search against a noiseless oracle: a bad commit shows `rate` of its sessions corrupt, a good one none."""
    model = Model()
    obs: list[Observation] = []

    def probe(i: int) -> Observation:
        corrupt = round(rate * sessions) if i >= culprit else 0
        return Observation(i, corrupt, sessions)

    obs.append(probe(commits - 1))
    while True:
        post = posterior(commits, obs, model)
        stop = should_stop(post, confidence=0.95, probes=len(obs), sessions=0, max_probes=max_probes, max_sessions=10**9)
        if stop is not None:
            return stop, len(obs)
        nxt = next_commit(post, sessions, model.good_rate)
        assert nxt is not None
        obs.append(probe(nxt))


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 64).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n - 1))))
def test_search_finds_the_culprit_anywhere_in_the_range(case: tuple[int, int]) -> None:
    commits, culprit = case
    stop, probes = _search(commits, culprit)
    assert (stop.reason, stop.commit) == ("found", culprit)
    # About a bisection's worth of probes, plus the bad end and a few re-checks near the boundary.
    assert probes <= np.ceil(np.log2(commits)) + 6


def test_no_culprit_when_the_bad_end_never_corrupts() -> None:
    obs = [Observation(63, 0, 60), Observation(63, 0, 60)]
    stop = should_stop(posterior(64, obs), confidence=0.95, probes=2, sessions=120, max_probes=30, max_sessions=10**6)
    assert stop is not None and stop.reason == "no_culprit"


def test_a_corrupt_bad_end_rules_out_no_culprit() -> None:
    post = posterior(64, [Observation(63, 9, 60)])
    assert post.none < 1e-6
    assert 0.1 < post.bad_rate < 0.2


def test_budget_and_stuck_end_the_search_with_the_likeliest_commit() -> None:
    post = posterior(8, [Observation(7, 5, 30), Observation(4, 3, 30)])
    stop = should_stop(post, confidence=0.95, probes=2, sessions=60, max_probes=2, max_sessions=1000)
    assert stop is not None and stop.reason == "budget" and stop.commit in range(1, 5)
    stuck = should_stop(post, confidence=0.95, probes=2, sessions=60, max_probes=9, max_sessions=1000, stuck=True)
    assert stuck is not None and stuck.reason == "stuck"


def test_next_commit_steers_around_skipped_commits() -> None:
    post = posterior(16, [Observation(15, 6, 30)])
    first = next_commit(post, 30, 0.001)
    assert first is not None
    second = next_commit(post, 30, 0.001, frozenset({first}))
    assert second is not None and second != first
    assert next_commit(post, 30, 0.001, frozenset(range(16))) is None


@given(st.integers(0, 30), st.integers(0, 60), st.integers(0, 60))
def test_a_probe_with_many_unfinished_sessions_is_never_good(corrupt: int, clean: int, unfinished: int) -> None:
    for mode in ("sequential", "fixed"):
        plan = ProbePlan(mode, 16, 64, bad_rate=0.15, good_rate=0.001)
        verdict = judge_probe(plan, corrupt, corrupt + clean, unfinished)
        if unfinished > 0.2 * (corrupt + clean + unfinished):
            assert verdict == "inconclusive"
        if verdict == "good":
            assert corrupt == 0 or mode == "sequential"


def test_probe_verdicts() -> None:
    seq = ProbePlan("sequential", 16, 64, bad_rate=0.15, good_rate=0.001)
    assert judge_probe(seq, 1, 4, 0) == "bad"
    # One corrupt in 16 is weaker evidence of the bad rate 0.15 than one in 4: Wald's SPRT waits.
    assert judge_probe(seq, 1, 16, 0) == "continue"
    assert judge_probe(seq, 0, 16, 0) == "continue"
    assert judge_probe(seq, 0, 32, 0) == "good"
    # 2 of 64 sits between the rates at the cap: undecided, its counts still evidence.
    assert judge_probe(seq, 2, 64, 0) == "undecided"
    fixed = ProbePlan("fixed", 32, 32, bad_rate=0.15, good_rate=0.001)
    assert judge_probe(fixed, 0, 32, 0) == "good"
    assert judge_probe(fixed, 0, 16, 0) == "continue"
    assert judge_probe(fixed, 1, 5, 0) == "bad"
    assert judge_probe(fixed, 0, 20, 12) == "inconclusive"
    with pytest.raises(UsageError, match="bad rate"):
        ProbePlan("fixed", 8, 8, bad_rate=0.0005, good_rate=0.001)


@settings(max_examples=200)
@given(st.integers(1, 30).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1, max_size=3))))
def test_ddmin_finds_exactly_the_changes_that_fail_together(case: tuple[int, set[int]]) -> None:
    size, culprits = case
    tested: list[tuple[int, ...]] = []

    def test(subset: tuple[int, ...]) -> str:
        tested.append(subset)
        return "fail" if culprits <= set(subset) else "pass"

    assert set(ddmin(range(size), test)) == culprits
    assert all(list(t) == sorted(t) for t in tested)


@settings(max_examples=200)
@given(st.integers(2, 20), st.sets(st.integers(0, 19), min_size=1, max_size=2), st.randoms(use_true_random=False))
def test_ddmin_with_inconclusive_tests_still_returns_a_failing_set(size: int, culprits: set[int], rnd) -> None:
    culprits = {c % size for c in culprits}

    def test(subset: tuple[int, ...]) -> str:
        if culprits <= set(subset):
            return "fail"
        return "inconclusive" if rnd.random() < 0.3 else "pass"

    result = ddmin(range(size), test)
    assert culprits <= set(result)


@settings(max_examples=200)
@given(st.integers(2, 24), st.sets(st.integers(0, 23), min_size=1, max_size=3), st.integers(2, 5))
def test_ddmin_with_tests_at_once_returns_the_one_at_a_time_result(size: int, culprits: set[int], parallel: int) -> None:
    culprits = {c % size for c in culprits}

    def test(subset: tuple[int, ...]) -> str:
        return "fail" if culprits <= set(subset) else "pass"

    batches: list[list[tuple[int, ...]]] = []
    result = ddmin(range(size), test, parallel=parallel, ahead=batches.append)
    assert result == ddmin(range(size), test) and set(result) == culprits
    assert all(2 <= len(batch) <= parallel for batch in batches)


def test_journal_keeps_probes_ignores_a_torn_line_and_refuses_other_settings(tmp_path) -> None:
    setup = {"kind": "commits", "commits": ["a", "b"], "confidence": 0.95}
    journal = Journal(tmp_path / "b", setup, resume=False)
    journal.append(ProbeRecord(number=1, target="b", index=1, verdict="bad", corrupt=3, clean=20))
    with open(tmp_path / "b" / PROBES, "a", encoding="utf-8") as fh:
        fh.write('{"number": 2, "target": "a", "verd')
    again = Journal(tmp_path / "b", setup, resume=True)
    assert [(p.number, p.verdict, p.completed) for p in again.probes()] == [(1, "bad", 23)]
    with pytest.raises(UsageError, match="confidence"):
        Journal(tmp_path / "b", {**setup, "confidence": 0.99}, resume=True)
    with pytest.raises(UsageError, match="not empty"):
        Journal(tmp_path / "b", setup, resume=False)
    first = again.probe_dir(2, "a")
    (first / "x").write_text("partial")
    second = again.probe_dir(2, "a")
    assert second == first and not any(second.iterdir())
    assert (first.parent / f"{first.name}.partial-1" / "x").exists()
    again.write_state({"probes": 1})
    assert json.loads((tmp_path / "b" / "bisect.json").read_text()) == {"probes": 1}


def _drawn_search(commits: int, culprit: int | None, rate: float, seed: int, broken: frozenset[int] = frozenset(),
                  parallel: int = 1):
    """`bisect commits`' own decisions against probes drawn at `rate` (bad commits) and 0 (good ones);
    with `parallel` > 1 each step's probes are drawn together, as if run at once; (end, records, steps)."""
    rng = np.random.default_rng(seed)
    settings = ProbeSettings(load={}, round_sessions=16, max_rounds=1)
    records: list[ProbeRecord] = []
    steps = 0
    while True:
        batch = decide_many(commits, records, Model(), settings, parallel=parallel, confidence=0.95,
                            max_probes=60, max_sessions=5000)
        if isinstance(batch, Ended):
            return batch, records, steps
        steps += 1
        for nxt in batch:
            if nxt.index in broken:
                records.append(ProbeRecord(number=len(records) + 1, target="", index=nxt.index, verdict="inconclusive",
                                           message="build failed"))
                continue
            truth = rate if culprit is not None and nxt.index >= culprit else 0.0
            corrupt = clean = 0
            while True:
                k = int(rng.binomial(nxt.plan.round_sessions, truth))
                corrupt, clean = corrupt + k, clean + nxt.plan.round_sessions - k
                verdict = judge_probe(nxt.plan, corrupt, corrupt + clean, 0)
                if verdict != "continue":
                    break
            records.append(ProbeRecord(number=len(records) + 1, target="", index=nxt.index, verdict=verdict,
                                       corrupt=corrupt, clean=clean))


@pytest.mark.parametrize("culprit", [1, 63])
def test_a_culprit_at_either_end_is_named_on_a_flaky_signal(culprit: int) -> None:
    for seed in range(5):
        step, records, _ = _drawn_search(64, culprit, 0.15, seed)
        assert step.stop is not None and (step.stop.reason, step.stop.commit) == ("found", culprit), (seed, records)
        assert records[0].index == 63


def test_a_range_with_no_culprit_says_so() -> None:
    step, records, _ = _drawn_search(64, None, 0.15, 0)
    assert step.stop is not None and step.stop.reason == "no_culprit"
    assert all(r.corrupt == 0 for r in records)


def test_inconclusive_commits_are_steered_around_and_never_reprobed() -> None:
    # The commit before the culprit does not build: once 7 is good and 9 bad, only 8 or 9 can be to blame,
    # and no probe left can tell them apart. The search says so instead of probing on.
    step, records, _ = _drawn_search(16, 9, 0.3, 1, broken=frozenset({8}))
    assert sum(r.index == 8 for r in records) == 1
    assert step.stop is not None and step.stop.reason == "stuck"
    assert {i for i, _ in step.posterior.top(2)} == {8, 9}
    assert step.posterior.culprit[8] + step.posterior.culprit[9] > 0.95
    # Elsewhere an unbuildable commit only costs its own failed build.
    step, records, _ = _drawn_search(16, 9, 0.3, 1, broken=frozenset({4, 12}))
    assert step.stop is not None and (step.stop.reason, step.stop.commit) == ("found", 9)
    assert sum(r.index in (4, 12) for r in records) <= 2


@pytest.mark.parametrize("culprit", [1, 40, 63])
def test_probes_at_once_name_the_same_culprit_in_fewer_steps(culprit: int) -> None:
    for seed in range(5):
        one, _, one_steps = _drawn_search(64, culprit, 0.15, seed)
        four, records, four_steps = _drawn_search(64, culprit, 0.15, seed, parallel=4)
        assert four.stop is not None and (four.stop.reason, four.stop.commit) == ("found", culprit), (seed, records)
        assert records[0].index == 63 and four_steps < one_steps
    # A lost probe is no evidence and marks nothing: the same commit is chosen again.
    settings = ProbeSettings(load={}, round_sessions=16, max_rounds=1)
    lost = [ProbeRecord(number=1, target="", index=63, verdict="lost", message="node died")]
    again = decide(64, lost, Model(), settings, confidence=0.95, max_probes=30, max_sessions=1000)
    assert not isinstance(again, Ended) and again.index == 63


def test_probes_at_once_split_the_doubt_at_the_posteriors_quantiles() -> None:
    post = posterior(17, [Observation(16, 5, 16)], Model())  # the bad end only: the culprit anywhere in 1..16
    picks = spread_commits(post, 3, 16, 0.001)
    bad = post.bad_probability()
    assert picks == sorted(picks) and len(set(picks)) == 3
    assert [abs(bad[i] - q) < 1 / 16 for i, q in zip(picks, (0.25, 0.5, 0.75))] == [True] * 3
    assert picks == [4, 8, 12]
    # The doubt on one commit (9 or 10 is the culprit): every probe of the step goes there; skipped, none is left.
    sharp = posterior(17, [Observation(16, 5, 16), Observation(8, 0, 64), Observation(10, 9, 32)], Model())
    assert spread_commits(sharp, 2, 16, 0.001) == [9, 9]
    assert spread_commits(sharp, 2, 16, 0.001, skip=frozenset({9})) == []


def test_a_bad_end_that_cannot_be_probed_ends_the_search() -> None:
    settings = ProbeSettings(load={})
    records = [ProbeRecord(number=1, target="", index=15, verdict="inconclusive", message="start failed")]
    step = decide(16, records, Model(), settings, confidence=0.95, max_probes=30, max_sessions=1000)
    assert isinstance(step, Ended) and step.stop is None


@pytest.mark.parametrize("fix", [1, 4, 11])
def test_find_fix_searches_newest_first_and_names_the_first_good_commit(fix: int) -> None:
    # 12 commits, history order: those before `fix` corrupt 3 of 16 sessions, the fix and later ones none.
    searched = Searched("fix", 12)
    assert [searched.history(i) for i in (0, 11)] == [11, 0]  # the newest (good) end first, the old bad end last
    settings = ProbeSettings(load={}, round_sessions=16, max_rounds=1)
    records: list[ProbeRecord] = []
    while not isinstance(step := decide(12, records, Model(), settings, confidence=0.95, max_probes=40,
                                        max_sessions=2000, searched=searched), Ended):
        corrupt = 3 if searched.history(step.index) < fix else 0
        records.append(ProbeRecord(number=len(records) + 1, target=str(step.index), index=step.index,
                                   verdict="bad" if corrupt else "good", corrupt=corrupt, clean=16 - corrupt))
    assert records[0].index == 11  # the old end is probed first: it must corrupt
    assert step.stop is not None and step.stop.reason == "found" and step.stop.commit is not None
    assert searched.named(step.stop.commit) == fix
    # The plot's posterior, in history order, puts the mass on the fix.
    assert int(np.argmax(searched.in_history(step.posterior.culprit))) == fix
