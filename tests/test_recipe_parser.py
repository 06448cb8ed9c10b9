"""The `sglang-0.5.23` parse path against DeepSeek's own parser (deepseek-recipe), on generated damage.

Damage comes from every class of repro.sim.damage_classes (the simulator's operators and the generated
shapes, the ones where the hand emulation was seen to part included), applied by hypothesis to clean
renders. Fields compared: reasoning, content, call names, the exact arguments strings, finish reason.
- where the package is installed, `parse_as` is exactly the package's output, driven here as SGLang
  0.5.23's `DeepSeekRecipeOutputParser` / `parse_chat_response` drive it, written out independently;
- the emulation (the fallback where the package cannot be installed) agrees with it on every class;
  benchmarks/parser_recall.py measures that on the simulator's own answers, per class, for
  docs/parser-recall.md.
Skipped, loudly, where the package is not installed.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsml_checker import ToolCall, render_completion
from dsml_checker.formats import EOS
from dsml_checker.server_parsers import NativeParserError, parse_as
from repro.sim.damage_classes import CLASSES

recipe = pytest.importorskip("deepseek_recipe", reason="deepseek-recipe is not installed here: the real parser cannot run")

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "n": {"type": "integer"}}}}} for n in ("read_file", "grep", "submit")]

_words = st.lists(st.sampled_from(["alpha", "b c", "東京", '"q"', "a<b", "&", "  pad ", "x\ny", "🙂"]), min_size=1, max_size=3).map("".join)
_values = st.one_of(_words, st.integers(-999, 999), st.booleans(), st.lists(st.integers(0, 9), max_size=2))
_calls = st.lists(st.builds(ToolCall, st.sampled_from(["read_file", "grep", "submit"]),
                            st.dictionaries(st.sampled_from(["path", "n", "flag", "q"]), _values, max_size=3)),
                  min_size=0, max_size=3)
_turns = st.builds(lambda reasoning, content, calls: render_completion(reasoning=reasoning, content=content, calls=calls),
                   st.sampled_from(["Plan.", "Think\nstep by step.", "I should call a tool first."]),
                   st.sampled_from(["", "Let me check.", "Two\nlines."]), _calls)


def _fields(reasoning: str | None, content: str, calls: list[tuple[str, str]], finish: str) -> tuple[Any, ...]:
    return reasoning or None, content, [name for name, _ in calls], [args for _, args in calls], finish


def _sglang_0523(raw: str, tools: list[dict[str, Any]]) -> tuple[Any, ...]:
    """SGLang 0.5.23's non-streaming chat path over recipe (serving_deepseek_recipe.parse_chat_response),
    written out here from its source, independently of dsml_checker.server_parsers._native."""
    text, engine = (raw[: -len(EOS)], "stop") if raw.endswith(EOS) else (raw, "length")
    options = recipe.ParsingOptions(parse_tool_calls=bool(tools), thinking_initial_stage=recipe.ThinkingInitialStage.ReasoningStart,
                                    special_tokens=recipe.SpecialTokens(image="<｜deepseek_image｜>"))
    request = recipe.ConversationRequest(recipe.Conversation(), recipe.ModelVersion.DeepseekV4Pro)
    processor = recipe.StreamProcessor(recipe.ChatCompletionRequest.chunk_generator(request, "", "DeepSeek-V4-Pro"), options, None)
    chunks = processor.push(recipe.InferenceChunk.text(text)) if text else []
    chunks += processor.push(recipe.InferenceChunk.finish(
        recipe.InferenceFinishReason.Stop if engine == "stop" else recipe.InferenceFinishReason.Length))
    reasoning, content, pieces = "", "", []
    for chunk in chunks:
        delta = json.loads(chunk.to_json())["choices"][0]["delta"]
        if delta.get("role"):
            continue
        reasoning += delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
        pieces += delta.get("tool_calls") or []
    whole: dict[int, list[str]] = {}
    for piece in pieces:
        if piece["function"].get("name") is not None:
            whole[piece["index"]] = [piece["function"]["name"], piece["function"]["arguments"]]
        else:
            whole[piece["index"]][1] += piece["function"]["arguments"]
    calls = [(name, args) for _, (name, args) in sorted(whole.items())]
    return _fields(reasoning, content, calls, "tool_calls" if calls and engine == "stop" else engine)


def _ours(raw: str, *, emulate: bool) -> tuple[Any, ...]:
    got = parse_as("sglang-0.5.23", raw, tools=TOOLS, tool_choice="auto", emulate=emulate)
    return _fields(got.reasoning, got.content, [(c.name, a) for c, a in zip(got.calls, got.arguments)], got.finish_reason)


def _damaged(turn: str, name: str, seed: int) -> str:
    damaged = CLASSES[name](turn, random.Random(seed))
    return turn if damaged is None else damaged


@SETTINGS
@given(turn=_turns, name=st.sampled_from(sorted(CLASSES)), seed=st.integers(0, 2**32 - 1))
def test_the_parse_path_is_exactly_the_packages_output(turn: str, name: str, seed: int) -> None:
    raw = _damaged(turn, name, seed)
    assert _ours(raw, emulate=False) == _sglang_0523(raw, TOOLS), (name, raw)


@SETTINGS
@given(turn=_turns, name=st.sampled_from(sorted(CLASSES)), seed=st.integers(0, 2**32 - 1))
def test_the_emulation_agrees_with_the_package_on_every_damage_class(turn: str, name: str, seed: int) -> None:
    raw = _damaged(turn, name, seed)
    assert _ours(raw, emulate=True) == _sglang_0523(raw, TOOLS), (name, raw)


def test_every_damage_class_fits_some_turn() -> None:
    calls = render_completion(reasoning="Plan.", content="Let me check.",
                              calls=[ToolCall("read_file", {"path": "a.py", "n": 3}), ToolCall("grep", {"path": "b"})])
    answer = render_completion(reasoning="Plan.", content="The answer is 42.", calls=[])
    for name, damage in CLASSES.items():
        fits = [(turn, damage(turn, random.Random(seed))) for seed in range(20) for turn in (calls, answer)]
        assert any(d is not None and d != turn for turn, d in fits), name


def test_a_text_the_package_rejects_is_an_error_never_a_crash() -> None:
    with pytest.raises(NativeParserError):
        _ours("Plan.</think>x \udcff" + EOS, emulate=False)
