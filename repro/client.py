"""One chat-completion turn over a shared `httpx.AsyncClient`: send, read (streamed or not), time, classify.

Knows nothing of sessions. Never raises on bad server output: refused or reset connections,
4xx/5xx, malformed SSE or JSON all come back as a `TurnResult` with status `error`; no bytes for
`stall_timeout` gives `stalled`; the whole turn exceeding its budget gives `timeout`.

Stalls are watched by one task per turn, not by httpx's read timeout: that one opens a cancel
scope and schedules (then cancels) a timer for every socket read, a large part of the client's
CPU per streamed chunk.
"""

from __future__ import annotations

import functools
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import anyio
import httpx

from dsml_checker import StreamAccumulator
from repro.records import TurnStatus

_CONNECT_EVENT = "connection.connect_tcp.started"
_SENT_EVENT = "http11.send_request_headers.started"
_HEADERS_EVENTS = ("http11.receive_response_headers.started", "http11.receive_response_headers.complete")
_SSE_FIELDS = (b"data", b"event", b"id", b"retry")


class _ReleasingStream(httpx.AsyncByteStream):
    """A response body that tells its shard when it is closed."""

    def __init__(self, inner: httpx.AsyncByteStream, release: Callable[[], None]) -> None:
        self.inner = inner
        self.release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self.inner:
            yield part

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        finally:
            if self.release is not None:
                self.release()
                self.release = None


class ShardedTransport(httpx.AsyncBaseTransport):
    """One single-connection pool per connection; a request takes the most recently idle one.

    httpcore's pool rescans all its connections (a poll() and a socket-info lookup for each) on
    every request and release, quadratic in the pool size: at 60 connections that cost more client
    CPU than the whole rest of a run. Pools of one connection make each lookup constant. While no
    more than `connections` requests are in flight every request finds an idle pool at once; beyond
    that (never in `repro run`, where sessions ≤ connections) extra requests queue round-robin.
    """

    def __init__(self, connections: int) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        # One TLS context for all pools: building one costs ~0.1 s of CPU.
        tls = httpx.create_ssl_context()
        self.pools = [httpx.AsyncHTTPTransport(verify=tls, limits=limits) for _ in range(max(1, connections))]
        self.idle = list(reversed(range(len(self.pools))))
        """A stack: the connection used last is reused first, while its keep-alive is fresh."""
        self.overflow = itertools.count()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.idle:
            index = self.idle.pop()
            release: Callable[[], None] = functools.partial(self.idle.append, index)
        else:
            index = next(self.overflow) % len(self.pools)
            release = _nothing
        try:
            response = await self.pools[index].handle_async_request(request)
        except BaseException:
            release()
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_ReleasingStream(response.stream, release),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        for pool in self.pools:
            await pool.aclose()


def _nothing() -> None:
    return None


def make_client(concurrency: int, *, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    """The run's one shared HTTP client: room for `concurrency` connections, no hidden cap.

    Environment proxies are ignored (the target is addressed directly, usually on loopback).
    """
    return httpx.AsyncClient(transport=ShardedTransport(concurrency), headers=headers, trust_env=False)


@dataclass
class TurnResult:
    """What one request produced. `message` is the assembled assistant message when status is `ok`."""

    status: TurnStatus
    raw: bytes = b""
    message: dict[str, Any] | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    http_status: int | None = None
    request_id: str | None = None
    error: str | None = None
    queue_s: float = 0.0
    """From the call to the first network action (a free connection in hand): client-side waiting."""
    ttft_s: float | None = None
    e2e_s: float | None = None
    max_gap_s: float | None = None
    chunks: int = 0
    gaps: list[float] = field(default_factory=list, repr=False)

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
    """Timestamps of one request; `sent` comes from httpcore's trace hook."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.sent: float | None = None
        self.first_token: float | None = None
        self.first_bytes: float | None = None
        self.last_bytes: float | None = None
        self.heard: float | None = None
        """When the client began waiting for the answer, or its headers came: where a stall is timed from before body bytes."""
        self.max_gap = 0.0
        self.stalled = False

    async def trace(self, name: str, info: dict[str, Any]) -> None:
        # The first network action ends the client-side wait: connecting (a new connection) or
        # sending headers (a reused one). Connect time is the server's accept latency, not queueing.
        if self.sent is None and name in (_CONNECT_EVENT, _SENT_EVENT):
            self.sent = time.perf_counter()
        elif name in _HEADERS_EVENTS:
            self.heard = time.perf_counter()

    @property
    def quiet_since(self) -> float | None:
        """Since when the server has sent nothing while the client waited for it; None before the wait began."""
        return self.last_bytes if self.last_bytes is not None else self.heard

    @property
    def origin(self) -> float:
        return self.sent if self.sent is not None else self.start

    def got_bytes(self) -> None:
        now = time.perf_counter()
        if self.last_bytes is not None:
            self.max_gap = max(self.max_gap, now - self.last_bytes)
        else:
            self.first_bytes = now
        self.last_bytes = now

    def fill(self, result: TurnResult) -> None:
        end = time.perf_counter()
        result.queue_s = self.origin - self.start
        result.e2e_s = end - self.origin
        if self.first_token is not None:
            result.ttft_s = self.first_token - self.origin
        if self.last_bytes is not None:
            result.max_gap_s = self.max_gap


def _has_output(chunk: dict[str, Any]) -> bool:
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    delta = choices[0].get("delta")
    if not isinstance(delta, dict):
        return False
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))


class _SSEReader:
    """Incremental Server-Sent Events parser feeding chat-completion chunks to a StreamAccumulator."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.accumulator = StreamAccumulator()
        self.buffer = b""
        self.data: list[bytes] = []
        self.done = False
        self.events = 0
        self.request_id: str | None = None

    def feed(self, data: bytes) -> None:
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            self._line(line.rstrip(b"\r"))

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
        if self.done:
            raise _Failure("malformed stream: data after [DONE]")
        if payload.strip() == b"[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            raise _Failure(f"malformed stream: event is not JSON: {payload[:80]!r}") from None
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

    def finish(self) -> None:
        """The body ended: flush a last event and check that the answer is whole."""
        if self.buffer:
            self._line(self.buffer.rstrip(b"\r"))
            self.buffer = b""
        self._dispatch()
        if self.accumulator.malformed:
            raise _Failure(f"malformed stream: {self.accumulator.malformed} chunk(s) of the wrong shape")
        if self.events == 0:
            raise _Failure("malformed stream: no chat-completion events")
        if not self.done and self.accumulator.finish_reason is None:
            raise _Failure("stream ended before finish_reason or [DONE]")


def _error_text(error: object) -> str:
    if isinstance(error, dict):
        error = error.get("message", error)
    return str(error)[:200]


def _http_error(status: int, body: bytes) -> str:
    excerpt = body[:200].decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(body)
        if isinstance(data, dict) and "error" in data:
            excerpt = _error_text(data["error"])
        elif isinstance(data, dict) and "detail" in data:
            excerpt = str(data["detail"])[:200]
    except ValueError:
        pass
    return f"HTTP {status}" + (f": {excerpt}" if excerpt else "")


def _transport_error(err: httpx.HTTPError) -> str:
    kinds = {
        httpx.ConnectError: "connection failed",
        httpx.RemoteProtocolError: "connection closed by server",
        httpx.ReadError: "connection reset while reading",
        httpx.WriteError: "connection reset while sending",
        httpx.PoolTimeout: "no free connection in the pool",
        httpx.ConnectTimeout: "connect timed out",
        httpx.WriteTimeout: "send timed out",
    }
    for kind, text in kinds.items():
        if isinstance(err, kind):
            return f"{text}: {err}" if str(err) else text
    return f"{type(err).__name__}: {err}"


def _parse_completion(body: bytes) -> tuple[dict[str, Any], str | None, dict[str, Any] | None, str | None]:
    try:
        data = json.loads(body)
    except ValueError:
        raise _Failure(f"malformed response: not JSON: {body[:80]!r}") from None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _Failure("malformed response: no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise _Failure("malformed response: choice has no message")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
    request_id = data.get("id") if isinstance(data.get("id"), str) else None
    return message, choices[0].get("finish_reason"), usage, request_id


async def _watch_stall(clock: _Clock, stall_timeout: float, scope: anyio.CancelScope) -> None:
    """Mark the turn stalled and cancel `scope` once the server has been quiet for `stall_timeout`.

    Wakes about once per `stall_timeout` while bytes flow, instead of a timer per read.
    """
    while True:
        now = time.perf_counter()
        since = clock.quiet_since
        if since is not None and now - since >= stall_timeout:
            clock.stalled = True
            scope.cancel()
            return
        await anyio.sleep((since if since is not None else now) + stall_timeout - now)


async def _exchange(
    client: httpx.AsyncClient,
    url: str | httpx.URL,
    body: dict[str, Any],
    *,
    stream: bool,
    timeout: httpx.Timeout,
    headers: dict[str, str] | None,
    reader: _SSEReader,
    raw: bytearray,
    result: TurnResult,
) -> None:
    """Send the request and read the answer into `raw` and `result`; bad server output ends up in `result.error`."""
    clock = reader.clock
    try:
        async with client.stream(
            "POST", url, json=body, headers=headers, timeout=timeout, extensions={"trace": clock.trace}
        ) as response:
            result.http_status = response.status_code
            async for data in response.aiter_bytes():
                clock.got_bytes()
                raw += data
                if response.status_code < 400 and stream:
                    reader.feed(data)
            if response.status_code >= 400:
                result.error = _http_error(response.status_code, bytes(raw))
            elif stream:
                reader.finish()
                message = reader.accumulator.message()
                result.status = "ok"
                result.message = message
                result.finish_reason = reader.accumulator.finish_reason
                result.usage = reader.accumulator.usage
                result.request_id = reader.request_id
                result.chunks = reader.events
            else:
                message, finish, usage, request_id = _parse_completion(bytes(raw))
                # Without streaming the first answer byte is the closest thing to a first token.
                clock.first_token = clock.first_bytes
                result.status = "ok"
                result.message, result.finish_reason, result.usage = message, finish, usage
                result.request_id = request_id
                result.chunks = 1
    except _Failure as failure:
        result.error = str(failure)
    except httpx.HTTPError as err:
        result.error = _transport_error(err)


async def send_turn(
    client: httpx.AsyncClient,
    url: str | httpx.URL,
    payload: dict[str, Any],
    *,
    stream: bool = True,
    turn_timeout: float,
    stall_timeout: float,
    headers: dict[str, str] | None = None,
) -> TurnResult:
    """POST one chat completion and classify how it ended; see the module docstring."""
    clock = _Clock()
    # No read timeout: _watch_stall times the quiet spells.
    timeout = httpx.Timeout(connect=stall_timeout, read=None, write=stall_timeout, pool=turn_timeout)
    body = {**payload, "stream": stream}
    if stream:
        body.setdefault("stream_options", {"include_usage": True})
    raw = bytearray()
    result = TurnResult(status="error")
    reader = _SSEReader(clock)
    with anyio.move_on_after(turn_timeout) as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(_watch_stall, clock, stall_timeout, group.cancel_scope)
            await _exchange(
                client, url, body, stream=stream, timeout=timeout, headers=headers, reader=reader, raw=raw, result=result
            )
            group.cancel_scope.cancel()
    if clock.stalled:
        result.status = "stalled"
        result.error = f"no bytes for {stall_timeout:g}s"
    if scope.cancelled_caught:
        result.status = "timeout"
        result.error = f"turn exceeded {turn_timeout:g}s"
    if result.request_id is None:
        result.request_id = reader.request_id
    result.chunks = result.chunks or reader.events
    result.raw = bytes(raw)
    clock.fill(result)
    return result
