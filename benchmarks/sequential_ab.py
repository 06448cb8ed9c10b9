"""The HiCache question (on vs off) at p < 0.01: `repro run --until-decided --baseline` against the fixed design.

Per seed, on the embedded simulator in the seeds' configuration: a fixed baseline run with HiCache off
(BASELINE sessions, all at once), then a `--until-decided --baseline` run with HiCache on, in waves of 60
(the load at which the race fires), capped at CAP, at confidence 0.99. The fixed design is 60 + 60 with
one Boschloo test at 0.01; it is read off the same data (the on run's first wave against the baseline).
The simulator's truth is that HiCache on corrupts and off does not, so a pass is a wrong verdict.

Then the same rule over pure Bernoulli draws (no simulator): its wrong-verdict rate when the arms do not
differ (a fail is wrong) and the sessions it spends, against the nominal alpha.

Run: .venv/bin/python benchmarks/sequential_ab.py [--seeds 20] [--null-runs 300]
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console

from repro.run.options import RunOptions
from repro.run.runner import execute_run
from repro.run.stopping import BaselineRule, max_looks, waves_of
from repro.stats import compare
from repro.store.rundir import load_run

WAVE = 60
CAP = 180
BASELINE = 60
CONFIDENCE = 0.99
FIXED = 2 * 60


def _run(out: Path, **options: object) -> Path:
    quiet = Console(file=io.StringIO())
    return execute_run(RunOptions.parse({"out": out, "timeout": 120, **options}), console=quiet, live=False,
                       report=False).path


def on_the_simulator(seeds: int) -> None:
    print(f"simulator: baseline HiCache off, {BASELINE} sessions; HiCache on until decided, waves of {WAVE}, cap "
          f"{CAP}, confidence {CONFIDENCE}; fixed design {FIXED} sessions")
    print(f"{'seed':>4} {'off':>6} {'on wave 1':>9} {'fixed p':>8} {'fixed':>6} {'sequential':>10} {'total':>6} "
          f"{'wall s':>6}")
    totals, decisions, fixed_fails = [], [], 0
    for seed in range(seeds):
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="seq-ab-") as tmp:
            sim = f"--seed {seed}"
            off = _run(Path(tmp) / "off", sim_args=f"--no-enable-hierarchical-cache {sim}", sessions=BASELINE,
                       seed=seed, name="off")
            on = _run(Path(tmp) / "on", sim_args=sim, sessions=CAP, concurrency=WAVE, seed=seed, until_decided=True,
                      baseline=off, confidence=CONFIDENCE)
            base, run = load_run(off), load_run(on)
            assert run.summary is not None and run.summary.stopping is not None
            stop = run.summary.stopping
            kb = sum(s.outcome == "corrupt" for s in base.sessions)
            nb = sum(s.outcome in ("clean", "corrupt") for s in base.sessions)
            first = waves_of(run.sessions, WAVE)[0]
            k1 = sum(s.outcome == "corrupt" for s in first)
            n1 = sum(s.outcome in ("clean", "corrupt") for s in first)
        p_fixed = compare(k1, n1, kb, nb, alternative="greater").p_boschloo
        fixed = "fail" if p_fixed < 1 - CONFIDENCE else "undecided"
        fixed_fails += fixed == "fail"
        total = len(base.sessions) + stop.sessions
        totals.append(total)
        decisions.append(stop.decision)
        print(f"{seed:>4} {kb:>3}/{nb:<3} {k1:>4}/{n1:<4} {p_fixed:8.2g} {fixed:>6} {stop.decision:>10} {total:>6} "
              f"{time.monotonic() - started:6.0f}", flush=True)
    wrong = decisions.count("pass")
    print(f"sequential: {decisions.count('fail')} of {seeds} decided 'increase' at p<{1 - CONFIDENCE:g}, "
          f"{decisions.count('undecided')} undecided at the cap, {wrong} wrong (pass); sessions per seed mean "
          f"{np.mean(totals):.1f}, median {np.median(totals):.0f}, min {min(totals)}, max {max(totals)} "
          f"(fixed {FIXED}); within 60 in total: {sum(t <= 60 for t in totals)}")
    print(f"fixed 60 + 60: {fixed_fails} of {seeds} decided 'increase' at p<{1 - CONFIDENCE:g}")


def under_the_null(runs: int, rate: float, rng: np.random.Generator) -> None:
    """The rule over Bernoulli draws when both arms corrupt at `rate`: how often it wrongly fails."""
    looks = max_looks(CAP, WAVE)
    wrong = passes = 0
    spent = 0
    for _ in range(runs):
        kb = int((rng.random(BASELINE) < rate).sum())
        rule = BaselineRule(kb, BASELINE, max_looks=looks, confidence=CONFIDENCE)
        draws = rng.random(CAP) < rate
        n = WAVE
        for n in range(WAVE, CAP + 1, WAVE):
            decision = rule.look(int(draws[:n].sum()), n, n).decision
            if decision is not None:
                wrong += decision == "fail"
                passes += decision == "pass"
                break
        spent += BASELINE + n
    print(f"null, both arms at {rate:.0%}: {wrong}/{runs} wrongly failed ({wrong / runs:.4f}, nominal "
          f"{1 - CONFIDENCE:g}), {passes} passed (increase under 5 points shown), mean sessions {spent / runs:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--null-runs", type=int, default=300, help="Bernoulli runs per null rate (0: none)")
    args = parser.parse_args()
    started = time.monotonic()
    rng = np.random.default_rng(7)
    if args.null_runs:
        for rate in (0.05, 0.15):
            under_the_null(args.null_runs, rate, rng)
        print(f"({time.monotonic() - started:.0f}s)", flush=True)
    if args.seeds:
        on_the_simulator(args.seeds)
    print(f"total {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
