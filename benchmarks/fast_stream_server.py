"""A minimal, fast OpenAI-style streaming server for client benchmarks: raw asyncio, pre-encoded chunks.

Every completion waits `--ttft` seconds (the prefill), sends its first content chunk then, and the
rest of its `--chunks` content chunks `--interval` seconds apart (so the time to first token is
`--ttft`, and the client's TTFT overhead can be read off directly), then one tool call
(`read_file`) and finish_reason `tool_calls`; once the request already holds `--final-after`
assistant messages it answers with content only (finish_reason `stop`). A request with
`"logprobs":true` gets each chunk's token strings and bytes in `logprobs.content` (about 4 characters a
token) and the tool-call block's and end of sentence's tokens on a standalone empty-delta chunk, as
SGLang sends them. HTTP/1.1 keep-alive, chunked transfer encoding. Not a general HTTP server: just
enough for repro's client.

Run: `python benchmarks/fast_stream_server.py --port P [--ttft 0] [--chunks 16] [--interval 0.05] [--final-after 4]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re

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
    def __init__(self, ttft: float, chunks: int, interval: float, final_after: int) -> None:
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


class Connection(asyncio.Protocol):
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
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
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self.buffer[:head_end].decode("latin-1")
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        total = head_end + 4 + length
        if len(self.buffer) < total:
            return
        body, self.buffer = self.buffer[head_end + 4 : total], self.buffer[total:]
        path = head.split(" ", 2)[1]
        if path.endswith("/chat/completions"):
            self.busy = True
            asyncio.ensure_future(self._stream(body.count(ASSISTANT) >= self.plan.final_after, LOGPROBS in body))
        else:
            payload = MODELS if path.endswith("/models") else b"ok"
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(payload), payload))
            self._next()

    async def _stream(self, final: bool, logprobs: bool) -> None:
        transport = self.transport
        assert transport is not None
        plan = self.plan
        if plan.ttft:
            await asyncio.sleep(plan.ttft)
        transport.write(STREAM_HEAD + plan.head)
        for index, part in enumerate(plan.lp_body if logprobs else plan.body):
            if plan.interval and index:
                await asyncio.sleep(plan.interval)
            if transport.is_closing():
                return
            transport.write(part)
        if logprobs:
            transport.write(plan.lp_final_tail if final else plan.lp_tool_tail)
        else:
            transport.write(plan.final_tail if final else plan.tool_tail)
        self.busy = False
        self._next()


async def serve(port: int, plan: Plan) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(plan), "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft", type=float, default=0.0)
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--final-after", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(serve(args.port, Plan(args.ttft, args.chunks, args.interval, args.final_after)))
