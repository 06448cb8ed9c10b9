"""The simulator over real HTTP: the OpenAI client and raw httpx read its streams, endpoints behave like SGLang's."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any, Iterator

import httpx
import jsonschema
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from repro.errors import TargetError
from repro.procs.process import free_port, start_process, wait_http_ready
from repro.sim.launch import SimHandle, start_sim

MODEL = "deepseek-ai/DeepSeek-V4"
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "minLength": 2},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city", "unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_files",
            "parameters": {
                "type": "object",
                "properties": {
                    "patterns": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "recursive": {"type": "boolean"},
                    "limits": {"type": "object", "properties": {"max": {"type": "number", "minimum": 0}}, "required": ["max"]},
                },
                "required": ["patterns", "limits"],
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def default_sim() -> Iterator[SimHandle]:
    """One simulator with the default (healthy) flags, shared by the tests that need nothing else."""
    with start_sim() as sim:
        yield sim


def _conversation(task: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": task}]


def _read_sse(response: httpx.Response) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = []
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            chunks.append({"done": True})
        else:
            chunks.append(json.loads(data))
    return chunks


def test_openai_client_streams_valid_tool_calls_and_usage(default_sim: SimHandle) -> None:
    sim = default_sim
    client = openai.OpenAI(base_url=sim.base_url, api_key="unused", max_retries=0, timeout=30)
    assert [m.id for m in client.models.list()] == [MODEL]
    calls_seen = 0
    for task in ("fix the cache", "deploy the router", "write the report", "audit the logs"):
        stream = client.chat.completions.create(
            model=MODEL, messages=_conversation(task), tools=TOOLS, stream=True, stream_options={"include_usage": True}
        )
        args: dict[int, str] = {}
        names: dict[int, str] = {}
        reasoning, finish, usage = "", None, None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            delta = choice.delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            for call in delta.tool_calls or []:
                if call.function.name:
                    names[call.index] = call.function.name
                args[call.index] = args.get(call.index, "") + (call.function.arguments or "")
            finish = choice.finish_reason or finish
        assert finish == "tool_calls"
        assert reasoning
        assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0
        assert usage.prompt_tokens_details.cached_tokens is not None
        for index, name in names.items():
            jsonschema.validate(json.loads(args[index]), SCHEMAS[name])
            calls_seen += 1
    assert calls_seen >= 4


def test_httpx_stream_has_sglang_chunk_shapes_and_nonstream_agrees(default_sim: SimHandle) -> None:
    sim = default_sim
    body = {"model": MODEL, "messages": _conversation("same task"), "tools": TOOLS, "tool_choice": "required",
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{sim.base_url}/chat/completions", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            chunks = _read_sse(response)
        assert chunks[-1] == {"done": True}
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        usage = chunks[-2]
        assert usage["choices"] == [] and "cached_tokens" in usage["usage"]["prompt_tokens_details"]
        assert chunks[-3]["choices"][0]["finish_reason"] == "tool_calls"
        ids = {c["id"] for c in chunks if "id" in c}
        assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
        headers = [tc for c in chunks[:-2] for tc in c["choices"][0]["delta"].get("tool_calls", []) if "id" in tc]
        assert headers and all(h["type"] == "function" and h["function"]["name"] for h in headers)
        streamed = {}
        for c in chunks[:-2]:
            for tc in c["choices"][0]["delta"].get("tool_calls", []):
                streamed[tc["index"]] = streamed.get(tc["index"], "") + tc["function"]["arguments"]

        # The same conversation without streaming: the scripted model answers the same way.
        plain = client.post(f"{sim.base_url}/chat/completions", json={**body, "stream": False}).json()
        message = plain["choices"][0]["message"]
        assert plain["choices"][0]["finish_reason"] == "tool_calls"
        assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [
            json.loads(streamed[i]) for i in sorted(streamed)
        ]
        assert plain["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_tool_choice_none_named_and_final_answer(sim_server) -> None:
    sim = sim_server("--final-after-turns", "1")
    with httpx.Client(base_url=sim.base_url, timeout=30) as client:
        none = client.post("/chat/completions", json={"messages": _conversation("t"), "tools": TOOLS, "tool_choice": "none"}).json()
        assert none["choices"][0]["finish_reason"] == "stop" and not none["choices"][0]["message"]["tool_calls"]
        named = client.post("/chat/completions", json={
            "messages": _conversation("t"), "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "search_files"}}}).json()
        assert {c["function"]["name"] for c in named["choices"][0]["message"]["tool_calls"]} == {"search_files"}
        history = _conversation("t") + [
            {"role": "assistant", "content": None, "tool_calls": named["choices"][0]["message"]["tool_calls"]},
            {"role": "tool", "tool_call_id": "x", "content": "ok"},
        ]
        final = client.post("/chat/completions", json={"messages": history, "tools": TOOLS}).json()
        assert final["choices"][0]["finish_reason"] == "stop"
        assert final["choices"][0]["message"]["content"]
        short = client.post("/chat/completions", json={"messages": history, "tools": TOOLS, "max_tokens": 5}).json()
        assert short["choices"][0]["finish_reason"] == "length"
        assert short["usage"]["completion_tokens"] <= 5


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ("not json", 400),
        ({"messages": []}, 422),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 422),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 422),
        ({"messages": [{"role": "user", "content": "x"}], "tools": TOOLS,
          "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 422),
        ({"model": "gpt-nothing", "messages": [{"role": "user", "content": "x"}]}, 404),
    ],
)
def test_bad_requests_get_openai_error_json(default_sim: SimHandle, body: Any, status: int) -> None:
    sim = default_sim
    content = body if isinstance(body, str) else json.dumps(body)
    response = httpx.post(f"{sim.base_url}/chat/completions", content=content, timeout=10)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["message"] and error["code"] == status


def test_endpoints_server_info_metrics_loads_flush(sim_server) -> None:
    sim = sim_server("--enable-hierarchical-cache", "--index-k-dtype", "bf16", "--disable-cuda-graph",
                     "--max-running-requests", "12", "--served-model-name", "dsv4")
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        info = client.get("/server_info").json()
        assert info["simulator"] is True and info["version"]
        assert info["enable_hierarchical_cache"] is True and info["index_k_dtype"] == "bf16"
        assert info["disable_cuda_graph"] is True and info["disable_overlap_schedule"] is False
        assert info["max_running_requests"] == 12 and info["disaggregation_mode"] == "null"
        assert client.get("/v1/models").json()["data"][0]["id"] == "dsv4"
        assert client.get("/health_generate").status_code == 200
        answer = client.post("/v1/chat/completions", json={"model": "dsv4", "messages": _conversation("m"), "tools": TOOLS})
        assert answer.status_code == 200
        families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
        for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate",
                     "sglang:load_back_tokens", "sglang:prompt_tokens", "sglang:generation_tokens",
                     "sglang:cached_tokens", "sglang:time_to_first_token_seconds",
                     "sglang:inter_token_latency_seconds", "sglang:e2e_request_latency_seconds"):
            assert name in families, name
        prompt = next(s.value for s in families["sglang:prompt_tokens"].samples if s.name.endswith("_total"))
        assert prompt >= answer.json()["usage"]["prompt_tokens"]
        assert next(s.value for s in families["sglang:is_cuda_graph"].samples) == 0.0
        e2e = [s for s in families["sglang:e2e_request_latency_seconds"].samples if s.name.endswith("_count")]
        assert e2e[0].value >= 1
        loads = client.get("/v1/loads").json()["loads"][0]
        assert loads["num_reqs"] == 0 and loads["num_tokens"] > 0
        assert client.post("/flush_cache").status_code == 200
        assert client.get("/v1/loads").json()["loads"][0]["num_tokens"] == 0
        assert client.get("/debug/faults").json() == {"faults": []}


def test_flush_refused_while_busy_and_a_dropped_stream_is_aborted(sim_server) -> None:
    # A slow clock keeps the request running while the flush is attempted.
    sim = sim_server("--time-scale", "20")
    body = {"messages": _conversation("slow"), "tools": TOOLS, "stream": True}
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()  # held: a dropped iterator closes the stream
            next(lines)
            refused = client.post("/flush_cache")
            assert refused.status_code == 400 and "error" in refused.json()
        # The client went away mid-answer: the engine must let go of the request.
        deadline = time.monotonic() + 60
        while client.get("/v1/loads").json()["loads"][0]["num_reqs"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.get("/v1/loads").json()["loads"][0]["num_reqs"] == 0
        families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
        assert next(s.value for s in families["sglang:num_aborted_requests"].samples if s.name.endswith("_total")) == 1
        assert client.post("/flush_cache").status_code == 200


def test_health_is_503_during_warmup() -> None:
    # However long the machine takes to start it, the first answer the simulator gives is 503.
    port = free_port()
    process = start_process([sys.executable, "-m", "repro.sim", "serve", "--port", str(port), "--warmup", "3600"])
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.alive and time.monotonic() < deadline, "the simulator never answered"
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert status == 503
        with pytest.raises(TargetError, match="HTTP 503"):
            wait_http_ready(f"http://127.0.0.1:{port}/health", timeout=0.5, process=process)
    finally:
        process.stop()


def test_bad_flag_is_one_line_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "repro.sim", "serve", "--index-k-dtype", "fp16"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "index_k_dtype" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
