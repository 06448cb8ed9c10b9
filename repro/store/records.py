"""Records of the run directory: what `repro run` writes and what report, gate and matrix read.

These models are the contract of docs/run-directory.md and docs/concepts.md (outcomes). Field names are part of
the on-disk format that other tools read: add fields freely, never rename or remove one.

Stored text is UTF-8: a lone surrogate (JSON may escape one, `"\ud800"`, and non-UTF-8 argv
arrives as one) is written as U+FFFD; the raw files keep the server's exact bytes.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any, Literal, Sequence

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticSerializationError, to_json

from repro.untrusted import scrub_json

TurnVerdict = Literal["clean", "corrupt", "suspect"]
"""dsml_checker's label for a turn that produced a whole answer."""

TurnStatus = Literal["ok", "timeout", "stalled", "error", "interrupted"]
"""How the request ended: `ok` means a whole answer arrived and was judged."""

SessionOutcome = Literal["clean", "corrupt", "timeout", "error", "interrupted"]
"""A session's outcome. `interrupted` is a session still in flight when the run was stopped (Ctrl-C)."""

OUTCOMES: tuple[SessionOutcome, ...] = ("clean", "corrupt", "timeout", "error", "interrupted")

CorruptSeen = Literal["raw", "parsed", "both"]
"""Where a session's corruption showed: in the text the model generated, in the parsed message, or in both."""


@dataclass(frozen=True)
class OutcomeCounts:
    """Sessions per outcome: the tally every summary, report, gate and matrix verdict starts from."""

    clean: int = 0
    corrupt: int = 0
    timeout: int = 0
    error: int = 0
    interrupted: int = 0
    wedged: int = 0
    suspect: int = 0
    """Clean sessions with at least one suspect turn (soft findings only)."""

    @property
    def completed(self) -> int:
        """Sessions that observed the corruption rate: only clean and corrupt ones do."""
        return self.clean + self.corrupt

    @property
    def total(self) -> int:
        return self.clean + self.corrupt + self.timeout + self.error + self.interrupted

    def outcomes(self) -> dict[str, int]:
        """Every outcome of OUTCOMES with its count, zero included (summary.json's `counts`)."""
        return {outcome: getattr(self, outcome) for outcome in OUTCOMES}

    def __add__(self, other: "OutcomeCounts") -> "OutcomeCounts":
        return OutcomeCounts(*(a + b for a, b in zip(astuple(self), astuple(other))))

    @classmethod
    def of(cls, sessions: Sequence["SessionRecord"]) -> "OutcomeCounts":
        tally = dict.fromkeys(OUTCOMES, 0)
        wedged = suspect = 0
        for session in sessions:
            tally[session.outcome] += 1
            wedged += session.wedged
            suspect += session.outcome == "clean" and any(turn.verdict == "suspect" for turn in session.turns)
        return cls(**tally, wedged=wedged, suspect=suspect)


class _Record(BaseModel):
    # Readers must accept files written by newer versions that added fields.
    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    # Serialising a lone surrogate to JSON raises, which would lose the record (and the run): scrub what
    # comes in (dict keys of free-form fields included), and what was assigned after construction.
    @model_validator(mode="before")
    @classmethod
    def _utf8_in(cls, data: Any, info: ValidationInfo) -> Any:
        # Parsed JSON cannot hold one (pydantic refuses the escape), so reading a run directory skips the walk.
        return scrub_json(data) if info.mode == "python" and isinstance(data, dict) else data

    @model_serializer(mode="wrap")
    def _utf8_out(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)
        if not info.mode_is_json():
            return data
        # Nearly every record encodes as it is, which pydantic-core's encoder finds out in native code; walking
        # every string in Python cost the driver of a sharded run ~0.7 ms a session record. Only a record
        # that does not encode is walked.
        try:
            to_json(data)
        except PydanticSerializationError:
            return scrub_json(data)
        return data


class FindingRecord(_Record):
    """One dsml_checker finding, as stored."""

    rule: str
    field: str
    start: int
    end: int
    excerpt: str
    severity: Literal["hard", "soft", "info"]


class TurnRecord(_Record):
    """One request of a session: timings, server accounting, the verdict and where its raw bytes are."""

    index: int
    status: TurnStatus
    verdict: TurnVerdict | None = None
    """None unless status is `ok`."""
    findings: list[FindingRecord] = Field(default_factory=list)
    start_s: float
    """When the turn was ready to send, seconds since the run started."""
    queue_s: float = 0.0
    """Client-side wait (concurrency slot, connection pool) before the request left the client."""
    ttft_s: float | None = None
    """From sending the request to the first content, reasoning or tool-call byte."""
    e2e_s: float | None = None
    """From sending the request to the end of the response."""
    max_gap_s: float | None = None
    """Longest silence between two received chunks."""
    chunks: int = 0
    http_status: int | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    tool_calls: list[str] = Field(default_factory=list)
    """Names of the structured tool calls the turn returned."""
    request_id: str | None = None
    """The server's response id, to match server-side logs (the simulator's fault log)."""
    error: str | None = None
    raw_path: str | None = None
    """Path of the turn's exact response bytes, relative to the run directory; set for every non-clean turn."""
    truncated_at: int | None = None
    """The response passed the per-turn byte cap (--max-turn-bytes): reading stopped, and the raw file
    holds exactly this many bytes, the first ones received."""
    parsed_verdict: TurnVerdict | None = None
    """The verdict on the parsed message (what an agent saw); `findings` are its findings. None before raw mode existed."""
    raw_verdict: TurnVerdict | None = None
    """The verdict on the text the model generated; None in parsed mode or when that text was not whole."""
    raw_findings: list[FindingRecord] = Field(default_factory=list)
    """The raw verdict's findings; offsets into the rebuilt raw text (`raw_text_path`)."""
    raw_source: str | None = None
    """Where the raw text came from: `logprobs`, `completions` or `generate`; None in parsed mode."""
    raw_complete: bool | None = None
    """The raw text was whole enough to judge; False says why in `raw_gap`."""
    raw_gap: str | None = None
    raw_text_path: str | None = None
    """Path of the rebuilt raw text (UTF-8), relative to the run directory; set for every non-clean turn."""
    lost_findings: list[FindingRecord] = Field(default_factory=list)
    """What the server's parse lost of the raw text (`call-lost`, `param-lost`): parser damage that an agent
    cannot see in the message, so `parsed_verdict` leaves it out; it makes the turn corrupt all the same."""

    @property
    def parse_corrupt(self) -> bool:
        """The parser's side is corrupt: the parsed message, or what the parse lost of the raw text."""
        return self.parsed_verdict == "corrupt" or any(f.severity == "hard" for f in self.lost_findings)

    @property
    def parser_effect(self) -> Literal["hidden", "made"] | None:
        """`hidden`: the raw text is corrupt and the parsed message looks clean (an agent saw nothing wrong);
        `made`: the raw text is clean and the parser's side is corrupt (a parser bug)."""
        if self.raw_verdict is None or self.parsed_verdict is None:
            return None
        raw = self.raw_verdict == "corrupt"
        if raw and self.parsed_verdict != "corrupt":
            return "hidden"
        return "made" if not raw and self.parse_corrupt else None


class SessionRecord(_Record):
    """One finished (or interrupted) agentic session: one line of sessions.jsonl."""

    session_id: int
    task: str
    outcome: SessionOutcome
    wedged: bool = False
    """A stream went silent for longer than --stall-timeout."""
    finished: bool = False
    """The model gave a final answer (as opposed to running out of turns or budget)."""
    start_s: float
    end_s: float
    turns: list[TurnRecord] = Field(default_factory=list)
    clean_turns: int = 0
    """Turns judged clean (or suspect) before the session ended; for a timeout, how far it got cleanly."""
    first_corrupt_turn: int | None = None
    rules: list[str] = Field(default_factory=list)
    """Distinct hard rule ids seen in the session, in order of first appearance."""
    error: str | None = None
    corrupt_seen: CorruptSeen | None = None
    """Which side found corrupt turns: the raw text, the parser's (the parsed message or what its parse lost),
    or both; None when neither did, or before raw mode."""

    @property
    def parser_effect(self) -> Literal["hidden", "made"] | None:
        """`hidden`: the raw text was corrupt and no parsed message of the session looked it (an agent saw
        nothing wrong); `made`: the parser's side was corrupt and no raw text was."""
        raw = any(turn.raw_verdict == "corrupt" for turn in self.turns)
        if raw and not any(turn.parsed_verdict == "corrupt" for turn in self.turns):
            return "hidden"
        return "made" if not raw and any(turn.parser_effect == "made" for turn in self.turns) else None


def corrupt_seen(turns: Sequence[TurnRecord]) -> CorruptSeen | None:
    """Where a session's turns showed corruption: raw, parsed or both (see SessionRecord.corrupt_seen)."""
    raw = any(turn.raw_verdict == "corrupt" for turn in turns)
    parsed = any(turn.parse_corrupt for turn in turns)
    return "both" if raw and parsed else "raw" if raw else "parsed" if parsed else None


class RateEstimate(_Record):
    """A proportion with its interval: k events out of n observations."""

    k: int
    n: int
    estimate: float | None
    """None when n is 0: no observation, no estimate."""
    ci_low: float
    ci_high: float
    method: str
    confidence: float = 0.95


class Percentiles(_Record):
    count: int
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None


class ParserEffect(_Record):
    """summary.json's comparison of the two verdicts (raw and both modes): how much damage the server's parser
    hid (raw text corrupt, parsed message not) and how much it made (the other way round: a parser bug)."""

    judged_turns: int = 0
    """Turns judged on both the parsed message and a whole raw text."""
    raw_incomplete_turns: int = 0
    """Answered turns whose raw text was not whole (no or partial logprobs): judged on the parsed message only."""
    raw_corrupt_turns: int = 0
    parsed_corrupt_turns: int = 0
    hidden_turns: int = 0
    made_turns: int = 0
    raw_corrupt_sessions: int = 0
    parsed_corrupt_sessions: int = 0
    hidden_sessions: int = 0
    """Sessions whose corruption only the raw text showed: an agent saw nothing wrong."""
    made_sessions: int = 0

    @property
    def hidden_share(self) -> float | None:
        """Of the sessions whose raw text was corrupt, the share the parser made look clean."""
        return self.hidden_sessions / self.raw_corrupt_sessions if self.raw_corrupt_sessions else None

    @property
    def made_share(self) -> float | None:
        """Of the sessions whose parsed messages were corrupt, the share whose raw text was clean."""
        return self.made_sessions / self.parsed_corrupt_sessions if self.parsed_corrupt_sessions else None

    def describe(self) -> str:
        """One sentence for the terminal and the reports: how much the parser hid and made."""
        if not (self.raw_corrupt_sessions or self.parsed_corrupt_sessions):
            text = f"Raw text and parsed messages agree: no corrupt turn in either ({self.judged_turns} turns judged both ways)."
        else:
            share = "" if self.hidden_share is None else f" ({self.hidden_share:.0%})"
            text = (
                f"The server's parser hid the damage of {self.hidden_sessions} of {self.raw_corrupt_sessions} sessions "
                f"whose raw text was corrupt{share}, and made {self.made_sessions} corrupt itself (raw text clean); "
                f"turns: {self.hidden_turns} hidden, {self.made_turns} made, of {self.judged_turns} judged both ways."
            )
        if self.raw_incomplete_turns:
            text += f" {self.raw_incomplete_turns} turns had no whole raw text and were judged on the parsed message only."
        return text

    @classmethod
    def of(cls, sessions: Sequence["SessionRecord"]) -> "ParserEffect":
        turns = [turn for session in sessions for turn in session.turns if turn.status == "ok"]
        judged = [turn for turn in turns if turn.raw_verdict is not None]
        effects = [session.parser_effect for session in sessions]
        return cls(
            judged_turns=len(judged),
            raw_incomplete_turns=sum(turn.raw_complete is False for turn in turns),
            raw_corrupt_turns=sum(turn.raw_verdict == "corrupt" for turn in judged),
            parsed_corrupt_turns=sum(turn.parse_corrupt for turn in judged),
            hidden_turns=sum(turn.parser_effect == "hidden" for turn in judged),
            made_turns=sum(turn.parser_effect == "made" for turn in judged),
            raw_corrupt_sessions=sum(session.corrupt_seen in ("raw", "both") for session in sessions),
            parsed_corrupt_sessions=sum(session.corrupt_seen in ("parsed", "both") for session in sessions),
            hidden_sessions=effects.count("hidden"),
            made_sessions=effects.count("made"),
        )


class StoppingRecord(_Record):
    """How a `--until-decided` run stopped (repro.run.stopping): the rule, its looks, what it spent and why."""

    rule: str
    limit: float | None = None
    """The tolerated corruption rate; None for a run stopped against a baseline."""
    confidence: float
    wave: int
    """Sessions per wave; the rule looked after each."""
    cap: int
    looks: int
    sessions: int
    """Sessions spent when it stopped."""
    decision: Literal["pass", "fail", "undecided"]
    reason: str
    low: float
    high: float
    """The rule's interval (or bound) at the last look."""
    baseline: str | None = None
    margin: float | None = None
    """Against a baseline: the increase under which the run passes."""
    verdict: str | None = None
    """Against a baseline, once decided: worse, practically equivalent, or no worse than the margin."""


ExerciseStatus = Literal["exercised", "not exercised", "unknown"]
"""Whether a feature the target has on acted during the load: unknown when no metric the target exports shows it."""


class ExerciseFact(_Record):
    """One fact about what the server did during the load, from its metric scrapes; `value` None means unknown."""

    value: float | None = None
    metric: str | None = None
    """The metric it was read from (with its labels), or the ones looked for when unknown."""


class FeatureExercise(_Record):
    """A feature the target's `/server_info` turns on, and whether the load made it act."""

    feature: str
    """Its name, as printed (HiCache, PD disaggregation, CUDA graph, speculative decoding)."""
    status: ExerciseStatus
    fact: str
    """The key of `Exercise.facts` that shows it."""
    metric: str
    line: str
    """One line with the numbers, as printed."""


class Exercise(_Record):
    """summary.json's `exercised`: what the load made the server do, and which features it left idle."""

    facts: dict[str, ExerciseFact] = Field(default_factory=dict)
    """evicted_tokens, host_load_back_tokens, prefix_cache_hit_rate, pd_transfer_mb, pd_transfer_failures,
    cuda_graph_passes, spec_accept_rate: each known or unknown."""
    features: list[FeatureExercise] = Field(default_factory=list)
    """The features `/server_info` shows on; empty when the target serves no `/server_info`."""

    def values(self) -> dict[str, float | None]:
        """Fact -> value (None: unknown)."""
        return {key: fact.value for key, fact in self.facts.items()}

    def idle(self) -> list[FeatureExercise]:
        """The features that were on and never acted."""
        return [f for f in self.features if f.status == "not exercised"]


class LoopCounts(_Record):
    """Turns showing each loop signal (repro.store.loops), and turns showing any: not counted as corrupt."""

    turns: int = 0
    by_signal: dict[str, int] = Field(default_factory=dict)


class Summary(_Record):
    """summary.json: the run's counts and rates, written at the end (also after Ctrl-C)."""

    sessions: int
    counts: dict[str, int]
    """Every key of OUTCOMES, zero included."""
    wedged: int
    corruption_rate: RateEstimate
    """Over completed sessions (clean + corrupt), Clopper-Pearson."""
    worst_case: RateEstimate | None = None
    """Every timeout counted as corrupt."""
    best_case: RateEstimate | None = None
    """Every timeout counted as clean."""
    suspect_sessions: int = 0
    inconclusive: bool = False
    inconclusive_reasons: list[str] = Field(default_factory=list)
    turns: int = 0
    turn_counts: dict[str, int] = Field(default_factory=dict)
    """Turns per verdict (clean, corrupt, suspect) and per non-ok status."""
    loops: LoopCounts | None = None
    """Turns with a loop signal (max_tokens without a tool call, a repeated span): their own class, never
    counted as corrupt (docs/control.md). None in runs from before it was recorded."""
    latency: dict[str, Percentiles] = Field(default_factory=dict)
    """Keys: ttft_s, e2e_s, queue_s, max_gap_s, session_s."""
    loop_lag: Percentiles | None = None
    """Event-loop lag of the client, sampled during the run: high values mean the client distorted timings."""
    worker_loop_lag: list[Percentiles] = Field(default_factory=list)
    """With `--workers`: each worker process's loop lag (`loop_lag` pools them)."""
    duration_s: float = 0.0
    interrupted: bool = False
    gate: dict[str, Any] | None = None
    observe: str | None = None
    """The observe mode that ran (raw, parsed, both); None for runs from before raw mode (parsed)."""
    raw_source: str | None = None
    parser_effect: ParserEffect | None = None
    """Set when the run judged raw text (raw and both modes)."""
    stopping: StoppingRecord | None = None
    """Set by `repro run --until-decided`."""
    exercised: Exercise | None = None
    """What the load made the server do (from metrics.csv); None for runs from before it was recorded."""


class WorkerPlace(_Record):
    """One `--workers` worker in the manifest: where it ran, and why it was lost if it was."""

    index: int
    node: dict[str, str]
    """repro.cluster.node in the worker: hostname, and ray_node_id for a Ray actor."""
    lost: str | None = None
    """Set when the worker ended without finishing its sessions (its process or its node died)."""


class Manifest(_Record):
    """manifest.json: what was run, against what, with which versions; written at start, completed at end."""

    name: str
    run_id: str
    command: list[str]
    options: dict[str, Any]
    workload: dict[str, Any]
    """At least name, path and sha256 of the workload file."""
    target: dict[str, Any]
    """At least base_url, model and embedded (bool); sim_args when embedded."""
    server_info: dict[str, Any] | None = None
    observe: dict[str, Any] | None = None
    """The observe mode requested and run, the raw source, what the capability probe found, and warnings."""
    versions: dict[str, str] = Field(default_factory=dict)
    node: dict[str, str] | None = None
    """Where the load ran (repro.cluster.node): hostname, and ray_node_id under the Ray executor."""
    workers: list[WorkerPlace] = Field(default_factory=list)
    """With `--workers`: where each worker ran (written once all are up, again at the end)."""
    ignore_eos: bool = False
    """Never true: repro never asks the server to ignore the end of sentence (`--extra-body` may not either),
    so a turn that runs to max_tokens is the model's own doing (docs/control.md)."""
    control: str | None = None
    """Set on a control arm's own run directory: `concurrency-1`, `reference` or `feature-off` (docs/control.md)."""
    started_at: str
    """ISO 8601, UTC."""
    ended_at: str | None = None
