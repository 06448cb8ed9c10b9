"""How often the sequential matrix (`design: {sequential: true}`) names an effect that is not there: Monte Carlo.

For the shipped simulator matrix's design (2 factors, baseline HiCache off / index-K fp8, `replicates`
rounds at most, the spec's sessions per run, alpha and correction) it draws, per replicate of the
simulation, every planned run's corrupt sessions as Binomial(sessions, true rate of the run's cell) and
the rest clean, as finished `CellRun`s (progress.jsonl's records). On those draws it replays the
sequential matrix with the runner's own functions (sequential_matrix.replay: `round_runs`, `after_round`,
which calls `needed_cells`, and the last look's analysis) and runs the fixed design (the analysis of every
replicate at alpha). A verdict is wrong when it names an effect (causes, widens, reduces) of a factor
whose true effect is none; the family-wise wrong-verdict rate is the share of simulations with any.

Scenarios (true per-session corruption rate of each cell; HiCache off/on × index-K fp8/bf16):
  zero       every cell 0%                                         null: both factors
  null5      every cell 5%                                         null: both factors
  null15     every cell 15%                                        null: both factors
  hicache    HiCache-on cells 15%, HiCache-off cells 0%            null: index-K
  sim        off 0%, on+fp8 4%, on+bf16 60% (the simulator's shape)  null: none (verdict counts only)

    .venv/bin/python benchmarks/sequential_matrix_null.py [--spec SPEC] [--sims 1000] [--seed 1] [--scenarios zero,null5,...]
"""

from __future__ import annotations

import argparse
import gc
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import sequential_matrix
from repro.matrix import sequential
from repro.matrix.analysis import CellRun, MatrixAnalysis, analyse
from repro.matrix.design import cells, plan
from repro.matrix.sequential import DECIDED
from repro.matrix.spec import MatrixSpec, load_spec
from repro.stats import clopper_pearson

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Scenario:
    name: str
    rates: dict[tuple[str, str], float]
    """(hicache, index_k) -> true per-session corruption rate."""
    null: tuple[str, ...]
    """The factors with no true effect: any decided verdict on them is wrong."""


SCENARIOS = [
    Scenario("zero", {(h, k): 0.0 for h in ("off", "on") for k in ("fp8", "bf16")}, ("hicache", "index_k")),
    Scenario("null5", {(h, k): 0.05 for h in ("off", "on") for k in ("fp8", "bf16")}, ("hicache", "index_k")),
    Scenario("null15", {(h, k): 0.15 for h in ("off", "on") for k in ("fp8", "bf16")}, ("hicache", "index_k")),
    Scenario("hicache", {(h, k): 0.15 if h == "on" else 0.0 for h in ("off", "on") for k in ("fp8", "bf16")},
             ("index_k",)),
    Scenario("sim", {("off", "fp8"): 0.0, ("off", "bf16"): 0.0, ("on", "fp8"): 0.04, ("on", "bf16"): 0.60}, ()),
]


def remembered(spec: MatrixSpec, runs: list[CellRun], cell_order: list[dict[str, str]], planned: int,
               **options: bool) -> MatrixAnalysis:
    """`analyse`, once per set of runs: the replay's final analysis is its last look's (same runs, same alpha)."""
    key = (spec.design.alpha, planned, tuple(options.items()), tuple((r.key, r.counts["corrupt"]) for r in runs))
    if key not in _MEMO:
        if len(_MEMO) > 8:  # one simulation's looks are all it can reuse
            _MEMO.clear()
        _MEMO[key] = analyse(spec, runs, cell_order, planned, **options)
    return _MEMO[key]


_MEMO: dict[tuple, MatrixAnalysis] = {}


def draw(spec: MatrixSpec, scenario: Scenario, rng: np.random.Generator) -> dict[str, CellRun]:
    """Every planned run of the fixed design as a finished run whose corrupt sessions are binomial at its cell's rate."""
    sessions = int(spec.load["sessions"])
    runs = {}
    for run in plan(spec):
        corrupt = int(rng.binomial(sessions, scenario.rates[(run.cell.level("hicache"), run.cell.level("index_k"))]))
        runs[run.key] = CellRun(
            key=run.key, cell=run.cell.as_dict(), replicate=run.replicate, order=run.order, status="finished",
            counts={"clean": sessions - corrupt, "corrupt": corrupt, "timeout": 0, "error": 0},
        )
    return runs


def simulate(spec: MatrixSpec, scenario: Scenario, sims: int, rng: np.random.Generator) -> None:
    planned, design_cells = plan(spec), cells(spec)
    order = [c.as_dict() for c in design_cells]
    wrong = Counter()
    verdicts: dict[str, Counter] = {"sequential": Counter(), "fixed": Counter()}
    sessions = Counter()
    began = time.monotonic()
    for i in range(1, sims + 1):
        runs = draw(spec, scenario, rng)
        fixed = analyse(spec, list(runs.values()), order, len(planned))
        got = {
            "fixed": {e.factor: e.verdict for e in fixed.factors},
            "sequential": (seq := sequential_matrix.replay(spec, runs))["verdicts"],
        }
        sessions["fixed"] += sum(sum(r.counts.values()) for r in runs.values())
        sessions["sequential"] += seq["sessions"]
        for design, found in got.items():
            wrong[design] += any(found[f] in DECIDED for f in scenario.null)
            verdicts[design][", ".join(f"{f}={v}" for f, v in found.items())] += 1
        if i % 50 == 0:
            gc.collect()
            gc.freeze()  # see main(): the objects that outlive a simulation (caches) are not walked again
        if i % 100 == 0 or i == sims:
            print(f"  {scenario.name}: {i}/{sims} ({time.monotonic() - began:.0f}s; wrong so far: "
                  f"sequential {wrong['sequential']}, fixed {wrong['fixed']})", flush=True)
    print(f"scenario {scenario.name}: rates " + ", ".join(
        f"{h}/{k} {100 * p:g}%" for (h, k), p in scenario.rates.items()) + f"; null factors: {', '.join(scenario.null) or 'none'}")
    for design in ("sequential", "fixed"):
        if scenario.null:
            ci = clopper_pearson(wrong[design], sims)
            rate = (f"family-wise wrong verdicts {wrong[design]}/{sims} = {ci.estimate:.4f} "
                    f"(95% CI {ci.low:.4f}-{ci.high:.4f}; nominal {spec.design.alpha:g})")
        else:
            rate = "no null factor"
        print(f"  {design:10} {rate}; mean sessions {sessions[design] / sims:.1f}", flush=True)
        for label, count in verdicts[design].most_common():
            print(f"  {'':10}   {count:>5} {label}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(ROOT / "matrices" / "sim_hicache_bf16.yaml"))
    parser.add_argument("--sims", type=int, default=1000, help="simulations per scenario")
    parser.add_argument("--seed", type=int, default=1, help="seed of the draws")
    parser.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS))
    options = parser.parse_args()
    spec = load_spec(Path(options.spec), {})
    spec = spec.model_copy(update={"design": spec.design.model_copy(update={"sequential": True})})
    chosen = options.scenarios.split(",")
    unknown = [name for name in chosen if name not in {s.name for s in SCENARIOS}]
    if unknown:
        raise SystemExit(f"unknown scenario(s): {', '.join(unknown)}")
    print(f"{spec.name}: {len(cells(spec))} cells, at most {spec.design.replicates} rounds, {spec.load['sessions']} "
          f"sessions per run, alpha {spec.design.alpha:g}, {spec.design.correction}; {options.sims} simulations per scenario")
    rng = np.random.default_rng(options.seed)
    # statsmodels' multipletests (Holm) calls gc.collect() on every call, which walks every live object
    # (most of the time of an analysis here); frozen objects are skipped. It changes no result.
    gc.freeze()
    # The replay's last analysis repeats its last look: the same function, computed once.
    sequential.analyse = sequential_matrix.analyse = remembered
    for scenario in SCENARIOS:
        if scenario.name in chosen:
            simulate(spec, scenario, options.sims, rng)


if __name__ == "__main__":
    main()
