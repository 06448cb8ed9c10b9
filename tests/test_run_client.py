"""repro.client against purpose-built faulty servers over real HTTP: every failure is classified, none raises."""

from __future__ import annotations

from typing import Any, Iterator

import anyio
import pytest

from faulty_servers import start_faulty_server
from repro.client import TurnResult, make_client, send_turn
from repro.procs import free_port
from repro.transport import Endpoint

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, root = start_faulty_server(tmp_path_factory.mktemp("faulty") / "server.log")
    yield root
    proc.stop()


def turn(url: str, *, stream: bool = True, history: int = 0, turn_timeout: float = 10, stall_timeout: float = 5) -> TurnResult:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "fix it"}]
    messages += [{"role": "assistant", "content": "ok"}] * history

    async def go() -> TurnResult:
        async with make_client(2) as client:
            payload = {"model": "m", "messages": messages, "tools": TOOLS}
            return await send_turn(
                client, Endpoint.parse(url), payload, stream=stream, turn_timeout=turn_timeout, stall_timeout=stall_timeout
            )

    return anyio.run(go)


def test_streamed_tool_call_is_assembled_with_timings(faulty: str) -> None:
    result = turn(f"{faulty}/good/v1/chat/completions")
    assert result.status == "ok", result.error
    assert result.message is not None
    call = result.message["tool_calls"][0]["function"]
    assert call == {"name": "read_file", "arguments": '{"path": "src/app.py"}'}
    assert result.finish_reason == "tool_calls"
    assert result.http_status == 200 and result.request_id and result.request_id.startswith("chatcmpl-")
    assert result.usage_int("prompt_tokens") is not None and result.chunks == 5
    assert result.ttft_s is not None and result.e2e_s is not None and 0 <= result.ttft_s <= result.e2e_s
    assert result.queue_s >= 0 and result.max_gap_s is not None
    assert result.raw.endswith(b"data: [DONE]\n\n")


def test_non_streamed_turn(faulty: str) -> None:
    result = turn(f"{faulty}/good/v1/chat/completions", stream=False)
    assert result.status == "ok", result.error
    assert result.message is not None and result.message["tool_calls"][0]["function"]["name"] == "read_file"
    assert result.raw.startswith(b"{")


def test_http_500_is_an_error_with_the_server_message(faulty: str) -> None:
    result = turn(f"{faulty}/http500/v1/chat/completions")
    assert (result.status, result.http_status) == ("error", 500)
    assert result.error == "HTTP 500: internal failure (on purpose)"
    assert b"internal failure" in result.raw


def test_malformed_sse_is_an_error(faulty: str) -> None:
    result = turn(f"{faulty}/malformed/v1/chat/completions")
    assert result.status == "error" and result.error is not None
    assert result.error.startswith("malformed stream: event is not JSON")
    assert b"broken" in result.raw


def test_cut_stream_is_an_error(faulty: str) -> None:
    result = turn(f"{faulty}/reset/v1/chat/completions")
    assert result.status == "error" and result.error is not None
    assert result.raw.startswith(b"data: ")


def test_connection_refused_is_an_error() -> None:
    result = turn(f"http://127.0.0.1:{free_port()}/v1/chat/completions")
    assert result.status == "error" and result.error is not None and result.error.startswith("connection failed")


def test_stall_and_turn_timeout_are_told_apart(faulty: str) -> None:
    stalled = turn(f"{faulty}/stall/v1/chat/completions", history=1, stall_timeout=0.5)
    assert stalled.status == "stalled" and stalled.chunks == 1
    slow = turn(f"{faulty}/slow:0.2/v1/chat/completions", turn_timeout=0.5, stall_timeout=5)
    assert slow.status == "timeout" and slow.error == "turn exceeded 0.5s"
