"""The shipped simulator matrix, fixed against sequential (`design: {sequential: true}`), over design seeds.

Per seed it runs the spec as shipped (a real `repro matrix` process; the design seed also seeds every
run's simulator), then replays the sequential design on the same runs: round r of a sequential
matrix launches the fixed plan's replicate-r runs (same keys, same simulator seeds) of the cells the
previous look still needs, and `repro.matrix.sequential.after_round` (the runner's own look) decides
after each. It prints per seed both designs' verdicts, sessions, server starts and rounds, then
the totals: in how many seeds the verdicts agree, the sessions saved, and whether the sequential
design ever started more servers. Seeds run `--parallel` at a time (the simulated clock leaves the
cores mostly idle). With `--keep DIR` the fixed matrices are kept there (DIR/s<seed>, DIR/m<seed>) and
a seed whose matrix finished in an earlier call is replayed without running it again, so a change to the
sequential rule can be measured on the same runs.

    .venv/bin/python benchmarks/sequential_matrix.py [--spec SPEC] [--seeds 1,2,3] [--parallel 3] [--keep DIR] [--var NAME=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from repro.matrix import sequential
from repro.matrix.analysis import CellRun, analyse
from repro.matrix.design import cells, plan
from repro.matrix.spec import MatrixSpec, SpecLoader, load_spec

ROOT = Path(__file__).resolve().parent.parent
REPRO = [sys.executable, "-c", "from repro.cli import main; main()"]


def write_spec(source: Path, target: Path, *, seed: int) -> Path:
    spec = yaml.load(source.read_text(encoding="utf-8"), Loader=SpecLoader)
    workload = Path(spec["load"]["workload"])
    spec["load"]["workload"] = str(workload if workload.is_absolute() else (source.parent / workload).resolve())
    spec["design"] = {**spec["design"], "seed": seed}
    target.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return target


def replay(spec: MatrixSpec, records: dict[str, CellRun]) -> dict[str, Any]:
    """What the sequential matrix does with these runs: its rounds, runs, verdicts and why it stopped."""
    seq = spec.model_copy(update={"design": spec.design.model_copy(update={"sequential": True})})
    planned, design_cells = plan(seq), cells(seq)
    order = [c.as_dict() for c in design_cells]
    needed, used, looks = design_cells, [], []
    for round_ in range(1, sequential.max_rounds(seq) + 1):
        ran = sequential.round_runs(planned, round_, needed)
        used += [records[run.key] for run in ran]
        looks.append(sequential.after_round(seq, round_, ran, used, order, len(planned), design_cells))
        needed = [cell for cell in design_cells if cell.name in looks[-1].next_cells]
        if not needed:
            break
    final = analyse(sequential.look_spec(seq), used, order, len(planned))
    spent = sequential.record(seq, looks, used, len(planned), interrupted=False)
    return {"verdicts": {e.factor: e.verdict for e in final.factors}, "sessions": spent.sessions,
            "starts": spent.server_starts, "rounds": spent.rounds, "stopped": spent.stopped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(ROOT / "matrices" / "sim_hicache_bf16.yaml"))
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--parallel", type=int, default=3)
    parser.add_argument("--var", action="append", default=[], help="NAME=VALUE, passed to repro matrix")
    parser.add_argument("--keep", help="keep the fixed matrices in this directory and reuse those that finished")
    options = parser.parse_args()
    seeds = [int(s) for s in options.seeds.split(",")]
    began = time.monotonic()
    rows = []
    print(f"{'seed':>4} {'design':10} {'verdicts':36} {'sessions':>8} {'starts':>6} {'rounds':>6}")
    with tempfile.TemporaryDirectory(prefix="seq-matrix-") as scratch:
        tmp = Path(options.keep or scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        done = [seed for seed in seeds if (tmp / f"m{seed}" / "matrix.json").exists()]
        todo = [seed for seed in seeds if seed not in done]
        for batch in [done, *(todo[i:i + options.parallel] for i in range(0, len(todo), options.parallel))]:
            procs = {}
            for seed in batch:
                spec = write_spec(Path(options.spec), tmp / f"s{seed}.yaml", seed=seed)
                out = tmp / f"m{seed}"
                if seed in done:
                    procs[seed] = (None, spec, out)
                    continue
                cmd = [*REPRO, "matrix", str(spec), "--out", str(out), "--no-cell-reports", *(f"--var={v}" for v in options.var)]
                procs[seed] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), spec, out)
            for seed, (proc, spec_path, out) in procs.items():
                if proc is not None:
                    _, err = proc.communicate(timeout=1800)
                    if proc.returncode != 0:
                        raise SystemExit(f"seed {seed}: repro matrix exited {proc.returncode}: {err.strip()[-600:]}")
                spec = load_spec(spec_path, dict(v.split("=", 1) for v in options.var))
                runs = [CellRun.model_validate_json(line) for line in (out / "progress.jsonl").read_text().splitlines()]
                result = json.loads((out / "matrix.json").read_text())
                got = {
                    "fixed": {"verdicts": {e["factor"]: e["verdict"] for e in result["factors"]},
                              "sessions": sum(sum(r.counts.values()) for r in runs), "starts": len(runs), "rounds": None},
                    "sequential": replay(spec, {r.key: r for r in runs}),
                }
                for design, g in got.items():
                    verdicts = ", ".join(f"{f}={v}" for f, v in g["verdicts"].items())
                    print(f"{seed:>4} {design:10} {verdicts:36} {g['sessions']:>8} {g['starts']:>6} {g['rounds'] or '-':>6}",
                          flush=True)
                print(f"{'':>4} stopped: {got['sequential']['stopped']}", flush=True)
                rows.append(got)
    same = sum(r["fixed"]["verdicts"] == r["sequential"]["verdicts"] for r in rows)
    fixed_sessions = sum(r["fixed"]["sessions"] for r in rows)
    seq_sessions = sum(r["sequential"]["sessions"] for r in rows)
    more_starts = sum(r["sequential"]["starts"] > r["fixed"]["starts"] for r in rows)
    print(f"verdicts identical in {same} of {len(rows)} seeds; sessions {seq_sessions} sequential vs {fixed_sessions} "
          f"fixed ({100 * (1 - seq_sessions / fixed_sessions):.0f}% saved); server starts "
          f"{sum(r['sequential']['starts'] for r in rows)} vs {sum(r['fixed']['starts'] for r in rows)} "
          f"(seeds with more: {more_starts}); {time.monotonic() - began:.0f}s")


if __name__ == "__main__":
    main()
