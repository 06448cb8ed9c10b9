"""`repro run --until-decided`: the anytime-valid rule that stops a run in waves, and its replay for the gate.

A run started with `--until-decided` runs its sessions in waves of `--concurrency` and looks at the
counts after each finished wave. Against a tolerated rate R it keeps the beta-binomial mixture
confidence sequence (repro.stats.sequential.confidence_sequence) at alpha = 1 - confidence: the
chance that it EVER excludes the true rate, at any look, is at most alpha (Ville's inequality), so
stopping at the first look where it lies wholly above R (fail) or wholly below R (pass) keeps the
wrong-verdict rate at most alpha however the looks were chosen. `--sessions` is the cap: a run that
reaches it undecided says so.

Against a finished baseline run (`--baseline RUN_DIR`) the rule is group-sequential instead: the run
has at most K = ceil(cap / wave) looks, fixed before it starts, and each look spends alpha / K
(Bonferroni), so the chance that any look errs is at most alpha whatever the stopping. A look fails
the run when Boschloo's one-sided exact test shows an increase over the baseline at alpha / K; it
passes it when the increase is shown to be under `margin`: the run's one-sided Clopper-Pearson upper
bound at alpha / (2K) less the baseline's lower bound at alpha / 2 (fixed once: the baseline does not
grow). With few looks this spends far fewer sessions than a confidence sequence would.

The looks are a function of sessions.jsonl alone (session ids in waves of the run's wave size), so
`repro gate` replays them and reaches the run's decision from the records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Literal, Protocol, Sequence

from repro.errors import UsageError
from repro.run.options import RunOptions
from repro.stats.verdict import MIN_COMPLETED
from repro.store.records import OutcomeCounts, SessionRecord, StoppingRecord
from repro.store.rundir import DamagedRun, load_run

StopDecision = Literal["pass", "fail", "undecided"]
RULE = "beta-binomial mixture confidence sequence"
BASELINE_RULE = "group-sequential Boschloo test against a baseline, Bonferroni over the looks"


@dataclass(frozen=True)
class Look:
    """The counts after one finished wave and what the rule made of them."""

    sessions: int
    """Sessions finished so far (every outcome)."""
    corrupt: int
    completed: int
    low: float
    high: float
    """The rate's interval; against a baseline, the bounds of the increase over it."""
    decision: StopDecision | None
    """None: keep going."""
    p_value: float | None = None
    """Against a baseline: Boschloo's one-sided p of an increase at this look."""
    verdict: str | None = None
    """Against a baseline, once decided: worse, practically equivalent (the bracket [low, high] within
    ±margin), or "no worse than the margin" (only high under it)."""


class Rule(Protocol):
    def look(self, corrupt: int, completed: int, sessions: int) -> Look: ...

    def describe(self, look: Look) -> str: ...


def replay(rule: Rule, waves: Iterable[Sequence[SessionRecord]]) -> list[Look]:
    """The looks after each wave, up to and including the first that decides."""
    looks: list[Look] = []
    seen: list[SessionRecord] = []
    for wave in waves:
        seen.extend(wave)
        counts = OutcomeCounts.of(seen)
        looks.append(rule.look(counts.corrupt, counts.completed, len(seen)))
        if looks[-1].decision is not None:
            break
    return looks


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


@dataclass(frozen=True)
class BaselineRule:
    """Stop when an increase over a finished baseline (kb corrupt of nb completed) is shown, or shown to be
    under `margin`; at most `max_looks` looks, each at alpha / max_looks."""

    baseline_corrupt: int
    baseline_completed: int
    max_looks: int
    margin: float = 0.05
    confidence: float = 0.95
    baseline: str = "baseline"

    def bracket(self, corrupt: int, completed: int) -> tuple[float, float]:
        """(low, high) bounds of the run's rate minus the baseline's at one look: the run's Clopper-Pearson
        ends at alpha / (2K) each side, the baseline's at alpha / 2 (benchmarks/equivalence_error.py replays it)."""
        from repro.stats import clopper_pearson

        alpha = 1 - self.confidence
        # Two-sided Clopper-Pearson at 1 - 2a has a in each tail: its ends are the one-sided bounds at a.
        run = clopper_pearson(corrupt, completed, 1 - alpha / self.max_looks)
        base = clopper_pearson(self.baseline_corrupt, self.baseline_completed, 1 - alpha)
        return run.low - base.high, run.high - base.low

    def look(self, corrupt: int, completed: int, sessions: int) -> Look:
        from repro.stats import compare

        alpha = 1 - self.confidence
        kb, nb = self.baseline_corrupt, self.baseline_completed
        if completed == 0 or nb == 0:
            return Look(sessions, corrupt, completed, -1.0, 1.0, None)
        step = alpha / self.max_looks
        p = compare(corrupt, completed, kb, nb, alternative="greater").p_boschloo
        low, high = self.bracket(corrupt, completed)
        decision: StopDecision | None = None
        verdict: str | None
        if p < step:
            decision, verdict = "fail", "worse"
        else:
            verdict = self.pass_verdict(low, high)
            decision = "pass" if verdict is not None else None
        return Look(sessions, corrupt, completed, low, high, decision, p_value=p, verdict=verdict)

    def pass_verdict(self, low: float, high: float) -> str | None:
        """A look's pass, decided on its bracket alone (the fail test aside): its verdict, None for no pass
        (benchmarks/equivalence_error.py replays it)."""
        if high >= self.margin:
            return None
        # [low, high] brackets the difference with each end wrong at some look with chance at most
        # K * step/2 + alpha/2 = alpha: inside ±margin it is an anytime-valid equivalence (TOST).
        return "practically equivalent" if low > -self.margin else "no worse than the margin"

    def describe(self, look: Look) -> str:
        alpha = 1 - self.confidence
        step = alpha / self.max_looks
        observed = (f"{look.corrupt}/{look.completed} vs {self.baseline_corrupt}/{self.baseline_completed} in "
                    f"baseline {self.baseline!r}")
        if look.p_value is None:
            return f"{observed}: no completed sessions on one side"
        facts = (f"{observed}, Boschloo p={look.p_value:.2g} (each look at {step:.3g} = {alpha:g}/{self.max_looks}), "
                 f"increase under {100 * look.high:+.1f} points")
        if look.decision == "fail":
            return f"{facts}: an increase is shown"
        if look.decision == "pass" and look.verdict == "practically equivalent":
            return (f"{facts}: shown under the {100 * self.margin:g}-point margin, and practically equivalent "
                    f"(the difference lies in [{100 * look.low:+.1f}, {100 * look.high:+.1f}] points, within "
                    f"±{100 * self.margin:g})")
        if look.decision == "pass":
            return f"{facts}: shown under the {100 * self.margin:g}-point margin"
        return f"{facts}: neither an increase nor one under {100 * self.margin:g} points is shown yet"


def max_looks(cap: int, wave: int) -> int:
    return math.ceil(cap / wave)


def waves_of(sessions: Sequence[SessionRecord], wave: int) -> list[list[SessionRecord]]:
    """Session records grouped into the waves they ran in: ids 0..wave-1, wave..2*wave-1, and so on."""
    ordered = sorted(sessions, key=lambda record: record.session_id)
    groups: dict[int, list[SessionRecord]] = {}
    for record in ordered:
        groups.setdefault(record.session_id // wave, []).append(record)
    return [groups[index] for index in sorted(groups)]


def stopping_record(rule: StoppingRule | BaselineRule, looks: Sequence[Look], *, wave: int, cap: int, interrupted: bool) -> StoppingRecord:
    """summary.json's `stopping`: the rule, the looks, what was spent and why the run stopped."""
    last = looks[-1] if looks else rule.look(0, 0, 0)
    decision: StopDecision = last.decision or "undecided"
    if last.decision is not None:
        reason = f"decided at look {len(looks)}: {rule.describe(last)}"
    elif interrupted:
        reason = f"interrupted before a decision: {rule.describe(last)}"
    else:
        reason = f"reached the cap of {cap} sessions undecided: {rule.describe(last)}"
    against = isinstance(rule, BaselineRule)
    return StoppingRecord(
        rule=BASELINE_RULE if against else RULE, limit=None if against else rule.limit,
        confidence=rule.confidence, wave=wave, cap=cap, looks=len(looks), sessions=last.sessions,
        decision=decision, reason=reason, low=last.low, high=last.high,
        baseline=rule.baseline if against else None, margin=rule.margin if against else None,
        verdict=last.verdict,
    )


def rule_for(options: RunOptions) -> "StoppingRule | BaselineRule | None":
    """The `--until-decided` rule: against the baseline when one is given, else against the limit."""
    if not options.until_decided:
        return None
    if options.baseline is None:
        assert options.max_corruption_rate is not None  # RunOptions._stopping_needs
        return StoppingRule(limit=options.max_corruption_rate, confidence=options.confidence)
    try:
        base = load_run(options.baseline)
    except (DamagedRun, UsageError) as err:
        raise UsageError(f"--baseline: {err}") from None
    if base.summary is None or base.summary.interrupted:
        raise UsageError(f"--baseline {options.baseline}: the run did not finish; compare against a finished run")
    counts = OutcomeCounts.of(base.sessions)
    return BaselineRule(
        baseline_corrupt=counts.corrupt, baseline_completed=counts.completed,
        max_looks=max_looks(options.sessions, options.concurrency or options.sessions), margin=options.margin,
        confidence=options.confidence, baseline=base.name,
    )
