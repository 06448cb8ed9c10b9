"""The shipped simulator matrix on Ray's two-node test cluster against the local executor, in one session.

Starts `ray.cluster_utils.Cluster` on loopback (two nodes, one CPU and 80 MB of object store each,
custom resources node_a and node_b; HiCache-off cells pinned to node_a, -on to node_b), runs
matrices/sim_hicache_bf16.yaml with `--executor local` and then `--executor ray`, and prints each
wall time, their ratio and whether every factor's verdict and every cell's counts agree.

Usage: `python benchmarks/matrix_ray.py [--replicates 2] [--sessions 32]`. Prints numbers only.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import yaml

from ray_bench import ROOT, timed_repro, two_nodes
from repro.matrix.spec import SpecLoader


def matrix(spec: Path, out: Path, *extra: str) -> float:
    return timed_repro(out, "matrix", str(spec), "--out", str(out), "--no-cell-reports", *extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--keep", type=Path, help="Keep both matrix directories here (default: a temporary one).")
    args = parser.parse_args()
    data = yaml.load((ROOT / "matrices" / "sim_hicache_bf16.yaml").read_text(), Loader=SpecLoader)
    data["load"].update(workload=str(ROOT / "experiments" / "agentic_coding.yaml"), sessions=args.sessions,
                        concurrency=args.sessions)
    data["design"]["replicates"] = args.replicates
    data["resources"] = {"run": {"CPU": 1}, "levels": {"hicache": {"off": {"node_a": 1}, "on": {"node_b": 1}}}}
    with tempfile.TemporaryDirectory(prefix="matrix-ray-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        spec = root / "spec.yaml"
        spec.write_text(yaml.safe_dump(data, sort_keys=False))
        with two_nodes() as cluster:
            local = matrix(spec, root / "local")
            on_ray = matrix(spec, root / "ray", "--executor", "ray", "--ray-address", cluster.address)
        results = {name: json.loads((root / name / "matrix.json").read_text()) for name in ("local", "ray")}
        verdicts = {name: {f["factor"]: f["verdict"] for f in r["factors"]} for name, r in results.items()}
        cells = {name: {c["name"]: c["counts"] for c in r["cells"]} for name, r in results.items()}
        runs = args.replicates * 4
        print(f"sim matrix, {runs} runs of {args.sessions} sessions: local {local:.1f}s, "
              f"Ray 2-node test cluster {on_ray:.1f}s, ratio ray/local {on_ray / local:.2f}")
        print(f"verdicts local: {verdicts['local']}")
        print(f"verdicts ray:   {verdicts['ray']}")
        print(f"verdicts identical: {verdicts['local'] == verdicts['ray']}; "
              f"cell counts identical: {cells['local'] == cells['ray']}")
        print(f"verdict local: {results['local']['verdict']}")
        print(f"verdict ray:   {results['ray']['verdict']}")


if __name__ == "__main__":
    main()
