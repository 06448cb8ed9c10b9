"""Does the "practically equivalent" verdict keep its error under nominal alpha, and what does it cost?

Monte Carlo over pure Bernoulli draws (no simulator), through the product's own decision code:
- fixed: `repro.stats.equivalence.equivalence` on two arms of n completed sessions each (`repro report`,
  `repro gate --baseline`);
- sequential: `repro run --until-decided --baseline`'s rule (repro.run.stopping.BaselineRule) with a
  finished baseline of BASELINE sessions and the run in waves of WAVE up to CAP. The simulation looks
  only at the rule's bracket and its pass (`BaselineRule.bracket`, `BaselineRule.pass_verdict`) and leaves
  out its Boschloo fail test (seconds per look): a fail can only stop a run earlier, so the false-pass and
  false-equivalence rates measured here are upper bounds of the real rule's.

A false "practically equivalent" is that verdict at a true difference of ±margin. Margin 0.05, confidence
0.95 (alpha 0.05). Each rate has its one-sided 95% Clopper-Pearson upper bound beside it.

Run: .venv/bin/python benchmarks/equivalence_error.py [--runs 2000] [--seed 1]
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np

import repro.stats
from repro.run.stopping import BaselineRule, max_looks
from repro.stats import upper_bound
from repro.stats.equivalence import equivalence, sessions_to_decide

MARGIN = 0.05
CONFIDENCE = 0.95
FIXED_N = (200, 500)
BASELINE = 300
WAVE = 60
CAP = 600
SCENARIOS = (  # (run's true rate, baseline's true rate)
    (0.06, 0.01), (0.15, 0.10), (0.05, 0.10), (0.01, 0.06),  # a difference of exactly ±margin
    (0.0, 0.0), (0.01, 0.01), (0.10, 0.10),  # no difference
)

# Memoised for speed: the rule calls it with the same few hundred (k, n) pairs many thousands of times.
repro.stats.clopper_pearson = functools.lru_cache(maxsize=None)(repro.stats.clopper_pearson)  # type: ignore[attr-defined]


def fixed(p1: float, p2: float, n: int, runs: int, rng: np.random.Generator) -> int:
    """Runs whose verdict was "practically equivalent" (the p-value is irrelevant to that verdict: 1.0)."""
    k1, k2 = rng.binomial(n, p1, runs), rng.binomial(n, p2, runs)
    return sum(equivalence(int(a), n, int(b), n, margin=MARGIN, confidence=CONFIDENCE, pvalue=1.0).verdict
               == "practically equivalent" for a, b in zip(k1, k2))


def sequential(p1: float, p2: float, runs: int, rng: np.random.Generator) -> tuple[int, int, float]:
    """(passes, "practically equivalent" verdicts, mean sessions) over `runs` simulated runs."""
    passes = equivalent = spent = 0
    looks = max_looks(CAP, WAVE)
    for _ in range(runs):
        rule = BaselineRule(int(rng.binomial(BASELINE, p2)), BASELINE, max_looks=looks, margin=MARGIN,
                            confidence=CONFIDENCE)
        draws = rng.random(CAP) < p1
        n = 0
        for n in range(WAVE, CAP + 1, WAVE):
            verdict = rule.pass_verdict(*rule.bracket(int(draws[:n].sum()), n))
            if verdict is not None:
                passes += 1
                equivalent += verdict == "practically equivalent"
                break
        spent += n
    return passes, equivalent, spent / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    alpha = 1 - CONFIDENCE
    start = time.perf_counter()
    print(f"margin {MARGIN}, nominal alpha {alpha:.2f}, {args.runs} runs per row")
    print("\nfixed: two arms of n completed sessions each")
    print(f"{'run':>5} {'base':>5} {'diff':>6} {'n/arm':>5} {'equivalent':>10} {'(95% upper)':>11} {'n/arm to decide':>15}")
    worst = 0.0
    for p1, p2 in SCENARIOS:
        need = sessions_to_decide(p1, p2, margin=MARGIN, confidence=CONFIDENCE)
        for n in FIXED_N:
            hits = fixed(p1, p2, n, args.runs, rng)
            share = hits / args.runs
            if abs(abs(p1 - p2) - MARGIN) < 1e-9:
                worst = max(worst, share)
            print(f"{p1:5.2f} {p2:5.2f} {p1 - p2:+6.2f} {n:5d} {share:10.3f} {upper_bound(hits, args.runs):11.3f} "
                  f"{need if need is not None else '-':>15}")
    print(f"worst false-equivalent rate (fixed, |difference| = margin): {worst:.3f} (nominal {alpha:.2f})")
    print(f"\nsequential: baseline of {BASELINE}, run in waves of {WAVE} up to {CAP} "
          f"({max_looks(CAP, WAVE)} looks), Boschloo fail test left out")
    print(f"{'run':>5} {'base':>5} {'diff':>6} {'pass':>6} {'equivalent':>10} {'(95% upper)':>11} {'mean sessions':>13}")
    worst_seq = worst_pass = 0.0
    for p1, p2 in SCENARIOS:
        passes, equivalent, mean = sequential(p1, p2, args.runs, rng)
        if abs(abs(p1 - p2) - MARGIN) < 1e-9:
            worst_seq = max(worst_seq, equivalent / args.runs)
        if p1 - p2 >= MARGIN - 1e-9:
            worst_pass = max(worst_pass, passes / args.runs)
        print(f"{p1:5.2f} {p2:5.2f} {p1 - p2:+6.2f} {passes / args.runs:6.3f} {equivalent / args.runs:10.3f} "
              f"{upper_bound(equivalent, args.runs):11.3f} {mean:13.1f}")
    print(f"worst false-equivalent rate (sequential, |difference| = margin): {worst_seq:.3f}; "
          f"worst false pass (difference = +margin): {worst_pass:.3f} (nominal {alpha:.2f}); "
          f"{time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    main()
