"""The simulator's parts without HTTP: scripted model, SGLang parsing policy, damage operators, engine mechanics."""

from __future__ import annotations

import asyncio
import json
import random

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsml_checker import check
from dsml_checker.formats import EOS, THINK_CLOSE, ToolCall, render_calls, render_completion
from repro.sim.config import SimConfig, parse_flags, server_info
from repro.sim.corrupt import OPERATORS, damage
from repro.sim.engine import Engine, EngineRequest, page_keys
from repro.sim.model import answer, object_for
from repro.sim.parser import parse_output
from repro.sim.protocol import Reply, StreamCursor
from repro.errors import UsageError

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "start": {"type": "integer", "minimum": 1},
                                         "mode": {"enum": ["r", "rb"]}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "run_tests", "parameters": {
        "type": "object", "properties": {"targets": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                                         "verbose": {"type": "boolean"}, "timeout": {"type": "number", "maximum": 60}},
        "required": ["targets", "verbose"]}}},
]
NAMES = {"read_file", "run_tests"}


def _message(raw: str, tools_enabled: bool = True) -> tuple[dict, str]:
    output = parse_output(raw, tool_names=NAMES, tools_enabled=tools_enabled)
    reason = "tool_calls" if output.calls else "stop"
    return Reply("r", "m", 0, output, reason, 0, 0, 0).message(), reason


# --- the scripted model -------------------------------------------------------------------------

def test_answers_are_deterministic_and_valid_under_their_schemas() -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for task in range(30):
        messages = [{"role": "user", "content": f"ticket {task}"}]
        first = answer(messages, TOOLS, "auto", seed=7, final_after_turns=3)
        assert first == answer(messages, TOOLS, "auto", seed=7, final_after_turns=3)
        assert first.calls
        for call in first.calls:
            jsonschema.validate(call.arguments, schemas[call.name])
        message, reason = _message(first.raw)
        assert reason == "tool_calls" and check(message, finish_reason=reason, tools=TOOLS).label == "clean"


def test_final_answer_after_the_configured_turns_unless_a_call_is_required() -> None:
    history = [{"role": "user", "content": "t"}] + [{"role": "assistant", "content": "x"}, {"role": "tool", "content": "y"}] * 2
    assert not answer(history, TOOLS, "auto", seed=1, final_after_turns=2).calls
    assert answer(history, TOOLS, "auto", seed=1, final_after_turns=3).calls
    assert answer(history, TOOLS, "required", seed=1, final_after_turns=2).calls
    named = answer(history, TOOLS, {"type": "function", "function": {"name": "run_tests"}}, seed=1, final_after_turns=2)
    assert {c.name for c in named.calls} == {"run_tests"}
    assert not answer(history, TOOLS, "none", seed=1, final_after_turns=9).calls


_SCHEMAS = st.recursive(
    st.sampled_from([{"type": "string"}, {"type": "integer", "minimum": -5, "maximum": 5}, {"type": "boolean"},
                     {"type": "number"}, {"enum": ["a", "b"]}, {"type": "null"}, {"type": "string", "minLength": 30}]),
    lambda inner: st.one_of(
        st.builds(lambda items: {"type": "array", "items": items, "minItems": 1}, inner),
        st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), inner, min_size=1, max_size=4).map(
            lambda props: {"type": "object", "properties": props, "required": sorted(props)[:2]}),
    ),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None)
@given(schema=_SCHEMAS.filter(lambda s: s.get("type") == "object"), seed=st.integers(0, 2**32))
def test_generated_arguments_satisfy_generated_schemas(schema: dict, seed: int) -> None:
    jsonschema.validate(object_for(schema, random.Random(seed)), schema)


# --- SGLang's parsing policy (dsml-format.md §4) ----------------------------------------------------

CALL = ToolCall("read_file", {"path": "a.py", "start": 3})
GOOD = render_completion(reasoning="think", content="Let me look.", calls=[CALL])


@pytest.mark.parametrize(
    ("raw", "content", "calls", "reasoning_has_dsml"),
    [
        (GOOD, "Let me look.", 1, False),
        (GOOD.replace("tool_calls>", "function_calls>"), None, 0, False),
        (GOOD.replace("<｜DSML｜tool_calls>\n", "").replace("\n</｜DSML｜tool_calls>", ""), None, 0, False),
        (GOOD.replace("tool_calls>", "toolcalls>", 1), None, 0, False),
        (GOOD.split("</｜DSML｜invoke>")[0], "Let me look.", 0, False),
        (GOOD.replace('"read_file"', '"delete_all"'), "Let me look.", 0, False),
        ("think\n\n" + render_calls([CALL]) + THINK_CLOSE + "done" + EOS, "done", 0, True),
    ],
    ids=["well-formed", "v32-block", "bare-invokes", "misspelled", "truncated", "unknown-tool", "before-think"],
)
def test_parser_fallbacks_follow_sglang(raw: str, content: str | None, calls: int, reasoning_has_dsml: bool) -> None:
    output = parse_output(raw, tool_names=NAMES, tools_enabled=True)
    assert len(output.calls) == calls
    body = raw.partition(THINK_CLOSE)[2].removesuffix(EOS)
    assert output.content == (body if content is None else content)
    assert ("｜DSML｜" in output.reasoning) == reasoning_has_dsml


def test_tool_choice_none_leaves_the_markup_in_content() -> None:
    output = parse_output(GOOD, tool_names=NAMES, tools_enabled=False)
    assert not output.calls and "<｜DSML｜tool_calls>" in output.content


def test_invalid_json_under_string_false_stays_a_raw_string() -> None:
    raw = GOOD.replace('string="false">3<', 'string="false">3x<')
    assert parse_output(raw, tool_names=NAMES, tools_enabled=True).calls[0].arguments["start"] == "3x"


# --- damage operators ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_every_operator_is_visible_to_the_checker(name: str) -> None:
    applied = 0
    for task in range(12):
        for final_after in (1, 9):
            history = [{"role": "user", "content": f"t{task}"}, {"role": "assistant", "content": "x"}]
            meant = answer(history, TOOLS, "auto", seed=task, final_after_turns=final_after)
            reasoning, _, body = meant.raw.partition(THINK_CLOSE)
            damaged = OPERATORS[name](reasoning, body.removesuffix(EOS), "read_file")
            if damaged is None:
                continue
            applied += 1
            message, reason = _message(damaged)
            assert check(message, finish_reason=reason, tools=TOOLS, tool_choice="auto").label == "corrupt", damaged
    assert applied


def test_damage_is_deterministic_and_respects_the_check() -> None:
    meant = answer([{"role": "user", "content": "t"}], TOOLS, "auto", seed=3, final_after_turns=5)
    first = damage(meant.raw, random.Random(11), tool="read_file", is_corrupt=lambda raw: True)
    assert first == damage(meant.raw, random.Random(11), tool="read_file", is_corrupt=lambda raw: True)
    seen: list[str] = []
    name, _ = damage(meant.raw, random.Random(11), tool="read_file", is_corrupt=lambda raw: seen.append(raw) or len(seen) == 3)
    assert len(seen) == 3 and name in OPERATORS


# --- streaming layout ------------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.integers(1, 9), min_size=1, max_size=30))
def test_stream_deltas_rebuild_the_reply_whatever_the_pace(steps: list[int]) -> None:
    meant = answer([{"role": "user", "content": "s"}], TOOLS, "auto", seed=5, final_after_turns=5)
    reply = Reply("chatcmpl-x", "m", 0, parse_output(meant.raw, tool_names=NAMES, tools_enabled=True), "tool_calls", 1, 40, 0)
    cursor = StreamCursor(reply)
    done, total, chunks = 0, 40, []
    for step in [*steps, total]:
        done = min(total, done + step)
        chunks += list(cursor.advance(done, total))
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks)
    args: dict[int, str] = {}
    for c in chunks:
        for call in c["choices"][0]["delta"].get("tool_calls", []):
            args[call["index"]] = args.get(call["index"], "") + call["function"]["arguments"]
    assert reasoning == reply.output.reasoning
    assert [json.loads(args[i]) for i in sorted(args)] == [c.arguments for c in reply.output.calls]


# --- engine mechanics ---------------------------------------------------------------------------------------

def _engine(*flags: str) -> Engine:
    return Engine(parse_flags(list(flags)))


def test_layer_walk_bf16_overtakes_where_fp8_does_not_and_the_gate_never_does() -> None:
    per_layer = 0.001
    window = [(tokens, share) for tokens in range(256, 8192, 256) for share in range(1, 10)]

    def races(*flags: str) -> int:
        engine = _engine("--enable-hierarchical-cache", *flags)
        return sum(engine._forward_with_load_back(t, n, per_layer, 0.8 * per_layer)[1] is not None for t, n in window)

    bf16, fp8 = races("--index-k-dtype", "bf16"), races("--index-k-dtype", "fp8")
    assert bf16 > fp8 > 0
    assert races("--index-k-dtype", "bf16", "--index-k-gate") == 0
    # CUDA graphs change decode kernels only: the prefill's race is the same with or without them.
    assert races("--index-k-dtype", "bf16", "--disable-cuda-graph") == bf16


def test_disabling_cuda_graph_or_overlap_slows_decode_steps() -> None:
    def decode_cost(*flags: str) -> float:
        return _engine(*flags)._decode()

    base = decode_cost()
    assert decode_cost("--disable-cuda-graph") > base and decode_cost("--disable-overlap-schedule") > base


def _conversation_pages(conversation: int, turns: int) -> list[str]:
    shared = "S" * 64 * 4 * 8
    text = shared + "".join(f"[{conversation}:{turn}]" * 400 for turn in range(turns))
    return page_keys(text, 64)


async def _serve_all(engine: Engine, prompts: list[list[str]]) -> list[EngineRequest]:
    runner = asyncio.create_task(engine.run())
    done = []
    try:
        for pages in prompts:
            request = EngineRequest(f"r{len(done)}", len(pages) * 64 + 10, pages, lambda race: 16)
            engine.submit(request)
            while not request.finished:
                request.changed.clear()
                await asyncio.wait_for(request.changed.wait(), timeout=10)
            done.append(request)
    finally:
        runner.cancel()
    return done


def test_evicted_pages_come_back_from_host_only_with_hicache() -> None:
    # Eight conversations whose histories do not fit on the device together, visited in turn.
    prompts = [_conversation_pages(c, turn) for turn in (1, 2) for c in range(8)]
    flags = ("--max-total-tokens", "4096", "--time-scale", "0")
    with_hicache = asyncio.run(_serve_all(_engine(*flags, "--enable-hierarchical-cache"), prompts))
    without = asyncio.run(_serve_all(_engine(*flags), prompts))
    assert sum(r.load_back_tokens for r in with_hicache) > 0
    assert sum(r.load_back_tokens for r in without) == 0
    assert sum(r.cached_tokens for r in with_hicache) > sum(r.cached_tokens for r in without)


def test_config_flags_and_server_info_names() -> None:
    config = parse_flags(["--enable-hierarchical-cache", "--no-enable-hierarchical-cache", "--index-k-dtype", "bf16"])
    assert config == SimConfig(index_k_dtype="bf16")
    info = server_info(config)
    assert info["enable_hierarchical_cache"] is False and info["simulator"] is True
    with pytest.raises(UsageError, match="max_running_requests"):
        parse_flags(["--max-running-requests", "0"])
    with pytest.raises(UsageError, match="unrecognized"):
        parse_flags(["--no-such-flag"])
