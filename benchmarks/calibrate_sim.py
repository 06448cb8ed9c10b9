"""Calibrate the simulator against the seeds' story: `repro run` on the embedded simulator, per configuration.

For each configuration it runs the default workload (60 sessions unless stated) through `repro run`,
then prints the session outcomes, the fault log's count, the load-back volume and the wall time.
Expected: HiCache + bf16 index-K corrupts roughly 10-20% of sessions at 60, and so does the same server
with a device pool the default workload never fills (5,000,000 tokens) once `--pressure auto` sizes the
load to it (its 150k-token prefixes must come back from the host tier); one session, HiCache off, fp8
index-K and the index-K gate corrupt none. The ", 8, sized" rows size 8 sessions to the default 64,000-token
pool: every turn loads about 8,500 tokens back, two or three in a batch, which erases fp8's margin
(docs/sim.md): 4 of 8 at fp8, 8 of 8 at bf16 (seed 0).

The counts come from the simulator's virtual clock (the default here): the same seed gives the same counts
at any machine load. `--clock real` shows the real clock's, which vary with the machine's load.

    .venv/bin/python benchmarks/calibrate_sim.py [--repeat N] [--only NAME ...] [--clock virtual|real]
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from repro.store.rundir import read_sessions

FAULTY = ["--enable-hierarchical-cache", "--index-k-dtype", "bf16"]
BIG_POOL = ["--max-total-tokens", "5000000"]


@dataclass(frozen=True)
class Config:
    """One configuration: its sessions, its simulator flags, and whether `--pressure auto` sizes its load."""

    sessions: int
    sim_args: list[str]
    sized: bool = False


CONFIGS: dict[str, Config] = {
    "hicache+bf16": Config(60, FAULTY),
    "hicache+bf16, sized": Config(60, [*FAULTY, *BIG_POOL], sized=True),
    "hicache+fp8, sized": Config(60, ["--enable-hierarchical-cache", "--index-k-dtype", "fp8", *BIG_POOL], sized=True),
    "hicache+bf16, 8, sized": Config(8, FAULTY, sized=True),
    "hicache+fp8, 8, sized": Config(8, ["--enable-hierarchical-cache", "--index-k-dtype", "fp8"], sized=True),
    "hicache+bf16, 1 session": Config(1, FAULTY),
    "hicache+bf16+gate": Config(60, [*FAULTY, "--index-k-gate"]),
    "hicache+fp8": Config(60, ["--enable-hierarchical-cache", "--index-k-dtype", "fp8"]),
    "hicache off, bf16": Config(60, ["--no-enable-hierarchical-cache", "--index-k-dtype", "bf16"]),
    "hicache+bf16, no overlap": Config(60, [*FAULTY, "--disable-overlap-schedule"]),
    "hicache+bf16, no cuda graph": Config(60, [*FAULTY, "--disable-cuda-graph"]),
}


def run_once(name: str, config: Config, seed: int, workdir: Path, clock: str) -> dict[str, object]:
    out = workdir / f"{len(list(workdir.iterdir()))}"
    faults = workdir / f"{out.name}-faults.jsonl"
    # `repro run` passes the seeds' faulty flags first; these come after them and win.
    args = [*config.sim_args, "--clock", clock, "--fault-log", str(faults)]
    cmd = [sys.executable, "-c", "from repro.cli import main; main()", "run", "--sessions", str(config.sessions),
           "--seed", str(seed), "--out", str(out), "--sim-args", shlex.join(args)]
    if config.sized:
        cmd += ["--pressure", "auto"]
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    if not (out / "summary.json").exists():
        raise SystemExit(f"{name}: repro run failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    summary = json.loads((out / "summary.json").read_text())
    logged = faults.read_text().splitlines() if faults.exists() else []
    return {"counts": summary["counts"], "faults": len(logged),
            "fault_sessions": len({json.loads(line)["conversation"] for line in logged}), "wall_s": wall,
            "run_s": summary["duration_s"], "ttft_p50": summary["latency"]["ttft_s"]["p50"], **_server_totals(out)}


def _server_totals(run_dir: Path) -> dict[str, float]:
    """Cache hit rate from the turns' usage; load-back from the last scrape `repro run` kept in metrics.csv."""
    turns = [turn for record in read_sessions(run_dir) for turn in record.turns]
    prompt = sum(turn.prompt_tokens or 0 for turn in turns)
    cached = sum(turn.cached_tokens or 0 for turn in turns)
    load_back = 0.0
    with open(run_dir / "metrics.csv", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if row["metric"] == "sglang:load_back_tokens_total":
                load_back = float(row["value"])
    return {"hit_rate": cached / prompt if prompt else 0.0, "load_back": load_back}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration (seeds 0..N-1)")
    parser.add_argument("--only", nargs="*", help="configuration names to run")
    parser.add_argument("--clock", choices=("virtual", "real"), default="virtual",
                        help="the simulator's clock: virtual counts do not depend on the machine's load")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="calibrate-sim-") as tmp:
        workdir = Path(tmp)
        print(f"{'configuration':30} {'seed':>4} {'clean':>5} {'corrupt':>7} {'timeout':>7} {'error':>5} "
              f"{'faults':>6} {'f.sess':>6} {'hit':>5} {'loadback':>8} {'ttft50':>6} {'run s':>5} {'wall s':>6}")
        for name, config in CONFIGS.items():
            if options.only and name not in options.only:
                continue
            for seed in range(options.repeat):
                row = run_once(name, config, seed, workdir, options.clock)
                counts = row["counts"]
                print(f"{name:30} {seed:>4} {counts['clean']:>5} {counts['corrupt']:>7} {counts['timeout']:>7} "
                      f"{counts['error']:>5} {row['faults']:>6} {row['fault_sessions']:>6} {row['hit_rate']:>5.2f} "
                      f"{row['load_back']:>8.0f} {row['ttft_p50']:>6.2f} {row['run_s']:>5.1f} {row['wall_s']:>6.1f}",
                      flush=True)


if __name__ == "__main__":
    main()
