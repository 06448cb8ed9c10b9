"""What the commit and flag searches share: numbering and running probes (one at a time here, or
several at once as Ray tasks: repro.bisect.executor) into the journal, showing progress, and ending
with bisect.json, the reports and an exit code.

Exit codes: 0 a culprit was named; 1 the search showed there is none (the bad end did not
reproduce); 3 every probe of a step was lost with its Ray task (a node died: `--resume` probes
again); 125 it could not decide (budget spent, every candidate inconclusive, a good end that
corrupts too); 130 interrupted (every probe that ended is kept: `--resume` goes on).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.text import Text

from repro.bisect.executor import NumberedProbe, ProbeExecutor
from repro.bisect.journal import Journal, ProbeRecord
from repro.bisect.posterior import ProbePlan
from repro.bisect.probe import ProbeJob, ProbeSettings
from repro.bisect.report import write_reports
from repro.errors import EXIT_FAILED, EXIT_INCONCLUSIVE, EXIT_OK, EXIT_TARGET

EXIT_BY_STATUS = {"found": EXIT_OK, "no_culprit": EXIT_FAILED, "lost": EXIT_TARGET}


@dataclass(frozen=True)
class SearchOutcome:
    path: Path
    state: dict[str, Any]
    exit_code: int


@dataclass(frozen=True)
class ProbeRequest:
    """One probe the search wants: what it deploys (`job`), how it runs (`plan`) and why it was chosen."""

    target: str
    job: ProbeJob
    plan: ProbePlan
    why: str
    index: int | None = None
    subset: list[int] | None = None


class ProbesLost(Exception):
    """Every probe of a step was lost with its Ray task: the cluster, not the target, failed."""


def _label(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:40].strip("-") or "probe"


class Search:
    """A search's journal and probe runner: `probe_all()` runs the next probes and records them."""

    def __init__(self, journal: Journal, settings: ProbeSettings, console: Console, executor: ProbeExecutor) -> None:
        self.journal = journal
        self.settings = settings
        self.console = console
        self.executor = executor
        self.records: list[ProbeRecord] = journal.probes()
        if self.records:
            console.print(Text(f"resuming {journal.path}: {len(self.records)} probe(s) already recorded"))

    @property
    def sessions(self) -> int:
        return sum(r.clean + r.corrupt + r.timeout + r.error for r in self.records)

    def _numbers(self, count: int) -> list[int]:
        """The `count` lowest numbers no recorded probe has: after probes one at a time, the next ones;
        after an interrupted step of probes at once, first those of its probes that never ended."""
        used = {r.number for r in self.records}
        out: list[int] = []
        number = 1
        while len(out) < count:
            if number not in used:
                out.append(number)
            number += 1
        return out

    def probe(self, request: ProbeRequest, *,
              posterior: Callable[[list[ProbeRecord]], list[float]] | None = None) -> ProbeRecord:
        """Run one probe and record it."""
        return self.probe_all([request], posterior=posterior)[0]

    def probe_all(self, requests: list[ProbeRequest], *,
                  posterior: Callable[[list[ProbeRecord]], list[float]] | None = None) -> list[ProbeRecord]:
        """Run the probes (at once when the executor can), record each as it ends (with `posterior` of
        every record so far), and return their records in the order of `requests`. ProbesLost when
        every one of them was lost."""
        numbered = []
        for number, request in zip(self._numbers(len(requests)), requests):
            plan = request.plan
            self.console.print(Text(f"[probe {number}] {request.target}: {request.why}; {plan.mode}, "
                                    f"{plan.round_sessions} sessions a round"))
            numbered.append(NumberedProbe(number, _label(request.target), request.job, plan,
                                          seed=self.settings.seed + 1000 * number))
        by_number = {item.number: request for item, request in zip(numbered, requests)}
        ended: dict[int, ProbeRecord] = {}
        with contextlib.closing(self.executor.run(numbered, self.journal, self.settings.load, self.console)) as results:
            for item, result, node in results:
                request = by_number[item.number]
                record = ProbeRecord(number=item.number, target=request.target, why=request.why, index=request.index,
                                     subset=request.subset, node=node, **asdict(result))
                if posterior is not None:
                    record = record.model_copy(update={"posterior": posterior([*self.records, record])})
                self.journal.append(record)
                self.records.append(record)
                self.journal.write_state(self._state({"kind": self.journal.setup["kind"], "status": "running"}))
                ended[item.number] = record
        batch = [ended[item.number] for item in numbered]
        if all(record.verdict == "lost" for record in batch):
            raise ProbesLost(batch[-1].message or "the probe's Ray task ended without a result")
        return batch

    def _state(self, state: dict[str, Any]) -> dict[str, Any]:
        return {**state, "sessions": self.sessions, "probes": [r.model_dump(mode="json") for r in self.records]}

    def lost(self, state: dict[str, Any], err: ProbesLost) -> SearchOutcome:
        """End a search whose last probes were all lost: the cluster failed, and `--resume` probes again."""
        return self.finish({**state, "status": "lost", "found": [],
                            "conclusion": f"The search stopped: its last probes were lost ({err}); "
                                          "--resume probes them again."})

    def finish(self, state: dict[str, Any]) -> SearchOutcome:
        """Write bisect.json and the reports, print the conclusion, and choose the exit code."""
        state = self._state(state)
        self.journal.write_state(state)
        md, html = write_reports(self.journal.path, state)
        self.console.print(Text(state["conclusion"], style="bold"))
        self.console.print(Text(f"bisect: {self.journal.path} (bisect.json, {md.name}, {html.name})"))
        return SearchOutcome(self.journal.path, state, EXIT_BY_STATUS.get(state["status"], EXIT_INCONCLUSIVE))
