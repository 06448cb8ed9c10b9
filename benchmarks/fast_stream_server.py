"""A minimal, fast OpenAI-style streaming server for client benchmarks: raw asyncio, pre-encoded chunks.

Every completion waits `--ttft` seconds (the prefill), sends its first content chunk then, and the
rest of its `--chunks` content chunks `--interval` seconds apart (so the time to first token is
`--ttft`, and the client's TTFT overhead can be read off directly), then one tool call
(`read_file`) and finish_reason `tool_calls`; once the request already holds `--final-after`
assistant messages it answers with content only (finish_reason `stop`). A request with
`"logprobs":true` gets each chunk's token strings and bytes in `logprobs.content` (about 4 characters a
token) and the tool-call block's and end of sentence's tokens on a standalone empty-delta chunk, as
SGLang sends them. HTTP/1.1 keep-alive, chunked transfer encoding. Not a general HTTP server: just
enough for repro's client. One event-loop timer paces every stream (`Pacer`), so the server stays
cheap next to the client it measures (about ten thousand streams on one core).

`GET /stats` answers `{"completions": N, "chunks": M}`: the completions finished and the content
chunks sent so far, so a client's CPU can be divided by what it was actually sent.

`--first-request-file PATH` writes the wall-clock time (`time.time()`) at which the first chat request
arrived, for a client's time to its first request.

Run: `python benchmarks/fast_stream_server.py --port P [--ttft 0] [--chunks 16] [--interval 0.05] [--final-after 4]
[--first-request-file PATH]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections import deque
from pathlib import Path

from dsml_checker import ToolCall, render_calls
from dsml_checker.formats import EOS

ASSISTANT = b'"role": "assistant"'
LOGPROBS = b'"logprobs":true'


def _frame(data: bytes) -> bytes:
    """One piece of a chunked transfer-encoded body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(body: dict) -> bytes:
    return _frame(b"data: " + json.dumps(body).encode() + b"\n\n")


def _chunk(delta: dict, finish: str | None = None, tokens: list[str] | None = None) -> bytes:
    choice: dict = {"index": 0, "delta": delta, "finish_reason": finish}
    if tokens is not None:
        choice["logprobs"] = {"content": [{"token": t, "logprob": -0.25, "bytes": list(t.encode()), "top_logprobs": []}
                                          for t in tokens]}
    return _event({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "model": "bench", "choices": [choice]})


def _tokens(text: str) -> list[str]:
    return re.findall(r" ?[^\s]{1,4}|\s", text)


class Plan:
    def __init__(self, ttft: float, chunks: int, interval: float, final_after: int,
                 first_request_file: Path | None = None) -> None:
        self.first_request_file = first_request_file
        self.ttft = ttft
        self.interval = interval
        self.final_after = final_after
        self.head = _chunk({"role": "assistant", "content": ""})
        # Distinct words, so the checker's repetition rules see ordinary prose.
        texts = [f"step {i} reads line {7 * i + 3} of the file; " for i in range(chunks)]
        self.body = [_chunk({"content": text}) for text in texts]
        self.lp_body = [_chunk({"content": text}, tokens=_tokens(text)) for text in texts]
        content_tokens = sum(len(_tokens(text)) for text in texts)
        call = {"index": 0, "id": "call_1", "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "src/cache/evict.py"}'}}
        block = _tokens("\n\n" + render_calls([ToolCall("read_file", {"path": "src/cache/evict.py"})])) + [EOS]
        done = _frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        tool_call = _chunk({"tool_calls": [call]})
        self.tool_tail = tool_call + _chunk({}, "tool_calls") + self._usage(4 * chunks) + done
        self.final_tail = _chunk({}, "stop") + self._usage(4 * chunks) + done
        self.lp_tool_tail = (_chunk({}, tokens=block) + tool_call + _chunk({}, "tool_calls")
                             + self._usage(content_tokens + len(block)) + done)
        self.lp_final_tail = _chunk({}, tokens=[EOS]) + _chunk({}, "stop") + self._usage(content_tokens + 1) + done

    @staticmethod
    def _usage(completion: int) -> bytes:
        return _event({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "model": "bench", "choices": [],
                       "usage": {"prompt_tokens": 100, "completion_tokens": completion, "total_tokens": 100 + completion}})


MODELS = json.dumps({"object": "list", "data": [{"id": "bench", "object": "model"}]}).encode()
STREAM_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
               b"connection: keep-alive\r\n\r\n")


class Stream:
    """One completion being sent: what is left of it, and when its next piece is due (loop time)."""

    __slots__ = ("connection", "parts", "tail", "next", "due")

    def __init__(self, connection: Connection, parts: list[bytes], tail: bytes, due: float) -> None:
        self.connection = connection
        self.parts = parts
        self.tail = tail
        self.next = 0
        self.due = due


class Pacer:
    """Sends every stream's pieces on time with one event-loop timer, not one sleeping task per stream.

    A task per stream cost a future, a timer and a task step per chunk: at tens of thousands of chunks
    a second the server took more CPU than the client it measures. Streams wait in two queues that are
    each in due order by construction: `first` (request time + ttft, in arrival order) and `paced`
    (previous due + interval, appended while the queues are drained in due order). Each stream keeps
    its own cadence from its scheduled times, so a late wake-up does not shift its later chunks.
    """

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.loop = asyncio.get_running_loop()
        self.first: deque[Stream] = deque()
        self.paced: deque[Stream] = deque()
        self.timer: asyncio.Handle | None = None
        self.timer_due = 0.0
        self.completions = 0
        self.chunks = 0

    def add(self, connection: Connection, final: bool, logprobs: bool) -> None:
        plan = self.plan
        parts = plan.lp_body if logprobs else plan.body
        if logprobs:
            tail = plan.lp_final_tail if final else plan.lp_tool_tail
        else:
            tail = plan.final_tail if final else plan.tool_tail
        stream = Stream(connection, parts, tail, self.loop.time() + plan.ttft)
        self.first.append(stream)
        self._arm(stream.due)

    def _arm(self, due: float) -> None:
        # The due time is kept here: uvloop hands back a plain Handle (no `when()`) for a time already past.
        if self.timer is None or due < self.timer_due:
            if self.timer is not None:
                self.timer.cancel()
            self.timer, self.timer_due = self.loop.call_at(due, self._tick), due

    def _tick(self) -> None:
        self.timer = None
        now = self.loop.time()
        first, paced, interval = self.first, self.paced, self.plan.interval
        while True:
            if first and first[0].due <= now and (not paced or first[0].due <= paced[0].due):
                stream = first.popleft()
            elif paced and paced[0].due <= now:
                stream = paced.popleft()
            else:
                break
            if self._send(stream, interval):
                stream.due += interval
                paced.append(stream)
        due = min((queue[0].due for queue in (first, paced) if queue), default=None)
        if due is not None:
            self._arm(due)

    def _send(self, stream: Stream, interval: float) -> bool:
        """Write the stream's next piece (all of it when unpaced); True when more is to come."""
        connection = stream.connection
        transport = connection.transport
        assert transport is not None
        if transport.is_closing():
            return False
        index = stream.next
        if index == 0:
            # The first content chunk goes with the head, at ttft: TTFT overhead reads off directly.
            pieces = [STREAM_HEAD, self.plan.head, *(stream.parts if not interval else stream.parts[:1])]
            stream.next = len(pieces) - 2
        else:
            pieces = [stream.parts[index]]
            stream.next = index + 1
        self.chunks += stream.next - index
        if stream.next >= len(stream.parts):
            self.completions += 1
            pieces.append(stream.tail)
            transport.write(b"".join(pieces))
            connection.finished()
            return False
        transport.write(b"".join(pieces) if len(pieces) > 1 else pieces[0])
        return True


def take_request(buffer: bytes) -> tuple[str, bytes, bytes] | None:
    """The first whole request in `buffer` (its path and body) and the bytes after it; None until it is whole."""
    head_end = buffer.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    head = buffer[:head_end].decode("latin-1")
    length = 0
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    total = head_end + 4 + length
    if len(buffer) < total:
        return None
    return head.split(" ", 2)[1], buffer[head_end + 4 : total], buffer[total:]


class Connection(asyncio.Protocol):
    def __init__(self, plan: Plan, pacer: Pacer) -> None:
        self.plan = plan
        self.pacer = pacer
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

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
        if path.endswith("/chat/completions"):
            if self.plan.first_request_file is not None:
                self.plan.first_request_file.write_text(repr(time.time()))
                self.plan.first_request_file = None
            self.busy = True
            self.pacer.add(self, body.count(ASSISTANT) >= self.plan.final_after, LOGPROBS in body)
        else:
            if path.endswith("/models"):
                payload = MODELS
            elif path.endswith("/stats"):
                payload = json.dumps({"completions": self.pacer.completions, "chunks": self.pacer.chunks}).encode()
            else:
                payload = b"ok"
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(payload), payload))
            self._next()

    def finished(self) -> None:
        """The completion has been sent whole: a request pipelined behind it may go."""
        self.busy = False
        self._next()


async def serve(port: int, plan: Plan) -> None:
    loop = asyncio.get_running_loop()
    pacer = Pacer(plan)
    server = await loop.create_server(lambda: Connection(plan, pacer), "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft", type=float, default=0.0)
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--final-after", type=int, default=4)
    parser.add_argument("--first-request-file", type=Path)
    args = parser.parse_args()
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    run(serve(args.port, Plan(args.ttft, args.chunks, args.interval, args.final_after, args.first_request_file)))
