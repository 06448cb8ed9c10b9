"""A sweep's load options: `repro run`'s flags and `--config` YAML (repro.run.flags), applied to every level.

The sweep chooses each level's concurrency, directory and name itself; the options of a single run's
verdict (the gate, the stopping rule) and of sharding have no meaning for a level and are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from repro.errors import UsageError
from repro.run.options import RunOptions

SET_PER_LEVEL = ("concurrency", "out", "name")
"""A `--config` file's values for these are replaced by the sweep's, level by level."""
REFUSED = ("until_decided", "baseline", "margin", "max_corruption_rate", "workers", "executor", "ray_address",
           "worker_resources")
"""A single run's gate, stopping rule and sharding: a sweep judges its levels against each other instead."""
DEFAULT_SESSIONS = 60


@dataclass(frozen=True)
class SweepLoad:
    """What every level runs: its sessions, the deployment's URL or simulator flags, and the run options."""

    sessions: int
    base_url: str | None
    sim_args: list[str]
    run_options: dict[str, Any] = field(default_factory=dict)


def sweep_load(*, sessions: int | None, base_url: str | None, load: dict[str, Any]) -> SweepLoad:
    """The command line's values (None: not given) over `--config`'s, checked as a run's options are."""
    config = load.get("config")
    given = {key: value for key, value in load.items() if key != "config" and value is not None}
    options = RunOptions.from_sources(config, {**given, "sessions": sessions, "base_url": base_url})
    chosen = options.model_dump(include=options.model_fields_set)
    refused = [name for name in REFUSED if name in chosen]
    if refused:
        where = f"--config {config}" if config is not None else "sweep"
        raise UsageError(f"{where}: {refused[0]} is a single run's option; a sweep compares its levels instead "
                         "(remove it)")
    return SweepLoad(
        sessions=options.sessions if "sessions" in chosen else DEFAULT_SESSIONS,
        base_url=options.base_url,
        sim_args=list(options.sim_args),
        run_options={key: value for key, value in chosen.items()
                     if key not in (*SET_PER_LEVEL, "sessions", "base_url", "sim_args")},
    )


def check_sessions(sessions: int, levels: list[int]) -> None:
    """Every level must run exactly its concurrency: refuse a level above the sessions it is given."""
    above = [level for level in levels if level > sessions]
    if above:
        raise UsageError(f"--sessions {sessions} is below concurrency {above[0]}: that level could only run "
                         f"{sessions} sessions at once; give --sessions {max(levels)} or more, or drop the level")

