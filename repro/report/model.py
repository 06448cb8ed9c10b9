"""Run directories → the report's view model: counts, intervals, verdicts, comparisons and drill-downs.

Everything here is computed from what `repro.store.rundir.load_run` returns (sessions.jsonl is the source of
truth, so a run that crashed before writing summary.json still gets a report); the statistics come
from `repro.stats`. Templates only format what this module decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Sequence

from repro.cluster.node import describe as describe_node
from repro.store.exercise import idle_reasons
from repro.report.queueing import queueing_note
from repro.store.loops import ControlReport, count_loops, read_control
from repro.store.records import Exercise, FindingRecord, LoopCounts, OutcomeCounts, ParserEffect, SessionRecord, StoppingRecord, TurnRecord
from repro.report.raw import RawExcerpt, read_raw, response_fields
from repro.report.sidebyside import SideBySide, place, side_by_side
from repro.stats import Inconclusive, Interval, assess_inconclusive, clopper_pearson, timeout_bounds, upper_bound
from repro.stats.equivalence import DEFAULT_MARGIN, EquivalenceResult, check_margin
from repro.stats.verdict import MAX_TIMEOUT_FRACTION, MIN_COMPLETED
from repro.store.rundir import METRICS, Run, load_run

if TYPE_CHECKING:
    # pandas and the two-sample tests (statsmodels) are imported where used: `repro gate` imports this
    # module for its formatting and would otherwise pay for both.
    import pandas as pd

    from repro.stats import Comparison
    from repro.stats.sidechannels import ChannelTest

VerdictKind = Literal["corrupt", "clean", "inconclusive"]

CONTEXT_CHARS = 400
"""Characters of model output shown on each side of an offending span."""
HIT_CHARS = 4000
"""Characters of an offending span shown; a repetition loop can make one span megabytes long."""
TEXT_CHARS = 1000
"""Characters shown of any other stored text (a task, an error, a tool name, a request id)."""


def clip_more(text: str, limit: int) -> tuple[str, int]:
    """The first `limit` characters of `text`, and how many UTF-8 bytes were left out after them."""
    if len(text) <= limit:
        return text, 0
    return text[:limit], len(text[limit:].encode("utf-8", "surrogatepass"))


def clip(text: object, limit: int = TEXT_CHARS) -> str:
    """`text` bounded for a report, ending in a visible "… N more bytes" marker when it was cut."""
    shown, more = clip_more("" if text is None else str(text), limit)
    return f"{shown} … {more} more bytes" if more else shown


def fmt_pct(x: float | None, *, precise: bool = False) -> str:
    """A rate as a reviewer reads it: 19%, 4.9%, 0.13%; an em dash when there is no estimate.

    `precise` keeps three significant digits, for bounds compared against a limit (1.98% vs 2%).
    """
    if x is None:
        return "—"
    value = 100.0 * x
    if precise:
        return f"{value:.3g}%"
    if value == 0.0 or value >= 10.0:
        return f"{value:.0f}%"
    if value >= 0.1:
        return f"{value:.1f}%"
    return f"{value:.2g}%"


def fmt_range(low: float, high: float) -> str:
    """An interval with one percent sign: 10–31%."""
    return f"{fmt_pct(low)[:-1]}–{fmt_pct(high)}"


def fmt_points(x: float | None) -> str:
    """A difference of rates in percentage points: +18.3 pts."""
    return "—" if x is None else f"{100 * x:+.1f} pts"


def fmt_conf(confidence: float) -> str:
    return f"{100 * confidence:g}%"


@dataclass(frozen=True)
class Verdict:
    """The banner: one headline sentence with the numbers, and further sentences for the details."""

    kind: VerdictKind
    headline: str
    details: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FindingView:
    """One finding with the offending span cut out of its field's text, so a template can highlight it."""

    rule: str
    field: str
    severity: str
    before: str
    hit: str
    after: str
    in_context: bool
    """False when the field's text could not be recovered from the raw bytes: `hit` is the stored excerpt."""
    hit_more: int = 0
    """Bytes of the span left out after `hit` (which holds its first HIT_CHARS characters)."""


@dataclass(frozen=True)
class TurnView:
    index: int
    status: str
    verdict: str | None
    finish_reason: str | None
    request_id: str | None
    tool_calls: list[str]
    error: str | None
    ttft_s: float | None
    e2e_s: float | None
    findings: list[FindingView]
    raw: RawExcerpt | None
    parsed_verdict: str | None = None
    raw_verdict: str | None = None
    """None in parsed mode or when the raw text was not whole (`raw_gap` says why)."""
    raw_source: str | None = None
    raw_gap: str | None = None
    raw_findings: list[FindingView] = field(default_factory=list)
    """Findings on the text the model generated, cut out of the rebuilt raw text."""
    raw_text: RawExcerpt | None = None
    lost_findings: list[FindingView] = field(default_factory=list)
    """What the server's parse lost of the raw text (`call-lost`, `param-lost`)."""
    side: SideBySide | None = None
    """A corrupt turn's raw text and parsed message side by side, the findings marked."""


@dataclass(frozen=True)
class SessionView:
    """A non-clean session for the drill-down: what went wrong, where, and how far it got cleanly."""

    session_id: int
    task: str
    outcome: str
    wedged: bool
    turns_taken: int
    clean_turns: int
    first_corrupt_turn: int | None
    rules: list[str]
    duration_s: float
    last_status: str | None
    error: str | None
    run: Run = field(repr=False, compare=False)
    record: SessionRecord = field(repr=False, compare=False)

    @cached_property
    def turns(self) -> list[TurnView]:
        """The turns worth showing: every turn that was not clean.

        Built on first use, so only the sessions a page shows in full read and parse their raw bytes.
        """
        return [_turn_view(self.run, t) for t in self.record.turns if not _all_clean(t)]


@dataclass(frozen=True)
class RunView:
    name: str
    path: Path
    run: Run
    counts: OutcomeCounts
    confidence: float
    rate: Interval
    upper: float
    """One-sided upper bound of the corruption rate over completed sessions."""
    worst: Interval
    best: Interval
    assessment: Inconclusive
    verdict: Verdict
    corrupt_sessions: list[SessionView]
    timeout_sessions: list[SessionView]
    error_sessions: list[SessionView]
    target: str
    started_at: str
    ended_at: str | None
    finished: bool
    """summary.json exists: the run ended (normally or by Ctrl-C) rather than crashing."""
    gate: dict[str, Any] | None
    metrics: pd.DataFrame | None
    """metrics.csv (t_s or elapsed_s, metric, labels, value) when present and readable."""
    notes: list[str]
    """Problems with the run directory that the report worked around (a torn metrics file, …)."""
    observe: str = "parsed"
    """What the run judged: parsed (runs from before raw mode too), raw or both."""
    effect: ParserEffect | None = None
    """How much damage the server's parser hid and made (raw and both modes)."""
    parser: str | None = None
    """Which parser code turned the text into messages: the client-side one, else the simulator's (None: unknown)."""
    stopping: StoppingRecord | None = None
    """How a `--until-decided` run stopped."""
    exercised: Exercise | None = None
    """What the load made the server do, from its metrics (runs from before it was recorded: None)."""
    node: str | None = None
    """Where the load ran: the host, and the Ray node under the Ray executor (runs from before: None)."""
    workers: list[str] = field(default_factory=list)
    """With `--workers`: where each worker ran, and why it was lost if it was."""
    loops: LoopCounts = field(default_factory=LoopCounts)
    """Turns with a loop signal (repro.store.loops): their own finding class, apart from corrupt ones."""
    control: ControlReport | None = None
    """control.json: what the run's control arms say about its failing turns (None: no control arm)."""


@dataclass(frozen=True)
class ComparisonRow:
    """One run against the reference run (the first one given)."""

    name: str
    reference: str
    k1: int
    n1: int
    k2: int
    n2: int
    result: Comparison
    p_holm: float
    equivalence: EquivalenceResult | None = None
    """Worse, better, practically equivalent within the margin, or inconclusive (repro.stats.equivalence)."""
    side: list[ChannelTest] = field(default_factory=list)
    """The side channels (finish_reason mix, output length, speculative acceptance) against the reference."""

    @property
    def verdict_line(self) -> str:
        from repro.stats.equivalence import describe

        return describe(self.equivalence) if self.equivalence is not None else "not compared"

    @property
    def side_lines(self) -> list[str]:
        from repro.stats.sidechannels import describe

        silent = self.silent_shifts
        return [describe(test, silent=test in silent) for test in self.side]

    @property
    def silent_shifts(self) -> list[ChannelTest]:
        """Side channels that shifted while the corruption verdict shows no difference."""
        if self.equivalence is not None and self.equivalence.verdict in ("worse", "better"):
            return []
        return [test for test in self.side if test.shifted]


@dataclass(frozen=True)
class ReportModel:
    runs: list[RunView]
    comparisons: list[ComparisonRow]
    confidence: float
    generated_at: str
    margin: float = DEFAULT_MARGIN
    """δ of the equivalence verdicts: the difference in corruption rate that does not matter."""

    @property
    def overall(self) -> VerdictKind:
        """The worst verdict of any run: corrupt beats inconclusive beats clean."""
        kinds = {run.verdict.kind for run in self.runs}
        for kind in ("corrupt", "inconclusive"):
            if kind in kinds:
                return kind  # type: ignore[return-value]
        return "clean"


def _option(run: Run, key: str, default: Any) -> Any:
    value = run.manifest.options.get(key)
    return default if value is None else value


def verdict_for(counts: OutcomeCounts, rate: Interval, upper: float, worst: Interval, best: Interval,
                assessment: Inconclusive, *, interrupted_run: bool = False, effect: ParserEffect | None = None,
                idle: Sequence[str] = ()) -> Verdict:
    """The banner's words. Evidence wins: any corrupt session makes the run corrupt, whatever timed out.

    `idle` names the features the server had on and the load never made act: without corruption, the run
    is then inconclusive, not clean."""
    conf = fmt_conf(rate.confidence)
    k, n = counts.corrupt, counts.completed
    details: list[str] = [effect.describe()] if effect is not None else []
    details += [f"Not exercised: {line}." for line in idle]
    if counts.timeout:
        details.append(
            f"{counts.timeout} of {counts.total} sessions timed out; counting each as corrupt or as clean, "
            f"the rate over all judged sessions lies between {fmt_pct(best.estimate)} and "
            f"{fmt_pct(worst.estimate)}."
        )
    if counts.suspect:
        details.append(f"{counts.suspect} clean sessions had soft findings only (suspect, not counted as corrupt).")
    if counts.error:
        details.append(f"{counts.error} sessions failed with transport or HTTP errors; they are not counted.")
    if counts.wedged:
        details.append(f"{counts.wedged} sessions had a stream that went silent (wedged).")
    if counts.interrupted or interrupted_run:
        details.append(f"The run was interrupted; {counts.interrupted} sessions were still in flight.")
    if k > 0:
        headline = (
            f"CORRUPT: {k} of {n} completed sessions ({fmt_pct(rate.estimate)}, {conf} CI "
            f"{fmt_range(rate.low, rate.high)}) returned broken tool-call markup."
        )
        if assessment.inconclusive:
            details.insert(0, "The rate itself is uncertain: " + "; ".join(assessment.reasons) + ".")
        return Verdict("corrupt", headline, details)
    if counts.total == 0:
        return Verdict("inconclusive", "INCONCLUSIVE: the run recorded no sessions.", details)
    if assessment.inconclusive:
        first, *rest = assessment.reasons
        headline = f"INCONCLUSIVE: {first}; 0 of {n} completed were corrupt, which proves nothing."
        return Verdict("inconclusive", headline, [r[:1].upper() + r[1:] + "." for r in rest] + details)
    if idle:
        headline = (f"INCONCLUSIVE: the load never exercised what it tests ({idle[0]}); 0 of {n} completed sessions "
                    "were corrupt, which proves nothing about it.")
        return Verdict("inconclusive", headline, details)
    headline = (
        f"CLEAN: 0 of {n} completed sessions corrupt; the corruption rate is below {fmt_pct(upper)} "
        f"({conf} upper bound)."
    )
    return Verdict("clean", headline, details)


def read_metrics(run_dir: Path) -> tuple[pd.DataFrame | None, str | None]:
    """metrics.csv as a frame with numeric t_s and value, or None and why it could not be used."""
    file = Path(run_dir) / METRICS
    if not file.exists():
        return None, None
    import pandas as pd

    try:
        frame = pd.read_csv(file, dtype={"metric": str, "labels": str}, keep_default_na=False)
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError, OSError) as err:
        return None, f"{METRICS} could not be read ({type(err).__name__}); server metrics are not shown"
    # `repro run` names the time column elapsed_s; t_s is the name in the issue.
    frame = frame.rename(columns={"elapsed_s": "t_s"})
    missing = {"t_s", "metric", "labels", "value"} - set(frame.columns)
    if missing:
        return None, f"{METRICS} lacks columns {', '.join(sorted(missing))}; server metrics are not shown"
    frame["t_s"] = pd.to_numeric(frame["t_s"], errors="coerce")
    frame["value"] = pd.to_numeric(frame["value"], errors="coerce")
    return frame.dropna(subset=["t_s", "value"]), None


def _all_clean(turn: TurnRecord) -> bool:
    """An answered turn that every verdict it carries calls clean."""
    verdicts = (turn.verdict, turn.parsed_verdict or "clean", turn.raw_verdict or "clean")
    return turn.status == "ok" and all(v == "clean" for v in verdicts) and not turn.lost_findings


def _finding_views(found: list[FindingRecord], texts: dict[str, str]) -> list[FindingView]:
    """Each finding with its span cut out of its field's text (a raw finding on the faithful parse's
    `content`, say, out of the raw text: repro.report.sidebyside.place), or its stored excerpt when the
    text is not there."""
    findings: list[FindingView] = []
    for finding in found:
        name = finding.field if finding.field in texts else "raw"
        text = texts.get(name)
        where = place(text, finding, name) if text is not None else None
        if text is not None and where is not None:
            start, end = where
            finding = finding.model_copy(update={"start": start, "end": end})
            hit, more = clip_more(text[finding.start : finding.end], HIT_CHARS)
            findings.append(
                FindingView(
                    rule=finding.rule,
                    field=finding.field,
                    severity=finding.severity,
                    before=text[max(0, finding.start - CONTEXT_CHARS) : finding.start],
                    hit=hit,
                    after=text[finding.end : finding.end + CONTEXT_CHARS],
                    in_context=True,
                    hit_more=more,
                )
            )
        else:
            hit, more = clip_more(finding.excerpt, HIT_CHARS)
            findings.append(
                FindingView(finding.rule, finding.field, finding.severity, "", hit, "", False, more)
            )
    return findings


def _turn_view(run: Run, turn: TurnRecord) -> TurnView:
    raw = read_raw(run.path, turn.raw_path) if turn.raw_path else None
    texts = response_fields(raw.data) if raw is not None else {}
    raw_text = read_raw(run.path, turn.raw_text_path) if turn.raw_text_path else None
    generated = {"raw": raw_text.data.decode("utf-8", "replace")} if raw_text is not None else {}
    return TurnView(
        index=turn.index,
        status=turn.status,
        verdict=turn.verdict,
        finish_reason=turn.finish_reason,
        request_id=turn.request_id,
        tool_calls=list(turn.tool_calls),
        error=turn.error,
        ttft_s=turn.ttft_s,
        e2e_s=turn.e2e_s,
        findings=_finding_views(turn.findings, texts),
        raw=raw.excerpt if raw is not None else None,
        parsed_verdict=turn.parsed_verdict,
        raw_verdict=turn.raw_verdict,
        raw_source=turn.raw_source,
        raw_gap=turn.raw_gap,
        raw_findings=_finding_views(turn.raw_findings, generated),
        raw_text=raw_text.excerpt if raw_text is not None else None,
        lost_findings=_finding_views(turn.lost_findings, texts),
        side=side_by_side(
            generated.get("raw"), {**texts, "finish_reason": turn.finish_reason} if texts and turn.finish_reason else texts,
            turn.findings, turn.raw_findings, turn.lost_findings,
            hidden=turn.raw_verdict == "corrupt" and turn.parsed_verdict != "corrupt",
        ) if turn.verdict == "corrupt" else None,
    )


def _session_view(run: Run, session: SessionRecord) -> SessionView:
    return SessionView(
        session_id=session.session_id,
        task=session.task,
        outcome=session.outcome,
        wedged=session.wedged,
        turns_taken=len(session.turns),
        clean_turns=session.clean_turns,
        first_corrupt_turn=session.first_corrupt_turn,
        rules=list(session.rules),
        duration_s=session.end_s - session.start_s,
        last_status=session.turns[-1].status if session.turns else None,
        error=session.error,
        run=run,
        record=session,
    )


def _parser_used(observe: dict[str, Any], server_info: dict[str, Any]) -> str | None:
    """`<parser> (<implementation>)` from the manifest: the client-side parser, else the simulator's."""
    if observe.get("client_parser_implementation"):
        return f"{observe.get('client_parser')} ({observe['client_parser_implementation']})"
    if server_info.get("tool_parser_implementation"):
        return f"{server_info.get('tool_parser')} ({server_info['tool_parser_implementation']})"
    return None


def run_view(run: Run, *, confidence: float = 0.95) -> RunView:
    """OutcomeCounts, intervals and the verdict for one run, with thresholds taken from the run's own options."""
    counts = OutcomeCounts.of(run.sessions)
    rate = clopper_pearson(counts.corrupt, counts.completed, confidence)
    worst, best = timeout_bounds(counts.corrupt, counts.clean, counts.timeout, confidence)
    assessment = assess_inconclusive(
        counts.clean,
        counts.corrupt,
        counts.timeout,
        counts.error,
        min_completed=int(_option(run, "min_completed", MIN_COMPLETED)),
        max_timeout_fraction=float(_option(run, "max_timeout_rate", MAX_TIMEOUT_FRACTION)),
        confidence=confidence,
    )
    upper = upper_bound(counts.corrupt, counts.completed, confidence)
    metrics, metrics_note = read_metrics(run.path)
    exercised = run.summary.exercised if run.summary is not None else None
    interrupted = bool(run.summary and run.summary.interrupted)
    observe = str((run.manifest.observe or {}).get("mode") or "parsed")
    effect = ParserEffect.of(run.sessions) if observe in ("raw", "both") else None
    parser = _parser_used(run.manifest.observe or {}, run.manifest.server_info or {})
    target = run.manifest.target
    by_outcome = {
        outcome: [_session_view(run, s) for s in run.sessions if s.outcome == outcome]
        for outcome in ("corrupt", "timeout", "error")
    }
    return RunView(
        name=run.name,
        path=run.path,
        run=run,
        counts=counts,
        confidence=confidence,
        rate=rate,
        upper=upper,
        worst=worst,
        best=best,
        assessment=assessment,
        verdict=verdict_for(counts, rate, upper, worst, best, assessment, interrupted_run=interrupted, effect=effect,
                            idle=idle_reasons(exercised)),
        corrupt_sessions=by_outcome["corrupt"],
        timeout_sessions=by_outcome["timeout"],
        error_sessions=by_outcome["error"],
        target=str(target.get("base_url") or ("embedded simulator" if target.get("embedded") else "unknown")),
        started_at=run.manifest.started_at,
        ended_at=run.manifest.ended_at,
        finished=run.summary is not None,
        gate=run.summary.gate if run.summary is not None else None,
        metrics=metrics,
        notes=[note for note in (metrics_note, queueing_note(run.sessions)) if note],
        observe=observe,
        effect=effect,
        parser=parser,
        stopping=run.summary.stopping if run.summary is not None else None,
        exercised=exercised,
        node=describe_node(run.manifest.node),
        workers=[
            f"worker {place.index} on {describe_node(place.node)}" + (" (lost)" if place.lost else "")
            for place in run.manifest.workers
        ],
        loops=count_loops(run.sessions),
        control=read_control(run.path),
    )


def comparisons(runs: Sequence[RunView], *, margin: float = DEFAULT_MARGIN) -> list[ComparisonRow]:
    """Every run after the first against the first, two-sided, Holm-adjusted over the family.

    The equivalence verdicts use the Holm-adjusted p for worse/better and bracket the difference at
    alpha / m for m comparisons (Bonferroni), so no "practically equivalent" in the family is wrong
    with chance over alpha.
    """
    if len(runs) < 2:
        return []
    from repro.report.sidechannels import channels_of, compare_channels
    from repro.stats import compare, holm
    from repro.stats.equivalence import equivalence

    ref = runs[0]
    results = [
        compare(r.counts.corrupt, r.counts.completed, ref.counts.corrupt, ref.counts.completed,
                alternative="two-sided", confidence=ref.confidence)
        for r in runs[1:]
    ]
    adjusted = holm([c.p_boschloo for c in results])
    alpha = 1 - ref.confidence
    family = 1 - alpha / len(results)
    ref_channels = channels_of(ref.run.sessions, ref.path)
    rows = []
    for r, c, p in zip(runs[1:], results, adjusted):
        verdict = equivalence(r.counts.corrupt, r.counts.completed, ref.counts.corrupt, ref.counts.completed,
                              timeout1=r.counts.timeout, timeout2=ref.counts.timeout, margin=margin,
                              confidence=family, pvalue=float(p))
        side = compare_channels(channels_of(r.run.sessions, r.path), ref_channels, alpha=alpha)
        rows.append(ComparisonRow(r.name, ref.name, r.counts.corrupt, r.counts.completed, ref.counts.corrupt,
                                  ref.counts.completed, c, float(p), verdict, side))
    return rows


def build_model(run_dirs: Sequence[Path], *, confidence: float = 0.95, margin: float = DEFAULT_MARGIN) -> ReportModel:
    """Load every run directory (UsageError names a bad one) and compute the whole report."""
    check_margin(margin)
    views = [run_view(load_run(path), confidence=confidence) for path in run_dirs]
    return ReportModel(
        runs=views,
        comparisons=comparisons(views, margin=margin),
        confidence=confidence,
        generated_at=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        margin=margin,
    )
