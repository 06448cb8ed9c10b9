"""Does `repro run --until-decided` keep its wrong-verdict rate at or under nominal, and what does it save?

Many simulated runs, each session a Bernoulli draw at a true corruption rate, looked at after every wave
through the same decision code the run uses (repro.run.stopping.StoppingRule). A wrong verdict is a fail when
the true rate is at or under the limit, or a pass when it is at or over it (at the limit both are wrong).
Saved sessions are against the fixed design that always spends the cap.

Run: .venv/bin/python benchmarks/sequential_error.py [--runs 2000] [--seed 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from repro.run.stopping import StoppingRule

LIMIT = 0.10
WAVE = 20
CAP = 600
CONFIDENCE = 0.95
RATES = (0.0, 0.02, 0.05, 0.08, 0.10, 0.12, 0.15, 0.25)


def simulate(rate: float, runs: int, rng: np.random.Generator, rule: StoppingRule) -> tuple[int, int, int, float]:
    """(wrong verdicts, passes, fails, mean sessions spent) over `runs` simulated runs."""
    wrong = passes = fails = 0
    spent = 0
    for _ in range(runs):
        draws = rng.random(CAP) < rate
        decision = None
        n = 0
        for n in range(WAVE, CAP + 1, WAVE):
            decision = rule.look(int(draws[:n].sum()), n, n).decision
            if decision is not None:
                break
        spent += n
        passes += decision == "pass"
        fails += decision == "fail"
        if (decision == "fail" and rate <= LIMIT) or (decision == "pass" and rate >= LIMIT):
            wrong += 1
    return wrong, passes, fails, spent / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    rule = StoppingRule(limit=LIMIT, confidence=CONFIDENCE)
    alpha = 1 - CONFIDENCE
    print(f"limit {LIMIT:.0%}, confidence {CONFIDENCE:.0%} (nominal alpha {alpha:.2f}), waves of {WAVE}, cap {CAP}, "
          f"{args.runs} runs per rate")
    print(f"{'true rate':>9} {'pass':>6} {'fail':>6} {'undecided':>9} {'wrong':>7} {'(95% upper)':>11} "
          f"{'mean sessions':>13} {'saved':>6}")
    start = time.perf_counter()
    worst = 0.0
    for rate in RATES:
        wrong, passes, fails, mean = simulate(rate, args.runs, rng, rule)
        share = wrong / args.runs
        # One-sided normal bound on the Monte Carlo share (floored at one run, so 0 wrong still has a width).
        upper = share + 1.645 * np.sqrt(max(share * (1 - share), 1 / args.runs) / args.runs)
        worst = max(worst, share)
        undecided = args.runs - passes - fails
        print(f"{rate:9.2f} {passes:6d} {fails:6d} {undecided:9d} {share:7.3f} {upper:11.3f} "
              f"{mean:13.1f} {1 - mean / CAP:6.0%}")
    print(f"worst wrong-verdict rate {worst:.3f} at nominal {alpha:.2f}; {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    main()
