"""Small purpose-built OpenAI-compatible servers that misbehave on purpose, for `repro run`'s fault tests.

One process serves every behaviour; the first path segment picks it, so a test's base URL is
`http://127.0.0.1:PORT/<mode>/v1`. Modes:

- `good`: well-formed streamed tool calls (from the request's own tools) for `turns` turns, then a final answer.
- `slow:SECONDS`: like good, with SECONDS between chunks (5 chunks a turn): for session-budget timeouts.
- `leak`: the first turn leaks DSML markup into content with finish_reason stop; later turns are good.
- `stall`: the second turn sends one chunk and then nothing, ever.
- `huge:CHARS`: one final answer of CHARS characters of degenerate markup (`<|` repeated), 64 KB a chunk.
- `http500`: every completion is an HTTP 500.
- `echokey`: every completion is an HTTP 401 whose message repeats the request's Authorization header.
- `malformed`: the stream carries an event that is not JSON.
- `reset`: the stream is cut (connection closed) after one chunk.
- `nomodels`: `/v1/models` lists nothing.

Run: `python tests/faulty_servers.py --port PORT`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from repro.procs import ManagedProcess, free_port, start_process, wait_http_ready

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


async def models(request: Request) -> Response:
    if request.path_params["mode"] == "nomodels":
        return JSONResponse({"object": "list", "data": []})
    return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


async def completions(request: Request) -> Response:
    mode = request.path_params["mode"]
    body = await request.json()
    if mode == "http500":
        return JSONResponse({"error": {"message": "internal failure (on purpose)"}}, status_code=500)
    if mode == "echokey":
        offered = request.headers.get("authorization", "")
        return JSONResponse({"error": {"message": f"invalid credentials: {offered}"}}, status_code=401)
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


app = Starlette(
    routes=[
        Route("/health", health),
        Route("/{mode}/v1/models", models),
        Route("/{mode}/v1/chat/completions", completions, methods=["POST"]),
    ]
)


def start_faulty_server(log_path: Path | None = None) -> tuple[ManagedProcess, str]:
    """Start this server as a subprocess; returns the process and its root URL (stop it with `.stop()`)."""
    port = free_port()
    proc = start_process([sys.executable, __file__, "--port", str(port)], log_path=log_path)
    root = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready(f"{root}/health", timeout=30, process=proc)
    except BaseException:
        proc.stop()
        raise
    return proc, root


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
