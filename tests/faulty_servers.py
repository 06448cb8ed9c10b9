"""Small purpose-built OpenAI-compatible servers that misbehave on purpose, for `repro run`'s fault tests.

One process serves every behaviour; the first path segment picks it, so a test's base URL is
`http://127.0.0.1:PORT/<mode>/v1`. Modes:

- `good`: well-formed streamed tool calls (from the request's own tools) for `turns` turns, then a final answer.
- `slow:SECONDS`: like good, with SECONDS between chunks (5 chunks a turn): for session-budget timeouts.
- `leak`: the first turn leaks DSML markup into content with finish_reason stop; later turns are good.
- `leak-every:K`: as `leak` in every K-th session (by its ticket, `REPRO-<seed>-<session>`), good in the rest:
  a corruption rate of 1/K whatever the concurrency.
- `stall`: the second turn sends one chunk and then nothing, ever.
- `huge:CHARS`: one final answer of CHARS characters of degenerate markup (`<|` repeated), 64 KB a chunk.
- `http500`: every completion is an HTTP 500.
- `echokey`: every completion is an HTTP 401 whose message repeats the request's Authorization header.
- `malformed`: the stream carries an event that is not JSON.
- `reset`: the stream is cut (connection closed) after one chunk.
- `nomodels`: `/v1/models` lists nothing.

Faults below the ASGI layer (or any fault mixed with others) are answered by a raw HTTP/1.1 front
door (`RawFaults`) on the same port, which relays every other mode to the Starlette app. A
connection is routed by its first request, so keep one mode per client connection. Raw modes:

- `early-hints`: an HTTP 103 before every (good) answer.
- `redirect`: every completion is an HTTP 307 to the `good` mode.
- `drip-headers`: a status line, then one header byte every 50 ms, never ending the header block.
- `deep`: a streamed event (or a non-streamed body) nested 50,000 levels deep.
- `deep-args`: the first turn's tool-call arguments are a string of 5,000 nested brackets.
- `deep-models`: `/v1/models` answers JSON nested 50,000 levels deep.
- `surrogate`: the first turn leaks DSML holding lone surrogates (`\ud800`), in its id too.
- `comments`: an endless stream of SSE comments, as fast as the client reads.
- `huge-loop`: the first turn's tool-call arguments are a 2 MB repetition loop (never closed).
- `endless-side`: good completions, but `/server_info` and `/metrics` answer an endless body.
- `hang-metrics`: good completions, but `/metrics` sends its headers and then nothing for a minute: the
  run's last scrape, after its last session, waits out its timeout.
- `raw-malformed`, `raw-reset`: as `malformed` and `reset` (the reset is a TCP RST).
- `cancelled`: the first turn's stream is the role chunk and `[DONE]`, no finish_reason (a stream
  cancelled in flight, closed properly); later turns are good.
- `chaos`: each session gets `CHAOS[session % len(CHAOS)]`, the session read from its task's ticket
  (`REPRO-<seed>-<session>`), so a test knows which session met which fault.

Raw-text modes (`repro run --observe`, `repro.wire.rawtext`): asked with `logprobs: true`, these modes
send every token's string and bytes (split inside multi-byte characters, so only the bytes rebuild
the text), on the content chunk or a standalone empty-delta chunk, as SGLang 0.5.23 does:
- `lp`: well-formed turns, full logprob coverage.
- `lp-hide`: the first turn's raw text carries a stray invoke closer that the "parser" absorbed: the
  parsed message is clean, the raw text is not.
- `lp-made`: the first turn's raw text is clean, the parsed message leaks DSML (a parser bug).
- `lp-notools`: no logprobs for the tool-call tokens; `/v1/completions` answers a rendered prompt.
- `lp-garbage`: after the first turn, logprobs of every wrong shape.
- `text`: chat without logprobs; `/v1/completions` and `/generate` (cumulative text) answer.
Every request body is kept per mode; `GET /{mode}/received` lists them. A mode may carry a `~tag`
suffix (`good~a`): it behaves as the mode and keeps its own list of requests.

Run: `python tests/faulty_servers.py --port PORT`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import sys
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from dsml_checker import ToolCall, render_completion
from dsml_checker.formats import EOS
from repro.procs.process import ManagedProcess, free_port, start_process, wait_http_ready

MODEL = "faulty-model"
FINAL_AFTER = 3
LEAK = (
    "Let me read it.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"read_file\">\n"
    "<｜DSML｜parameter name=\"path\" string=\"true\">src/a.py</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>"
)


def huge_reply(chars: int) -> str:
    """What `huge:CHARS` answers: a "<" and a bar again and again, each a special-token candidate to judge."""
    return "<|" * (chars // 2)


def _example(schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    return {"string": "src/app.py", "integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}}.get(
        kind, "x"
    )


def _arguments(tool: dict[str, Any]) -> str:
    params = tool.get("function", {}).get("parameters", {}) or {}
    props = params.get("properties", {}) or {}
    return json.dumps({name: _example(props.get(name, {})) for name in params.get("required", [])})


def _chunk(cid: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": cid,
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _usage(cid: str, prompt: int) -> bytes:
    body = {
        "id": cid,
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5},
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _plan(body: dict[str, Any], mode: str) -> tuple[list[bytes], str, dict[str, Any]]:
    """The chunks of a well-behaved (or leaking) answer, and the equivalent non-streamed message."""
    messages = body.get("messages", [])
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    cid = f"chatcmpl-{abs(hash(json.dumps(messages[:2], sort_keys=True))) % 10**8}-{turn}"
    prompt = sum(len(str(m.get("content") or "")) for m in messages) // 4
    tools = body.get("tools") or []
    if mode == "leak" and turn == 0:
        parts = [LEAK[i : i + 40] for i in range(0, len(LEAK), 40)]
        chunks = [_chunk(cid, {"role": "assistant", "content": ""})]
        chunks += [_chunk(cid, {"content": part}) for part in parts]
        chunks += [_chunk(cid, {}, "stop"), _usage(cid, prompt)]
        return chunks, cid, {"message": {"role": "assistant", "content": LEAK}, "finish_reason": "stop"}
    if mode.startswith("huge:"):
        text = huge_reply(int(mode.split(":", 1)[1]))
        chunks = [_chunk(cid, {"role": "assistant", "content": ""})]
        chunks += [_chunk(cid, {"content": text[i : i + 65536]}) for i in range(0, len(text), 65536)]
        chunks += [_chunk(cid, {}, "stop"), _usage(cid, prompt)]
        return chunks, cid, {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    if turn >= FINAL_AFTER or not tools:
        chunks = [
            _chunk(cid, {"role": "assistant", "content": "All done: "}),
            _chunk(cid, {"content": "the fix is in."}),
            _chunk(cid, {}, "stop"),
            _usage(cid, prompt),
        ]
        message = {"role": "assistant", "content": "All done: the fix is in."}
        return chunks, cid, {"message": message, "finish_reason": "stop"}
    tool = tools[turn % len(tools)]
    name = tool["function"]["name"]
    args = _arguments(tool)
    call_id = f"call_{turn}"
    chunks = [
        _chunk(cid, {"role": "assistant", "content": "Looking."}),
        _chunk(cid, {"tool_calls": [{"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}]}),
        _chunk(cid, {"tool_calls": [{"index": 0, "function": {"arguments": args}}]}),
        _chunk(cid, {}, "tool_calls"),
        _usage(cid, prompt),
    ]
    message = {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}],
    }
    return chunks, cid, {"message": message, "finish_reason": "tool_calls"}


RECEIVED: dict[str, list[dict[str, Any]]] = {}
TOKEN_BYTES = 4
"""Bytes per fake token: the fullwidth bar of the DSML sentinel (3 bytes) ends up split across two tokens."""
ORPHAN_CLOSER = "</｜DSML｜invoke>\n"


def _tokens(text: str) -> list[dict[str, Any]]:
    """Logprob entries for `text`: each token's string as a per-token decode would give it (U+FFFD for a cut
    character), its exact bytes, and the end of sentence as one special token."""
    body, eos = (text[: -len(EOS)], True) if text.endswith(EOS) else (text, False)
    data = body.encode()
    pieces = [data[i : i + TOKEN_BYTES] for i in range(0, len(data), TOKEN_BYTES)]
    entries = [{"token": p.decode("utf-8", "replace"), "bytes": list(p), "logprob": -0.1, "top_logprobs": []} for p in pieces]
    if eos:
        entries.append({"token": EOS, "bytes": list(EOS.encode()), "logprob": -0.01, "top_logprobs": []})
    return entries


def _raw_turn(body: dict[str, Any], base: str) -> tuple[str, dict[str, Any], str, int]:
    """One chat turn in raw mode: the generated text, the parsed message, the finish reason, the turn number."""
    messages = body.get("messages", [])
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    tools = body.get("tools") or []
    if turn >= FINAL_AFTER or not tools:
        text = render_completion(reasoning=None, content="All done: the fix is in.", calls=[])
        return text, {"role": "assistant", "content": "All done: the fix is in."}, "stop", turn
    name = tools[turn % len(tools)]["function"]["name"]
    args = _arguments(tools[turn % len(tools)])
    text = render_completion(reasoning=None, content="Looking.", calls=[ToolCall(name, json.loads(args))])
    if base == "lp-made" and turn == 0:
        return text, {"role": "assistant", "content": LEAK}, "stop", turn
    if base == "lp-hide" and turn == 0:
        at = text.index("</｜DSML｜invoke>") + len(ORPHAN_CLOSER)
        text = text[:at] + ORPHAN_CLOSER + text[at:]
    call = {"id": f"call_{turn}", "type": "function", "function": {"name": name, "arguments": args}}
    return text, {"role": "assistant", "content": "Looking.", "tool_calls": [call]}, "tool_calls", turn


GARBAGE_LOGPROBS: list[Any] = [
    7,
    {"content": "not a list"},
    {"content": [1, None, {"token": 5}]},
    {"content": [{"token": "ok", "bytes": "zz"}, {"token": "x", "bytes": [300]}]},
]


def _raw_chat(body: dict[str, Any], base: str) -> Response:
    """A chat completion in one of the raw modes (module docstring)."""
    text, message, finish, turn = _raw_turn(body, base)
    cid = f"chatcmpl-raw-{turn}"
    entries = _tokens(text) if body.get("logprobs") else []
    usage = {"prompt_tokens": 10, "completion_tokens": len(_tokens(text)), "total_tokens": 10 + len(_tokens(text))}
    block = text.find("\n\n<｜DSML｜")
    head_bytes = len(text[: block if block >= 0 else len(text) - len(EOS)].encode())
    head = [e for e, _ in zip(entries, range((head_bytes + TOKEN_BYTES - 1) // TOKEN_BYTES))]
    tail = entries[len(head) :]
    if base == "lp-notools":
        tail = tail[-1:]  # the end of sentence only: the tool-call tokens carry no logprobs
    if base == "lp-garbage" and turn > 0:  # the first turn (the capability probe's) is well-formed
        head_lp: Any = GARBAGE_LOGPROBS[(turn - 1) % len(GARBAGE_LOGPROBS)]
        tail_lp: Any = {"content": [{"token": None}]}
    else:
        head_lp, tail_lp = {"content": head}, {"content": tail}
    if not body.get("stream"):
        choice = {"index": 0, "message": message, "finish_reason": finish}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": head + tail} if head_lp == {"content": head} else head_lp
        return JSONResponse({"id": cid, "object": "chat.completion", "model": MODEL, "choices": [choice], "usage": usage})
    # (delta, logprobs): the step's logprobs ride on its content chunk, the block's on a standalone empty delta.
    steps: list[tuple[dict[str, Any], Any]] = [
        ({"role": "assistant", "content": ""}, None),
        ({"content": message["content"]}, head_lp),
    ]
    if body.get("logprobs"):
        steps.append(({}, tail_lp))
    steps += [({"tool_calls": [{"index": i, **call}]}, None) for i, call in enumerate(message.get("tool_calls") or [])]
    chunks = []
    for delta, logprobs in steps:
        event = {"id": cid, "object": "chat.completion.chunk", "model": MODEL,
                 "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        if logprobs is not None and body.get("logprobs"):
            event["choices"][0]["logprobs"] = logprobs
        chunks.append(b"data: " + json.dumps(event).encode() + b"\n\n")
    usage_event = {"id": cid, "object": "chat.completion.chunk", "model": MODEL, "choices": [], "usage": usage}
    chunks += [_chunk(cid, {}, finish), b"data: " + json.dumps(usage_event).encode() + b"\n\n", b"data: [DONE]\n\n"]

    async def stream() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    return StreamingResponse(stream(), media_type="text/event-stream")


def _prompt_text(prompt: str) -> str:
    """The raw text a rendered prompt gets: a read_file call until FINAL_AFTER turns, then a final answer."""
    turn = prompt.count("<｜Assistant｜>") - 1
    if turn >= FINAL_AFTER:
        return render_completion(reasoning="Done.", content="All done: the fix is in.", calls=[])
    return render_completion(reasoning="Read it.", content="Looking.", calls=[ToolCall("read_file", {"path": "src/app.py"})])


async def text_completions(request: Request) -> Response:
    """`/v1/completions` for the `text` and `lp-notools` modes: the raw text, streamed in deltas or whole."""
    mode = request.path_params["mode"]
    body = await request.json()
    RECEIVED.setdefault(mode, []).append(body)
    if mode.split("~")[0] not in ("text", "lp-notools"):
        return JSONResponse({"error": {"message": "no completions here"}}, status_code=404)
    text = _prompt_text(str(body.get("prompt")))[: 4 * int(body.get("max_tokens") or 10**6)]
    usage = {"prompt_tokens": 10, "completion_tokens": len(text) // 4, "total_tokens": 10 + len(text) // 4}
    if not body.get("stream"):
        choice = {"index": 0, "text": text, "finish_reason": "stop"}
        return JSONResponse({"id": "cmpl-raw", "object": "text_completion", "choices": [choice], "usage": usage})
    pieces = [text[i : i + 7] for i in range(0, len(text), 7)]
    events = [{"id": "cmpl-raw", "choices": [{"index": 0, "text": p, "finish_reason": None}]} for p in pieces]
    events.append({"id": "cmpl-raw", "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})
    events.append({"id": "cmpl-raw", "choices": [], "usage": usage})
    data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    return Response(data, media_type="text/event-stream")


async def generate(request: Request) -> Response:
    """SGLang's `/generate` for the `text` mode: cumulative text per event, meta_info with the finish reason."""
    mode = request.path_params["mode"]
    body = await request.json()
    RECEIVED.setdefault(mode, []).append(body)
    if mode.split("~")[0] != "text":
        return JSONResponse({"error": {"message": "no generate here"}}, status_code=404)
    text = _prompt_text(str(body.get("text")))
    meta = {"id": "gen-raw", "finish_reason": {"type": "stop", "matched": 1}, "prompt_tokens": 10,
            "completion_tokens": len(text) // 4, "cached_tokens": 0}
    if not body.get("stream"):
        return JSONResponse({"text": text, "meta_info": meta})
    cuts = list(range(9, len(text), 9)) + [len(text)]
    events = [{"text": text[:cut], "meta_info": {**meta, "finish_reason": None}} for cut in cuts[:-1]]
    events.append({"text": text, "meta_info": meta})
    data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    return Response(data, media_type="text/event-stream")


async def received(request: Request) -> Response:
    return JSONResponse(RECEIVED.get(request.path_params["mode"], []))


async def models(request: Request) -> Response:
    if request.path_params["mode"] == "nomodels":
        return JSONResponse({"object": "list", "data": []})
    return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


async def completions(request: Request) -> Response:
    mode = request.path_params["mode"]
    body = await request.json()
    RECEIVED.setdefault(mode, []).append(body)
    mode = mode.split("~")[0]
    if mode.startswith("lp"):
        return _raw_chat(body, mode)
    if mode == "http500":
        return JSONResponse({"error": {"message": "internal failure (on purpose)"}}, status_code=500)
    if mode == "echokey":
        offered = request.headers.get("authorization", "")
        return JSONResponse({"error": {"message": f"invalid credentials: {offered}"}}, status_code=401)
    if mode.startswith("leak-every:"):
        task = next((str(m.get("content")) for m in body.get("messages", []) if m.get("role") == "user"), "")
        ticket = _TICKET.search(task)
        mode = "leak" if ticket and int(ticket.group(1)) % int(mode.split(":", 1)[1]) == 0 else "good"
    chunks, cid, whole = _plan(body, mode)
    turn = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
    if not body.get("stream"):
        return JSONResponse({"id": cid, "object": "chat.completion", "model": MODEL, "choices": [{"index": 0, **whole}]})
    delay = float(mode.split(":", 1)[1]) if mode.startswith("slow:") else 0.0

    async def stream() -> AsyncIterator[bytes]:
        if mode == "malformed":
            yield chunks[0]
            yield b"data: {\"id\": \"broken\", \"choices\": [\n\n"
            yield b"data: [DONE]\n\n"
            return
        for index, chunk in enumerate(chunks):
            if delay:
                await anyio.sleep(delay)
            yield chunk
            if mode == "reset" and index == 0:
                raise RuntimeError("connection cut on purpose")
            if mode == "stall" and turn == 1:
                await anyio.sleep_forever()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream")


async def health(request: Request) -> Response:
    return PlainTextResponse("ok")


CHAOS = (
    "good", "deep", "deep-args", "surrogate", "comments", "early-hints", "redirect", "drip-headers",
    "huge-loop", "raw-malformed", "raw-reset", "cancelled",
)
"""The faults of the `chaos` mode, by session id modulo its length."""
_TICKET = re.compile(r"REPRO-\d+-(\d+)")
DEEP = 50_000
_SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _frame(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


def _json_response(body: bytes, status: str = "200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        status.encode(), len(body), body)


def _with_arguments(body: dict[str, Any], arguments: str) -> tuple[list[bytes], dict[str, Any]]:
    """A first-turn tool call whose arguments are `arguments` (sent in 64 KB deltas), and its whole message."""
    cid = "chatcmpl-args"
    name = ((body.get("tools") or [{}])[0].get("function") or {}).get("name", "read_file")
    call = {"index": 0, "id": "call_0", "type": "function", "function": {"name": name, "arguments": ""}}
    chunks = [_chunk(cid, {"role": "assistant", "content": ""}), _chunk(cid, {"tool_calls": [call]})]
    chunks += [
        _chunk(cid, {"tool_calls": [{"index": 0, "function": {"arguments": arguments[i : i + 65536]}}]})
        for i in range(0, len(arguments), 65536)
    ]
    chunks += [_chunk(cid, {}, "tool_calls"), _usage(cid, 10)]
    whole = {"id": call["id"], "type": "function", "function": {"name": name, "arguments": arguments}}
    return chunks, {"message": {"role": "assistant", "content": "", "tool_calls": [whole]}, "finish_reason": "tool_calls"}


def _surrogate_answer() -> tuple[list[bytes], dict[str, Any]]:
    cid = "chatcmpl-\ud800"
    content = LEAK.replace("src/a.py", "src/\ud800.py") + " and \udfff"
    chunks = [_chunk(cid, {"role": "assistant", "content": ""}), _chunk(cid, {"content": content})]
    chunks += [_chunk(cid, {}, "stop"), _usage(cid, 10)]
    return chunks, {"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}


class RawFaults:
    """The front door: raw-mode requests are answered here byte by byte; any other connection is relayed to `inner_port`."""

    def __init__(self, inner_port: int) -> None:
        self.inner_port = inner_port

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if self._mode(head) in RAW_MODES:
                while await self._answer(head, reader, writer):
                    head = await reader.readuntil(b"\r\n\r\n")
            else:
                await self._relay(head, reader, writer)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _mode(head: bytes) -> str:
        path = head.split(b" ", 2)[1].decode("latin-1")
        return path.split("/")[1] if path.count("/") >= 2 else ""

    async def _relay(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.inner_port)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except ConnectionError:
                pass
            finally:
                sink.close()

        up_writer.write(head)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def _answer(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False to close the connection afterwards."""
        lines = head.decode("latin-1").split("\r\n")
        method, path = lines[0].split(" ")[:2]
        length = next((int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")), 0)
        body = json.loads(await reader.readexactly(length)) if length else {}
        mode = self._mode(head)
        if method == "GET" and path.endswith("/models"):
            listing = (b"[" * DEEP + b"]" * DEEP) if mode == "deep-models" else json.dumps(
                {"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
            writer.write(_json_response(listing))
            return True
        if mode == "hang-metrics" and path.endswith("/metrics"):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 10\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(60)
            return False
        if mode == "endless-side" and path.endswith(("/server_info", "/metrics")):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n")
            piece = _frame(b"# " + b"x" * 65536 + b"\n")
            for _ in range(2**40 // len(piece)):
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.001)
            return False
        if not (method == "POST" and path.endswith("/chat/completions")):
            writer.write(_json_response(b'{"detail": "Not Found"}', "404 Not Found"))
            return True
        if mode == "chaos":
            task = next((str(m.get("content")) for m in body.get("messages", []) if m.get("role") == "user"), "")
            ticket = _TICKET.search(task)
            mode = CHAOS[int(ticket.group(1)) % len(CHAOS)] if ticket else "good"
        return await self._fault(mode, body, writer)

    async def _fault(self, mode: str, body: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        stream = bool(body.get("stream"))
        first = not any(m.get("role") == "assistant" for m in body.get("messages", []))
        if mode == "redirect":
            writer.write(b"HTTP/1.1 307 Temporary Redirect\r\nlocation: /good/v1/chat/completions\r\ncontent-length: 0\r\n\r\n")
            return True
        if mode == "drip-headers":
            writer.write(b"HTTP/1.1 200 OK\r\nx-drip: ")
            for _ in range(20 * 600):  # ten minutes at most, should a client wait that long
                await writer.drain()
                await asyncio.sleep(0.05)
                writer.write(b"a")
            return False
        if mode == "comments":
            writer.write(_SSE_HEAD)
            comment = _frame(b": " + b"keep-alive " * 6000 + b"\n")
            for _ in range(2**40 // len(comment)):
                writer.write(comment)
                await writer.drain()
            return False
        if mode == "deep":
            deep = b"[" * DEEP + b"]" * DEEP
            writer.write(_SSE_HEAD + _frame(b"data: " + deep + b"\n\n") + b"0\r\n\r\n" if stream else _json_response(deep))
            return True
        if mode == "early-hints":
            writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n")
            await writer.drain()
        chunks, cid, whole = _plan(body, "good")
        if mode == "deep-args" and first:
            chunks, whole = _with_arguments(body, "[" * 5000 + "]" * 5000)
        elif mode == "huge-loop" and first:
            chunks, whole = _with_arguments(body, '{"path": "' + "src/a.py src/a.py " * 120_000)
        elif mode == "surrogate" and first:
            chunks, whole = _surrogate_answer()
        elif mode == "cancelled" and first:
            # The stream cancelled in flight, closed properly: the role chunk, then [DONE] (llama.cpp does this).
            chunks = [_chunk(cid, {"role": "assistant", "content": ""})]
        if not stream:
            answer = {"id": cid, "object": "chat.completion", "model": MODEL, "choices": [{"index": 0, **whole}]}
            writer.write(_json_response(json.dumps(answer).encode()))
            return True
        writer.write(_SSE_HEAD + _frame(chunks[0]))
        if mode == "raw-reset":
            await writer.drain()
            writer.transport.abort()
            return False
        if mode == "raw-malformed":
            chunks = [chunks[0], b'data: {"id": "broken", "choices": [\n\n']
        writer.write(b"".join(_frame(chunk) for chunk in chunks[1:]) + _frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return True


RAW_MODES = (frozenset(CHAOS) | {"chaos", "deep-models", "endless-side"}) - {"good"}


app = Starlette(
    routes=[
        Route("/health", health),
        Route("/{mode}/v1/models", models),
        Route("/{mode}/v1/chat/completions", completions, methods=["POST"]),
        Route("/{mode}/v1/completions", text_completions, methods=["POST"]),
        Route("/{mode}/generate", generate, methods=["POST"]),
        Route("/{mode}/received", received),
    ]
)


def start_faulty_server(log_path: Path | None = None) -> tuple[ManagedProcess, str]:
    """Start this server as a subprocess; returns the process and its root URL (stop it with `.stop()`)."""
    port = free_port()
    proc = start_process([sys.executable, __file__, "--port", str(port)], log_path=log_path)
    root = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready(f"{root}/health", timeout=120, process=proc)
    except BaseException:
        proc.stop()
        raise
    return proc, root


def sessions_seen(root: str, mode: str) -> set[int]:
    """The session ids whose requests `mode` has received so far (read from their tasks' tickets)."""
    text = httpx.get(f"{root}/{mode}/received", timeout=10).text
    return {int(ticket) for ticket in re.findall(r"REPRO-\d+-(\d+)", text)}


async def _serve(port: int) -> None:
    inner = socket.socket()
    inner.bind(("127.0.0.1", 0))
    front = await asyncio.start_server(RawFaults(inner.getsockname()[1]).handle, "127.0.0.1", port)
    async with front:
        await uvicorn.Server(uvicorn.Config(app, log_level="warning")).serve(sockets=[inner])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(_serve(args.port))
