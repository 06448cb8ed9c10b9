"""Time exact power and sample size for docs/statistics.md's design (12% vs 1%), cold caches, and print the numbers.

Run: .venv/bin/python benchmarks/bench_power.py
"""

from __future__ import annotations

import time

from repro.stats import power as power_module
from repro.stats import power_two_proportions, sample_size_two_proportions


def _cold() -> None:
    power_module._p_value.cache_clear()
    power_module._fisher_one_sided.cache_clear()
    power_module._boschloo_floor.cache_clear()


def main() -> None:
    # CPU seconds beside wall seconds: the machine may be shared.
    print(f"{'what':44} {'result':>8} {'wall s':>8} {'cpu s':>8} {'scipy calls':>11}")
    for test in ("fisher", "boschloo"):
        for n in (60, 70, 85):
            _cold()
            start, cpu = time.perf_counter(), time.process_time()
            value = power_two_proportions(0.12, 0.01, n, n, test=test)
            took, cpu = time.perf_counter() - start, time.process_time() - cpu
            calls = power_module._p_value.cache_info().misses
            print(f"{f'power {test} n={n}':44} {value:8.4f} {took:8.2f} {cpu:8.2f} {calls:11d}")
    for test in ("fisher", "boschloo"):
        _cold()
        start, cpu = time.perf_counter(), time.process_time()
        n = sample_size_two_proportions(0.12, 0.01, test=test)
        took, cpu = time.perf_counter() - start, time.process_time() - cpu
        calls = power_module._p_value.cache_info().misses
        print(f"{f'sample size {test} (80% power)':44} {n:8d} {took:8.2f} {cpu:8.2f} {calls:11d}")


if __name__ == "__main__":
    main()
