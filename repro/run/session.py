"""One agentic session: the turn loop that sends the conversation, judges each answer and runs its tools.

Knows nothing of concurrency: `load` runs many of these. Outcome rules (docs/concepts.md):
- `corrupt` as soon as one turn is judged corrupt; evidence wins over a later timeout or error.
- `error` when a request failed in transport, HTTP or stream format.
- `timeout` when the session budget or a turn's budget ran out, or a stream stalled (`wedged`).
- `clean` otherwise, once the session ended normally: a final answer (a reply without tool calls,
  as an agent loop ends; a `finish` tool is just a tool whose result the model then answers) or the
  turn limit. The turn limit is the workload's bound on a session,
  not a failure, so a session that used every turn cleanly is clean with `finished: false`.

A corrupt turn does not end the session: its tool calls (if any parsed) are run, otherwise the
workload's recovery prompt is sent, so later turns show whether the damage persists.
"""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import anyio

from repro.run import clock
from repro.run.observe import (
    Judgement,
    ObservePlan,
    RenderError,
    finding_records,
    judge,
    parse_text,
    turn_request,
)
from repro.store.records import SessionRecord, TurnRecord, corrupt_seen
from repro.wire.budget import Ticket
from repro.wire.client import MAX_TURN_BYTES, BodyEncoder, TurnResult, send_turn
from repro.wire.rawtext import RawText
from repro.wire.spool import Spooled, give_back, whole
from repro.workload.context import context_document
from repro.wire.transport import Endpoint, HTTPClient
from repro.workload import sandbox
from repro.workload.scenario import Workload
from repro.workload.trace import Trace

_OFF_LOOP_BYTES = 1 << 16
"""Replies this long or longer are judged off the event loop (about a millisecond of checking per 64 KB)."""
_OFF_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = weakref.WeakKeyDictionary()
"""Per event loop, one reply judged off the loop at a time: the GIL lets no two run at once anyway, and the
checker's working copies of a reply of megabytes then exist for one reply, not for every long reply in flight."""

RawKeeper = Callable[..., str | None]
"""(session id, turn index, bytes, suffix=…) → path of the kept bytes relative to the run directory."""
RAW_TEXT_SUFFIX = "txt"


@dataclass(frozen=True)
class SessionConfig:
    """Everything a session needs to talk to the target; shared by all sessions of a run."""

    url: str
    """The chat-completions endpoint."""
    model: str
    workload: Workload | Trace
    """A scripted scenario (agentic sessions), or recorded conversations to replay (repro.run.replay)."""
    seed: int = 0
    stream: bool = True
    turns: int = 12
    timeout: float = 180.0
    turn_timeout: float = 120.0
    stall_timeout: float = 30.0
    max_turn_bytes: int = MAX_TURN_BYTES
    max_bytes_in_flight: int | None = None
    """The answer bytes one process's turns hold at once (repro.wire.budget); None: no limit."""
    extra_body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    observe: ObservePlan = field(default_factory=ObservePlan)
    clock_url: str | None = None
    """A simulator on the virtual clock: where sessions say they ended (repro.run.clock); None otherwise."""

    # Built once per run, not per turn: both showed up in the client's CPU profile.
    @functools.cached_property
    def tools(self) -> list[dict[str, Any]]:
        """The scenario's tools (a trace's are per conversation)."""
        return self.workload.openai_tools() if isinstance(self.workload, Workload) else []

    @functools.cached_property
    def encoder(self) -> BodyEncoder:
        """The run's tools, encoded once: every session's encoder falls back on it."""
        encoder = BodyEncoder()
        encoder.encode({"tools": self.tools})
        return encoder

    @functools.cached_property
    def endpoint(self) -> Endpoint:
        """Where turns are sent: chat completions, or the raw-text endpoint the observe plan chose."""
        return Endpoint.parse(self.observe.raw_url if self.observe.text_endpoint and self.observe.raw_url else self.url)

    def opening(self, session_id: int) -> list[dict[str, Any]]:
        """The messages a session's first request carries: the system prompt and its task, or a recorded
        conversation up to its first assistant turn."""
        workload = self.workload
        if isinstance(workload, Trace):
            conversation = workload.conversation(session_id)
            return [message.sent() for message in conversation.messages[: conversation.turn_positions()[0]]]
        context = ([{"role": "user", "content": context_document(session_id, self.seed, workload.context_tokens)}]
                   if workload.context_tokens else [])
        return [
            {"role": "system", "content": workload.system_prompt},
            *context,
            {"role": "user", "content": workload.task_for(session_id, self.seed)},
        ]

    def payload(self, messages: list[dict[str, Any]], session_id: int = 0) -> dict[str, Any]:
        """The production chat request for a conversation (before the observe plan adds to it)."""
        workload = self.workload
        if isinstance(workload, Trace):
            settings = workload.conversation(session_id).settings()
        else:
            settings = {
                "tools": self.tools,
                "tool_choice": workload.tool_choice,
                "max_tokens": workload.max_tokens,
                "temperature": workload.temperature,
            }
        return {"model": self.model, "messages": messages, **settings, **self.extra_body}


def _assistant_message(message: dict[str, Any], turn: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The message to send back as history, and its tool calls with ids and string arguments."""
    calls: list[dict[str, Any]] = []
    for position, call in enumerate(message.get("tool_calls") or []):
        if not isinstance(call, dict):
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        arguments = function.get("arguments")
        calls.append(
            {
                "id": str(call.get("id") or f"call_{turn}_{position}"),
                "type": "function",
                "function": {
                    "name": str(function.get("name") or ""),
                    "arguments": arguments if isinstance(arguments, str) else "{}" if arguments is None else str(arguments),
                },
            }
        )
    content = message.get("content")
    history: dict[str, Any] = {"role": "assistant", "content": content if isinstance(content, str) else ""}
    if calls:
        history["tool_calls"] = calls
    return history, calls


async def _judge(plan: ObservePlan, result: TurnResult, tools: Any, tool_choice: Any, rawtext: RawText | None,
                 parser_error: str | None = None) -> Judgement:
    """The turn's verdicts; a long reply is judged in a worker thread, so the event loop goes on timing the
    other sessions (their stall watchdogs, their chunk gaps) meanwhile.

    A thread, not a process: the checker is linear and its C calls are short, so the loop gets the GIL back
    every switch interval, and a thread spares pickling a reply of megabytes both ways. A short reply is
    judged in place: a thread hop costs more than its verdict.
    """
    assert result.message is not None
    verdicts = functools.partial(
        judge, plan, result.message, finish_reason=result.finish_reason, tools=tools, tool_choice=tool_choice, rawtext=rawtext,
        parser_error=parser_error,
    )
    if len(result.raw) < _OFF_LOOP_BYTES:
        return verdicts()
    loop = asyncio.get_running_loop()
    limiter = _OFF_LOOP.get(loop)
    if limiter is None:
        limiter = _OFF_LOOP[loop] = anyio.CapacityLimiter(1)
    judgement = await anyio.to_thread.run_sync(verdicts, abandon_on_cancel=True, limiter=limiter)
    if isinstance(result.raw, Spooled):
        give_back()  # the checker's working copies of a big reply are free now
    return judgement


class Session:
    """One session's state; `run()` plays it to the end, `interrupted()` records it if it is cut short."""

    def __init__(
        self,
        session_id: int,
        config: SessionConfig,
        client: HTTPClient,
        *,
        keep_raw: RawKeeper,
        origin: float,
        on_turn: Callable[[TurnRecord], None] | None = None,
    ) -> None:
        self.session_id = session_id
        self.config = config
        self.client = client
        self.keep_raw = keep_raw
        self.origin = origin
        """time.perf_counter() of the run's start; record times are relative to it."""
        self.on_turn = on_turn
        self.messages: list[dict[str, Any]] = config.opening(session_id)
        self.task = self.messages[-1]["content"]
        self.turns: list[TurnRecord] = []
        self.start_s = self._now()
        self.turn_start_s = self.start_s
        self.finished = False
        self.wedged = False
        self.error: str | None = None
        self.failure: str | None = None
        """The non-corrupt way the session ended early: `error` or `timeout`."""
        self.rules: list[str] = []
        self.encoder = BodyEncoder(config.encoder)
        self.queued = 0.0
        """Seconds the recorded turns waited in the client (their `queue_s`), which the session's budget does not count."""

    def _now(self) -> float:
        return time.perf_counter() - self.origin

    def _left(self) -> float:
        """Seconds left of the session's budget: time queued in the client is not the session's to spend."""
        return self.start_s + self.config.timeout + self.queued - self._now()

    async def run(self) -> SessionRecord:
        config = self.config
        for index in range(config.turns):
            remaining = self._left()
            if remaining <= 0:
                self.failure, self.error = "timeout", f"session budget of {config.timeout:g}s used up"
                break
            if not await self._turn(index, min(config.turn_timeout, remaining)):
                break
        return self._record(None)

    async def _turn(self, index: int, budget: float) -> bool:
        """Play one turn; False when the session cannot go on."""
        workload = self.config.workload
        exchanged = await self._exchange(index, budget)
        if exchanged is None:
            return False
        message, verdict = exchanged
        history, calls = _assistant_message(message, index)
        self.messages.append(history)
        for call in calls:
            output = sandbox.execute(workload, call["function"]["name"], call["function"]["arguments"])
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        if calls:
            return True
        if verdict == "corrupt":
            self.messages.append({"role": "user", "content": workload.recovery_prompt})
            return True
        self.finished = True
        return False

    def _headers(self) -> dict[str, str] | None:
        if self.config.clock_url is None:
            return self.config.headers or None
        return {**self.config.headers, **clock.session_headers(self.session_id)}

    async def leave(self) -> None:
        """After `run()`: a simulator on the virtual clock stops waiting for this session."""
        if self.config.clock_url is not None:
            await clock.end(self.config.clock_url, self.session_id)

    def _payload(self) -> dict[str, Any]:
        """The chat request for the conversation so far."""
        return self.config.payload(self.messages)

    @property
    def _tools(self) -> list[dict[str, Any]]:
        return self.config.tools

    @property
    def _tool_choice(self) -> Any:
        return self.config.workload.tool_choice

    async def _exchange(self, index: int, budget: float) -> tuple[dict[str, Any], str] | None:
        """Send `self.messages`, judge the answer and record the turn: the answer's message and verdict, or
        None when the turn failed (the session's failure and error are then set).

        The answer's bytes count against the client's in-flight budget until the turn is recorded."""
        ticket = self.client.budget.ticket()
        try:
            return await self._exchange_held(index, budget, ticket)
        finally:
            ticket.release()

    async def _exchange_held(self, index: int, budget: float, ticket: Ticket) -> tuple[dict[str, Any], str] | None:
        config = self.config
        start_s = self.turn_start_s = self._now()
        try:
            body, collector = turn_request(config.observe, self._payload())
        except RenderError as err:
            # The history holds a call the encoder cannot write: no request can continue this session.
            self.failure, self.error = "error", str(err)
            self._add(TurnRecord(index=index, status="error", start_s=start_s, error=self.error), TurnResult(status="error"))
            return None
        result = await send_turn(
            self.client,
            config.endpoint,
            body,
            stream=config.stream,
            turn_timeout=budget,
            stall_timeout=config.stall_timeout,
            headers=self._headers(),
            max_bytes=config.max_turn_bytes,
            rawtext=collector,
            encoder=self.encoder,
            ticket=ticket,
        )
        record = self._turn_record(index, start_s, result)
        rawtext: RawText | None = None
        parser_error: str | None = None
        if collector is not None and result.status == "ok":
            rawtext = collector.result(result.message)
            if config.observe.text_endpoint:
                result.message, result.finish_reason, parser_error = parse_text(
                    config.observe, rawtext.text, result.finish_reason,
                    tools=self._tools, tool_choice=self._tool_choice, turn=index,
                )
                record.finish_reason = result.finish_reason
        if result.status != "ok" or result.message is None:
            self.wedged = self.wedged or result.status == "stalled"
            self.failure = "error" if result.status == "error" else "timeout"
            self.error = result.error
            if result.status == "timeout" and budget < config.turn_timeout:
                self.error = f"session budget of {config.timeout:g}s used up during turn {index}"
            self._add(record, result)
            return None
        judgement = await _judge(config.observe, result, self._tools, self._tool_choice, rawtext, parser_error)
        self._record_judgement(record, judgement, rawtext)
        record.tool_calls = [call["function"]["name"] for call in _assistant_message(result.message, index)[1]]
        self._add(record, result, rawtext)
        return result.message, judgement.verdict

    def _record_judgement(self, record: TurnRecord, judgement: Judgement, rawtext: RawText | None) -> None:
        """The turn's verdicts and findings into its record; a corrupt turn's hard rules into the session's."""
        record.verdict = judgement.verdict
        record.parsed_verdict = judgement.parsed.label
        record.findings = finding_records(judgement.parsed)
        if rawtext is not None:
            record.raw_source, record.raw_complete, record.raw_gap = rawtext.source, rawtext.complete, rawtext.gap
        if judgement.raw is not None:
            record.raw_verdict = judgement.raw.label
            record.raw_findings = finding_records(judgement.raw)
        if judgement.lost is not None:
            record.lost_findings = finding_records(judgement.lost)
        if judgement.verdict != "corrupt":
            return
        for verdict in (judgement.parsed, judgement.raw, judgement.lost):
            for finding in verdict.findings if verdict is not None and verdict.label == "corrupt" else ():
                if finding.severity == "hard" and finding.rule not in self.rules:
                    self.rules.append(finding.rule)

    def _turn_record(self, index: int, start_s: float, result: TurnResult) -> TurnRecord:
        return TurnRecord(
            index=index,
            status=result.status,
            start_s=start_s,
            queue_s=result.queue_s,
            ttft_s=result.ttft_s,
            e2e_s=result.e2e_s,
            max_gap_s=result.max_gap_s,
            chunks=result.chunks,
            http_status=result.http_status,
            finish_reason=result.finish_reason,
            prompt_tokens=result.usage_int("prompt_tokens"),
            completion_tokens=result.usage_int("completion_tokens"),
            cached_tokens=result.cached_tokens,
            request_id=result.request_id,
            error=result.error,
            truncated_at=result.truncated_at,
        )

    def _add(self, record: TurnRecord, result: TurnResult, rawtext: RawText | None = None) -> None:
        # A turn is kept when either verdict is not clean, so a parser's hidden damage has its evidence.
        verdicts = (record.verdict, record.raw_verdict or "clean", record.parsed_verdict or "clean")
        if any(verdict != "clean" for verdict in verdicts) or record.lost_findings:
            record.raw_path = self.keep_raw(self.session_id, record.index, whole(result.raw))
            if rawtext is not None:
                record.raw_text_path = self.keep_raw(
                    self.session_id, record.index, rawtext.text.encode("utf-8", "surrogatepass"), suffix=RAW_TEXT_SUFFIX
                )
        self.turns.append(record)
        self.queued += record.queue_s
        if self.on_turn is not None:
            self.on_turn(record)

    def _record(self, cut_short: str | None) -> SessionRecord:
        corrupt = [turn.index for turn in self.turns if turn.verdict == "corrupt"]
        if corrupt:
            outcome = "corrupt"
        elif cut_short is not None:
            outcome = cut_short
        else:
            outcome = self.failure or "clean"
        return SessionRecord(
            session_id=self.session_id,
            task=self.task,
            outcome=outcome,
            wedged=self.wedged,
            finished=self.finished,
            start_s=self.start_s,
            end_s=self._now(),
            turns=list(self.turns),
            clean_turns=sum(1 for turn in self.turns if turn.verdict in ("clean", "suspect")),
            first_corrupt_turn=corrupt[0] if corrupt else None,
            rules=list(self.rules),
            error=self.error,
            corrupt_seen=corrupt_seen(self.turns),
        )

    def interrupted(self) -> SessionRecord:
        """The record of a session stopped mid-flight (Ctrl-C): `interrupted`, unless a turn was already corrupt."""
        in_flight = TurnRecord(index=len(self.turns), status="interrupted", start_s=self.turn_start_s)
        self.turns.append(in_flight)
        return self._record("interrupted")
