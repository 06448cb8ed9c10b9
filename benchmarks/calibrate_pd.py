"""Calibrate the simulator's PD wedges: `repro run` sessions against a simulator in PD mode, per load.

For each configuration it starts the simulator, runs the default workload through `repro.run.runner.execute_run`
with a stall timeout, then prints the wedged sessions, the wedges the simulator recorded (/debug/wedges),
whether the two match one for one (by conversation and turn), and the transfer-failure counter.
Expected: 1 and 8 sessions never wedge; 60 sessions wedge a few percent of sessions; null mode never does.

    .venv/bin/python benchmarks/calibrate_pd.py [--repeat N] [--only NAME ...] [--time-scale S] [--stall-timeout S]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console

from repro.run.metrics import parse_samples
from repro.run.options import RunOptions
from repro.run.runner import execute_run
from repro.sim.launch import start_sim
from repro.sim.model import conversation_key
from repro.store.rundir import read_sessions

PD = ["--disaggregation-mode", "decode"]
CONFIGS: dict[str, tuple[int, list[str]]] = {
    "pd, 1 session": (1, PD),
    "pd, 8 sessions": (8, PD),
    "pd, 60 sessions": (60, PD),
    "null, 60 sessions": (60, []),
    "pd+hicache+bf16, 60 sessions": (60, [*PD, "--enable-hierarchical-cache", "--index-k-dtype", "bf16"]),
}


def run_once(sessions: int, sim_args: list[str], seed: int, time_scale: float, stall_timeout: float,
             out: Path) -> dict[str, object]:
    """One run: counts of wedged sessions and recorded wedges, and whether they match one for one."""
    with start_sim([*sim_args, "--time-scale", str(time_scale)]) as sim:
        started = time.monotonic()
        options = RunOptions(base_url=sim.base_url, sessions=sessions, seed=seed, out=out, stall_timeout=stall_timeout,
                             timeout=1200, turn_timeout=600)
        execute_run(options, console=Console(quiet=True), live=False)
        wall = time.monotonic() - started
        wedges = httpx.get(f"{sim.url}/debug/wedges", timeout=10).json()["wedges"]
        metrics = httpx.get(f"{sim.url}/metrics", timeout=10).text
    records = read_sessions(out)
    stalled = {(conversation_key([{"role": "user", "content": r.task}]), t.index)
               for r in records for t in r.turns if t.status == "stalled"}
    failed = next((value for name, _, value in parse_samples(metrics) if name == "sglang:num_transfer_failed_reqs_total"),
                  0.0)
    return {"wedged": sum(r.wedged for r in records), "corrupt": sum(r.outcome == "corrupt" for r in records),
            "wedges": len(wedges), "match": stalled == {(w["conversation"], w["turn"]) for w in wedges},
            "failed": failed, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration (seeds 0..N-1)")
    parser.add_argument("--only", nargs="*", help="configuration names to run")
    # The defaults are what `repro run` and `repro sim serve` use: the calibration describes what users see.
    parser.add_argument("--time-scale", type=float, default=0.2, help="the simulator's real seconds per simulated second")
    parser.add_argument("--stall-timeout", type=float, default=30.0, help="real seconds without bytes: wedged")
    options = parser.parse_args()
    print(f"{'configuration':30} {'seed':>4} {'wedged':>6} {'wedges':>6} {'match':>5} {'corrupt':>7} "
          f"{'failed':>6} {'wall s':>6}")
    with tempfile.TemporaryDirectory(prefix="calibrate-pd-") as tmp:
        for name, (sessions, sim_args) in CONFIGS.items():
            if options.only and name not in options.only:
                continue
            for seed in range(options.repeat):
                out = Path(tmp) / f"{len(list(Path(tmp).iterdir()))}"
                row = run_once(sessions, sim_args, seed, options.time_scale, options.stall_timeout, out)
                print(f"{name:30} {seed:>4} {row['wedged']:>6} {row['wedges']:>6} {row['match']!s:>5} "
                      f"{row['corrupt']:>7} {row['failed']:>6.0f} {row['wall_s']:>6.1f}", flush=True)


if __name__ == "__main__":
    main()
