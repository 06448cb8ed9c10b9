"""`repro gate`: pass, fail or inconclusive for one run against a tolerated corruption rate (and a baseline).

Pure evaluation over loaded runs; the CLI prints the lines and exits with the code. Exit codes follow
docs/troubleshooting.md: 0 passed, 1 failed (the rate is shown to exceed the limit or the baseline), 125 inconclusive
(so `git bisect run` skips), 2 bad input (a UsageError before any check). A run that did not finish
(no summary, interrupted, fewer sessions recorded than planned) or whose records are damaged is
inconclusive, never a pass: its evidence is partial or unusable. A `repro run --until-decided` run that
stopped because it was decided is finished; its rate check replays the run's looks (repro.run.stopping).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from repro.errors import EXIT_FAILED, EXIT_INCONCLUSIVE, EXIT_OK, UsageError
from repro.report.junit import gate_cases, junit_xml
from repro.report.model import fmt_conf, fmt_pct
from repro.run.stopping import BaselineRule, StoppingRule, max_looks, replay, waves_of
from repro.stats import assess_inconclusive, clopper_pearson, upper_bound
from repro.stats.equivalence import DEFAULT_MARGIN
from repro.stats.verdict import MAX_TIMEOUT_FRACTION, MIN_COMPLETED
from repro.store.records import OutcomeCounts
from repro.store.rundir import DamagedRun, Run, load_run

CheckStatus = Literal["pass", "fail", "inconclusive"]


@dataclass(frozen=True)
class GateCheck:
    name: str
    status: CheckStatus
    line: str
    """One line with the numbers, as printed."""
    numbers: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GateResult:
    exit_code: int
    checks: list[GateCheck]

    @property
    def status(self) -> CheckStatus:
        return {EXIT_OK: "pass", EXIT_FAILED: "fail"}.get(self.exit_code, "inconclusive")  # type: ignore[return-value]

    def lines(self) -> list[str]:
        """What the gate prints: one line per check, then the verdict with its exit code."""
        return [check.line for check in self.checks] + [f"gate: {self.status.upper()} (exit {self.exit_code})"]

    def as_record(self) -> dict[str, Any]:
        """The JSON form stored in summary.json's `gate` and read back by the report."""
        return {"status": self.status, "exit_code": self.exit_code, "checks": [asdict(c) for c in self.checks]}


def write_junit(result: GateResult, run_dir: Path, output: Path) -> None:
    """The gate's checks as JUnit XML: one testcase per check, its numbers as properties."""
    cases = gate_cases(Path(run_dir).name, result.as_record()["checks"])
    try:
        Path(output).write_text(junit_xml(cases, suite="repro.gate"), encoding="utf-8")
    except OSError as err:
        raise UsageError(f"--junit {output}: cannot write ({err.strerror or err})") from None


def _load(run: Run | Path | str) -> Run:
    return run if isinstance(run, Run) else load_run(run)


def _lower_bound(k: int, n: int, confidence: float) -> float:
    # A two-sided Clopper-Pearson interval at 2c-1 puts (1-c) in each tail: its low end is the one-sided bound.
    return clopper_pearson(k, n, 2 * confidence - 1).low


def _finished(run: Run, *, allow_partial: bool) -> GateCheck:
    """Did the run record every session it planned? A partial run's rate is not the deployment's."""
    recorded = sum(session.outcome != "interrupted" for session in run.sessions)
    planned = run.manifest.options.get("sessions")
    numbers: dict[str, Any] = {"recorded": recorded, "planned": planned, "allow_partial": allow_partial}
    summary = run.summary
    if summary is None:
        problem = f"no summary.json: the run did not finish (crashed or killed); {recorded} sessions recorded"
    elif summary.interrupted:
        why = [reason for reason in summary.inconclusive_reasons if reason.startswith("the run ")]
        problem = f"the run did not finish: {why[0] if why else 'interrupted'}; {recorded} sessions recorded"
    elif summary.stopping is not None and summary.stopping.decision != "undecided" and recorded == summary.stopping.sessions:
        numbers["stopped"] = summary.stopping.decision
        return GateCheck("finished", "pass", f"finished: ok: stopped when decided ({summary.stopping.decision}) after "
                         f"{recorded} sessions (cap {planned})", numbers)
    elif isinstance(planned, int) and recorded < planned:
        problem = f"only {recorded} of {planned} planned sessions recorded"
    elif summary.sessions != len(run.sessions):
        problem = f"summary.json counts {summary.sessions} sessions, sessions.jsonl holds {len(run.sessions)}"
    else:
        of = f" of {planned} planned" if isinstance(planned, int) else ""
        return GateCheck("finished", "pass", f"finished: ok: {recorded}{of} sessions recorded", numbers)
    if allow_partial:
        return GateCheck("finished", "pass", f"finished: PARTIAL (allowed by --allow-partial): {problem}", numbers)
    return GateCheck("finished", "inconclusive",
                     f"finished: INCONCLUSIVE: {problem} (--allow-partial judges what was recorded)", numbers)


def _evidence(counts: OutcomeCounts, *, threshold: float, confidence: float, min_completed: int,
              max_timeout_rate: float) -> GateCheck:
    verdict = assess_inconclusive(
        counts.clean, counts.corrupt, counts.timeout, counts.error,
        min_completed=min_completed, max_timeout_fraction=max_timeout_rate,
        threshold=threshold if threshold > 0 else None, confidence=confidence,
    )
    judged = counts.clean + counts.corrupt + counts.timeout + counts.error
    timeout_share = counts.timeout / judged if judged else 0.0
    numbers = {"completed": counts.completed, "sessions": judged, "timeout": counts.timeout,
               "error": counts.error, "min_completed": min_completed, "max_timeout_rate": max_timeout_rate}
    facts = (f"{counts.completed} of {judged} sessions completed (minimum {min_completed}), "
             f"{counts.timeout} timed out ({fmt_pct(timeout_share)}, limit {fmt_pct(max_timeout_rate)})")
    if verdict.inconclusive:
        return GateCheck("evidence", "inconclusive", f"evidence: INCONCLUSIVE: {'; '.join(verdict.reasons)}", numbers)
    return GateCheck("evidence", "pass", f"evidence: ok: {facts}", numbers)


def _rate(counts: OutcomeCounts, *, limit: float, confidence: float) -> GateCheck:
    k, n = counts.corrupt, counts.completed
    conf = fmt_conf(confidence)
    if n == 0:
        return GateCheck("corruption-rate", "inconclusive",
                         "corruption-rate: INCONCLUSIVE: no completed sessions, no estimate",
                         {"k": 0, "n": 0, "limit": limit, "confidence": confidence})
    upper, lower = upper_bound(k, n, confidence), _lower_bound(k, n, confidence)
    numbers = {"k": k, "n": n, "rate": k / n, "lower": lower, "upper": upper, "limit": limit, "confidence": confidence}
    observed = f"{k} of {n} completed sessions corrupt ({fmt_pct(k / n)})"
    if lower > limit:
        return GateCheck("corruption-rate", "fail",
                         f"corruption-rate: FAIL: {observed}; at {conf} confidence the rate is above "
                         f"{fmt_pct(lower, precise=True)} (one-sided lower bound), over the "
                         f"{fmt_pct(limit, precise=True)} allowed", numbers)
    if limit == 0:
        # A zero-tolerance invariant: no interval ever lies under 0, so "none observed" is the pass.
        return GateCheck("corruption-rate", "pass",
                         f"corruption-rate: PASS: {observed}; none observed under a zero-tolerance limit "
                         f"(the rate is below {fmt_pct(upper, precise=True)} at {conf})", numbers)
    if upper < limit:
        return GateCheck("corruption-rate", "pass",
                         f"corruption-rate: PASS: {observed}; the rate is below {fmt_pct(upper, precise=True)} "
                         f"({conf} upper bound), under the {fmt_pct(limit, precise=True)} allowed", numbers)
    return GateCheck("corruption-rate", "inconclusive",
                     f"corruption-rate: INCONCLUSIVE: {observed}; the {conf} upper bound {fmt_pct(upper, precise=True)} "
                     f"is not under {fmt_pct(limit, precise=True)} and the rate is not shown to exceed it: "
                     "run more sessions", numbers)


def _sequential_rate(run: Run, *, limit: float, confidence: float, min_completed: int) -> GateCheck:
    """The rate check of a `--until-decided` run: its looks replayed from sessions.jsonl under the gate's own
    limit and confidence. The confidence sequence is valid at every look at once, so the verdict keeps its
    error rate whatever made the run stop (repro.run.stopping)."""
    assert run.summary is not None and run.summary.stopping is not None
    rule = StoppingRule(limit=limit, confidence=confidence, min_completed=min_completed)
    looks = replay(rule, waves_of(run.sessions, run.summary.stopping.wave))
    last = looks[-1] if looks else rule.look(0, 0, 0)
    numbers = {"k": last.corrupt, "n": last.completed, "lower": last.low, "upper": last.high, "limit": limit,
               "confidence": confidence, "looks": len(looks), "method": "confidence sequence"}
    line = f"looks replayed: {len(looks)}; {rule.describe(last)}"
    if last.decision == "fail":
        return GateCheck("corruption-rate", "fail", f"corruption-rate: FAIL: {line}", numbers)
    if last.decision == "pass":
        return GateCheck("corruption-rate", "pass", f"corruption-rate: PASS: {line}", numbers)
    return GateCheck("corruption-rate", "inconclusive", f"corruption-rate: INCONCLUSIVE: {line}: run more sessions",
                     numbers)


def _sequential_baseline(run: Run, base: Run, *, confidence: float) -> GateCheck:
    """The baseline check of a run that stopped against a baseline: its group-sequential looks replayed, each at
    alpha over the planned looks (repro.run.stopping), so stopping early does not raise the error rate."""
    assert run.summary is not None and run.summary.stopping is not None
    stop = run.summary.stopping
    ref = OutcomeCounts.of(base.sessions)
    rule = BaselineRule(baseline_corrupt=ref.corrupt, baseline_completed=ref.completed,
                        max_looks=max_looks(stop.cap, stop.wave), margin=stop.margin or 0.05,
                        confidence=confidence, baseline=base.name)
    looks = replay(rule, waves_of(run.sessions, stop.wave))
    last = looks[-1] if looks else rule.look(0, 0, 0)
    numbers = {"k": last.corrupt, "n": last.completed, "baseline_k": ref.corrupt, "baseline_n": ref.completed,
               "baseline": base.name, "p_boschloo": last.p_value, "looks": len(looks), "max_looks": rule.max_looks}
    line = f"looks replayed: {len(looks)} of at most {rule.max_looks}; {rule.describe(last)}"
    status: CheckStatus = "fail" if last.decision == "fail" else "pass" if last.decision == "pass" else "inconclusive"
    return GateCheck("baseline", status, f"baseline: {status.upper()}: {line}", numbers)


def _baseline(counts: OutcomeCounts, base: Run, *, confidence: float, margin: float) -> GateCheck:
    """Worse (fail), better or practically equivalent within ±margin (pass), or an increase shown under the
    margin (pass: the gate asks "no worse"); anything else is inconclusive, with the sessions that would decide."""
    ref = OutcomeCounts.of(base.sessions)
    k, n, kb, nb = counts.corrupt, counts.completed, ref.corrupt, ref.completed
    numbers: dict[str, Any] = {"k": k, "n": n, "baseline_k": kb, "baseline_n": nb, "baseline": base.name,
                               "margin": margin}
    if n == 0 or nb == 0:
        return GateCheck("baseline", "inconclusive",
                         f"baseline: INCONCLUSIVE: {k}/{n} vs {kb}/{nb} in baseline {base.name!r}: "
                         "no completed sessions on one side", numbers)
    # Imported here: statsmodels (and pandas under it) load only for a gate with a baseline.
    from repro.stats import compare
    from repro.stats.equivalence import describe, equivalence

    result = compare(k, n, kb, nb, alternative="two-sided", confidence=confidence)
    verdict = equivalence(k, n, kb, nb, timeout1=counts.timeout, timeout2=ref.timeout, margin=margin,
                          confidence=confidence, pvalue=result.p_boschloo)
    numbers.update(p_boschloo=result.p_boschloo, p_fisher=result.p_fisher, difference=result.difference,
                   diff_low=verdict.low, diff_high=verdict.high, verdict=verdict.verdict,
                   sessions_to_decide=verdict.sessions_to_decide)
    facts = (f"{k}/{n} ({fmt_pct(k / n)}) vs {kb}/{nb} ({fmt_pct(kb / nb)}) in baseline {base.name!r}, "
             f"Boschloo p={result.p_boschloo:.2g} (Fisher {result.p_fisher:.2g}, two-sided); {describe(verdict)}")
    if verdict.verdict == "worse":
        return GateCheck("baseline", "fail", f"baseline: FAIL: {facts}", numbers)
    if verdict.verdict in ("better", "practically equivalent"):
        return GateCheck("baseline", "pass", f"baseline: PASS: {facts}", numbers)
    if verdict.noninferior:
        return GateCheck("baseline", "pass", f"baseline: PASS: any increase is under the {100 * margin:g}-point "
                         f"margin: {facts}", numbers)
    return GateCheck("baseline", "inconclusive", f"baseline: INCONCLUSIVE: {facts}", numbers)


def _side_channels(run: Run, base: Run, *, confidence: float) -> GateCheck:
    """The finish_reason mix, output length and speculative acceptance against the baseline. A shift never
    fails the gate (a lead, not a verdict: docs/statistics.md), but the line names it."""
    from repro.report.sidechannels import channels_of, compare_channels
    from repro.stats.sidechannels import describe

    tests = compare_channels(channels_of(run.sessions, run.path), channels_of(base.sessions, base.path),
                             alpha=1 - confidence)
    shifted = [test.channel for test in tests if test.shifted]
    numbers = {test.channel: {"p": test.p_adjusted, "shifted": test.shifted, "test": test.test} for test in tests}
    head = f"SHIFTED ({', '.join(shifted)})" if shifted else "ok"
    return GateCheck("side-channels", "pass", f"side-channels: {head}: " + "; ".join(describe(t) for t in tests),
                     numbers)


def _exercised(run: Run) -> GateCheck | None:
    """Did the load make every feature the server had on act? A feature that never did makes a clean rate
    meaningless for it: inconclusive, naming the feature and the metric. None for runs that recorded nothing."""
    exercise = run.summary.exercised if run.summary is not None else None
    if exercise is None or not exercise.features:
        return None
    idle = exercise.idle()
    numbers = {f.feature: {"status": f.status, "metric": f.metric, "value": exercise.facts[f.fact].value}
               for f in exercise.features}
    if idle:
        return GateCheck("exercised", "inconclusive", "exercised: INCONCLUSIVE: " + "; ".join(f.line for f in idle),
                         numbers)
    return GateCheck("exercised", "pass", "exercised: ok: " + "; ".join(f.line for f in exercise.features), numbers)


def evaluate(
    run_dir: Run | Path | str,
    *,
    max_corruption_rate: float,
    confidence: float = 0.95,
    baseline: Run | Path | str | None = None,
    max_timeout_rate: float | None = None,
    min_completed: int = MIN_COMPLETED,
    allow_partial: bool = False,
    margin: float = DEFAULT_MARGIN,
) -> GateResult:
    """Judge a run. Evidence wins: a rate shown to exceed the limit fails even when the run is thin or
    unfinished. Damaged records make the result inconclusive (exit 125): the evidence is unusable."""
    if not 0.0 <= max_corruption_rate < 1.0:
        raise UsageError(f"--max-corruption-rate must be at least 0 and below 1, got {max_corruption_rate}")
    if not 0.5 < confidence < 1.0:
        raise UsageError(f"--confidence must be above 0.5 and below 1, got {confidence}")
    timeout_limit = MAX_TIMEOUT_FRACTION if max_timeout_rate is None else max_timeout_rate
    if not 0.0 <= timeout_limit <= 1.0:
        raise UsageError(f"--max-timeout-rate must be between 0 and 1, got {timeout_limit}")
    if min_completed < 1:
        raise UsageError(f"--min-completed must be at least 1, got {min_completed}")
    if not 0.0 < margin < 1.0:
        raise UsageError(f"--margin must be strictly between 0 and 1, got {margin}")
    try:
        run = _load(run_dir)
        base = _load(baseline) if baseline is not None else None
    except DamagedRun as err:
        return GateResult(EXIT_INCONCLUSIVE, [GateCheck("records", "inconclusive", f"records: INCONCLUSIVE: {err}")])
    counts = OutcomeCounts.of(run.sessions)
    # A zero limit is judged as always (any corrupt session fails, none passes): stopping early cannot bias that.
    sequential = run.summary is not None and run.summary.stopping is not None and max_corruption_rate > 0
    checks = [
        _finished(run, allow_partial=allow_partial),
        _evidence(counts, threshold=max_corruption_rate, confidence=confidence, min_completed=min_completed,
                  max_timeout_rate=timeout_limit),
        _sequential_rate(run, limit=max_corruption_rate, confidence=confidence, min_completed=min_completed)
        if sequential else _rate(counts, limit=max_corruption_rate, confidence=confidence),
    ]
    exercised = _exercised(run)
    if exercised is not None:
        checks.insert(2, exercised)
    if base is not None:
        stop = run.summary.stopping if run.summary is not None else None
        checks.append(_sequential_baseline(run, base, confidence=confidence) if stop is not None and stop.baseline
                      else _baseline(counts, base, confidence=confidence, margin=margin))
        checks.append(_side_channels(run, base, confidence=confidence))
    statuses = {c.status for c in checks}
    code = EXIT_FAILED if "fail" in statuses else EXIT_INCONCLUSIVE if "inconclusive" in statuses else EXIT_OK
    return GateResult(code, checks)
