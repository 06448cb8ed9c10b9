"""Did a matrix cell exercise its levels? A cell that did not is left out of the analysis and named.

Two kinds of check, on the cell's own metrics.csv:
- built in: every feature a process's `/server_info` shows on must have acted (repro.store.exercise:
  HiCache loads back from the host tier, PD transfers KV, CUDA graphs run decode passes); a feature
  whose metric the target does not export is unknown and does not exclude the cell;
- written in the spec: each level's `exercise:` conditions (repro.store.conditions) must hold. One that
  names a metric the target does not export is bad input (exit 2): it could never be checked.

A factor's verdict needs its level to have acted somewhere: a bf16 index-K acts only through HiCache's
load-backs, so a "no detectable effect" of a level that never saw one becomes "not exercised"
(`idle_levels`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from repro.errors import UsageError
from repro.matrix.spec import Level, MatrixSpec
from repro.store.conditions import ConditionError, evaluate, parse
from repro.store.exercise import FACT_WORDS, Scrapes, assess, read_samples
from repro.store.rundir import METRICS



class RunFacts(Protocol):
    """What `idle_levels` reads of a cell's run (matrix.analysis.CellRun has it)."""

    status: str
    cell: dict[str, str]
    exercised: dict[str, float | None]


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


LEVEL_FACTS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("enable_hierarchical_cache", lambda value: value is True, "host_load_back_tokens"),
    # Any index-K dtype acts only on the bytes a load-back copies.
    ("index_k_dtype", lambda value: value is not None, "host_load_back_tokens"),
    ("disaggregation_mode", lambda value: value in ("prefill", "decode"), "pd_transfer_mb"),
    ("disable_cuda_graph", lambda value: value is False, "cuda_graph_passes"),
)
"""`confirm` key of a level, whether its value turns the feature on, and the fact that shows it acting."""


def level_fact(level: Level) -> str | None:
    """The fact that shows a level acting, from the keys it confirms (dotted paths by their last part)."""
    confirmed = {key.rsplit(".", 1)[-1]: value for key, value in level.confirm.items()}
    return next((fact for key, is_on, fact in LEVEL_FACTS if key in confirmed and is_on(confirmed[key])), None)


def idle_levels(spec: MatrixSpec, runs: Sequence[RunFacts]) -> dict[tuple[str, str], str]:
    """(factor, level) -> why it never acted: its fact was known and 0 in every finished run at that level."""
    idle: dict[tuple[str, str], str] = {}
    for name, factor in spec.factors.items():
        for level_name in factor.levels:
            fact = level_fact(factor.level(level_name))
            values = [run.exercised.get(fact) for run in runs
                      if fact and run.status == "finished" and run.cell.get(name) == level_name]
            known = [value for value in values if value is not None]
            if known and len(known) == len(values) and not any(known):
                idle[(name, level_name)] = (f"{FACT_WORDS[fact]} stayed 0 in all {len(known)} runs with "
                                            f"{factor.label or name} {level_name}")
    return idle

