"""One chat-completion turn over the run's shared `HTTPClient`: send, read (streamed or not), time, classify.

Knows nothing of sessions. Never raises on bad server output: refused or reset connections,
3xx/4xx/5xx, malformed SSE or JSON (however deeply nested), headers that never end, and a response
larger than `max_bytes` all come back as a `TurnResult` with status `error`; no bytes for
`stall_timeout` gives `stalled`; the whole turn exceeding its budget gives `timeout`.

The response is read in the transport's I/O callbacks (see `repro.wire.transport`), so a streamed chunk
never wakes the turn's task; stalls are watched by one event-loop timer per turn that re-arms itself
about once per `stall_timeout`, not by a timeout per read.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import anyio

from dsml_checker import StreamAccumulator
from repro.wire import chunks
from repro.wire.budget import InFlight, Ticket
from repro.wire.rawtext import LogprobText, RawCollector
from repro.wire.spool import SPOOL_AT, Spooled, give_back, map_big_blocks, whole
from repro.store.records import TurnStatus
from repro.wire.transport import Endpoint, HTTPClient, TransportError
from repro.untrusted import parse_json

_SSE_FIELDS = (b"data", b"event", b"id", b"retry")
MAX_TURN_BYTES = 64 * 1024 * 1024
"""Default cap on one response: ~6x a 32k-token stream with logprobs; beyond it the server is looping or hostile."""


def make_client(concurrency: int, *, headers: dict[str, str] | None = None,
                max_bytes_in_flight: int | None = None) -> HTTPClient:
    """The run's one shared HTTP client: room for `concurrency` connections, no hidden cap; its turns
    share a budget of `max_bytes_in_flight` answer bytes (None: no limit; see `repro.wire.budget`).

    Environment proxies are not consulted: the target is addressed directly, usually on loopback.
    """
    client = HTTPClient(concurrency, headers=headers)
    client.budget = InFlight(max_bytes_in_flight)
    map_big_blocks()
    return client


@dataclass
class TurnResult:
    """What one request produced. `message` is the assembled assistant message when status is `ok`."""

    status: TurnStatus
    raw: bytes | bytearray | Spooled = b""
    """The response's bytes as read: the reader's own buffer, handed over (not copied), or for a streamed
    answer past `SPOOL_AT` its temporary file (`repro.wire.spool.whole` reads either)."""
    message: dict[str, Any] | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    http_status: int | None = None
    request_id: str | None = None
    error: str | None = None
    queue_s: float = 0.0
    """Client-side waiting: from the call to the first network action (room in the byte budget, a free
    connection in hand), plus any time the budget held the answer's reading paused."""
    ttft_s: float | None = None
    e2e_s: float | None = None
    max_gap_s: float | None = None
    chunks: int = 0
    truncated_at: int | None = None
    """The response passed the byte cap: reading stopped, and `raw` holds exactly this many bytes."""

    @property
    def cached_tokens(self) -> int | None:
        details = (self.usage or {}).get("prompt_tokens_details") or {}
        value = details.get("cached_tokens") if isinstance(details, dict) else None
        return value if isinstance(value, int) else None

    def usage_int(self, key: str) -> int | None:
        value = (self.usage or {}).get(key)
        return value if isinstance(value, int) else None


class _Failure(Exception):
    """Bad server output found while reading: ends the turn as an error."""


class _Clock:
    """Timestamps of one request, set by the transport's callbacks (see `_Turn`)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.sent: float | None = None
        """The first network action (connecting, or sending on a reused connection): connect time
        is the server's accept latency, not client-side queueing."""
        self.first_token: float | None = None
        self.first_bytes: float | None = None
        self.last_bytes: float | None = None
        self.heard: float | None = None
        """When the client began waiting for the answer, or its headers came: where a stall is timed from before body bytes."""
        self.head_at: float | None = None
        """When the last piece of an incomplete header block arrived (None once the headers are complete)."""
        self.headers_late = False
        self.max_gap = 0.0
        self.stalled = False
        self.paused_at: float | None = None
        """Since when the client itself holds the reading paused (the byte budget): no stall, no gap."""
        self.held = 0.0
        """Seconds the reading was held paused in all: queueing, taken out of the server's times."""

    @property
    def quiet_since(self) -> float | None:
        """Since when the server has sent nothing while the client waited for it; None before the wait
        began and while the client holds the reading paused."""
        if self.paused_at is not None:
            return None
        return self.last_bytes if self.last_bytes is not None else self.heard

    def pause(self) -> None:
        self.paused_at = time.perf_counter()

    def resume(self) -> float:
        """End a pause; the seconds it held (0.0 when not paused)."""
        if self.paused_at is None:
            return 0.0
        now = time.perf_counter()
        hold = now - self.paused_at
        self.held += hold
        self.paused_at = None
        self.last_bytes = now  # the silence while paused was the client's, not a gap in the stream
        return hold

    @property
    def origin(self) -> float:
        return self.sent if self.sent is not None else self.start

    def fill(self, result: TurnResult) -> None:
        end = time.perf_counter()
        self.resume()
        result.queue_s = self.origin - self.start + self.held
        result.e2e_s = end - self.origin - self.held
        if self.first_token is not None:
            result.ttft_s = self.first_token - self.origin
        if self.last_bytes is not None:
            result.max_gap_s = self.max_gap


def _has_output(chunk: dict[str, Any]) -> bool:
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return bool(chunk.get("text"))  # SGLang's /generate
    if choices[0].get("text"):
        return True  # /v1/completions
    delta = choices[0].get("delta")
    if not isinstance(delta, dict):
        return False
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))


class _SSEReader:
    """Incremental Server-Sent Events parser feeding chat-completion chunks to a StreamAccumulator."""

    def __init__(self, clock: _Clock, rawtext: RawCollector | None = None) -> None:
        self.clock = clock
        self.rawtext = rawtext
        self.accumulator = StreamAccumulator()
        self.buffer = bytearray()
        """The current line's bytes so far (no newline yet)."""
        self.data: list[bytes] = []
        self.done = False
        self.events = 0
        self.request_id: str | None = None
        self.plain = rawtext is None
        """Events may take the typed fast path (`repro.wire.chunks`): no raw text to rebuild, no `[DONE]` yet."""

    def feed(self, data: bytes) -> None:
        if (not self.buffer and data.startswith(b"data: ") and data.find(b"\n") == len(data) - 2
                and data[-1] == 10 and data[-3] != 13):
            # The usual piece, one whole event `data: {...}` + a blank line (no CR): what the general path
            # below does with it, without splitting lines (a streamed chunk's largest cost after its JSON).
            if self.data:
                self.data.append(data[6:-2])
                self._dispatch()
            elif self.plain and data[6] == 123:  # `{`: `_event`'s fast path, one call fewer for every chunk
                payload = data[6:-2]
                typed = chunks.decode(payload)
                if typed is None:
                    self._general(payload)
                else:
                    self._typed(typed)
            else:
                self._event(data[6:-2])
            return
        # Only the new bytes are searched for a newline: re-splitting the buffer made a long line quadratic.
        start = 0
        end = data.find(b"\n")
        if end >= 0 and self.buffer:
            self.buffer += data[:end]
            line = bytes(self.buffer)
            self.buffer.clear()
            self._line(line.rstrip(b"\r"))
            start, end = end + 1, data.find(b"\n", end + 1)
        while end >= 0:
            self._line(data[start:end].rstrip(b"\r"))
            start, end = end + 1, data.find(b"\n", end + 1)
        if start < len(data):
            self.buffer += data[start:]

    def _line(self, line: bytes) -> None:
        if not line:
            self._dispatch()
            return
        if line.startswith(b":"):
            return
        name, _, value = line.partition(b":")
        if name not in _SSE_FIELDS:
            raise _Failure(f"malformed stream: not an SSE line: {line[:80]!r}")
        if name == b"data":
            self.data.append(value[1:] if value.startswith(b" ") else value)

    def _dispatch(self) -> None:
        if not self.data:
            return
        payload = b"\n".join(self.data)
        self.data = []
        self._event(payload)

    def _event(self, payload: bytes) -> None:
        """One whole event's data."""
        if self.done:
            raise _Failure("malformed stream: data after [DONE]")
        if self.plain and payload.startswith(b"{"):
            typed = chunks.decode(payload)
            if typed is not None:
                self._typed(typed)
                return
        self._general(payload)

    def _general(self, payload: bytes) -> None:
        """`_event` for what the typed fast path does not take: `[DONE]`, and any event read as Python's json reads it."""
        if payload.strip() == b"[DONE]":
            self.done = True
            self.plain = False  # what follows is an error, which `_event` reports
            return
        try:
            chunk = parse_json(payload)
        except ValueError as err:
            raise _Failure(f"malformed stream: event is not JSON ({_reason(err)}): {payload[:80]!r}") from None
        if not isinstance(chunk, dict):
            raise _Failure("malformed stream: event is not a JSON object")
        if "error" in chunk and "choices" not in chunk:
            raise _Failure(f"server error in stream: {_error_text(chunk['error'])}")
        self.events += 1
        if self.request_id is None and isinstance(chunk.get("id"), str):
            self.request_id = chunk["id"]
        if self.clock.first_token is None and _has_output(chunk):
            self.clock.first_token = time.perf_counter()
        self.accumulator.add_chunk(chunk)
        if self.rawtext is not None:
            self.rawtext.add_chunk(chunk)

    def _typed(self, chunk: chunks.Chunk) -> None:
        """`_event` for an ordinary chat chunk, already taken apart and type-checked (`repro.wire.chunks`)."""
        self.events += 1
        if self.request_id is None and isinstance(chunk.id, str):
            self.request_id = chunk.id
        choice = chunk.choices[0] if chunk.choices else None
        delta = choice.delta if choice is not None else None
        if delta is None:
            self.accumulator.add_parts(chunk.usage, choice.finish_reason if choice is not None else None, None, None, None)
            return
        if self.clock.first_token is None and (delta.content or delta.reasoning_content or delta.tool_calls):
            self.clock.first_token = time.perf_counter()
        reasoning = delta.reasoning_content if delta.reasoning_content is not None else delta.reasoning
        self.accumulator.add_parts(chunk.usage, choice.finish_reason, delta.content, reasoning, delta.tool_calls)  # type: ignore[union-attr]

    def finish(self) -> None:
        """The body ended: flush a last event and check that the answer is whole."""
        if self.buffer:
            self._line(bytes(self.buffer).rstrip(b"\r"))
            self.buffer.clear()
        self._dispatch()
        if self.accumulator.malformed:
            raise _Failure(f"malformed stream: {self.accumulator.malformed} chunk(s) of the wrong shape")
        if self.events == 0:
            raise _Failure("malformed stream: no chat-completion events")
        # `[DONE]` alone proves nothing: a server that cancels an in-flight stream may still close it
        # properly. Without a finish reason the answer is cut short, whatever the framing says.
        if self.finish_reason is None:
            raise _Failure("stream ended without a finish reason")

    @property
    def finish_reason(self) -> str | None:
        """The stream's finish reason: the chat chunks', or the raw-text collector's (`/generate` keeps it in meta_info)."""
        if self.rawtext is None or isinstance(self.rawtext, LogprobText):
            return self.accumulator.finish_reason
        return self.rawtext.finish_reason


def _reason(err: ValueError) -> str:
    """Why a parse failed, in a few words (a JSONDecodeError's message without its position)."""
    return err.msg if isinstance(err, json.JSONDecodeError) else str(err)[:120]


def _error_text(error: object) -> str:
    if isinstance(error, dict):
        error = error.get("message", error)
    return str(error)[:200]


def _http_error(status: int, body: bytes) -> str:
    excerpt = body[:200].decode("utf-8", errors="replace").strip()
    try:
        data = parse_json(body)
        if isinstance(data, dict) and "error" in data:
            excerpt = _error_text(data["error"])
        elif isinstance(data, dict) and "detail" in data:
            excerpt = str(data["detail"])[:200]
    except ValueError:
        pass
    return f"HTTP {status}" + (f": {excerpt}" if excerpt else "")


def _not_an_answer(status: int, location: str | None) -> str:
    """Why a final response that is neither 2xx nor an HTTP error is no answer; redirects are not followed
    (the user named this URL; a redirected POST would be a guess)."""
    if 300 <= status < 400:
        target = f" to {location[:200]!r}" if location else " without a Location"
        return f"HTTP {status} redirect{target} (not followed)"
    return f"HTTP {status}: not a chat-completion answer"


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = parse_json(body)
    except ValueError as err:
        raise _Failure(f"malformed response: not JSON ({_reason(err)}): {body[:80]!r}") from None
    if not isinstance(data, dict):
        raise _Failure("malformed response: not a JSON object")
    return data


def _parse_completion(
    body: bytes, rawtext: RawCollector | None = None
) -> tuple[dict[str, Any], str | None, dict[str, Any] | None, str | None]:
    data = _json_object(body)
    if rawtext is not None:
        rawtext.add_body(data)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _Failure("malformed response: no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise _Failure("malformed response: choice has no message")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
    request_id = data.get("id") if isinstance(data.get("id"), str) else None
    return message, choices[0].get("finish_reason"), usage, request_id


class _StallWatch:
    """Marks the turn stalled and cancels `scope` once the server has been quiet for `stall_timeout`.

    Quiet means no body bytes: header bytes that keep dripping without the header block ever ending
    are not a stall but a broken response (`headers_late`). One event-loop timer, re-armed for the
    rest of the quiet spell each time it fires while bytes flow.
    """

    def __init__(self, clock: _Clock, stall_timeout: float, scope: anyio.CancelScope) -> None:
        self.clock = clock
        self.stall_timeout = stall_timeout
        self.scope = scope
        self.loop = asyncio.get_running_loop()
        self.timer = self.loop.call_later(stall_timeout, self._check)

    def _check(self) -> None:
        now = time.perf_counter()
        since = self.clock.quiet_since
        if since is not None and now - since >= self.stall_timeout:
            head_at = self.clock.head_at
            if head_at is not None and now - head_at < self.stall_timeout:
                self.clock.headers_late = True
            else:
                self.clock.stalled = True
            self.scope.cancel()
            return
        self.timer = self.loop.call_later((since if since is not None else now) + self.stall_timeout - now, self._check)

    def stop(self) -> None:
        self.timer.cancel()


class _Turn:
    """The `ResponseSink` of one turn: times the response, keeps its bytes, parses the stream as it comes."""

    def __init__(self, stream: bool, max_bytes: int, ticket: Ticket, rawtext: RawCollector | None = None) -> None:
        self.clock = _Clock()
        self.ticket = ticket
        self.transport: asyncio.Transport | None = None
        self.budget: anyio.CancelScope | None = None
        """The turn's time budget, lengthened by any time the byte budget held its reading paused."""
        self.stream = stream
        self.max_bytes = max_bytes
        self.rawtext = rawtext
        self.reader = _SSEReader(self.clock, rawtext)
        self.raw: bytearray | Spooled = bytearray()
        self.status: int | None = None
        self.location: str | None = None
        self.parse = False
        """Feed the body to the SSE reader: a streamed answer with a success status."""
        self.truncated = False

    def reading(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def _resume(self) -> None:
        hold = self.clock.resume()
        if self.budget is not None:
            self.budget.deadline += hold  # the hold is not the turn's time either
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def started(self) -> None:
        if self.clock.sent is None:
            self.clock.sent = time.perf_counter()

    def waiting(self) -> None:
        self.clock.heard = time.perf_counter()

    def head(self) -> None:
        self.clock.head_at = time.perf_counter()

    def headers(self, status: int, fields: dict[str, str]) -> None:
        self.clock.heard = time.perf_counter()
        self.clock.head_at = None
        self.status = status
        self.location = fields.get("location")
        self.parse = self.stream and 200 <= status < 300

    def body(self, data: bytes) -> None:
        # Every streamed chunk passes here: the clock's bookkeeping is inline, not a call.
        clock = self.clock
        now = time.perf_counter()
        last = clock.last_bytes
        if last is None:
            clock.first_bytes = now
        elif now - last > clock.max_gap:
            clock.max_gap = now - last
        clock.last_bytes = now
        raw = self.raw
        size = len(data)
        room = self.max_bytes - len(raw)
        if size > room:
            # Keep (and parse) no more than the cap: an endless stream must not grow memory or the raw file.
            self._keep(data[:room])
            self.truncated = True
            raise _Failure(f"response exceeded {self.max_bytes} bytes; reading stopped there")
        if isinstance(raw, bytearray) and len(raw) + size <= SPOOL_AT:
            raw += data  # the usual piece: no call on the way (every streamed chunk passes here)
        else:
            self._keep(data)
        if self.ticket.grow(size) and self.transport is not None:
            # Over the run's byte budget: no more reading until an older turn makes room.
            self.transport.pause_reading()
            self.clock.pause()
            self.ticket.resume = self._resume
        if self.parse:
            self.reader.feed(data)

    def _keep(self, data: bytes) -> None:
        raw = self.raw
        if isinstance(raw, bytearray):
            if self.parse and len(raw) + len(data) > SPOOL_AT:
                # Only a streamed answer goes to disk: any other body is parsed whole from memory.
                self.raw = Spooled(raw)
                self.raw.append(data)
            else:
                raw += data
        else:
            raw.append(data)

    def conclude(self, result: TurnResult) -> None:
        """The response has ended: fill `result` from it, or raise _Failure when it is not a whole answer.

        A streamed answer's request id and chunk count come from the reader, as they do for a turn cut short.
        """
        assert self.status is not None
        if self.status >= 400:
            raise _Failure(_http_error(self.status, bytes(whole(self.raw))))
        if not 200 <= self.status < 300:
            raise _Failure(_not_an_answer(self.status, self.location))
        rawtext = self.rawtext
        if rawtext is not None and not rawtext.chat:
            self._conclude_text(rawtext, result)
        elif self.stream:
            reader = self.reader
            reader.finish()
            result.message = reader.accumulator.message()
            result.finish_reason = reader.accumulator.finish_reason
            result.usage = reader.accumulator.usage
        else:
            message, finish, usage, request_id = _parse_completion(bytes(whole(self.raw)), rawtext)
            # Without streaming the first answer byte is the closest thing to a first token.
            self.clock.first_token = self.clock.first_bytes
            result.message, result.finish_reason, result.usage = message, finish, usage
            result.request_id = request_id
            result.chunks = 1
        result.status = "ok"

    def _conclude_text(self, rawtext: RawCollector, result: TurnResult) -> None:
        """A raw-text endpoint's answer: no message (the caller parses the text), the rest from the collector."""
        if self.stream:
            self.reader.finish()
        else:
            rawtext.add_body(_json_object(bytes(whole(self.raw))))
            self.clock.first_token = self.clock.first_bytes
            result.chunks = 1
        problem = rawtext.problem()
        if problem is not None:
            raise _Failure(problem)
        result.finish_reason, result.usage, result.request_id = rawtext.finish_reason, rawtext.usage, rawtext.request_id
        result.status = "ok"


# ASCII escapes: model output echoed back in the history may hold lone surrogates, which UTF-8 cannot encode.
_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)  # NaN is not JSON: never send it


_SHARED_TEXT_BYTES = 512
"""Strings at least this long are remembered across sessions by `_text`: a system prompt, a tool's output."""
_SHARED_TEXTS_MAX = 4096
_SHARED_TEXTS_MAX_CHARS = 32 * 1024 * 1024
"""What the remembered strings and their JSON may hold in all, so long answers cannot pile up in memory."""
_shared_texts: dict[int, tuple[str, str]] = {}
_shared_chars = 0


def _text(value: str) -> str:
    """A string's JSON; a long one is encoded once while the very same object keeps coming back.

    Every session sends the same system prompt, and the sandbox hands every session the same result
    object for the same call: encoded once for the run instead of once per session and turn.
    """
    global _shared_chars
    if len(value) < _SHARED_TEXT_BYTES:
        return _JSON.encode(value)
    known = _shared_texts.get(id(value))
    if known is not None and known[0] is value:
        return known[1]
    text = _JSON.encode(value)
    if len(_shared_texts) >= _SHARED_TEXTS_MAX or _shared_chars + len(value) + len(text) > _SHARED_TEXTS_MAX_CHARS:
        _shared_texts.clear()
        _shared_chars = 0
    if len(value) + len(text) <= _SHARED_TEXTS_MAX_CHARS:
        _shared_texts[id(value)] = (value, text)  # the object is kept with it: its id cannot be reused meanwhile
        _shared_chars += len(value) + len(text)
    return text


def _object(value: dict[str, Any]) -> str:
    """`_JSON.encode(value)` for a JSON object, its long string members through `_text`."""
    if not all(isinstance(key, str) for key in value):
        return _JSON.encode(value)  # JSON turns such keys into strings: leave that to json
    return "{" + ",".join(
        _JSON.encode(key) + ":" + (_text(item) if isinstance(item, str) else _JSON.encode(item))
        for key, item in value.items()
    ) + "}"


class BodyEncoder:
    """Request bodies as JSON bytes, each message and each list or object value encoded once per conversation.

    A session sends its whole history every turn, and encoding it again was the largest per-turn cost
    at thousands of sessions. Messages and the tools never change once sent (a session only appends),
    so their text is kept by identity; the object is kept with it, so its id cannot be reused while
    remembered. The bytes are exactly those of encoding the whole body at once.
    """

    def __init__(self, shared: BodyEncoder | None = None) -> None:
        self.memo: dict[int, tuple[object, str]] = {}
        self.shared = shared
        """An encoder of values every conversation of the run sends (the tools), consulted when this one has
        not seen a value: the run's tools are then encoded once for the run, not once per session."""

    def _value(self, value: object) -> str:
        known = self.memo.get(id(value))
        if known is None and self.shared is not None:
            known = self.shared.memo.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        text = _object(value) if isinstance(value, dict) else _JSON.encode(value)
        self.memo[id(value)] = (value, text)
        return text

    def encode(self, body: dict[str, Any]) -> bytes:
        if not all(isinstance(key, str) for key in body):
            return _JSON.encode(body).encode()
        parts = []
        for key, value in body.items():
            if key == "messages" and isinstance(value, list):
                text = "[" + ",".join(self._value(message) for message in value) + "]"
            elif isinstance(value, (list, dict)):
                text = self._value(value)
            else:
                text = _JSON.encode(value)
            parts.append(_JSON.encode(key) + ":" + text)
        return ("{" + ",".join(parts) + "}").encode()


async def send_turn(
    client: HTTPClient,
    endpoint: Endpoint,
    payload: dict[str, Any],
    *,
    stream: bool = True,
    turn_timeout: float,
    stall_timeout: float,
    headers: dict[str, str] | None = None,
    max_bytes: int = MAX_TURN_BYTES,
    rawtext: RawCollector | None = None,
    encoder: BodyEncoder | None = None,
    ticket: Ticket | None = None,
) -> TurnResult:
    """POST one chat completion and classify how it ended; see the module docstring.

    At most `max_bytes` of the response are read and kept; a longer one is an error with `truncated_at` set.
    `rawtext` is fed every stream event (or the body) to rebuild the generated text; when it is a
    raw-text endpoint's collector (`chat` False), the answer is its text, `message` stays None and
    the finish reason, usage and request id come from the collector. A conversation's turns share an
    `encoder`, so what they have in common is encoded once.

    The turn first waits for room in the client's byte budget (`ticket`, which the caller releases once
    it no longer holds the answer; without one the turn takes and releases its own).
    """
    body = {**payload, "stream": stream}
    if stream and (rawtext is None or rawtext.source != "generate"):  # /generate takes no stream_options
        body.setdefault("stream_options", {"include_usage": True})
    owned = ticket is None
    held = client.budget.ticket() if ticket is None else ticket
    turn = _Turn(stream, max_bytes, held, rawtext)
    clock = turn.clock
    result = TurnResult(status="error")
    try:
        # Outside the turn's time budget: waiting for room is the client's doing, not the server's.
        await held.admit()
    except BaseException:
        if owned:
            held.release()
        raise
    # One cancel scope for both limits (entering and leaving one cost a turn several µs): the watch cancels it on a
    # stall and says so in the clock, so what is left of a cancellation is the time budget's.
    with anyio.move_on_after(turn_timeout) as budget:
        turn.budget = budget
        watch = _StallWatch(clock, stall_timeout, budget)
        try:
            await client.post(
                endpoint,
                (encoder or BodyEncoder()).encode(body),
                turn,
                connect_timeout=stall_timeout,
                headers=headers,
                accept="text/event-stream" if stream else "application/json",
            )
            turn.conclude(result)
        except (_Failure, TransportError) as failure:
            result.error = str(failure)
        finally:
            watch.stop()
            held.read()
            if owned:
                held.release()
    if clock.headers_late:
        result.status = "error"
        result.error = f"headers not complete after {stall_timeout:g}s (header bytes kept coming)"
    if clock.stalled:
        result.status = "stalled"
        result.error = f"no bytes for {stall_timeout:g}s"
    if budget.cancelled_caught and not (clock.stalled or clock.headers_late):
        result.status = "timeout"
        result.error = f"turn exceeded {turn_timeout:g}s"
    result.http_status = turn.status
    if result.request_id is None:
        result.request_id = turn.reader.request_id
    result.chunks = result.chunks or turn.reader.events
    result.raw = turn.raw
    if turn.truncated:
        result.truncated_at = len(result.raw)
    clock.fill(result)
    if isinstance(turn.raw, Spooled):
        turn.reader.accumulator = StreamAccumulator()  # the answer's pieces: its text is whole in `result`
        give_back()
    return result
