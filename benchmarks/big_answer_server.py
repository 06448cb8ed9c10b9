"""A purpose-built OpenAI-style server that streams huge answers, for the client's memory benchmark and tests.

The first two path segments pick the answer, so a client's base URL is `http://127.0.0.1:PORT/<kind>/<n>/v1`:

- `content/N`: one streamed answer of N bytes of ordinary prose (distinct words, no markup) in
  `--piece`-byte content deltas, finish_reason `stop`.
- `calls/N`: one streamed answer carrying N `read_file` tool calls (a name delta, then an arguments
  delta each), finish_reason `tool_calls`.

`--together K` holds the answers until K chat requests have arrived in all (then answers them all at
once, and every later one at once): a client's first K turns are all in flight before any byte comes.

A request asking for `"logprobs":true` (a client's probe of the target) gets a 100-byte answer at
once and is not counted.

Every answer is made and written as fast as the client reads (the transport's write
buffer is drained before the next piece is queued, so the server itself holds little). HTTP/1.1
keep-alive, chunked transfer encoding; `GET /v1/models` answers, for readiness checks.

Run: `python benchmarks/big_answer_server.py --port P [--piece 4096] [--together K]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Iterator

from fast_stream_server import take_request

_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
         b"connection: keep-alive\r\n\r\n")
_MODELS = json.dumps({"object": "list", "data": [{"id": "bench", "object": "model"}]}).encode()
_BATCH = 1 << 20
"""Bytes written at once before waiting for the client to drain them."""


def _event(delta: dict, finish: str | None = None) -> bytes:
    data = b"data: " + json.dumps({"id": "chatcmpl-big", "object": "chat.completion.chunk", "model": "bench",
                                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


_TAIL = b"%x\r\n%s\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n") + b"0\r\n\r\n"


def content_events(size: int, piece: int) -> Iterator[bytes]:
    """Events whose content deltas add up to `size` bytes of prose, made as they are sent."""
    yield _event({"role": "assistant", "content": ""})
    made, line = 0, 0
    while made < size:
        words = []
        length = 0
        while length < min(piece, size - made):
            word = f"step {line} reads line {7 * line + 3} of the file; "
            words.append(word)
            length += len(word)
            line += 1
        text = "".join(words)[: size - made]
        yield _event({"content": text})
        made += len(text)
    yield _event({}, "stop")


def call_events(calls: int) -> Iterator[bytes]:
    """Events carrying `calls` tool calls, each as a name delta and an arguments delta."""
    yield _event({"role": "assistant", "content": ""})
    for index in range(calls):
        yield _event({"tool_calls": [{"index": index, "id": f"call_{index}", "type": "function",
                                      "function": {"name": "read_file", "arguments": ""}}]})
        yield _event({"tool_calls": [{"index": index, "function": {
            "arguments": json.dumps({"path": f"src/module_{index}/file_{index % 97}.py"})}}]})
    yield _event({}, "tool_calls")


class _Together:
    """Opens once `count` requests have come: until then every answer waits."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.open = asyncio.Event()
        if count <= 0:
            self.open.set()

    def arrived(self) -> None:
        self.count -= 1
        if self.count <= 0:
            self.open.set()


class _Connection(asyncio.Protocol):
    def __init__(self, piece: int, together: _Together) -> None:
        self.piece = piece
        self.together = together
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.drained = asyncio.Event()
        self.drained.set()
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(high=_BATCH, low=0)

    def pause_writing(self) -> None:
        self.drained.clear()

    def resume_writing(self) -> None:
        self.drained.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.drained.set()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._next()

    def _next(self) -> None:
        if self.busy:
            return
        request = take_request(self.buffer)
        if request is None:
            return
        path, body, self.buffer = request
        assert self.transport is not None
        parts = path.strip("/").split("/")
        if path.endswith("/chat/completions") and len(parts) >= 2 and parts[0] in ("content", "calls"):
            self.busy = True
            if b'"logprobs":true' in body:
                asyncio.ensure_future(self._answer("content", 100, held=False))
            else:
                self.together.arrived()
                asyncio.ensure_future(self._answer(parts[0], int(parts[1])))
            return
        payload = _MODELS if path.endswith("/models") else b"ok"
        self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(payload), payload))
        self._next()

    async def _answer(self, kind: str, n: int, held: bool = True) -> None:
        transport = self.transport
        assert transport is not None
        if held:
            await self.together.open.wait()
        # Made batch by batch as the client reads: the server holds about one batch per stream, and each
        # stream's first bytes come at once however many answers are being made.
        events = content_events(n, self.piece) if kind == "content" else call_events(n)
        transport.write(_HEAD)
        batch: list[bytes] = []
        size = 0
        for event in events:
            batch.append(event)
            size += len(event)
            if size >= _BATCH:
                transport.write(b"".join(batch))
                batch, size = [], 0
                await self.drained.wait()
                await asyncio.sleep(0)  # the other streams' turn
                if transport.is_closing():
                    return
        transport.write(b"".join(batch) + _TAIL)
        self.busy = False
        self._next()


async def serve(port: int, piece: int, together: int) -> None:
    loop = asyncio.get_running_loop()
    gate = _Together(together)
    server = await loop.create_server(lambda: _Connection(piece, gate), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--piece", type=int, default=4096, help="Bytes of content per delta.")
    parser.add_argument("--together", type=int, default=0, help="Hold the answers until this many requests came.")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.piece, args.together))
