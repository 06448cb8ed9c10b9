"""The project's DeepSeek renderer and prompt encoder, byte for byte against DeepSeek's own (deepseek-recipe).

`dsml_checker` keeps its own renderer (a judge must not be the code under test); here it is held to the
package's `DeepseekV4Encoding` / `DeepseekV41Encoding` on generated conversations: the assistant turn
`render_completion` writes appears verbatim in the package's prompt, and `encode_messages` gives the
package's whole prompt. Skipped, loudly, where the package cannot be installed.

DeepSeek's encoders differ in one place: a V4 zero-argument invoke is `">\n\n</｜DSML｜invoke>` in the Python
reference (vendored by vLLM, tests/fixtures/encoders/) and `">\n</｜DSML｜invoke>` in deepseek-recipe's V4
encoding (its V4.1 encoding writes the blank line). The renderer follows the Python reference; the
comparison maps recipe's V4 spelling onto it and nothing else, and the checker accepts both
(test_a_zero_argument_invoke_in_either_spelling_is_clean).

A past call's arguments are re-serialised by recipe, which writes a float's exponent its own way; the
model's own output is not re-serialised, and `string="false"` values are judged as JSON, so the generated
floats here are those without an exponent (test_floats_with_exponents_are_respelt_by_recipe_only).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsml_checker import ToolCall, encode_messages, render_completion

recipe = pytest.importorskip("deepseek_recipe", reason="deepseek-recipe is not installed here: no reference encoder to compare with")

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ENCODINGS = {"v4": ("DeepSeek-V4-Pro", recipe.DeepseekV4Encoding()), "v41": ("DeepSeek-V4.1-Flash", recipe.DeepseekV41Encoding())}

# Printable text with the characters the format carries literally (quotes, <>&, newlines, CJK, RTL, emoji);
# no fullwidth bar (a value could spell a tag) and no control token spelling.
_TEXT = st.text(st.characters(exclude_categories=["Cs", "Cc", "Co", "Cn"], exclude_characters="｜|", include_characters='\n"<>&'),
                max_size=12)
_strings = _TEXT | st.sampled_from(["  padded  ", "ends with newline\n", '{"looks": "json"}', "123", "", "東京", "مرحبا", "🙂"])
_keys = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
# Floats whose shortest form has no exponent: recipe re-serialises a past call's arguments and writes exponents
# its own way (5.960464477539063e-8 for Python's e-08, 0.00001 for 1e-05); module docstring.
_floats = st.floats(allow_nan=False, allow_infinity=False).filter(lambda v: "e" not in repr(v))
_scalars = st.none() | st.booleans() | st.integers(-(10**12), 10**12) | _floats | _strings
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=3), max_leaves=6)
_calls = st.lists(st.builds(ToolCall, st.sampled_from(["get_weather", "read_file", "submit"]),
                            st.dictionaries(_keys, _values, max_size=4)), min_size=1, max_size=3)
_prose = st.lists(st.sampled_from(["Let", "me", "check", "天气", "🙂", '"q"', "a < b", "&", "\n", "done."]), max_size=6).map(" ".join)

TOOLS = [
    {"type": "function", "function": {"name": name, "description": f"The {name} tool.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    for name in ("get_weather", "read_file", "submit")
]


def _conversation(reasoning: str, content: str, calls: list[ToolCall]) -> list[dict[str, Any]]:
    listed = [{"id": f"c{i}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
              for i, c in enumerate(calls)]
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What now?"},
        {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": listed},
        *({"role": "tool", "tool_call_id": f"c{i}", "content": f"result {i}"} for i in range(len(calls))),
    ]


def _python_reference_spelling(prompt: str, fmt: str) -> str:
    """recipe's zero-argument invokes respelt as the Python reference writes them (module docstring)."""
    return prompt.replace('">\n</｜DSML｜invoke>', '">\n\n</｜DSML｜invoke>') if fmt == "v4" else prompt


def _theirs(fmt: str, messages: list[dict[str, Any]], effort: str) -> str:
    model, encoding = ENCODINGS[fmt]
    body = {"model": model, "messages": messages, "tools": TOOLS, "thinking": {"type": "enabled"}, "reasoning_effort": effort}
    conversation = recipe.ChatCompletionRequest(body).convert(recipe.ConversionOptions()).conversation
    return _python_reference_spelling(str(encoding.render_conversation(conversation).prompt), fmt)


@SETTINGS
@given(calls=_calls, content=_prose, reasoning=_prose.filter(str.strip), fmt=st.sampled_from(sorted(ENCODINGS)),
       effort=st.sampled_from(["high", "max"]))
def test_the_renderer_and_encoder_are_byte_identical_to_deepseeks(
    calls: list[ToolCall], content: str, reasoning: str, fmt: str, effort: str
) -> None:
    messages = _conversation(reasoning, content, calls)
    theirs = _theirs(fmt, messages, effort)
    turn = render_completion(reasoning=reasoning, content=content, calls=calls, fmt=fmt)
    assert "<｜Assistant｜><think>" + turn in theirs
    assert encode_messages(messages, tools=TOOLS, fmt=fmt, thinking=True, reasoning_effort=effort) == theirs


@pytest.mark.parametrize("fmt", sorted(ENCODINGS))
def test_a_zero_argument_invoke_in_either_spelling_is_clean(fmt: str) -> None:
    from dsml_checker import check_raw

    messages = _conversation("Plan.", "", [ToolCall("submit", {})])
    model, encoding = ENCODINGS[fmt]
    body = {"model": model, "messages": messages, "tools": TOOLS, "thinking": {"type": "enabled"}}
    prompt = str(encoding.render_conversation(recipe.ChatCompletionRequest(body).convert(recipe.ConversionOptions()).conversation).prompt)
    turn = prompt.split("<｜Assistant｜><think>")[1].split("<｜User｜>")[0]
    ours = render_completion(reasoning="Plan.", content="", calls=[ToolCall("submit", {})], fmt=fmt)
    assert (turn != ours) is (fmt == "v4") and _python_reference_spelling(turn, fmt) == ours
    for text in (turn, ours):
        assert check_raw(text, tools=TOOLS, fmt=fmt).label == "clean", text


def test_floats_with_exponents_are_respelt_by_recipe_only() -> None:
    messages = _conversation("Plan.", "", [ToolCall("get_weather", {"a": 1e-05, "b": 5.960464477539063e-08})])
    theirs = _theirs("v4", messages, "high")
    ours = encode_messages(messages, tools=TOOLS, fmt="v4", thinking=True, reasoning_effort="high")
    assert ">1e-05<" in ours and ">0.00001<" in theirs and ">5.960464477539063e-8<" in theirs
    assert ours.replace(">1e-05<", ">0.00001<").replace("e-08<", "e-8<") == theirs
