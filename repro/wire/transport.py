"""The turn client's HTTP/1.1: a keep-alive connection pool on asyncio protocols, parsed by httptools.

Why not httpx here (it stays for every other request): at thousands of concurrent streams its
layers (httpx → httpcore → h11 → anyio streams) cost ~300 µs of CPU per streamed chunk, because each
chunk wakes the reading task and climbs the stack. Here a chunk is one `data_received` callback:
httptools (llhttp, in C) undoes the framing and hands the body straight to the caller's
`ResponseSink`, and the waiting task wakes once, when the response has ended.

Needs the asyncio backend of anyio (uvloop or not). Cancelling a `post` (a timeout, a stall, Ctrl-C)
aborts its connection; a connection goes back to the pool only after a whole response that allows
keep-alive.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Protocol, cast
from urllib.parse import urlsplit

import anyio
import httptools

from repro import __version__
from repro.wire.budget import InFlight

_USER_AGENT = f"repro/{__version__}".encode()
MAX_HEAD_BYTES = 64 * 1024
"""Status line and headers of one response; more is a hostile or broken server (httptools would buffer it all)."""


class TransportError(Exception):
    """The request failed below HTTP: no connection, or the connection broke. The text says how."""


class ResponseSink(Protocol):
    """What receives one response as it arrives; called from the event loop's I/O callbacks.

    An exception raised by a sink method ends the exchange: `post` aborts the connection and
    raises it.
    """

    def reading(self, transport: asyncio.Transport) -> None:
        """The connection the response comes on: the sink may pause and resume its reading (flow control)."""

    def started(self) -> None:
        """A connection is in hand (before connecting or sending): the client-side wait is over."""

    def waiting(self) -> None:
        """The request is written; from now on the server owes an answer."""

    def head(self) -> None:
        """Bytes of the status line or headers arrived; called for each piece until the headers are complete."""

    def headers(self, status: int, fields: dict[str, str]) -> None:
        """The final status line and headers have arrived (names lower-cased; a 1xx hint is not reported)."""

    def body(self, data: bytes) -> None:
        """A piece of the body, transfer framing removed."""


@dataclass(frozen=True)
class Endpoint:
    """A parsed request URL: where to connect and what to ask for."""

    scheme: str
    host: str
    port: int
    target: str
    """Path and query, as sent on the request line."""

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.scheme, parts.hostname, port, target)

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host, self.port

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host_header}{self.target}"


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; carries one exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.sink: ResponseSink | None = None
        self.done: asyncio.Future[None] | None = None
        self.lost = False
        self.heard = False
        """Some byte of the current response has arrived."""
        self.got_headers = False
        """The final (non-1xx) headers of the current response are complete."""
        self.head_bytes = 0
        self.fields: dict[str, str] = {}
        self.informational = False
        """The message being parsed is a 1xx hint (103 Early Hints, 100 Continue): the answer follows it."""
        self.refusal: Exception | None = None
        """What a sink method raised: the reason the exchange ends."""
        self.framed = False
        """The current response says where its body ends (length or chunked), so EOF is not its end."""
        self.reusable = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance check: uvloop's TCP transport has the same methods but is no asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.done is None or self.done.done():
            # Bytes nobody asked for: the connection is out of step; never reuse it.
            self.close()
            return
        self.heard = True
        in_head = not self.got_headers
        if in_head:
            assert self.sink is not None
            self.sink.head()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            # httptools reports a callback's exception as its own error; the sink's reason is the one to tell.
            self._fail(self.refusal or TransportError(f"malformed HTTP response: {err}"))
            return
        except httptools.HttpParserUpgrade:
            self._fail(TransportError("HTTP 101: the server switched protocols, which was never asked for"))
            return
        if in_head and not self.got_headers:
            # Still no end of the header block, which httptools buffers whole: bound it.
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES:
                self._fail(TransportError(f"malformed HTTP response: headers longer than {MAX_HEAD_BYTES} bytes"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.done is None or self.done.done():
            return
        if self.got_headers and not self.framed:
            self.done.set_result(None)  # the body was delimited by the close
        elif exc is not None:
            self._fail(TransportError(f"connection reset while reading: {exc}"))
        else:
            self._fail(TransportError("connection closed by server"))

    # httptools callbacks

    def on_message_begin(self) -> None:
        self.framed = False
        self.fields = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.lower().decode("latin-1")
        if key in ("content-length", "transfer-encoding"):
            self.framed = True
        self.fields[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            # RFC 9110 §15.2: an interim response; the real one follows on the same connection.
            self.informational = True
            return
        self.got_headers = True
        self._deliver("headers", status, self.fields)

    def on_body(self, body: bytes) -> None:
        # `_deliver` inlined: every streamed chunk passes here.
        sink, done = self.sink, self.done
        if sink is None or done is None or done.done():
            self._deliver("body", body)  # raises
        try:
            sink.body(body)  # type: ignore[union-attr]
        except Exception as err:
            self.refusal = err
            raise

    def _deliver(self, method: str, *values: object) -> None:
        """Hand `values` to the sink; what it raises stops the parser and becomes the exchange's end."""
        try:
            if self.sink is None or self.done is None or self.done.done():
                raise TransportError("malformed HTTP response: more bytes after the response ended")
            getattr(self.sink, method)(*values)
        except Exception as err:
            self.refusal = err
            raise

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
            return
        self.reusable = self.parser.should_keep_alive()
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    # the exchange

    def _fail(self, err: BaseException) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(err)
        self.close()

    def begin(self, sink: ResponseSink, request: bytes) -> asyncio.Future[None]:
        assert self.transport is not None
        self.sink = sink
        self.heard = self.got_headers = self.framed = self.reusable = self.informational = False
        self.head_bytes = 0
        self.refusal = None
        self.done = asyncio.get_running_loop().create_future()
        sink.reading(self.transport)
        self.transport.write(request)
        return self.done

    def end(self) -> None:
        self.sink = None
        self.done = None

    @property
    def idle_ok(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


class HTTPClient:
    """A pool of keep-alive connections, at most `connections` of them busy at once (more requests queue).

    The connection used last is reused first, while its keep-alive is fresh. `headers` go with
    every request (an Authorization header, say); they must not contain line breaks.
    """

    def __init__(self, connections: int, *, headers: dict[str, str] | None = None) -> None:
        # asyncio's, not anyio's: anyio's acquire yields to the event loop even when a slot is free, one more
        # pass of the loop for every turn.
        self.limit = asyncio.Semaphore(max(1, connections))
        self.idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self.headers = _header_lines(headers or {})
        self.tls: ssl.SSLContext | None = None
        self.open: set[_Connection] = set()
        self.budget = InFlight(None)
        """The answer bytes its turns may hold at once (`repro.wire.budget`); set by the run."""

    async def __aenter__(self) -> HTTPClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        for connection in list(self.open):
            connection.close()
        self.open.clear()
        self.idle.clear()

    async def post(
        self,
        endpoint: Endpoint,
        body: bytes,
        sink: ResponseSink,
        *,
        connect_timeout: float,
        headers: dict[str, str] | None = None,
        accept: str = "application/json",
    ) -> None:
        """Send `body` as JSON and feed the response to `sink`; returns when the response has ended.

        Raises TransportError when the connection fails, or whatever a sink method raised.
        """
        request = b"".join(
            (
                b"POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: %s\r\nAccept: %s\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n"
                % (endpoint.target.encode(), endpoint.host_header.encode(), _USER_AGENT, accept.encode(), len(body)),
                self.headers,
                _header_lines(headers) if headers else b"",
                b"\r\n",
                body,
            )
        )
        async with self.limit:
            sink.started()
            connection = self._reuse(endpoint)
            if connection is not None:
                if await self._exchange(connection, endpoint, sink, request, retry=True):
                    return
            connection = await self._connect(endpoint, connect_timeout)
            await self._exchange(connection, endpoint, sink, request, retry=False)

    def _reuse(self, endpoint: Endpoint) -> _Connection | None:
        idle = self.idle.get(endpoint.origin)
        while idle:
            connection = idle.pop()
            if connection.idle_ok:
                return connection
            self.open.discard(connection)
        return None

    async def _exchange(
        self, connection: _Connection, endpoint: Endpoint, sink: ResponseSink, request: bytes, *, retry: bool
    ) -> bool:
        """One request on `connection`. False (instead of an error) when `retry` and a reused
        connection turned out to be closed by the server before it answered anything."""
        done = connection.begin(sink, request)
        sink.waiting()
        reusable = False
        try:
            await done
            reusable = connection.reusable
        except TransportError:
            if retry and not connection.heard:
                return False
            raise
        finally:
            connection.end()
            if reusable and connection.idle_ok:
                self.idle.setdefault(endpoint.origin, []).append(connection)
            else:
                connection.close()
                self.open.discard(connection)
        return True

    async def _connect(self, endpoint: Endpoint, timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = None
        if endpoint.scheme == "https":
            if self.tls is None:
                self.tls = tls_context()
            tls = self.tls
        try:
            with anyio.fail_after(timeout):
                _, connection = await loop.create_connection(
                    _Connection, endpoint.host, endpoint.port, ssl=tls, server_hostname=endpoint.host if tls else None
                )
        except TimeoutError:
            raise TransportError(f"connect timed out after {timeout:g}s") from None
        except (OSError, ssl.SSLError) as err:
            raise TransportError(f"connection failed: {err}") from None
        self.open.add(connection)
        return connection


def tls_context() -> ssl.SSLContext:
    """Verified TLS trusting the system's roots (so SSL_CERT_FILE and SSL_CERT_DIR count) and certifi's.

    An internal CA reaches both this client and the httpx clients given this context as `verify`.
    """
    import certifi  # installed with httpx; imported here because plain-HTTP runs never need it

    context = ssl.create_default_context()
    context.load_verify_locations(cafile=certifi.where())
    return context


def tls_for(url: str) -> ssl.SSLContext:
    """The TLS context for a client of `url`'s server: `tls_context()` for https; for plain HTTP a context
    that trusts no certificate, so it costs nothing to make (loading the roots takes a third of a second)
    and an https request the client should never make fails verification instead of going unchecked."""
    if urlsplit(url).scheme == "https":
        return tls_context()
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def _header_lines(headers: dict[str, str]) -> bytes:
    lines = []
    for name, value in headers.items():
        if any(c in name + value for c in "\r\n\0") or not name or ":" in name:
            raise ValueError(f"header {name!r}: names and values must not contain line breaks")
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    return b"".join(lines)
