"""The bisect directory on disk: what the search was asked (setup.json), every probe as it ended
(probes.jsonl, appended, flushed and fsynced), and the whole state (bisect.json, rewritten
atomically after every probe with status "running", and at the end with the conclusion). `--resume` reads setup.json and probes.jsonl back; SIGKILL therefore
loses only the probes that were running, whose directories are moved aside and rerun.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from repro.errors import UsageError
from repro.jsonl import read_journal, read_json_object
from repro.store.rundir import dump_json

SETUP = "setup.json"
PROBES = "probes.jsonl"
BISECT_JSON = "bisect.json"
PROBE_DIRS = "probes"


class ProbeRecord(BaseModel):
    """One ended probe: where it ran, what it counted, what it concluded, and why."""

    model_config = ConfigDict(extra="ignore")

    number: int
    """1-based number, in the order the probes were chosen (probes run at once are numbered in the
    order they were chosen and recorded as they end; a probe lost to an interruption leaves its number
    to the next probe chosen)."""
    target: str
    """What was probed: a commit's label, or the changes applied (flags)."""
    index: int | None = None
    """The commit's index in the range (commit bisection), in the search's order: 0 is the good end,
    the oldest commit, or with --find-fix the newest."""
    subset: list[int] | None = None
    """The changes applied to the good configuration (flag bisection)."""
    why: str | None = None
    """Why this probe was chosen (the decision trail)."""
    verdict: Literal["bad", "good", "undecided", "inconclusive", "lost"]
    """undecided: the probe's test reached its cap (its counts count); inconclusive: they do not (the
    target failed to build, start or serve); lost: the probe's Ray task ended without a result (its
    node died): no evidence about the target, which may be probed again (`--resume` does)."""
    corrupt: int = 0
    clean: int = 0
    timeout: int = 0
    error: int = 0
    rounds: int = 0
    run_dirs: list[str] = Field(default_factory=list)
    message: str | None = None
    """Why the probe is inconclusive (a failed build or start, too many timeouts), when it is."""
    posterior: list[float] | None = None
    """Commit bisection: P(culprit = c) for every commit after this probe, then P(none) last."""
    duration_s: float = 0.0
    node: dict[str, str] | None = None
    """Where the probe ran (repro.cluster.node): the host name, and `ray_node_id` under the Ray executor."""

    @property
    def completed(self) -> int:
        return self.clean + self.corrupt


def probe_name(number: int, label: str) -> str:
    """The name of probe `number`'s directory (and of its Ray task)."""
    return f"{number:03d}-{label}"


class Journal:
    """A bisect directory: created fresh, or reopened with `resume=True` for the same setup."""

    def __init__(self, path: Path, setup: dict[str, Any], *, resume: bool) -> None:
        self.path = Path(path)
        self.setup = setup
        if resume:
            self._reopen()
        else:
            if self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
                raise UsageError(f"--out {self.path}: exists and is not empty; choose a new path or pass --resume")
            (self.path / PROBE_DIRS).mkdir(parents=True, exist_ok=True)
            dump_json(self.path / SETUP, setup)

    def _reopen(self) -> None:
        file = self.path / SETUP
        if not file.exists():
            raise UsageError(f"--resume {self.path}: not a bisect directory (no {SETUP})")
        recorded = read_json_object(file, f"--resume {self.path}")
        if recorded != json.loads(json.dumps(self.setup)):
            changed = sorted(k for k in {*recorded, *self.setup} if recorded.get(k) != self.setup.get(k))
            raise UsageError(
                f"--resume {self.path}: the bisection was started with other settings ({', '.join(changed)}); "
                "resume with the same options, or start a new bisect directory"
            )

    def probes(self) -> list[ProbeRecord]:
        """Every probe that ended, in order; a torn last line (SIGKILL mid-write) is ignored."""
        return read_journal(self.path / PROBES, ProbeRecord.model_validate_json)

    def append(self, record: ProbeRecord) -> None:
        with open(self.path / PROBES, "a", encoding="utf-8") as fh:
            fh.write(record.model_dump_json() + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def probe_dir(self, number: int, label: str) -> Path:
        """A fresh directory for probe `number`; a leftover of a killed attempt is moved aside first."""
        path = self.path / PROBE_DIRS / probe_name(number, label)
        if path.exists():
            n = 1
            while (aside := path.with_name(f"{path.name}.partial-{n}")).exists():
                n += 1
            path.rename(aside)
        path.mkdir(parents=True)
        return path

    def write_state(self, state: dict[str, Any]) -> None:
        dump_json(self.path / BISECT_JSON, state)
