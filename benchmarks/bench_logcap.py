"""What a capped server log costs: a process printing as fast as it can, its output written straight to a
file and through `repro.procs.logcap` (the matrix's default for every launched process).

For each: seconds to print N MiB (the writer must keep up, or the server blocks on its pipe),
throughput, and the bytes left on disk. The seeds' flood was 1.9 GB in 15 s, about 130 MB/s.

Usage: `python benchmarks/bench_logcap.py [--mib 1000] [--cap-mb 200]`. Prints numbers only.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from repro.procs.process import start_process

FLOOD = (
    "import sys\n"
    "line = b'x' * 1023 + b'\\n'\n"
    "block = line * 64\n"
    "out = sys.stdout.buffer\n"
    "for _ in range({blocks}): out.write(block)\n"
)


def measure(mib: int, cap: int | None, root: Path) -> tuple[float, int]:
    log = root / ("capped.log" if cap else "plain.log")
    started = time.perf_counter()
    proc = start_process([sys.executable, "-c", FLOOD.format(blocks=mib * 16)], log_path=log, log_max_bytes=cap)
    proc.popen.wait()
    proc.stop()
    elapsed = time.perf_counter() - started
    return elapsed, sum(f.stat().st_size for f in root.glob(log.name + "*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1000, help="how much to print, MiB")
    parser.add_argument("--cap-mb", type=int, default=200, help="the cap, MB (as log_max_bytes / 1e6)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for label, cap in (("file", None), ("logcap", args.cap_mb * 1_000_000)):
            elapsed, kept = measure(args.mib, cap, root)
            print(
                f"{label:7s} {args.mib} MiB printed in {elapsed:.2f} s "
                f"({args.mib / elapsed:.0f} MiB/s); {kept / 1e6:.1f} MB on disk"
            )


if __name__ == "__main__":
    main()
