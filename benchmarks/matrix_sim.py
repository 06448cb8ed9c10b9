"""Time `repro matrix` on the simulator matrix and print where the time goes and what it concluded.

Runs matrices/sim_hicache_bf16.yaml (or the spec given) as a real `repro matrix` process, then prints
per run its counts and wall time, the matrix's total wall time, the time of the final analysis
(stratified tests, Firth regression, power) re-run in this process, and the verdicts.

    .venv/bin/python benchmarks/matrix_sim.py [SPEC] [--var NAME=VALUE ...] [--cell-reports]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default=str(ROOT / "matrices" / "sim_hicache_bf16.yaml"))
    parser.add_argument("--var", action="append", default=[], help="NAME=VALUE, passed to repro matrix")
    parser.add_argument("--cell-reports", action="store_true", help="also render each run's report.html")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="matrix-bench-") as tmp:
        out = Path(tmp) / "m"
        cmd = [sys.executable, "-c", "from repro.cli import main; main()", "matrix", options.spec, "--out", str(out)]
        cmd += [f"--var={v}" for v in options.var]
        cmd.append("--cell-reports" if options.cell_reports else "--no-cell-reports")
        started = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        wall = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"repro matrix exited {done.returncode}: {done.stderr.strip()[-600:]}")
        records = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
        print(f"{'run':34} {'clean':>5} {'corrupt':>7} {'timeout':>7} {'error':>5} {'wall s':>7}")
        for r in records:
            c = r["counts"]
            print(f"{r['key']:34} {c['clean']:>5} {c['corrupt']:>7} {c['timeout']:>7} {c['error']:>5} "
                  f"{r['duration_s']:>7.1f}")
        in_runs = sum(r["duration_s"] for r in records)
        print(f"matrix wall time {wall:.1f}s: {in_runs:.1f}s in runs (launch, readiness, load, teardown), "
              f"{wall - in_runs:.1f}s elsewhere (start-up, analysis, reports)")

        from repro.matrix.analysis import CellRun, analyse
        from repro.matrix.design import cells
        from repro.matrix.spec import load_spec, parse_assignments

        spec = load_spec(options.spec, parse_assignments(options.var))
        runs = [CellRun.model_validate(r) for r in records]
        order = [c.as_dict() for c in cells(spec)]
        analyse(spec, runs, order, len(runs))  # the first call pays the imports and compilation
        started = time.monotonic()
        analysis = analyse(spec, runs, order, len(runs))
        print(f"analysis (warm) {time.monotonic() - started:.2f}s")
        for effect in analysis.factors:
            print(f"  {effect.label}: {effect.verdict} (adjusted p {effect.p_adjusted})")
        print(analysis.verdict)


if __name__ == "__main__":
    main()
