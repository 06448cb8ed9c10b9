"""Property tests: rendered calls parse back in both modes and pass as structured calls; corrupted markup is caught."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dsml_checker import DSMLParseError, ToolCall, check, parse_calls, render_calls, render_completion, split_completion
from dsml_checker.formats import DSML_FORMATS, SENTINEL, THINK_CLOSE, to_json
from dsml_checker.schema import json_equal

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Printable unicode plus the characters the format must carry literally; no fullwidth bar, which would let a
# value spell a tag, and short strings so that a value cannot form a 48-byte repetition loop.
_CHARS = st.characters(exclude_categories=["Cs", "Cc", "Co", "Cn"], exclude_characters="｜", include_characters='\n"<>&')
strings = st.text(_CHARS, max_size=10)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,15}", fullmatch=True)
keys = st.text(st.characters(exclude_categories=["Cs", "Cc", "Co", "Cn"], exclude_characters='｜"|‖'), min_size=1, max_size=8)
scalars = st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats(allow_nan=False, allow_infinity=False) | strings
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=6,
)
arguments = st.dictionaries(keys, json_values, max_size=4)
tool_calls = st.lists(st.builds(ToolCall, names, arguments), min_size=1, max_size=3)
dsml_formats = st.sampled_from(["v4", "v32", "v41"])
all_formats = st.sampled_from(["v4", "v32", "v41", "v3", "v31"])
prose = st.text(st.sampled_from(list("abcdefghij klmnop,.!?\n")), max_size=60)
# The sentinel with a bar dropped, or a bar's bytes lost at a token boundary (U+FFFD, or nothing at all).
LOST_BARS = ["DSML｜", "｜DSML", "\ufffdDSML｜", "｜DSML\ufffd", "\ufffd\ufffd\ufffdDSML｜", "DSML", "\ufffdDSML\ufffd"]


@SETTINGS
@given(calls=tool_calls, fmt=all_formats)
def test_rendered_calls_parse_back_in_both_modes(calls: list[ToolCall], fmt: str) -> None:
    block = render_calls(calls, fmt)
    assert parse_calls(block, mode="strict", fmt=fmt) == calls
    assert parse_calls(block, mode="tolerant", fmt=fmt) == calls


@SETTINGS
@given(calls=tool_calls, fmt=all_formats, reasoning=st.none() | prose, content=prose)
def test_rendered_completions_split_back(calls: list[ToolCall], fmt: str, reasoning: str | None, content: str) -> None:
    text = render_completion(reasoning=reasoning, content=content, calls=calls, fmt=fmt)
    # Without reasoning, a "</think>" spelt inside the block (a parameter name may hold one) reads as the end of
    # reasoning: the text itself cannot tell the two apart, so that case is no round trip.
    assume(reasoning is not None or THINK_CLOSE not in text)
    for mode in ("strict", "tolerant"):
        done = split_completion(text, mode=mode, fmt=fmt)
        assert (done.reasoning, done.content, done.calls) == (reasoning, content, calls)


def _tools_for(calls: list[ToolCall]) -> list[dict[str, Any]]:
    tools: dict[str, dict[str, Any]] = {}
    for call in calls:
        props = tools.setdefault(call.name, {"type": "object", "properties": {}, "required": []})
        for key in call.arguments:
            props["properties"][key] = {}
    return [{"type": "function", "function": {"name": name, "parameters": schema}} for name, schema in tools.items()]


def _structured(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [
        {"id": f"call_{i}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
        for i, c in enumerate(calls)
    ]


@SETTINGS
@given(calls=tool_calls, content=st.none() | prose, ascii_json=st.booleans())
def test_well_formed_calls_delivered_structured_are_clean(calls: list[ToolCall], content: str | None, ascii_json: bool) -> None:
    # The same call twice is a rule of its own (duplicate-call).
    assume(all(not a.arguments or not json_equal(a, b) for i, a in enumerate(calls) for b in calls[i + 1 :] if a.name == b.name))
    structured = _structured(calls)
    if ascii_json:
        for entry, call in zip(structured, calls):
            entry["function"]["arguments"] = json.dumps(call.arguments)
    message = {"role": "assistant", "content": content, "tool_calls": structured}
    verdict = check(message, finish_reason="tool_calls", tools=_tools_for(calls), tool_choice="auto")
    assert verdict.label == "clean", verdict.to_dict()


# ------------------------------------------------------------------------------------------ corruption operators

_PIECES = ("<｜DSML｜", "</｜DSML｜", "tool_calls", "function_calls", " calls", "invoke", "parameter", ">\n", 'name="', 'string="')


def _piece_spans(text: str) -> list[tuple[int, int]]:
    spans = []
    for piece in _PIECES:
        at = text.find(piece)
        while at >= 0:
            spans.append((at, at + len(piece)))
            at = text.find(piece, at + 1)
    return sorted(spans)


@st.composite
def corrupted(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A rendered block damaged by one operator, as the message a server would return after failing to parse it."""
    calls = draw(tool_calls)
    fmt = draw(dsml_formats)
    preamble = draw(prose)
    block = render_calls(calls, fmt)
    op = draw(st.sampled_from(["as-is", "drop", "duplicate", "misspell", "bar", "lost-bar", "truncate", "reasoning"]))
    if op in ("drop", "duplicate", "misspell"):
        start, end = draw(st.sampled_from(_piece_spans(block)))
        piece = block[start:end]
        if op == "drop":
            block = block[:start] + block[end:]
        elif op == "duplicate":
            block = block[:start] + piece + piece + block[end:]
        else:
            i = draw(st.integers(0, len(piece) - 1))
            block = block[:start] + piece[:i] + draw(st.sampled_from(["", "x", piece[i] * 2])) + piece[i + 1 :] + block[end:]
    elif op == "bar":
        block = block.replace("｜", draw(st.sampled_from(["|", "‖", "｜｜", "||", " | "])))
    elif op == "lost-bar":
        # Every sentinel loses a bar, or a bar's bytes at a token boundary: no canonical sentinel is left.
        block = block.replace(SENTINEL, draw(st.sampled_from(LOST_BARS)))
    elif op == "truncate":
        # Any cut after the first two characters of the opener (a bare "<" is ordinary prose).
        block = block[: draw(st.integers(2, len(block)))]
    if op == "reasoning":
        return op, {"role": "assistant", "content": preamble, "reasoning_content": "thinking\n\n" + block}
    return op, {"role": "assistant", "content": preamble + "\n\n" + block}


@SETTINGS
@given(case=corrupted(), finish=st.sampled_from([None, "stop", "length"]))
def test_corrupted_markup_in_text_is_always_flagged(case: tuple[str, dict[str, Any]], finish: str | None) -> None:
    op, message = case
    verdict = check(message, finish_reason=finish)
    assert verdict.label == "corrupt", (op, message, verdict.to_dict())


@SETTINGS
@given(calls=tool_calls, fmt=all_formats, data=st.data())
def test_truncating_special_token_blocks_is_flagged(calls: list[ToolCall], fmt: str, data: st.DataObject) -> None:
    block = render_calls(calls, fmt)
    cut = data.draw(st.integers(2, len(block)))
    assert check({"content": "Sure.\n\n" + block[:cut]}, finish_reason="length").label == "corrupt"


@SETTINGS
@given(calls=tool_calls, data=st.data())
def test_a_closer_injected_into_an_argument_is_flagged(calls: list[ToolCall], data: st.DataObject) -> None:
    structured = _structured(calls)
    target = data.draw(st.integers(0, len(calls) - 1))
    closer = data.draw(st.sampled_from(["</｜DSML｜parameter>", "</｜DSML｜invoke>", "</｜DSML｜tool_calls>", "</|DSML|parameter"]))
    key = data.draw(keys)
    value = data.draw(strings)
    cut = data.draw(st.integers(0, len(value)))
    args = dict(calls[target].arguments)
    args[key] = value[:cut] + closer + value[cut:]
    structured[target]["function"]["arguments"] = json.dumps(args, ensure_ascii=data.draw(st.booleans()))
    verdict = check({"content": None, "tool_calls": structured}, finish_reason="tool_calls")
    assert "args-dsml" in verdict.rules and verdict.label == "corrupt"


def _loosen(call: ToolCall, fmt: str, data: st.DataObject) -> str:
    """One invoke as SGLang also accepts it: JSON body, self-closing when empty, or parameters with loose blanks."""
    tags = DSML_FORMATS[fmt]
    pad = data.draw(st.sampled_from(["", " ", "  ", "\n", "\n\n    ", "\t"]))
    if not call.arguments and data.draw(st.booleans()):
        return f'{pad}{tags.invoke_open} name="{call.name}"{data.draw(st.sampled_from(["", " "]))}/>'
    if data.draw(st.booleans()):
        return f'{pad}{tags.invoke_open} name="{call.name}">{pad}{to_json(call.arguments)}{pad}{tags.invoke_close}'
    params = [
        f'{pad}{tags.param_open}  name="{key}" string="{"true" if isinstance(value, str) else "false"}" >'
        f"{value if isinstance(value, str) else to_json(value)}{tags.param_close}"
        for key, value in call.arguments.items()
    ]
    return f'{tags.invoke_open} name="{call.name}" >' + "\n".join(params) + f"{pad}\n{tags.invoke_close}"


@SETTINGS
@given(calls=tool_calls, fmt=dsml_formats, data=st.data())
def test_tolerant_mode_reads_the_shapes_sglang_accepts(calls: list[ToolCall], fmt: str, data: st.DataObject) -> None:
    tags = DSML_FORMATS[fmt]
    gap = data.draw(st.sampled_from(["\n", "\n\n", "\n  ", " "]))
    block = tags.opener + gap + gap.join(_loosen(c, fmt, data) for c in calls) + gap + tags.closer
    assert parse_calls(block, mode="tolerant", fmt=fmt) == calls
    try:
        strict = parse_calls(block, mode="strict", fmt=fmt)
    except DSMLParseError:
        return
    assert strict == calls  # loosened so little that the strict grammar still holds


_MENTIONS = ["DSML", "dsml", "DSML｜", "｜DSML", "\ufffdDSML", "<DSML>", "<b>DSML</b>", "<DSML-lite", "DSML-like"]
_WORDS = ["invoke", "parameter", "tool_calls", "calls", "tool", "the", "format", " ", "\n", "<", ">", "a < b", "&"]


@SETTINGS
@given(pieces=st.lists(st.sampled_from(_MENTIONS + _WORDS), max_size=12), head=prose)
def test_prose_naming_dsml_near_tag_words_is_not_a_lost_bar(pieces: list[str], head: str) -> None:
    """Clean look-alikes of a sentinel that lost a bar: DSML named in prose, beside the tag words, but never
    as a tag: no "<" right before it with a tag word right after."""
    text = head + " ".join(pieces)
    assert "sentinel-variant" not in check({"role": "assistant", "content": text}, finish_reason="stop").rules
