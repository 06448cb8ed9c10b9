"""The conversation encoder against DeepSeek's reference encoders: byte-identical prompts on every vector.

The vectors in tests/fixtures/encoders/ were written by the reference encoders vLLM ships, and by
SGLang 0.5.23's DeepSeek-V4 chat renderer (deepseek-recipe) for harness-shaped conversations
(tests/fixtures/encoders/regenerate.py); each holds the messages, the request tools, the options and
the reference's prompt, or the fact that the reference refused the input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dsml_checker.encoding import ENCODER_FORMATS, encode_messages

FIXTURES = Path(__file__).parent / "fixtures" / "encoders"


def _vectors(fmt: str) -> list[dict[str, Any]]:
    with open(FIXTURES / f"{fmt}.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _encode(vector: dict[str, Any]) -> str:
    options = dict(vector["options"])
    cut = options.pop("context_len", 0)
    messages = vector["messages"]
    return encode_messages(messages[cut:], context=messages[:cut] or None, tools=vector["tools"], **options)


@pytest.mark.parametrize("fmt", ENCODER_FORMATS)
def test_every_reference_vector_is_reproduced_byte_for_byte(fmt: str) -> None:
    vectors = _vectors(fmt)
    assert len(vectors) >= 100
    mismatches = []
    for index, vector in enumerate(vectors):
        if "error" in vector:
            with pytest.raises(ValueError):
                _encode(vector)
            continue
        if _encode(vector) != vector["prompt"]:
            mismatches.append(index)
    assert mismatches == []


def test_sglang_renders_harness_conversations_as_the_reference_does_but_for_empty_invokes() -> None:
    # The prompts SGLang 0.5.23 builds for DeepSeek-V4 chat (deepseek-recipe 0.2.0) at its default effort:
    # the one difference is a zero-argument call in the history, where the reference leaves an empty line.
    vectors = _vectors("sglang-recipe-v4")
    assert len(vectors) >= 100
    identical = 0
    for vector in vectors:
        ours = _encode(vector)
        identical += ours == vector["prompt"]
        assert ours.replace('">\n\n</｜DSML｜invoke>', '">\n</｜DSML｜invoke>') == vector["prompt"]
    assert 0 < identical < len(vectors)


@pytest.mark.parametrize("fmt", ENCODER_FORMATS)
def test_the_vectors_cover_what_the_harness_sends(fmt: str) -> None:
    # Guards the fixture generator: a regeneration that lost a feature would make the identity test weaker.
    vectors = [v for v in _vectors(fmt) if "prompt" in v]
    messages = [m for v in vectors for m in v["messages"]]
    assert any(m["role"] == "tool" for m in messages)
    assert any(m.get("tool_calls") for m in messages)
    assert any(isinstance(c["function"]["arguments"], str) for m in messages for c in m.get("tool_calls") or [])
    assert any(v["tools"] for v in vectors)
    assert any(not v["options"]["thinking"] for v in vectors)
    assert any("context_len" in v["options"] for v in vectors)
    assert any("日本語" in v["prompt"] and "🚀" in v["prompt"] for v in vectors)


def test_a_turn_ends_where_the_model_starts_writing() -> None:
    prompt = encode_messages([{"role": "user", "content": "hi"}])
    assert prompt == "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>"
    assert encode_messages([{"role": "user", "content": "hi"}], thinking=False).endswith("<｜Assistant｜></think>")


def test_reasoning_content_counts_as_reasoning() -> None:
    turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "because"},
            {"role": "user", "content": "next"}]
    same = [{**turn[0]}, {"role": "assistant", "content": "a", "reasoning": "because"}, {**turn[2]}]
    for fmt in ENCODER_FORMATS:
        assert encode_messages(turn, fmt=fmt, drop_thinking=False) == encode_messages(same, fmt=fmt, drop_thinking=False)
    assert "because</think>a" in encode_messages(turn, drop_thinking=False)


def test_unknown_format_and_bad_effort_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown encoder format"):
        encode_messages([{"role": "user", "content": "x"}], fmt="v3")
    with pytest.raises(ValueError, match="effort"):
        encode_messages([{"role": "user", "content": "x"}], reasoning_effort="extreme")
