"""What the commit and flag searches share: numbering and running probes into the journal, showing
progress, and ending with bisect.json, the reports and an exit code.

Exit codes: 0 a culprit was named; 1 the search showed there is none (the bad end did not
reproduce); 125 it could not decide (budget spent, every candidate inconclusive, a good end that
corrupts too); 130 interrupted (every probe that ended is kept: `--resume` goes on).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.text import Text

from repro.bisect.journal import Journal, ProbeRecord
from repro.bisect.posterior import ProbePlan
from repro.bisect.probe import ProbeResult, ProbeSettings, run_probe
from repro.bisect.report import write_reports
from repro.errors import EXIT_FAILED, EXIT_INCONCLUSIVE, EXIT_OK
from repro.matrix.deploy import LaunchPlan

EXIT_BY_STATUS = {"found": EXIT_OK, "no_culprit": EXIT_FAILED}


@dataclass(frozen=True)
class SearchOutcome:
    path: Path
    state: dict[str, Any]
    exit_code: int


def _label(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:40].strip("-") or "probe"


class Search:
    """A search's journal and probe runner: `probe()` runs the next probe (or reuses a recorded one)."""

    def __init__(self, journal: Journal, settings: ProbeSettings, console: Console) -> None:
        self.journal = journal
        self.settings = settings
        self.console = console
        self.records: list[ProbeRecord] = journal.probes()
        if self.records:
            console.print(Text(f"resuming {journal.path}: {len(self.records)} probe(s) already recorded"))

    @property
    def sessions(self) -> int:
        return sum(r.clean + r.corrupt + r.timeout + r.error for r in self.records)

    def probe(
        self,
        target: str,
        launch: Callable[[Path], LaunchPlan | ProbeResult],
        plan: ProbePlan,
        *,
        why: str,
        index: int | None = None,
        subset: list[int] | None = None,
        posterior: Callable[[list[ProbeRecord]], list[float]] | None = None,
    ) -> ProbeRecord:
        """Run one probe of `target` and record it. `launch(probe_dir)` prepares the deployment (a
        checkout, a build) and returns its plan, or a ProbeResult when the preparation already failed."""
        number = len(self.records) + 1
        self.console.print(Text(f"[probe {number}] {target}: {why}; {plan.mode}, {plan.round_sessions} sessions a round"))
        probe_dir = self.journal.probe_dir(number, _label(target))
        prepared = launch(probe_dir)
        if isinstance(prepared, ProbeResult):
            result = prepared
            self.console.print(Text(f"  inconclusive: {result.message}"))
        else:
            result = run_probe(prepared, plan, self.settings.load, probe_dir, seed=self.settings.seed + 1000 * number,
                               console=self.console)
        fields = asdict(result)
        record = ProbeRecord(number=number, target=target, why=why, index=index, subset=subset, **fields)
        if posterior is not None:
            record = record.model_copy(update={"posterior": posterior([*self.records, record])})
        self.journal.append(record)
        self.records.append(record)
        self.journal.write_state(self._state({"kind": self.journal.setup["kind"], "status": "running"}))
        return record

    def _state(self, state: dict[str, Any]) -> dict[str, Any]:
        return {**state, "sessions": self.sessions, "probes": [r.model_dump(mode="json") for r in self.records]}

    def finish(self, state: dict[str, Any]) -> SearchOutcome:
        """Write bisect.json and the reports, print the conclusion, and choose the exit code."""
        state = self._state(state)
        self.journal.write_state(state)
        md, html = write_reports(self.journal.path, state)
        self.console.print(Text(state["conclusion"], style="bold"))
        self.console.print(Text(f"bisect: {self.journal.path} (bisect.json, {md.name}, {html.name})"))
        return SearchOutcome(self.journal.path, state, EXIT_BY_STATUS.get(state["status"], EXIT_INCONCLUSIVE))
