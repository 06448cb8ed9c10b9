"""`repro bisect commits` on a repository of simulator versions: local, one probe at a time, against
Ray's two-node test cluster with `--parallel 1` and `--parallel 2`, in one session.

Builds the repository with repro.bisect.simrepo (`--commits`, `--culprit`), starts
`ray.cluster_utils.Cluster` on loopback (two nodes with one CPU and 80 MB of object store each, so two
one-CPU probes at once land one on each node), runs the same bisection (same seed) with each executor
in turn and prints, per run, the wall time, the probes and steps it took, the culprit it named and the
nodes its probes ran on.

Usage: `python benchmarks/bisect_ray.py [--commits 16] [--culprit 11] [--sessions 16]`. Prints numbers only.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from ray_bench import timed_repro, two_nodes
from repro.bisect.simrepo import BUILD, DEPLOY, build_repo


def bisect(repo: Path, good: str, out: Path, sessions: int, *extra: str) -> float:
    return timed_repro(out, "bisect", "commits", "--repo", str(repo), "--good", good, "--bad", "main", "--build", BUILD,
                       "--deploy", DEPLOY, "--sessions", str(sessions), "--turns", "14", "--out", str(out), *extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=16)
    parser.add_argument("--culprit", type=int, default=11)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--keep", type=Path, help="Keep the bisect directories here (default: a temporary one).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bisect-ray-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        shas = build_repo(root / "repo", commits=args.commits, culprit=args.culprit)
        with two_nodes() as cluster:
            ray = ["--executor", "ray", "--ray-address", cluster.address]
            runs = {
                "local": bisect(root / "repo", shas[0], root / "local", args.sessions),
                "ray --parallel 1": bisect(root / "repo", shas[0], root / "ray1", args.sessions, *ray),
                "ray --parallel 2": bisect(root / "repo", shas[0], root / "ray2", args.sessions, *ray, "--parallel", "2"),
            }
        print(f"{args.commits} simulator versions, culprit {args.culprit}, {args.sessions} sessions a round")
        for (name, wall), folder in zip(runs.items(), ("local", "ray1", "ray2")):
            state = json.loads((root / folder / "bisect.json").read_text())
            probes = state["probes"]
            # A step is one probe, or the probes at once whose first is at the posterior's quantile 1/(K+1).
            steps = sum(not p["why"].startswith("quantile") or p["why"].startswith("quantile 1/") for p in probes)
            named = state["found"][0].split()[0] if state["found"] else "none"
            nodes = len({(p.get("node") or {}).get("ray_node_id") or (p.get("node") or {}).get("hostname") for p in probes})
            print(f"{name:>17}: {wall:6.1f}s wall, {len(probes)} probes, ~{steps} steps, "
                  f"{state['sessions']} sessions, named commit {named} (right: {named == str(args.culprit)}), "
                  f"ran on {nodes} node(s)")


if __name__ == "__main__":
    main()
