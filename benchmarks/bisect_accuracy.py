"""How often does each bisection name the right commit of a 64-commit range on a flaky signal, and at what cost?

Per seed: a culprit drawn uniformly from the range and a bad rate from [--rate-low, --rate-high]
(the simulator's seeds' configuration corrupts 10-20% of sessions); a bad commit's sessions corrupt
independently at that rate, a good commit's at --good-rate-true (the simulator's gated versions: 0).
Probes are drawn, not deployed, so hundreds of searches take seconds; every decision is the
product's own code:

- bayes: `repro bisect commits`' search (repro.bisect.commits.decide, rounds of --round sessions
  judged by repro.bisect.posterior.judge_probe); its session budget is git-fixed's worst case at
  the true rate plus the two rounds that measure the bad end;
- git-fixed: the bad end measured (up to two rounds, as `repro probe --bad-rate P` needs P), then
  `git bisect run` driving `repro probe --probe fixed`: the midpoint of the remaining range (git's
  choice on a linear history), each probe bad at its first corrupt round and good after
  bisect_probe_sessions(P, 64) sessions in whole rounds, every answer trusted;
- git-1round: the same with one round per probe (a probe as long as one `repro run`).

`--find-fix` turns the history round: the commits before a fix drawn uniformly from the range
corrupt, the fix and every later commit do not, and each method searches as `repro bisect commits
--find-fix` does (repro.bisect.direction: the range newest first; a method is right when the
commit it names, mapped back to history, is the fix).

    .venv/bin/python benchmarks/bisect_accuracy.py [--seeds 20] [--commits 64] [--find-fix]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

from repro.bisect.commits import Ended, decide
from repro.bisect.direction import Searched
from repro.bisect.journal import ProbeRecord
from repro.bisect.posterior import Model, ProbePlan, judge_probe
from repro.bisect.probe import ProbeSettings


def draw_probe(rng: np.random.Generator, plan: ProbePlan, rate: float) -> tuple[str, int, int]:
    """Rounds of the plan against a target corrupting at `rate`: (verdict, corrupt, completed)."""
    corrupt = completed = 0
    while True:
        corrupt += int(rng.binomial(plan.round_sessions, rate))
        completed += plan.round_sessions
        verdict = judge_probe(plan, corrupt, completed, 0)
        if verdict != "continue":
            return verdict, corrupt, completed


def is_bad(searched: Searched, changed: int, index: int) -> bool:
    """Whether the search's commit `index` corrupts, when history commit `changed` is the culprit or the fix."""
    history = searched.history(index)
    return history >= changed if searched.direction == "regression" else history < changed


def bayes(rng, searched: Searched, changed: int, rate: float, good: float, settings: ProbeSettings, budget: int,
          confidence: float):
    model = Model(good_rate=settings.good_rate, min_bad_rate=settings.min_bad_rate)
    records: list[ProbeRecord] = []
    while True:
        step = decide(searched.commits, records, model, settings, confidence=confidence, max_probes=10_000,
                      max_sessions=budget, searched=searched)
        if isinstance(step, Ended):
            found = step.stop is not None and step.stop.reason in ("found", "budget") and step.stop.commit is not None
            named = searched.named(step.stop.commit) if found else None
            return named, sum(r.completed for r in records), len(records)
        truth = rate if is_bad(searched, changed, step.index) else good
        verdict, corrupt, completed = draw_probe(rng, step.plan, truth)
        records.append(ProbeRecord(number=len(records) + 1, target=str(step.index), index=step.index,
                                   verdict=verdict, corrupt=corrupt, clean=completed - corrupt))


def git_bisect(rng, searched: Searched, changed: int, rate: float, good: float, settings: ProbeSettings,
               rounds: int | None):
    """The bad end measured first (up to two rounds: `repro probe` needs --bad-rate), then git's loop (in the
    search's order, as `git bisect --term-old/--term-new` runs a fix search)."""
    commits = searched.commits
    measure = ProbePlan("fixed", settings.round_sessions, 2 * settings.round_sessions, 0.5, settings.good_rate)
    _, corrupt, sessions = draw_probe(rng, measure, rate)
    if corrupt == 0:
        return None, sessions, 1  # the bad end did not reproduce: nothing to bisect with
    measured = corrupt / sessions
    plan = settings.plan(measured, commits)
    if rounds is not None:
        plan = ProbePlan("fixed", settings.round_sessions, rounds * settings.round_sessions, measured, settings.good_rate)
    low, high, probes = 0, commits - 1, 1
    while high - low > 1:
        mid = (low + high) // 2
        verdict, _, completed = draw_probe(rng, plan, rate if is_bad(searched, changed, mid) else good)
        sessions, probes = sessions + completed, probes + 1
        if verdict == "bad":
            high = mid
        else:
            low = mid
    return searched.named(high), sessions, probes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--commits", type=int, default=64)
    parser.add_argument("--round", type=int, default=16, help="sessions per round")
    parser.add_argument("--rate-low", type=float, default=0.10)
    parser.add_argument("--rate-high", type=float, default=0.20)
    parser.add_argument("--good-rate-true", type=float, default=0.0)
    parser.add_argument("--confidence", type=float, default=0.95, help="bayes: stop when one commit holds this much")
    parser.add_argument("--find-fix", action="store_true", help="search for the fix after a bad range")
    args = parser.parse_args()
    searched = Searched("fix" if args.find_fix else "regression", args.commits)

    steps = math.ceil(math.log2(args.commits))
    results: dict[str, list[tuple[bool, int, int]]] = {"bayes": [], "git-fixed": [], "git-1round": []}
    started = time.monotonic()
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        changed = int(rng.integers(1, args.commits))  # the culprit, or with --find-fix the fix
        rate = float(rng.uniform(args.rate_low, args.rate_high))
        fixed = ProbeSettings(load={}, round_sessions=args.round, max_rounds=20, mode="fixed")
        # git-fixed's worst case at the true rate, and the bad end's two measuring rounds.
        budget = 2 * args.round + steps * fixed.plan(rate, args.commits).max_sessions
        settings = ProbeSettings(load={}, round_sessions=args.round, max_rounds=1)  # `bisect commits`' default
        truth = (searched, changed, rate, args.good_rate_true)
        for name, run in (
            ("bayes", lambda: bayes(rng, *truth, settings, budget, args.confidence)),
            ("git-fixed", lambda: git_bisect(rng, *truth, fixed, None)),
            ("git-1round", lambda: git_bisect(rng, *truth, fixed, 1)),
        ):
            named, sessions, probes = run()
            results[name].append((named == changed, sessions, probes))
    what = "find-fix: the first good commit after a bad range" if args.find_fix else "the first bad commit"
    print(f"{what}; {args.seeds} seeds, {args.commits} commits, bad rate U[{args.rate_low}, {args.rate_high}], "
          f"good commits corrupt at {args.good_rate_true}, rounds of {args.round} sessions "
          f"({time.monotonic() - started:.1f}s)")
    print(f"{'method':<12} {'right':>8} {'median sessions':>16} {'max sessions':>13} {'median probes':>14}")
    for name, rows in results.items():
        right = sum(r[0] for r in rows)
        print(f"{name:<12} {right:>3}/{len(rows):<4} {statistics.median(r[1] for r in rows):>16.0f} "
              f"{max(r[1] for r in rows):>13} {statistics.median(r[2] for r in rows):>14.0f}")


if __name__ == "__main__":
    main()
