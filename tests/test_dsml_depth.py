"""Nesting past Python's recursion limit never escapes the checker (issue 11, item 1): `check()` and `check_raw()`
promise a verdict for any input, and json.loads raises RecursionError, not ValueError, on such text."""

from __future__ import annotations

from typing import Any

import pytest

from dsml_checker import DSMLParseError, check, check_raw, parse_calls, split_completion

BOMB = "[" * 100_000
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _call(arguments: Any, name: Any = "f") -> dict[str, Any]:
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}


def _nested(depth: int, leaf: Any = None) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "arguments", [BOMB, '{"a": ' + BOMB, BOMB + '"\\uff5cDSML\\uff5c"', '{"a": ' + "[" * 5000 + "]" * 5000 + "}"]
)
def test_argument_text_nested_too_deep_is_not_an_object(arguments: str) -> None:
    verdict = check({"content": None, "tool_calls": [_call(arguments)]}, finish_reason="tool_calls", tools=TOOLS)
    assert verdict.label == "corrupt"
    assert "args-not-object" in verdict.rules


def test_argument_bomb_with_raw_text_beside_it() -> None:
    raw = '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">' + "{" * 100_000 + "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    verdict = check({"tool_calls": [_call(BOMB)]}, finish_reason="tool_calls", tools=TOOLS, raw=raw)
    assert "args-not-object" in verdict.rules


@pytest.mark.parametrize(
    "message",
    [
        _nested(5000),
        {"tool_calls": _nested(5000)},
        {"tool_calls": [_nested(5000)]},
        {"tool_calls": [_call(_nested(5000, {}))]},
        {"tool_calls": [_call("{}", name=_nested(5000))]},
    ],
    ids=["message", "tool_calls", "call", "arguments-object", "name"],
)
def test_a_structure_nested_too_deep_is_a_message_shape_finding(message: Any) -> None:
    verdict = check(message, finish_reason="stop", tools=TOOLS)
    assert verdict.label == "corrupt"
    assert verdict.rules == ("message-shape",)
    assert "too deeply" in verdict.findings[0].excerpt


def test_a_schema_nested_too_deep_does_not_raise() -> None:
    schema: dict[str, Any] = {}
    for _ in range(5000):
        schema = {"type": "object", "properties": {"a": schema}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    assert check({"tool_calls": [_call("{}")]}, finish_reason="tool_calls", tools=tools).label == "corrupt"


@pytest.mark.parametrize(("fmt", "block"), [
    ("v4", '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="false">'
           + BOMB + "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"),
    ("v31", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>" + BOMB + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
])
def test_strict_parsing_reports_a_bomb_as_bad_json(fmt: str, block: str) -> None:
    with pytest.raises(DSMLParseError, match="nested too deeply"):
        parse_calls(block, mode="strict", fmt=fmt)
    verdict = check_raw("\n\n" + block, fmt=fmt)
    assert verdict.label == "corrupt" and "raw-param-json" in verdict.rules


def test_tolerant_parsing_keeps_a_bomb_as_text_like_sglang() -> None:
    block = (
        '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="false">'
        + BOMB + "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    )
    (call,) = split_completion(block).calls
    assert call.arguments == {"a": BOMB}
