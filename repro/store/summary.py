"""Finished sessions → `records.Summary`: counts, the corruption rate with its intervals, latency percentiles.

Pure: no I/O. The rate's denominator is completed sessions (clean + corrupt); timeouts and errors
are counted apart and bound the rate from both sides (repro.stats).
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

import numpy as np

from repro.store.exercise import idle_reasons
from repro.store.loops import count_loops
from repro.store.records import Exercise, OutcomeCounts, ParserEffect, Percentiles, RateEstimate, SessionRecord, Summary
from repro.stats import Interval, assess_inconclusive, clopper_pearson, timeout_bounds
from repro.stats.verdict import MIN_COMPLETED


def percentiles(values: Iterable[float | None]) -> Percentiles:
    data = np.array([value for value in values if value is not None], dtype=float)
    if data.size == 0:
        return Percentiles(count=0)
    p50, p90, p99 = np.percentile(data, [50, 90, 99])
    return Percentiles(count=int(data.size), p50=float(p50), p90=float(p90), p99=float(p99), max=float(data.max()))


def rate(interval: Interval, k: int, n: int) -> RateEstimate:
    return RateEstimate(
        k=k,
        n=n,
        estimate=interval.estimate,
        ci_low=interval.low,
        ci_high=interval.high,
        method=interval.method,
        confidence=interval.confidence,
    )


def summarize(
    sessions: Sequence[SessionRecord],
    *,
    loop_lag_s: Sequence[float] = (),
    worker_loop_lag_s: Sequence[Sequence[float]] = (),
    duration_s: float = 0.0,
    interrupted: bool = False,
    stop_reason: str | None = None,  # why an interrupted run stopped, when no signal stopped it (a full disk)
    lost: int = 0,  # finished sessions that could not be written to sessions.jsonl
    min_completed: int = MIN_COMPLETED,
    observe: str | None = None,
    raw_source: str | None = None,
    exercised: Exercise | None = None,
) -> Summary:
    """The summary of a run from its session records; `observe` and `raw_source` say how turns were judged.

    A feature the server had on and the load never made act (`exercised`) makes the run inconclusive: its
    clean sessions say nothing about that feature."""
    tally = OutcomeCounts.of(sessions)
    clean, corrupt, timeout, error = tally.clean, tally.corrupt, tally.timeout, tally.error
    completed = tally.completed
    worst, best = timeout_bounds(corrupt, clean, timeout)
    verdict = assess_inconclusive(clean, corrupt, timeout, error, min_completed=min_completed,
                                  interrupted=tally.interrupted)
    reasons = list(verdict.reasons)
    if interrupted:
        reasons.append(f"{stop_reason or 'the run was interrupted'} ({tally.interrupted} sessions in flight)")
    if lost:
        reasons.append(f"{lost} finished sessions could not be written to sessions.jsonl")
    idle = idle_reasons(exercised)
    reasons += idle
    turns = [turn for session in sessions for turn in session.turns]
    turn_counts: Counter[str] = Counter()
    for turn in turns:
        turn_counts[turn.verdict if turn.status == "ok" and turn.verdict else turn.status] += 1
    return Summary(
        sessions=len(sessions),
        counts=tally.outcomes(),
        wedged=tally.wedged,
        corruption_rate=rate(clopper_pearson(corrupt, completed), corrupt, completed),
        worst_case=rate(worst, corrupt + timeout, completed + timeout),
        best_case=rate(best, corrupt, completed + timeout),
        suspect_sessions=tally.suspect,
        inconclusive=verdict.inconclusive or interrupted or bool(lost) or bool(idle),
        inconclusive_reasons=reasons,
        turns=len(turns),
        turn_counts=dict(turn_counts),
        loops=count_loops(sessions),
        latency={
            "ttft_s": percentiles(turn.ttft_s for turn in turns),
            "e2e_s": percentiles(turn.e2e_s for turn in turns),
            "queue_s": percentiles(turn.queue_s for turn in turns if turn.status != "interrupted"),
            "max_gap_s": percentiles(turn.max_gap_s for turn in turns),
            "session_s": percentiles(s.end_s - s.start_s for s in sessions),
        },
        loop_lag=percentiles(loop_lag_s) if loop_lag_s else None,
        worker_loop_lag=[percentiles(samples) for samples in worker_loop_lag_s],
        duration_s=duration_s,
        interrupted=interrupted,
        observe=observe,
        raw_source=raw_source,
        parser_effect=ParserEffect.of(sessions) if observe in ("raw", "both") else None,
        exercised=exercised,
    )
