"""Rendering and parsing DeepSeek tool-call markup: exact formats, strict and tolerant grammars, errors."""

from __future__ import annotations

import pytest

from dsml_checker import DSMLParseError, ToolCall, parse_calls, render_calls, render_completion, split_completion
from dsml_checker.formats import EOS, FORMATS

CALLS = [ToolCall("get_weather", {"city": "Paris", "days": 3}), ToolCall("get_weather", {"city": "Rome"})]

V4_EXPECTED = (
    "<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n"
    '<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Rome</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>"
)


def test_v4_rendering_matches_the_reference_example() -> None:
    assert render_calls(CALLS) == V4_EXPECTED


def test_v32_and_v41_differ_only_in_tag_names() -> None:
    assert render_calls(CALLS, "v32") == V4_EXPECTED.replace("tool_calls>", "function_calls>")
    v41 = render_calls(CALLS, "v41")
    assert v41.startswith("<｜DSML｜ calls>\n<｜DSML｜ invoke name=")
    assert '<｜DSML｜ parameter name="city" string="true">Paris</｜DSML｜ parameter>' in v41
    assert v41.endswith("</｜DSML｜ invoke>\n</｜DSML｜ calls>")


def test_v3_and_v31_special_token_renderings() -> None:
    assert render_calls(CALLS[:1], "v3") == (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        '```json\n{"city": "Paris", "days": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    )
    assert render_calls(CALLS, "v31") == (
        "<｜tool▁calls▁begin｜>"
        '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris", "days": 3}<｜tool▁call▁end｜>'
        '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Rome"}<｜tool▁call▁end｜>'
        "<｜tool▁calls▁end｜>"
    )


def test_values_string_true_raw_and_string_false_json() -> None:
    block = render_calls([ToolCall("f", {"s": 'a "b" <c> & d\ne', "n": None, "b": True, "o": {"k": [1, 2.5]}, "u": "東京"})])
    assert '<｜DSML｜parameter name="s" string="true">a "b" <c> & d\ne</｜DSML｜parameter>' in block
    assert '<｜DSML｜parameter name="n" string="false">null</｜DSML｜parameter>' in block
    assert '<｜DSML｜parameter name="b" string="false">true</｜DSML｜parameter>' in block
    assert '<｜DSML｜parameter name="o" string="false">{"k": [1, 2.5]}</｜DSML｜parameter>' in block
    assert "東京" in block


def test_zero_argument_invoke_has_an_empty_body() -> None:
    block = render_calls([ToolCall("submit", {})])
    assert block == '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="submit">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>'
    for mode in ("strict", "tolerant"):
        assert parse_calls(block, mode=mode) == [ToolCall("submit", {})]


def test_render_completion_is_the_raw_thinking_mode_text() -> None:
    text = render_completion(reasoning="I should look.", content="Let me check.", calls=CALLS)
    assert text == "I should look.</think>Let me check.\n\n" + V4_EXPECTED + EOS
    assert render_completion(reasoning=None, content="Hi.", calls=[]) == "Hi." + EOS


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["strict", "tolerant"])
def test_every_format_round_trips(fmt: str, mode: str) -> None:
    calls = [*CALLS, ToolCall("submit", {}), ToolCall("x.y-z", {"q": 'He said "hi" <b>&amp;\n', "l": [1, {"a": None}]})]
    assert parse_calls(render_calls(calls, fmt), mode=mode, fmt=fmt) == calls
    text = render_completion(reasoning="think", content="Preamble.", calls=calls, fmt=fmt)
    done = split_completion(text, mode=mode, fmt=fmt)
    assert (done.reasoning, done.content, done.calls) == ("think", "Preamble.", calls)
    assert done.block_span is not None
    assert text[done.block_span[0] : done.block_span[1]] == render_calls(calls, fmt)


def test_tolerant_mode_accepts_what_sglang_accepts() -> None:
    text = (
        "<｜DSML｜tool_calls>\n"
        '    <｜DSML｜invoke name="get_weather">\n'
        '        <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n\n'
        '        <｜DSML｜parameter name="days" string="false"> 3 </｜DSML｜parameter>\n'
        "    </｜DSML｜invoke>\n"
        '    <｜DSML｜invoke name="lookup">{"q": "SF", "n": 2}</｜DSML｜invoke>\n'
        '    <｜DSML｜invoke name="submit"/>\n'
        "</｜DSML｜tool_calls>\n"
    )
    assert parse_calls(text, mode="tolerant") == [
        ToolCall("get_weather", {"city": "Paris", "days": 3}),
        ToolCall("lookup", {"q": "SF", "n": 2}),
        ToolCall("submit", {}),
    ]
    with pytest.raises(DSMLParseError) as err:
        parse_calls(text, mode="strict")
    assert err.value.rule == "invoke-opener" and err.value.position == len("<｜DSML｜tool_calls>\n")


def test_tolerant_keeps_invalid_json_under_string_false_as_raw_string() -> None:
    text = V4_EXPECTED.replace('string="false">3<', 'string="false">three<')
    assert parse_calls(text, mode="tolerant")[0].arguments["days"] == "three"
    with pytest.raises(DSMLParseError) as err:
        parse_calls(text, mode="strict")
    assert err.value.rule == "param-json"
    assert err.value.position == V4_EXPECTED.index(">3<") + 1


BROKEN = [
    ("misspelled opener", V4_EXPECTED.replace("tool_calls>", "toolcalls>", 1), "block-opener", 0),
    ("bad string flag", V4_EXPECTED.replace('string="true"', 'string="invalid"', 1), "param-string-attr", None),
    ("truncated", V4_EXPECTED[:60], "truncated", None),
    ("duplicate parameter", V4_EXPECTED.replace('name="days"', 'name="city"'), "param-duplicate", None),
    ("unterminated parameter", V4_EXPECTED.replace("Rome</｜DSML｜parameter>", "Rome"), "param-unterminated", None),
    ("text after block", V4_EXPECTED + "\nmore", "trailing-text", len(V4_EXPECTED)),
    ("prose between invokes", V4_EXPECTED.replace("</｜DSML｜invoke>\n<", "</｜DSML｜invoke>\nhm\n<"), None, None),
    ("missing closer", V4_EXPECTED.replace("\n</｜DSML｜tool_calls>", ""), None, None),
    ("empty name", V4_EXPECTED.replace('name="get_weather"', 'name=""', 1), None, None),
]


@pytest.mark.parametrize(("label", "text", "rule", "position"), BROKEN, ids=[b[0] for b in BROKEN])
@pytest.mark.parametrize("mode", ["strict", "tolerant"])
def test_broken_blocks_raise_with_position_and_rule(mode: str, label: str, text: str, rule: str | None, position: int | None) -> None:
    with pytest.raises(DSMLParseError) as err:
        parse_calls(text, mode=mode)
    assert 0 <= err.value.position <= len(text)
    assert err.value.rule and err.value.rule in str(err.value)
    assert f"position {err.value.position}" in str(err.value)
    if mode == "strict" and rule is not None:
        assert err.value.rule == rule
        if position is not None:
            assert err.value.position == position


def test_split_completion_reports_positions_in_the_whole_text() -> None:
    text = "think</think>Pre.\n\n" + V4_EXPECTED.replace('string="true"', 'string="maybe"', 1) + EOS
    with pytest.raises(DSMLParseError) as err:
        split_completion(text)
    assert err.value.rule == "param-string-attr"
    assert text[err.value.position :].startswith("maybe")


def test_split_completion_without_block_or_think() -> None:
    done = split_completion("Just an answer." + EOS)
    assert (done.reasoning, done.content, done.calls, done.block_span) == (None, "Just an answer.", [], None)
    done = split_completion("r</think>" + "\n\n" + V4_EXPECTED + EOS, mode="strict")
    assert done.content == "" and done.calls == CALLS


def test_strict_split_needs_the_two_newline_start_marker() -> None:
    text = "r</think>Pre." + V4_EXPECTED + EOS
    assert split_completion(text, mode="strict").calls == []
    assert split_completion(text, mode="tolerant").calls == CALLS


def test_unknown_format_or_mode_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown DSML format"):
        render_calls(CALLS, "v9")
    with pytest.raises(ValueError, match="unknown parse mode"):
        parse_calls(V4_EXPECTED, mode="lenient")
