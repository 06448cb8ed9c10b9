"""repro.wire.transport against a purpose-built HTTP/1.1 server on loopback: framing, keep-alive, failures, TLS.

The server runs in the test's own event loop (real sockets, no mocks) so that it can count
connections, hold answers until the test releases them, and see when the client hangs up.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

import anyio
import pytest
import trustme

from repro.wire.transport import MAX_HEAD_BYTES, Endpoint, HTTPClient, TransportError, tls_for

BODY = b'{"messages": []}'
PIECES = [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"]
CHUNKED = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _frame(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


ANSWER_THEN_CLOSE = {
    "/close": b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
    "/until-eof": b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nthe body ends where the connection does",
    "/garbage": b"SPDY/9 maybe\r\n\r\n",
    "/cut": CHUNKED + _frame(PIECES[0]),  # then the connection closes mid-body
    "/header-flood": b"HTTP/1.1 200 OK\r\nx-flood: " + b"a" * 200_000,  # a header block that never ends
}


@dataclass
class Server:
    """Answers by path; see `_answer` for what each path does."""

    port: int = 0
    connections: int = 0
    requests: list[tuple[int, str, bytes]] = field(default_factory=list)
    """(connection number, path, body) of every request read."""
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    hung_up: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the client closed a connection while the server was still answering."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number, served = self.connections, 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = next(int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length"))
                body = await reader.readexactly(length)
                async with self.arrived:
                    self.requests.append((number, path, body))
                    self.arrived.notify_all()
                if not await self._answer(path, served, writer, reader):
                    break
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, path: str, served: int, writer: asyncio.StreamWriter, reader: asyncio.StreamReader) -> bool:
        """Write the answer for `path`; False to close the connection afterwards."""
        if path == "/ok" or (path == "/once" and served == 0):
            writer.write(CHUNKED + b"".join(_frame(piece) for piece in PIECES) + b"0\r\n\r\n")
            return True
        if path == "/early-hints":
            writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n")
            await writer.drain()
            writer.write(CHUNKED.replace(b"\r\n\r\n", b"\r\nx-final: yes\r\n\r\n") + _frame(PIECES[0]) + b"0\r\n\r\n")
            return True
        if path in ("/once", "/drop"):
            return False  # read the request, then hang up without a word
        if path == "/hold":
            await self.release.wait()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            return True
        if path in ANSWER_THEN_CLOSE:
            writer.write(ANSWER_THEN_CLOSE[path])
            return False
        if path == "/hang":
            writer.write(CHUNKED + _frame(PIECES[0]))
            await writer.drain()
            if await reader.read(1) == b"":
                self.hung_up.set()
            return False
        writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
        return True

    async def requests_seen(self, count: int) -> None:
        async with self.arrived:
            await self.arrived.wait_for(lambda: len(self.requests) >= count)


@dataclass
class Sink:
    events: list[str] = field(default_factory=list)
    status: int | None = None
    fields: dict[str, str] = field(default_factory=dict)
    head_pieces: int = 0
    data: bytearray = field(default_factory=bytearray)
    refuse: bool = False
    first_body: anyio.Event = field(default_factory=anyio.Event)

    def reading(self, transport: object) -> None:
        pass

    def started(self) -> None:
        self.events.append("started")

    def waiting(self) -> None:
        self.events.append("waiting")

    def head(self) -> None:
        self.head_pieces += 1

    def headers(self, status: int, fields: dict[str, str]) -> None:
        self.status = status
        self.fields = fields

    def body(self, data: bytes) -> None:
        if self.refuse:
            raise ValueError("the sink refuses this body")
        self.data += data
        self.first_body.set()


def serve(test: Callable[[Server, HTTPClient, str], Awaitable[None]], *, connections: int = 4,
          tls: ssl.SSLContext | None = None) -> Server:
    """Run `test(server, client, base_url)` with a fresh server and client in one event loop."""
    server = Server()

    async def main() -> None:
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=tls)
        server.port = listener.sockets[0].getsockname()[1]
        try:
            async with HTTPClient(connections) as client:
                with anyio.fail_after(20):
                    await test(server, client, f"{'https' if tls else 'http'}://127.0.0.1:{server.port}")
        finally:
            listener.close()

    anyio.run(main)
    return server


async def post(client: HTTPClient, url: str, sink: Sink | None = None) -> Sink:
    sink = sink or Sink()
    await client.post(Endpoint.parse(url), BODY, sink, connect_timeout=5)
    return sink


def test_chunked_stream_is_unframed_and_one_connection_is_kept_alive() -> None:
    async def test(server: Server, client: HTTPClient, url: str) -> None:
        for _ in range(5):
            sink = await post(client, f"{url}/ok")
            assert sink.status == 200 and bytes(sink.data) == b"".join(PIECES)
            assert sink.events == ["started", "waiting"]

    server = serve(test)
    assert server.connections == 1 and [r[2] for r in server.requests] == [BODY] * 5


def test_busy_connections_are_capped_and_extra_requests_wait_for_one() -> None:
    async def test(server: Server, client: HTTPClient, url: str) -> None:
        sinks = [Sink() for _ in range(3)]
        async with anyio.create_task_group() as group:
            for sink in sinks:
                group.start_soon(post, client, f"{url}/hold", sink)
            await server.requests_seen(2)
            # Two requests are on the wire; the third has not even been handed a connection.
            assert sorted(len(sink.events) for sink in sinks) == [0, 2, 2]
            server.release.set()
        assert all(bytes(sink.data) == b"ok" for sink in sinks)

    server = serve(test, connections=2)
    assert server.connections == 2 and len(server.requests) == 3


def test_a_reused_connection_the_server_dropped_is_retried_once_on_a_new_one() -> None:
    async def test(server: Server, client: HTTPClient, url: str) -> None:
        await post(client, f"{url}/once")
        sink = await post(client, f"{url}/once")
        assert sink.status == 200 and bytes(sink.data) == b"".join(PIECES)

    server = serve(test)
    assert [number for number, _, _ in server.requests] == [1, 1, 2]


def test_a_new_connection_dropped_without_an_answer_is_an_error() -> None:
    async def test(server: Server, client: HTTPClient, url: str) -> None:
        with pytest.raises(TransportError, match="connection closed by server"):
            await post(client, f"{url}/drop")

    assert len(serve(test).requests) == 1


def test_connection_close_is_honoured_and_a_body_may_end_with_the_connection() -> None:
    async def test(server: Server, client: HTTPClient, url: str) -> None:
        assert bytes((await post(client, f"{url}/close")).data) == b"ok"
        assert bytes((await post(client, f"{url}/until-eof")).data) == b"the body ends where the connection does"
        assert bytes((await post(client, f"{url}/ok")).data) == b"".join(PIECES)

    assert serve(test).connections == 3


def test_a_response_that_is_not_http_and_a_cut_body_are_transport_errors() -> None:
    async def test(server: Server, client: HTTPClient, url: str) -> None:
        with pytest.raises(TransportError, match="malformed HTTP response"):
            await post(client, f"{url}/garbage")
        sink = Sink()
        with pytest.raises(TransportError, match="connection closed by server"):
            await post(client, f"{url}/cut", sink)
        assert bytes(sink.data) == PIECES[0]

    serve(test)


def test_an_early_hint_is_skipped_and_the_answer_after_it_is_the_response() -> None:
    async def test(server: Server, client: HTTPClient, url: str) -> None:
        for _ in range(2):
            sink = await post(client, f"{url}/early-hints")
            assert sink.status == 200 and sink.fields.get("x-final") == "yes" and "link" not in sink.fields
            assert bytes(sink.data) == PIECES[0] and sink.head_pieces >= 1

    assert serve(test).connections == 1


def test_a_header_block_that_never_ends_is_refused_at_a_bound() -> None:
    async def test(server: Server, client: HTTPClient, url: str) -> None:
        with pytest.raises(TransportError, match=f"headers longer than {MAX_HEAD_BYTES} bytes"):
            await post(client, f"{url}/header-flood")

    serve(test)


def test_what_a_sink_raises_ends_the_exchange_and_the_connection_is_not_reused() -> None:
    async def test(server: Server, client: HTTPClient, url: str) -> None:
        with pytest.raises(ValueError, match="the sink refuses this body"):
            await post(client, f"{url}/ok", Sink(refuse=True))
        await post(client, f"{url}/ok")

    assert serve(test).connections == 2


def test_cancelling_a_request_mid_body_hangs_up_its_connection() -> None:
    async def test(server: Server, client: HTTPClient, url: str) -> None:
        sink = Sink()
        async with anyio.create_task_group() as group:
            group.start_soon(post, client, f"{url}/hang", sink)
            await sink.first_body.wait()
            group.cancel_scope.cancel()
        await server.hung_up.wait()
        assert not client.open and not any(client.idle.values())

    serve(test)


def test_tls_trusts_a_private_ca_named_by_ssl_cert_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)

    async def untrusted(server: Server, client: HTTPClient, url: str) -> None:
        with pytest.raises(TransportError, match="connection failed: .*CERTIFICATE_VERIFY_FAILED"):
            await post(client, f"{url}/ok")

    serve(untrusted, tls=server_context)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))

    async def trusted(server: Server, client: HTTPClient, url: str) -> None:
        assert bytes((await post(client, f"{url}/ok")).data) == b"".join(PIECES)

    serve(trusted, tls=server_context)


def _handshake(client: ssl.SSLContext, server: ssl.SSLContext) -> None:
    """A TLS handshake between the two contexts in memory, for 127.0.0.1; raises what the client's raises."""
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    ends = [client.wrap_bio(pipes[0], pipes[1], server_hostname="127.0.0.1"),
            server.wrap_bio(pipes[1], pipes[0], server_side=True)]
    done = [False, False]
    for _ in range(20):
        for index, end in enumerate(ends):
            if not done[index]:
                try:
                    end.do_handshake()
                    done[index] = True
                except ssl.SSLWantReadError:
                    pass
        if all(done):
            return
    raise AssertionError("the handshake did not finish")


def test_a_plain_http_targets_context_trusts_no_certificate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    _handshake(tls_for("https://127.0.0.1:8443/v1"), server_context)  # the CA the user named is trusted
    # An http:// target's clients never need TLS: should one be sent to https, nothing is trusted.
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(tls_for("http://127.0.0.1:8000/v1"), server_context)


def test_header_values_with_line_breaks_are_refused() -> None:
    with pytest.raises(ValueError, match="must not contain line breaks"):
        HTTPClient(1, headers={"Authorization": "Bearer x\r\nX-Evil: 1"})


@pytest.mark.parametrize(
    ("url", "host_header", "target"),
    [
        ("http://127.0.0.1:30000/v1/chat/completions", "127.0.0.1:30000", "/v1/chat/completions"),
        ("https://api.example.com/v1/chat/completions?x=1", "api.example.com", "/v1/chat/completions?x=1"),
        ("http://[::1]:8000", "[::1]:8000", "/"),
        ("http://example.com:80/v1", "example.com", "/v1"),
    ],
)
def test_endpoint_parsing(url: str, host_header: str, target: str) -> None:
    endpoint = Endpoint.parse(url)
    assert (endpoint.host_header, endpoint.target) == (host_header, target)


@pytest.mark.parametrize("url", ["ftp://example.com/", "http://", "example.com/v1"])
def test_endpoint_refuses_what_is_not_an_http_url(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        Endpoint.parse(url)
