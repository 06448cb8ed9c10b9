"""The simulator's parts without HTTP: scripted model, SGLang parsing policy, damage operators, engine mechanics."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsml_checker import check, check_raw
from dsml_checker.formats import EOS, THINK_CLOSE, ToolCall, render_calls, render_completion
from dsml_checker.server_parsers import PARSERS
from repro.sim.config import SimConfig, parse_flags, server_info
from repro.sim.corrupt import OPERATORS, damage
from repro.sim.engine import Engine, EngineRequest, page_keys
from repro.sim.faults import parser_effect
from repro.sim.model import answer, object_for
from repro.sim.parser import parse_output
from repro.sim.protocol import Reply, StreamCursor
from repro.errors import UsageError
from repro.workload.scenario import load_workload

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "start": {"type": "integer", "minimum": 1},
                                         "mode": {"enum": ["r", "rb"]}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "run_tests", "parameters": {
        "type": "object", "properties": {"targets": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                                         "verbose": {"type": "boolean"}, "timeout": {"type": "number", "maximum": 60}},
        "required": ["targets", "verbose"]}}},
]


def _message(raw: str, tool_choice: str = "auto") -> tuple[dict, str]:
    output, reason = parse_output(raw, tools=TOOLS, tool_choice=tool_choice)
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


def test_an_answer_never_issues_the_same_call_twice() -> None:
    """Tools with few, small-domain arguments (the reading workload's) make two draws collide now and then."""
    tools = load_workload(Path(__file__).parent.parent / "experiments" / "long_context_reading.yaml").workload.openai_tools()
    for task in range(1100, 1300):  # seed 1, task 1169 drew one search twice before the fix
        calls = answer([{"role": "user", "content": f"doc {task}"}], tools, "auto", seed=1, final_after_turns=9).calls
        assert len({(c.name, json.dumps(c.arguments, sort_keys=True)) for c in calls}) == len(calls), calls


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


# --- the server-side parser: the configured version's, emulated (tests/test_server_parsers.py checks them) ---

CALL = ToolCall("read_file", {"path": "a.py", "start": 3})
GOOD = render_completion(reasoning="think", content="Let me look.", calls=[CALL])
VARIANTS = {
    "well-formed": GOOD,
    "misspelled": GOOD.replace("tool_calls>", "toolcalls>", 1),
    "bare-invokes": GOOD.replace("<｜DSML｜tool_calls>\n", "").replace("\n</｜DSML｜tool_calls>", ""),
    "unknown-tool": GOOD.replace('"read_file"', '"delete_all"'),
    "before-think": "think\n\n" + render_calls([CALL]) + THINK_CLOSE + "done" + EOS,
    "trailing-text": GOOD.replace(EOS, "\nDone." + EOS),
}


@pytest.mark.parametrize(
    ("parser", "calls"),
    [
        # well-formed, misspelled, bare-invokes, unknown-tool, before-think, trailing-text
        ("sglang-0.5.23", [1, 1, 1, 1, 1, 1]),
        ("sglang-0.5.20", [1, 0, 0, 0, 0, 1]),
        ("vllm-0.33", [1, 1, 1, 1, 1, 1]),
    ],
)
def test_the_configured_parser_decides_which_calls_survive(parser: str, calls: list[int]) -> None:
    got = [len(parse_output(raw, tools=TOOLS, tool_choice="auto", parser=parser)[0].calls) for raw in VARIANTS.values()]
    assert got == calls
    output, reason = parse_output(VARIANTS["misspelled"], tools=TOOLS, tool_choice="auto", parser=parser)
    assert reason == ("tool_calls" if output.calls else "stop")
    if not output.calls:  # SGLang 0.5.20 needs the wrapper: the whole answer becomes content
        assert output.content == VARIANTS["misspelled"].partition(THINK_CLOSE)[2].removesuffix(EOS)


def test_a_cut_answer_is_reported_as_length_whatever_the_parser_kept() -> None:
    cut = GOOD.split("</｜DSML｜invoke>")[0]
    for parser in PARSERS:
        output, reason = parse_output(cut, tools=TOOLS, tool_choice="auto", parser=parser, truncated=True)
        assert reason == "length"
    assert not parse_output(cut, tools=TOOLS, tool_choice="auto", parser="sglang-0.5.20", truncated=True)[0].calls


@pytest.mark.parametrize(("parser", "markup_kept"), [("sglang-0.5.23", True), ("sglang-0.5.20", True), ("vllm-0.33", False)])
def test_tool_choice_none_parses_no_call(parser: str, markup_kept: bool) -> None:
    output, _ = parse_output(GOOD, tools=TOOLS, tool_choice="none", parser=parser)
    assert not output.calls and ("<｜DSML｜tool_calls>" in output.content) == markup_kept


def test_invalid_json_under_string_false_is_sent_as_the_parser_writes_it() -> None:
    raw = GOOD.replace('string="false">3<', 'string="false">3x<')
    recipe, _ = parse_output(raw, tools=TOOLS, tool_choice="auto", parser="sglang-0.5.23")
    assert recipe.arguments_text(0) == '{"path": "a.py", "start": 3x}'  # pasted verbatim: invalid JSON on the wire
    for parser in ("sglang-0.5.20", "vllm-0.33"):
        assert parse_output(raw, tools=TOOLS, tool_choice="auto", parser=parser)[0].calls[0].arguments["start"] == "3x"


# --- damage operators ----------------------------------------------------------------------------------

def _damaged_answers(name: str) -> list[str]:
    out = []
    for task in range(12):
        for final_after in (1, 9):
            history = [{"role": "user", "content": f"t{task}"}, {"role": "assistant", "content": "x"}]
            meant = answer(history, TOOLS, "auto", seed=task, final_after_turns=final_after)
            reasoning, _, body = meant.raw.partition(THINK_CLOSE)
            damaged = OPERATORS[name](reasoning, body.removesuffix(EOS), "read_file")
            if damaged is not None:
                out.append(damaged)
    return out


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_every_operator_is_caught_in_the_raw_text(name: str) -> None:
    damaged = _damaged_answers(name)
    assert damaged
    for raw in damaged:
        assert check_raw(raw, tools=TOOLS, tool_choice="auto").label == "corrupt", raw


def test_a_parser_can_hide_damage_from_the_parsed_verdict() -> None:
    # The same damaged text: SGLang 0.5.20 leaves the misspelled block in content, the recipe repairs it.
    raw = _damaged_answers("misspelled_opener")[0]
    assert check(_message(raw)[0], finish_reason="tool_calls", tools=TOOLS).label == "clean"
    stale, reason = parse_output(raw, tools=TOOLS, tool_choice="auto", parser="sglang-0.5.20")
    message = Reply("r", "m", 0, stale, reason, 0, 0, 0).message()
    assert check(message, finish_reason=reason, tools=TOOLS).label == "corrupt"


@pytest.mark.parametrize(
    ("parser", "operator", "effect"),
    [
        ("sglang-0.5.23", "orphan_closer", "absorbed"),
        ("sglang-0.5.23", "typographic_quotes", "dropped-call"),
        ("sglang-0.5.20", "think_leak", "absorbed"),
        ("sglang-0.5.23", "closer_in_argument", "truncated"),
        ("sglang-0.5.23", "block_in_reasoning", "altered"),
        ("vllm-0.33", "ascii_bars", "visible"),
    ],
)
def test_the_fault_log_says_what_the_parser_did(parser: str, operator: str, effect: str) -> None:
    effects = set()
    for task in range(12):
        meant = answer([{"role": "user", "content": f"t{task}"}], TOOLS, "auto", seed=task, final_after_turns=5)
        reasoning, _, body = meant.raw.partition(THINK_CLOSE)
        damaged = OPERATORS[operator](reasoning, body.removesuffix(EOS), "read_file")
        if damaged is None or "Let me" not in meant.raw:
            continue
        clean, _ = parse_output(meant.raw, tools=TOOLS, tool_choice="auto", parser=parser)
        got, reason = parse_output(damaged, tools=TOOLS, tool_choice="auto", parser=parser)
        visible = check(Reply("r", "m", 0, got, reason, 0, 0, 0).message(), finish_reason=reason, tools=TOOLS).label == "corrupt"
        effects.add(parser_effect(clean, got, visible=visible))
    assert effect in effects


def test_more_calls_than_meant_is_a_duplication_unless_the_checker_sees_it() -> None:
    meant, _ = parse_output(GOOD, tools=TOOLS, tool_choice="auto", parser="sglang-0.5.20")
    doubled, _ = parse_output(GOOD.replace(EOS, "\n\n" + render_calls([CALL]) + EOS), tools=TOOLS, tool_choice="auto",
                              parser="sglang-0.5.20")
    assert len(doubled.calls) == 2
    assert parser_effect(meant, doubled, visible=False) == "duplicated"
    assert parser_effect(meant, doubled, visible=True) == "visible"
    assert parser_effect(meant, meant, visible=False) == "absorbed"


def test_damage_is_chosen_from_the_draw_alone() -> None:
    meant = answer([{"role": "user", "content": "t"}], TOOLS, "auto", seed=3, final_after_turns=5)
    first = damage(meant.raw, random.Random(11), tool="read_file")
    assert first == damage(meant.raw, random.Random(11), tool="read_file")
    final = answer([{"role": "user", "content": "t"}, {"role": "assistant", "content": "x"}], TOOLS, "auto",
                   seed=3, final_after_turns=1)
    for raw in (meant.raw, final.raw):
        reasoning, _, body = raw.partition(THINK_CLOSE)
        fitting = {n for n, op in OPERATORS.items() if op(reasoning, body.removesuffix(EOS), "read_file") is not None}
        # Every operator that fits gets drawn, those every parser absorbs included: nothing filters them.
        assert {damage(raw, random.Random(seed), tool="read_file")[0] for seed in range(300)} == fitting
        assert len(fitting) >= 3


# --- streaming layout ------------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.integers(1, 9), min_size=1, max_size=30))
def test_stream_deltas_rebuild_the_reply_whatever_the_pace(steps: list[int]) -> None:
    meant = answer([{"role": "user", "content": "s"}], TOOLS, "auto", seed=5, final_after_turns=5)
    reply = Reply("chatcmpl-x", "m", 0, parse_output(meant.raw, tools=TOOLS, tool_choice="auto")[0], "tool_calls", 1, 40, 0)
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
    assert server_info(config)["tool_parser"] == "sglang-0.5.23"
    assert server_info(parse_flags(["--tool-parser", "vllm-0.33"]))["tool_parser"] == "vllm-0.33"
    with pytest.raises(UsageError, match="tool_parser"):
        parse_flags(["--tool-parser", "sglang-0.4"])
