"""The simulator's raw text over real HTTP: chat log-probabilities, `/generate` and `/v1/completions`.

The truth is the text the scripted model emitted (`repro.sim.model.answer`) or, for a damaged turn,
the text the simulator recorded for it (`/debug/fault-texts`); never the server's own parser.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsml_checker import StreamAccumulator
from dsml_checker.encoding import encode_messages
from dsml_checker.formats import EOS, THINK_CLOSE
from repro.run import clock
from repro.workload.sandbox import execute
from repro.sim.launch import SimHandle, start_sim
from repro.sim.model import answer, assistant_turns, conversation_key
from repro.sim.parser import ParsedOutput
from repro.sim.prompt_decode import decode_prompt
from repro.sim.protocol import Reply, StreamCursor
from repro.sim.server import cut_to_limit
from repro.sim.tokens import Coverage, token_logprobs, tokenize
from repro.workload.scenario import load_workload

WORKLOAD = load_workload().workload
TOOLS = WORKLOAD.openai_tools()
SYSTEM = {"role": "system", "content": WORKLOAD.system_prompt}
FINAL_AFTER = 6
"""The simulator's default --final-after-turns."""


def _task(n: int) -> list[dict[str, Any]]:
    return [SYSTEM, {"role": "user", "content": WORKLOAD.task_for(n, 7)}]


def _raw(messages: list[dict[str, Any]], seed: int) -> str:
    """What the scripted model writes for this conversation on a healthy server."""
    return answer(messages, TOOLS, "auto", seed=hash((0, seed)), final_after_turns=FINAL_AFTER).raw


def _rebuilt(entries: list[dict[str, Any]]) -> str:
    return b"".join(bytes(e["bytes"]) for e in entries).decode("utf-8")


def _sse(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data: {"):
            yield json.loads(line[len("data: "):])


def _chat_stream(url: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The chunks of a streamed chat answer, and the log-probability entries in stream order."""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as response:
        chunks = list(_sse(response))
    entries = [e for c in chunks for choice in c["choices"] for e in ((choice.get("logprobs") or {}).get("content") or [])]
    return chunks, entries


def _history(n: int, turns: int) -> list[dict[str, Any]]:
    """A conversation `turns` assistant turns deep, built from the model's own healthy answers."""
    messages = _task(n)
    for turn in range(turns):
        meant = answer(messages, TOOLS, "auto", seed=hash((0, n)), final_after_turns=FINAL_AFTER)
        calls = [{"id": f"call_{turn}_{i}", "type": "function",
                  "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for i, c in enumerate(meant.calls)]
        messages.append({"role": "assistant", "content": meant.content, "reasoning_content": meant.reasoning,
                         "tool_calls": calls or None})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": execute(WORKLOAD, c["function"]["name"],
                                                                                   c["function"]["arguments"])}
                     for c in calls]
    return messages


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(["--time-scale", "0"]) as handle:
        yield handle


# ---------------------------------------------------------------------------------------------- pure parts


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_pseudo_tokens_concatenate_to_the_text(text: str) -> None:
    assert "".join(tokenize(text)) == text


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=30), st.sampled_from(["｜DSML｜", "<｜DSML｜", "</｜DSML｜", THINK_CLOSE, EOS]), st.text(max_size=30))
def test_sentinel_think_close_and_eos_are_never_split(before: str, special: str, after: str) -> None:
    tokens = tokenize(before + special + after)
    assert any(special in token for token in tokens)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.integers(0, 9), min_size=1, max_size=30), coverage=st.sampled_from(["full", "no-tool-calls"]),
       top=st.integers(0, 5))
def test_streamed_logprobs_are_the_served_entries_once_each_whatever_the_pace(steps: list[int], coverage: Coverage,
                                                                              top: int) -> None:
    meant = answer(_task(1), TOOLS, "auto", seed=1, final_after_turns=FINAL_AFTER)
    output = ParsedOutput(meant.reasoning, meant.content, meant.calls)
    entries = tuple(token_logprobs(meant.raw, top_logprobs=top, coverage=coverage, has_calls=bool(output.calls)))
    reply = Reply("chatcmpl-x", "m", 0, output, "tool_calls", 1, 40, 0, meant.raw, entries)
    cursor, done, streamed = StreamCursor(reply), 0, []
    for step in [*steps, 40]:
        done = min(40, done + step)
        chunks = list(cursor.advance(done, 40))
        carried = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"]]
        assert len(carried) <= 1, "a step's log-probabilities ride on one chunk"
        streamed += [e for lp in carried for e in lp["content"]]
    assert streamed == [e for e in entries if e is not None] == reply.body()["choices"][0]["logprobs"]["content"]
    assert all(len(e["top_logprobs"]) == top for e in streamed)


_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40).filter(
    lambda t: not any(bad in t for bad in ("｜", "<think>", "</think>", "<tool_result>", "</tool_result>")))
_VALUE = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | _TEXT,
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3), max_leaves=6)


@st.composite
def _conversations(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    """Conversations in the form decoding gives back: string contents, calls without ids, results in order."""
    tools = draw(st.lists(st.builds(lambda n, d: {"type": "function", "function": {"name": n, "description": d, "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}}, st.from_regex(r"[a-z_]{1,12}", fullmatch=True), _TEXT),
        max_size=2))
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(_TEXT.filter(bool))})
    users = draw(st.integers(1, 3))
    for u in range(users):
        messages.append({"role": "user", "content": draw(_TEXT)})
        # Back-to-back user turns merge into one: every user turn but the last gets an answer.
        for _ in range(draw(st.integers(0 if u == users - 1 else 1, 2))):
            calls = [{"type": "function", "function": {"name": draw(st.from_regex(r"[a-z_]{1,12}", fullmatch=True)),
                                                        "arguments": json.dumps(draw(st.dictionaries(_TEXT, _VALUE, max_size=3)),
                                                                                ensure_ascii=False)}}
                     for _ in range(draw(st.integers(0, 2)))]
            assistant: dict[str, Any] = {"role": "assistant", "content": draw(_TEXT), "reasoning_content": draw(_TEXT)}
            if calls:
                assistant["tool_calls"] = calls
            messages.append(assistant)
            if not calls:
                break
            messages += [{"role": "tool", "content": draw(_TEXT)} for _ in calls]
    return messages, tools, draw(st.booleans())


def _expected(messages: list[dict[str, Any]], tools: list[dict[str, Any]], thinking: bool) -> list[dict[str, Any]]:
    """What the encoding keeps: past reasoning only in thinking mode and, without tools, after the last user turn
    (V4 turns tool results into user turns)."""
    last_user = max(i for i, m in enumerate(messages) if m["role"] in ("user", "tool"))
    kept = []
    for i, message in enumerate(messages):
        if message["role"] == "assistant" and not (thinking and (tools or i > last_user)):
            message = {k: v for k, v in message.items() if k != "reasoning_content"}
        kept.append(message)
    return kept


@settings(max_examples=200, deadline=None)
@given(_conversations())
def test_decoding_an_encoded_prompt_gives_the_conversation_back(case: tuple[list[dict[str, Any]], list[dict[str, Any]], bool]) -> None:
    messages, tools, thinking = case
    if messages[-1]["role"] == "assistant":
        messages = [*messages, {"role": "user", "content": "go on"}]
    decoded = decode_prompt(encode_messages(messages, tools=tools or None, thinking=thinking))
    assert decoded.thinking == thinking
    assert decoded.tools == tools
    assert decoded.messages == _expected(messages, tools, thinking)


def test_the_simulator_reads_the_prompts_sglang_itself_renders() -> None:
    # SGLang 0.5.23's DeepSeek-V4 prompts (deepseek-recipe, tests/fixtures/encoders/): what the scripted model
    # keys its answer on comes back: the task, the number of assistant turns, the tools.
    path = Path(__file__).parent / "fixtures" / "encoders" / "sglang-recipe-v4.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines():
        vector = json.loads(line)
        decoded = decode_prompt(vector["prompt"])
        messages = vector["messages"]
        assert conversation_key(decoded.messages) == conversation_key(messages)
        assert assistant_turns(decoded.messages) == assistant_turns(messages)
        assert decoded.tools == (vector["tools"] or [])
        assert decoded.thinking == vector["options"]["thinking"]


# ---------------------------------------------------------------------------------------------- chat log-probabilities


@pytest.mark.parametrize("turns", [0, 2, FINAL_AFTER])
def test_chat_logprobs_spell_the_models_raw_text(sim: SimHandle, turns: int) -> None:
    messages = _history(turns, turns)
    body = {"messages": messages, "tools": TOOLS, "seed": turns, "logprobs": True, "top_logprobs": 0}
    response = httpx.post(f"{sim.base_url}/chat/completions", json=body, timeout=60).json()
    entries = response["choices"][0]["logprobs"]["content"]
    raw = _raw(messages, turns)
    assert _rebuilt(entries) == raw == "".join(e["token"] for e in entries)
    assert all(e["top_logprobs"] == [] and e["logprob"] <= 0 for e in entries)
    # The parsed message is still there: the raw text is an addition, not a replacement.
    assert (response["choices"][0]["message"]["tool_calls"] is None) == (turns >= FINAL_AFTER)
    assert raw.endswith(EOS) and THINK_CLOSE in raw


def test_streamed_chat_logprobs_arrive_once_each_in_order(sim: SimHandle) -> None:
    messages = _history(3, 1)
    body = {"messages": messages, "tools": TOOLS, "seed": 3, "logprobs": True, "top_logprobs": 3}
    chunks, entries = _chat_stream(sim.url, body)
    assert _rebuilt(entries) == _raw(messages, 3)
    assert all(len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["token"] == e["token"] for e in entries)
    accumulated = StreamAccumulator()
    for chunk in chunks:
        accumulated.add_chunk(chunk)
    assert accumulated.message()["tool_calls"], "the parsed tool calls still stream beside the log-probabilities"
    # Several engine steps, each with its own tokens; the role and finish chunks carry none.
    carriers = [c for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    assert len(carriers) > 1
    assert chunks[0]["choices"][0]["logprobs"] is None and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"][0]["logprobs"] is None


def test_without_logprobs_the_response_shape_is_unchanged(sim: SimHandle) -> None:
    body = {"messages": _task(4), "tools": TOOLS, "seed": 4}
    response = httpx.post(f"{sim.base_url}/chat/completions", json=body, timeout=60).json()
    assert response["choices"][0]["logprobs"] is None
    chunks, entries = _chat_stream(sim.url, body)
    assert entries == [] and all(c["choices"][0]["logprobs"] is None for c in chunks if c["choices"])


@pytest.mark.parametrize("coverage", ["no-tool-calls", "none"])
def test_logprobs_coverage_withholds_what_it_says(coverage: str) -> None:
    calling, final = _history(5, 0), _history(5, FINAL_AFTER)
    with start_sim(["--time-scale", "0", "--logprobs-coverage", coverage]) as handle:
        for messages in (calling, final):
            body = {"messages": messages, "tools": TOOLS, "seed": 5, "logprobs": True}
            logprobs = httpx.post(f"{handle.base_url}/chat/completions", json=body, timeout=60).json()["choices"][0]["logprobs"]
            _, streamed = _chat_stream(handle.url, body)
            raw = _raw(messages, 5)
            if coverage == "none":
                assert logprobs is None and streamed == []
            elif messages is calling:
                # Everything up to the tool-call block, and nothing of it.
                text = _rebuilt(logprobs["content"])
                assert raw.startswith(text) and text.endswith(THINK_CLOSE + _raw_content(raw))
                assert "｜DSML｜" not in text and _rebuilt(streamed) == text
            else:
                assert _rebuilt(logprobs["content"]) == raw == _rebuilt(streamed)


def _raw_content(raw: str) -> str:
    return raw.split(THINK_CLOSE, 1)[1].split("\n\n<｜DSML｜", 1)[0]


# ---------------------------------------------------------------------------------------------- raw endpoints


def _generate(url: str, prompt: str, params: dict[str, Any], *, stream: bool = False) -> tuple[str, dict[str, Any]]:
    body = {"text": prompt, "sampling_params": params, "stream": stream}
    if not stream:
        out = httpx.post(f"{url}/generate", json=body, timeout=60).json()
        return out["text"], out["meta_info"]
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=60) as response:
        outs = list(_sse(response))
    texts = [o["text"] for o in outs]
    # SGLang re-sends the whole text so far on every step.
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:]))
    return texts[-1], outs[-1]["meta_info"]


def _completion(url: str, prompt: str, extra: dict[str, Any], *, stream: bool = False) -> tuple[str, str]:
    body = {"prompt": prompt, **extra, "stream": stream}
    if not stream:
        choice = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]
        return choice["text"], choice["finish_reason"]
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
        choices = [c["choices"][0] for c in _sse(response) if c["choices"]]
    return "".join(c["text"] for c in choices), choices[-1]["finish_reason"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("turns", [0, 3, FINAL_AFTER])
def test_raw_endpoints_return_what_chat_would_have_the_model_write(sim: SimHandle, turns: int, stream: bool) -> None:
    messages = _history(10 + turns, turns)
    seed = 10 + turns
    chat = httpx.post(f"{sim.base_url}/chat/completions", timeout=60, json={
        "messages": messages, "tools": TOOLS, "seed": seed, "logprobs": True}).json()
    raw = _rebuilt(chat["choices"][0]["logprobs"]["content"])
    assert raw == _raw(messages, seed)
    prompt = encode_messages(messages, tools=TOOLS)
    keep = {"max_new_tokens": 4096, "sampling_seed": seed, "skip_special_tokens": False, "no_stop_trim": True}
    text, meta = _generate(sim.url, prompt, keep, stream=stream)
    assert text == raw and meta["finish_reason"] == {"type": "stop", "matched": 1}
    # SGLang's defaults drop the end-of-sentence token from the text.
    assert _generate(sim.url, prompt, {"max_new_tokens": 4096, "sampling_seed": seed}, stream=stream)[0] == raw.removesuffix(EOS)
    text, reason = _completion(sim.url, prompt, {"max_tokens": 4096, "seed": seed}, stream=stream)
    assert (text, reason) == (raw.removesuffix(EOS), "stop")
    text, reason = _completion(sim.url, prompt, {"max_tokens": 4096, "seed": seed, "skip_special_tokens": False,
                                                 "no_stop_trim": True}, stream=stream)
    assert text == raw


def test_raw_endpoint_defaults_cut_the_answer_as_sglangs_do(sim: SimHandle) -> None:
    prompt = encode_messages(_task(20), tools=TOOLS)
    raw = _raw(_task(20), 20)
    text, reason = _completion(sim.url, prompt, {"seed": 20})
    assert (text, reason) == (cut_to_limit(raw, 16), "length")
    text, meta = _generate(sim.url, prompt, {"sampling_seed": 20})
    assert text == cut_to_limit(raw, 128).removesuffix(EOS)
    assert meta["finish_reason"]["type"] == ("length" if cut_to_limit(raw, 128) != raw else "stop")


@pytest.mark.parametrize("prompt", [
    "just text",
    "<｜begin▁of▁sentence｜><｜User｜>hi",
    "<｜User｜>hi<｜Assistant｜><think>r</think>no end of sentence<｜User｜>again<｜Assistant｜><think>",
])
def test_a_prompt_the_simulator_cannot_read_is_a_400(sim: SimHandle, prompt: str) -> None:
    for path, body in (("/generate", {"text": prompt}), ("/v1/completions", {"prompt": prompt})):
        response = httpx.post(f"{sim.url}{path}", json=body, timeout=60)
        assert response.status_code == 400
        assert "DeepSeek-V4 conversation" in response.json()["error"]["message"]


def test_raw_endpoints_share_the_prefix_cache_across_turns(sim: SimHandle) -> None:
    first = encode_messages(_history(30, 1), tools=TOOLS)
    later = encode_messages(_history(30, 2), tools=TOOLS)
    assert later.startswith(first[: len(first) - len("<｜Assistant｜><think>")])
    _generate(sim.url, first, {"sampling_seed": 30})
    assert _generate(sim.url, later, {"sampling_seed": 30})[1]["cached_tokens"] > 0


# ---------------------------------------------------------------------------------------------- damaged turns


async def _session(client: httpx.AsyncClient, n: int, seen: dict[str, str]) -> None:
    try:
        await _turns(client, n, seen)
    finally:
        await clock.end(f"{str(client.base_url).rstrip('/')}/sim/clock", n)  # the virtual clock stops waiting for it


async def _turns(client: httpx.AsyncClient, n: int, seen: dict[str, str]) -> None:
    messages = _task(100 + n)
    tag = clock.session_headers(n)
    for _ in range(FINAL_AFTER + 1):
        body = {"messages": messages, "tools": TOOLS, "seed": n, "logprobs": True, "max_tokens": 1024}
        if n % 2:
            async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True},
                                     headers=tag) as response:
                accumulated, entries, rid = StreamAccumulator(), [], ""
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        chunk = json.loads(line[len("data: "):])
                        rid = chunk["id"]
                        accumulated.add_chunk(chunk)
                        entries += [e for c in chunk["choices"] for e in ((c.get("logprobs") or {}).get("content") or [])]
                message = accumulated.message()
        else:
            response_body = (await client.post("/v1/chat/completions", json=body, headers=tag)).json()
            rid, message = response_body["id"], response_body["choices"][0]["message"]
            entries = response_body["choices"][0]["logprobs"]["content"]
        seen[rid] = _rebuilt(entries)
        calls = message.get("tool_calls") or []
        if not calls:
            return
        messages = [*messages, {"role": "assistant", "content": message.get("content"), "tool_calls": calls}]
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": execute(WORKLOAD, c["function"]["name"],
                                                                                   c["function"]["arguments"])}
                     for c in calls]


async def _sessions(url: str, first: int, count: int, seen: dict[str, str]) -> None:
    await clock.declare(f"{url}/sim/clock", count, count)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=count)) as client:
        await asyncio.gather(*(_session(client, n, seen) for n in range(first, first + count)))


def test_damaged_turns_logprobs_spell_the_damaged_text() -> None:
    seen: dict[str, str] = {}
    # On the virtual clock: which turns the race damages is the seed's, at any machine load.
    with start_sim(["--enable-hierarchical-cache", "--index-k-dtype", "bf16", "--clock", "virtual"]) as handle:
        # Play rounds of 60 fresh sessions until the race has damaged a few turns.
        for round_ in range(6):
            asyncio.run(_sessions(handle.url, 60 * round_, 60, seen))
            damaged = httpx.get(f"{handle.url}/debug/fault-texts", timeout=10).json()["texts"]
            if len(damaged) >= 3:
                break
        faults = httpx.get(f"{handle.url}/debug/faults", timeout=10).json()["faults"]
        assert httpx.get(f"{handle.url}/sim/clock", timeout=10).json()["timeouts"] == 0  # every step had its sessions
    assert damaged, "the race must have damaged some turns for this test to mean anything"
    assert set(damaged) == {f["request_id"] for f in faults} and set(damaged) <= set(seen)
    assert all(seen[rid] == text for rid, text in damaged.items())
