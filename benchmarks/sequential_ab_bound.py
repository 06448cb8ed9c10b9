"""Can any design answer the HiCache question at p < 0.01 within 60 sessions? An exact computation.

The issue asks for the HiCache question (on vs off) answered at p < 0.01 with at most 60 sessions in
total. The true rates are taken as 0 with HiCache off (the simulator never corrupts there) and 15% with
it on (the seeds saw 12-18%); sessions are independent. The tests are those repro uses: Boschloo's and
Fisher's exact tests, one-sided (an increase).

1. Every fixed split of 60 sessions, n_on + n_off = 60: the power (the chance that the one test gives
   p < 0.01), exact (repro.stats.power_two_proportions).

2. Every design at all, however it allocates sessions between the arms, whenever it looks and however
   it adapts to what it saw, with at most 60 sessions: an upper bound on the chance that SOME look
   shows a nominal p < 0.01. A look sees k corrupt of m HiCache-on sessions and 0 of c off sessions,
   m + c <= 60 (off never corrupts). It can only reject when k >= kmin(m), the smallest count that
   rejects for some c <= 60 - m. The on sessions are a Bernoulli(15%) sequence whatever the design does
   between them, so P(some look rejects) <= P(K_m >= kmin(m) for some m <= 60), K_m the number corrupt
   among the first m on sessions: a first-passage probability, computed exactly by dynamic programming.
   No multiplicity correction is charged, so the bound holds for every valid group-sequential design
   whose looks each test at a nominal level of at most 0.01 (Bonferroni, Pocock, O'Brien-Fleming, any
   alpha-spending function), and it is generous to all of them.

3. What a control from an earlier run buys when it is not counted: 60 new HiCache-on sessions against
   an earlier HiCache-off run of n_off sessions, one test.

Run: .venv/bin/python benchmarks/sequential_ab_bound.py [--total 60] [--rate 0.15] [--alpha 0.01]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import stats as sps

from repro.stats.power import power_two_proportions, rejects

TESTS = ("boschloo", "fisher")


def smallest_rejecting(test: str, m: int, c: int, alpha: float) -> int | None:
    """The fewest corrupt of m on sessions that reject at `alpha` against 0 of c off sessions (None: none does)."""
    for k in range(m + 1):
        if rejects(test, k, m, 0, c, alternative="greater", alpha=alpha):  # type: ignore[arg-type]
            return k
    return None


def first_passage(thresholds: list[int | None], rate: float) -> float:
    """P(K_m >= thresholds[m-1] for some m), K_m ~ the running count of corrupt Bernoulli(rate) sessions."""
    alive = np.zeros(len(thresholds) + 2)
    alive[0] = 1.0  # probability of k corrupt so far, over the paths that have not yet crossed
    crossed = 0.0
    for m, threshold in enumerate(thresholds, start=1):
        alive[1:] = alive[1:] * (1 - rate) + alive[:-1] * rate
        alive[0] *= 1 - rate
        if threshold is not None:
            crossed += alive[threshold:].sum()
            alive[threshold:] = 0.0
    return crossed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total", type=int, default=60)
    parser.add_argument("--rate", type=float, default=0.15, help="the corruption rate with HiCache on")
    parser.add_argument("--alpha", type=float, default=0.01)
    args = parser.parse_args()
    began = time.monotonic()
    total, rate, alpha = args.total, args.rate, args.alpha
    print(f"true rates: HiCache off 0, on {rate:.0%}; at most {total} sessions; p < {alpha:g}, one-sided")

    print(f"\n1. fixed splits of {total} sessions (on + off = {total}): exact power")
    for test in TESTS:
        powers = {m: power_two_proportions(rate, 0.0, m, total - m, alpha=alpha, test=test, alternative="greater")
                  for m in range(1, total)}
        best = max(powers, key=powers.__getitem__)
        shown = ", ".join(f"{m}+{total - m}: {powers[m]:.3f}" for m in (15, 20, 25, 30, 35, 40, 45) if m in powers)
        print(f"   {test:8} best {best} on + {total - best} off: power {powers[best]:.3f}; {shown}")

    print(f"\n2. any design of at most {total} sessions (any split, any looks, adaptive): "
          f"P(some look has p < {alpha:g}) at most")
    for test in TESTS:
        kmin: list[int | None] = []
        for m in range(1, total + 1):
            found = [k for c in range(1, total - m + 1) if (k := smallest_rejecting(test, m, c, alpha)) is not None]
            kmin.append(min(found) if found else None)
        bound = first_passage(kmin, rate)
        listed = ", ".join(f"m={m}: {kmin[m - 1]}" for m in (10, 20, 30, 40, 50) if kmin[m - 1] is not None)
        print(f"   {test:8} {bound:.3f}   (fewest corrupt on sessions that can reject: {listed})")
        for other in (0.12, 0.18):
            print(f"   {'':8} {first_passage(kmin, other):.3f}   at an on rate of {other:.0%}")

    print(f"\n3. {total} new HiCache-on sessions against an earlier HiCache-off run (not counted): exact power")
    for n_off in (60, 120, 240, 1000):
        power = power_two_proportions(rate, 0.0, total, n_off, alpha=alpha, test="boschloo", alternative="greater")
        k = smallest_rejecting("boschloo", total, n_off, alpha)
        print(f"   off {n_off:4} sessions: power {power:.3f} (needs {k} corrupt of {total}; "
              f"P(Bin({total}, {rate:g}) >= {k}) = {sps.binom.sf((k or 0) - 1, total, rate):.3f})")
    print(f"({time.monotonic() - began:.0f}s)")


if __name__ == "__main__":
    main()
