"""repro.wire.client against purpose-built faulty servers over real HTTP: every failure is classified, none raises."""

from __future__ import annotations

from typing import Any, Iterator

import anyio
import pytest

from faulty_servers import start_faulty_server
from repro.wire.client import MAX_TURN_BYTES, TurnResult, make_client, send_turn
from repro.procs.process import free_port
from repro.wire.transport import Endpoint

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


def turn(
    url: str,
    *,
    stream: bool = True,
    history: int = 0,
    turn_timeout: float = 120,
    stall_timeout: float = 60,
    max_bytes: int = MAX_TURN_BYTES,
) -> TurnResult:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "fix it"}]
    messages += [{"role": "assistant", "content": "ok"}] * history

    async def go() -> TurnResult:
        async with make_client(2) as client:
            payload = {"model": "m", "messages": messages, "tools": TOOLS}
            return await send_turn(
                client, Endpoint.parse(url), payload, stream=stream, turn_timeout=turn_timeout,
                stall_timeout=stall_timeout, max_bytes=max_bytes,
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


def test_a_stream_closed_without_a_finish_reason_is_an_error(faulty: str) -> None:
    # The role chunk, then [DONE]: properly framed, but the answer was cancelled, not finished.
    result = turn(f"{faulty}/cancelled/v1/chat/completions")
    assert (result.status, result.error, result.finish_reason) == ("error", "stream ended without a finish reason", None)
    assert result.raw.endswith(b"data: [DONE]\n\n")


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
    # The server sends one chunk and then nothing: a stall budget the first chunk meets at any load.
    stalled = turn(f"{faulty}/stall/v1/chat/completions", history=1, stall_timeout=5)
    assert stalled.status == "stalled" and stalled.chunks == 1
    slow = turn(f"{faulty}/slow:0.2/v1/chat/completions", turn_timeout=0.5, stall_timeout=5)
    assert slow.status == "timeout" and slow.error == "turn exceeded 0.5s"


def test_deep_nesting_in_an_event_or_a_body_is_an_error_not_a_crash(faulty: str) -> None:
    streamed = turn(f"{faulty}/deep/v1/chat/completions")
    assert streamed.status == "error" and streamed.error is not None
    assert streamed.error.startswith("malformed stream: event is not JSON (JSON nested deeper")
    whole = turn(f"{faulty}/deep/v1/chat/completions", stream=False)
    assert whole.status == "error" and whole.error is not None
    assert whole.error.startswith("malformed response: not JSON (JSON nested deeper")


def test_deeply_nested_tool_arguments_arrive_whole_as_a_string(faulty: str) -> None:
    result = turn(f"{faulty}/deep-args/v1/chat/completions")
    assert result.status == "ok" and result.message is not None
    assert result.message["tool_calls"][0]["function"]["arguments"] == "[" * 5000 + "]" * 5000


def test_an_early_hint_before_the_answer_is_no_malformed_stream(faulty: str) -> None:
    for stream in (True, False):
        result = turn(f"{faulty}/early-hints/v1/chat/completions", stream=stream)
        assert result.status == "ok", result.error
        assert result.http_status == 200 and result.message is not None and result.message["tool_calls"]


def test_a_redirect_is_named_with_its_target_and_not_followed(faulty: str) -> None:
    for stream in (True, False):
        result = turn(f"{faulty}/redirect/v1/chat/completions", stream=stream)
        assert (result.status, result.http_status) == ("error", 307)
        assert result.error == "HTTP 307 redirect to '/good/v1/chat/completions' (not followed)"


def test_headers_that_drip_forever_are_not_called_a_stall(faulty: str) -> None:
    result = turn(f"{faulty}/drip-headers/v1/chat/completions", stall_timeout=1)
    assert result.status == "error" and result.http_status is None
    assert result.error is not None and result.error.startswith("headers not complete after 1s")
    silent = turn(f"{faulty}/stall/v1/chat/completions", history=1, stall_timeout=5)
    assert silent.status == "stalled" and silent.error == "no bytes for 5s"


def test_an_endless_stream_of_comments_is_cut_at_the_byte_cap(faulty: str) -> None:
    result = turn(f"{faulty}/comments/v1/chat/completions", max_bytes=300_000)
    assert result.status == "error" and result.error == "response exceeded 300000 bytes; reading stopped there"
    assert result.truncated_at == len(result.raw) == 300_000 and result.raw.startswith(b": keep-alive")


def test_a_big_answer_under_the_cap_is_whole(faulty: str) -> None:
    result = turn(f"{faulty}/huge-loop/v1/chat/completions", max_bytes=8_000_000)
    assert result.status == "ok" and result.truncated_at is None and result.message is not None
    assert len(result.message["tool_calls"][0]["function"]["arguments"]) > 2_000_000
