"""`repro run --until-decided`: the anytime-valid rule that stops a run in waves, and its replay for the gate.

A run started with `--until-decided` runs its sessions in waves of `--concurrency` and looks at the
counts after each finished wave. Against a tolerated rate R it keeps the beta-binomial mixture
confidence sequence (repro.stats.sequential.confidence_sequence) at alpha = 1 - confidence: the
chance that it EVER excludes the true rate, at any look, is at most alpha (Ville's inequality), so
stopping at the first look where it lies wholly above R (fail) or wholly below R (pass) keeps the
wrong-verdict rate at most alpha however the looks were chosen. `--sessions` is the cap: a run that
reaches it undecided says so.

The looks are a function of sessions.jsonl alone (session ids in waves of the run's wave size), so
`repro gate` replays them and reaches the run's decision from the records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal, Sequence

from repro.records import OutcomeCounts, SessionRecord, StoppingRecord
from repro.stats.verdict import MIN_COMPLETED

StopDecision = Literal["pass", "fail", "undecided"]
RULE = "beta-binomial mixture confidence sequence"


@dataclass(frozen=True)
class Look:
    """The counts after one finished wave and what the rule made of them."""

    sessions: int
    """Sessions finished so far (every outcome)."""
    corrupt: int
    completed: int
    low: float
    high: float
    decision: StopDecision | None
    """None: keep going."""


@dataclass(frozen=True)
class StoppingRule:
    """Stop when the confidence sequence of the corruption rate lies wholly on one side of `limit`.

    A pass also needs `min_completed` completed sessions, as the gate's evidence check does, so a
    run never stops on a pass the gate would call thin.
    """

    limit: float
    confidence: float = 0.95
    min_completed: int = MIN_COMPLETED

    def look(self, corrupt: int, completed: int, sessions: int) -> Look:
        from repro.stats.sequential import confidence_sequence

        interval = confidence_sequence(corrupt, completed, alpha=1 - self.confidence)
        decision: StopDecision | None = None
        if completed and interval.low > self.limit:
            decision = "fail"
        elif interval.high < self.limit and completed >= self.min_completed:
            decision = "pass"
        return Look(sessions, corrupt, completed, interval.low, interval.high, decision)

    def replay(self, waves: Iterable[Sequence[SessionRecord]]) -> list[Look]:
        """The looks after each wave, up to and including the first that decides."""
        looks: list[Look] = []
        seen: list[SessionRecord] = []
        for wave in waves:
            seen.extend(wave)
            counts = OutcomeCounts.of(seen)
            looks.append(self.look(counts.corrupt, counts.completed, len(seen)))
            if looks[-1].decision is not None:
                break
        return looks

    def describe(self, look: Look) -> str:
        """Why the run stopped (or did not), in one line."""
        conf = f"{self.confidence:.0%}"
        bounds = f"[{100 * look.low:.1f}%, {100 * look.high:.1f}%]"
        observed = f"{look.corrupt} of {look.completed} completed sessions corrupt"
        if look.decision == "fail":
            return f"{observed}; the {conf} confidence sequence {bounds} lies above the {100 * self.limit:g}% allowed"
        if look.decision == "pass":
            return f"{observed}; the {conf} confidence sequence {bounds} lies below the {100 * self.limit:g}% allowed"
        return f"{observed}; the {conf} confidence sequence {bounds} still holds {100 * self.limit:g}%"


def waves_of(sessions: Sequence[SessionRecord], wave: int) -> list[list[SessionRecord]]:
    """Session records grouped into the waves they ran in: ids 0..wave-1, wave..2*wave-1, and so on."""
    ordered = sorted(sessions, key=lambda record: record.session_id)
    groups: dict[int, list[SessionRecord]] = {}
    for record in ordered:
        groups.setdefault(record.session_id // wave, []).append(record)
    return [groups[index] for index in sorted(groups)]


def stopping_record(rule: StoppingRule, looks: Sequence[Look], *, wave: int, cap: int, interrupted: bool) -> StoppingRecord:
    """summary.json's `stopping`: the rule, the looks, what was spent and why the run stopped."""
    last = looks[-1] if looks else rule.look(0, 0, 0)
    decision: StopDecision = last.decision or "undecided"
    if last.decision is not None:
        reason = f"decided at look {len(looks)}: {rule.describe(last)}"
    elif interrupted:
        reason = f"interrupted before a decision: {rule.describe(last)}"
    else:
        reason = f"reached the cap of {cap} sessions undecided: {rule.describe(last)}"
    return StoppingRecord(
        rule=RULE, limit=rule.limit, confidence=rule.confidence, wave=wave, cap=cap, looks=len(looks),
        sessions=last.sessions, decision=decision, reason=reason, low=last.low, high=last.high,
    )
