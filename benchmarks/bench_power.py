"""Time exact power and sample size for docs/statistics.md's design (12% vs 1%), cold caches, and print the numbers;
then a power curve on large arms (480 sessions each, 30% against 36-40%), whose designs share many tables.

Run: .venv/bin/python benchmarks/bench_power.py
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from repro.stats import power as power_module
from repro.stats import power_two_proportions, sample_size_two_proportions


SCIPY = Counter[str]()
_scipy_p_value = power_module._p_value


def _counted_p_value(*args: Any) -> float:
    SCIPY["calls"] += 1
    return _scipy_p_value(*args)


power_module._p_value = _counted_p_value  # the tables scipy decides, counted


def _cold() -> None:
    SCIPY.clear()
    power_module._decisions.cache_clear()
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
            calls = SCIPY["calls"]
            print(f"{f'power {test} n={n}':44} {value:8.4f} {took:8.2f} {cpu:8.2f} {calls:11d}")
    _cold()
    start, cpu = time.perf_counter(), time.process_time()
    curve = [power_two_proportions(0.30 + d, 0.30, 480, 480, test="fisher") for d in (0.06, 0.07, 0.08, 0.09, 0.10)]
    took, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"{'power curve fisher n=480, 5 designs':44} {curve[-1]:8.4f} {took:8.2f} {cpu:8.2f} {SCIPY['calls']:11d}")
    for test in ("fisher", "boschloo"):
        _cold()
        start, cpu = time.perf_counter(), time.process_time()
        n = sample_size_two_proportions(0.12, 0.01, test=test)
        took, cpu = time.perf_counter() - start, time.process_time() - cpu
        calls = SCIPY["calls"]
        print(f"{f'sample size {test} (80% power)':44} {n:8d} {took:8.2f} {cpu:8.2f} {calls:11d}")


if __name__ == "__main__":
    main()
