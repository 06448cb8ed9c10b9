"""A git repository of simulated "server versions" to bisect: each commit edits `sim.flags`, the
simulator flags the deploy command reads, and one commit drops `--index-k-gate` (the index-K read
stops waiting for its layer's load-back while the main-KV read still does: the seeds' "the gate was
already there"). The commits around it change unrelated flags, timing and eviction settings; one
commit can be made unbuildable (`build.sh` exits 1) to exercise inconclusive probes. With `--fix K`
the history runs the other way: the first commits lack the gate and commit K adds it (the fix a
`--find-fix` search names).

    python -m repro.bisect.simrepo PATH [--commits 64] [--culprit 40 | --fix 40] [--broken 20]

then bisect it with the deploy command printed at the end.
"""

from __future__ import annotations

import argparse
import random
import subprocess
from pathlib import Path
from typing import Collection

DEPLOY = "${python} -m repro.sim serve --host 127.0.0.1 --port ${port} $(cat sim.flags)"
BUILD = "bash build.sh"
BASE = {
    "--enable-hierarchical-cache": None,
    "--index-k-dtype": "bf16",
    "--index-k-gate": None,
    # A fast clock and long sessions: the fault corrupts a large share of sessions at 16 at once. The
    # virtual clock makes each commit's faults its seed's, whatever the machine's load.
    "--clock": "virtual",
    "--time-scale": "0.05",
    "--final-after-turns": "10",
    "--tp": "8",
}
# Changes that leave the race alone: launch-compatibility flags, write policy, prefill chunking, host pool size.
UNRELATED = [
    ("--tp", ["4", "8"]),
    ("--hicache-write-policy", ["write_through", "write_back", "write_through_selective"]),
    ("--mem-fraction-static", ["0.80", "0.85", "0.88"]),
    ("--attention-backend", ["dsv4", "flashmla"]),
    ("--cuda-graph-max-bs", ["64", "128", "160"]),
    ("--hicache-io-backend", ["kernel", "direct"]),
]


def _render(flags: dict[str, str | None]) -> str:
    return " ".join(k if v is None else f"{k} {v}" for k, v in flags.items()) + "\n"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, timeout=60)


def build_repo(
    path: Path, *, commits: int = 16, culprit: int = 9, broken: Collection[int] = (), seed: int = 0,
    fix: bool = False,
) -> list[str]:
    """Create the repository at `path` with `commits` commits (index 0 is good) and return their shas.

    Commit `culprit` removes the index-K gate, or with `fix` (index 0 is bad) adds it; the commits in
    `broken` ship a build.sh that fails. Every other commit changes one unrelated setting.
    """
    if not 1 <= culprit < commits:
        raise ValueError(f"culprit must be in 1..{commits - 1}, got {culprit}")
    rng = random.Random(seed)
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q", "-b", "main")
    _git(path, "config", "user.email", "sim@example.invalid")
    _git(path, "config", "user.name", "sim versions")
    flags = {k: v for k, v in BASE.items() if not (fix and k == "--index-k-gate")}
    shas = []
    for index in range(commits):
        if index == 0:
            subject = f"v0: HiCache with a bf16 index-K, index-K read {'not ' if fix else ''}gated"
        elif index == culprit and fix:
            flags["--index-k-gate"] = None
            subject = f"v{index}: gate the index-K read on its layer's load-back"
        elif index == culprit:
            flags.pop("--index-k-gate", None)
            subject = f"v{index}: drop the index-K gate (the outer pool's gate is already there)"
        else:
            key, values = UNRELATED[rng.randrange(len(UNRELATED))]
            flags[key] = rng.choice([v for v in values if v != flags.get(key)])
            subject = f"v{index}: {key.lstrip('-')} {flags[key]}"
        (path / "sim.flags").write_text(_render(flags), encoding="utf-8")
        failing = index in broken
        (path / "build.sh").write_text("echo 'build: missing header'; exit 1\n" if failing else "exit 0\n", encoding="utf-8")
        if failing:
            subject += " (does not build)"
        _git(path, "add", "-A")
        _git(path, "commit", "-q", "-m", subject)
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
        shas.append(out.stdout.strip())
    return shas


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--commits", type=int, default=64)
    parser.add_argument("--culprit", type=int, default=40)
    parser.add_argument("--fix", type=int, help="the commit that adds the gate (instead of --culprit removing it)")
    parser.add_argument("--broken", type=int, action="append", default=[], help="an unbuildable commit (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    fix = args.fix is not None
    changed = args.fix if fix else args.culprit
    shas = build_repo(args.path, commits=args.commits, culprit=changed, broken=args.broken, seed=args.seed, fix=fix)
    print(f"{args.path}: {len(shas)} commits; the {'fix' if fix else 'culprit'} is {shas[changed]}")
    ends = f"--bad {shas[0]} --good {shas[-1]} --find-fix" if fix else f"--good {shas[0]} --bad {shas[-1]}"
    print(f"repro bisect commits --repo {args.path} {ends} --build '{BUILD}' \\\n"
          f"    --deploy '{DEPLOY}' --sessions 16")


if __name__ == "__main__":
    main()
