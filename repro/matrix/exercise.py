"""Did a matrix cell exercise its levels? A cell that did not is left out of the analysis and named.

Two kinds of check, on the cell's own metrics.csv:
- built in: every feature a process's `/server_info` shows on must have acted (repro.store.exercise:
  HiCache loads back from the host tier, PD transfers KV, CUDA graphs run decode passes); a feature
  whose metric the target does not export is unknown and does not exclude the cell;
- written in the spec: each level's `exercise:` conditions (repro.store.conditions) must hold. One that
  names a metric the target does not export is bad input (exit 2): it could never be checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from repro.errors import UsageError
from repro.matrix.spec import MatrixSpec
from repro.store.conditions import ConditionError, evaluate, parse
from repro.store.exercise import Scrapes, assess, read_samples
from repro.store.rundir import METRICS


def not_exercised(spec: MatrixSpec, cell: Mapping[str, str], run_dir: Path,
                  server_info: Mapping[str, Any] | None) -> str | None:
    """One line naming every level the cell did not exercise and the metric that shows it; None if it did."""
    samples = read_samples(Path(run_dir) / METRICS)
    reasons: list[str] = []
    for process, info in (server_info or {}).items():
        if isinstance(info, Mapping):
            reasons += [f"{feature.line} (process {process})" for feature in assess(samples, info).idle()]
    scrapes = Scrapes(samples)
    for factor, level_name in cell.items():
        spec_factor = spec.factors[factor]
        for text in spec_factor.level(level_name).exercise:
            try:
                outcome = evaluate(parse(text), scrapes)
            except ConditionError as err:
                raise UsageError(f"factors.{factor}.levels.{level_name}.exercise: {err}") from None
            if not outcome.held:
                reasons.append(f"{spec_factor.label or factor} {level_name}: {outcome.line()}")
    return "; ".join(dict.fromkeys(reasons)) or None
