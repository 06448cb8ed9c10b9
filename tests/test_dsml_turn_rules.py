"""Property tests for the rules on what today's parsers produce: each damage is caught, its look-alikes stay clean."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dsml_checker import ToolCall, check, render_completion, split_completion
from dsml_checker.schema import json_equal

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Distinct words from disjoint vocabularies: no loop, no repeat, and no reasoning phrase in the answer by chance.
_ANSWER = ["The", "forecast", "for", "Paris", "is", "sunny,", "22°C.", "東京", "は", "晴れ", "🙂", "a < b", "&", '"ok"', "done.",
           "Next,", "I'll", "run", "tests", "now."]
_THOUGHT = ["user", "wants", "weather;", "should", "call", "tool", "first", "then", "summarise", "carefully", "考虑", "🤔", "maybe",
            "budget", "option", "seven", "weigh", "against", "plan:", "step"]
answers = st.lists(st.sampled_from(_ANSWER), unique=True, min_size=1, max_size=12).map(" ".join)
thoughts = st.lists(st.sampled_from(_THOUGHT), unique=True, min_size=8, max_size=20).map(" ".join)
names = st.from_regex(r"[a-z][a-z0-9_]{2,12}", fullmatch=True)
keys = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
values = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=8).filter(lambda s: "｜" not in s and "|" not in s),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=5,
)
calls_st = st.lists(st.builds(ToolCall, names, st.dictionaries(keys, values, max_size=4)), min_size=1, max_size=4)


def _distinct(calls: list[ToolCall]) -> bool:
    return all(not (a.name == b.name and json_equal(a.arguments, b.arguments)) for i, a in enumerate(calls) for b in calls[i + 1 :])


def structured(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [{"id": f"c{i}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for i, c in enumerate(calls)]


def tools_for(calls: list[ToolCall]) -> list[dict[str, Any]]:
    props: dict[str, dict[str, Any]] = {}
    for c in calls:
        props.setdefault(c.name, {}).update({k: {} for k in c.arguments})
    return [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": p}}} for n, p in props.items()]


def rules(message: dict[str, Any], **kw: Any) -> tuple[str, ...]:
    return check(message, **kw).rules


# ------------------------------------------------------------------------------------------ duplicate-call


@SETTINGS
@given(calls=calls_st, data=st.data())
def test_a_call_returned_twice_is_caught(calls: list[ToolCall], data: st.DataObject) -> None:
    # Zero-argument calls included: a re-sent block parsed twice duplicates them like any other.
    target = data.draw(st.sampled_from(calls))
    again = dict(reversed(list(target.arguments.items())))  # key order does not make it another call
    listed = structured(calls)
    listed.insert(data.draw(st.integers(0, len(listed))), structured([ToolCall(target.name, again)])[0])
    assert "duplicate-call" in rules({"content": None, "tool_calls": listed}, finish_reason="tool_calls")


@SETTINGS
@given(calls=calls_st)
def test_same_name_with_other_arguments_is_not_a_duplicate(calls: list[ToolCall]) -> None:
    assume(_distinct(calls))
    same_name = [ToolCall(calls[0].name, c.arguments) for c in calls]
    assume(_distinct(same_name))
    listed = structured(same_name) + structured([ToolCall("tick", {}), ToolCall("tock", {})])
    assert "duplicate-call" not in rules({"content": None, "tool_calls": listed}, finish_reason="tool_calls")


def test_a_zero_argument_call_returned_twice_is_a_duplicate() -> None:
    listed = structured([ToolCall("submit", {}), ToolCall("submit", {})])
    assert "duplicate-call" in rules({"content": None, "tool_calls": listed}, finish_reason="tool_calls")


# ------------------------------------------------------------------------------------------ reasoning-replayed


@SETTINGS
@given(answer=answers, thought=thoughts.filter(lambda t: len(t) >= 48), gap=st.sampled_from(["", " ", "\n\n"]))
def test_reasoning_replayed_into_the_content_is_caught(answer: str, thought: str, gap: str) -> None:
    message = {"content": answer + gap + thought, "reasoning_content": thought}
    assert "reasoning-replayed" in rules(message, finish_reason="stop")


@SETTINGS
@given(answer=answers, thought=thoughts, data=st.data())
def test_quoting_a_short_phrase_of_the_reasoning_stays_clean(answer: str, thought: str, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(thought) - 1))
    phrase = thought[start : start + data.draw(st.integers(1, 40))]
    message = {"content": f"{answer} ({phrase}) {answer}", "reasoning_content": thought}
    assert "reasoning-replayed" not in rules(message, finish_reason="stop")


# ------------------------------------------------------------------------------------------ bare-tool-tags


@SETTINGS
@given(calls=calls_st, answer=answers, data=st.data())
def test_bare_tags_naming_the_tools_are_caught(calls: list[ToolCall], answer: str, data: st.DataObject) -> None:
    call = data.draw(st.sampled_from(calls))
    quote = data.draw(st.sampled_from(['"', "'"]))
    if call.arguments and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(call.arguments)))
        tag = f"<parameter name={quote}{key}{quote}>x</parameter>"
    else:
        tag = f"<invoke name={quote}{call.name}{quote}>\n</invoke>"
    message = {"content": f"{answer}\n{tag}"}
    assert "bare-tool-tags" in rules(message, finish_reason="stop", tools=tools_for(calls))


@SETTINGS
@given(calls=calls_st, answer=answers, other=st.from_regex(r"[A-Z][A-Za-z]{2,8}", fullmatch=True), fence=st.booleans())
def test_xml_about_other_names_or_in_code_stays_clean(calls: list[ToolCall], answer: str, other: str, fence: bool) -> None:
    tag = f'<parameter name="{other}">x</parameter>' if not fence else f'```xml\n<invoke name="{calls[0].name}">\n```'
    message = {"content": f"{answer}\n{tag}"}
    assert "bare-tool-tags" not in rules(message, finish_reason="stop", tools=tools_for(calls))
    assert "bare-tool-tags" not in rules(message, finish_reason="stop")  # no tools offered


# ------------------------------------------------------------------------------------------ resent-prefix


@st.composite
def chunked(draw: st.DrawFn) -> list[str]:
    words = draw(st.lists(st.sampled_from(_ANSWER), unique=True, min_size=3, max_size=12))
    text = " ".join(words)
    cuts = sorted(draw(st.lists(st.integers(3, len(text) - 1), min_size=1, max_size=6, unique=True)))
    return [text[:cut] for cut in cuts] + [text]


@SETTINGS
@given(prefixes=chunked())
def test_a_growing_buffer_re_sent_is_caught(prefixes: list[str]) -> None:
    first = prefixes[0]
    assume(len(prefixes) >= 3 or (len(first) >= 12 and not first[-1].isspace()))
    assume(any(c.isalnum() for c in first))
    assert "resent-prefix" in rules({"content": "".join(prefixes)}, finish_reason="stop")


@SETTINGS
@given(answer=answers, word=st.sampled_from(_ANSWER), times=st.integers(2, 6))
def test_prose_with_repeated_words_stays_clean(answer: str, word: str, times: int) -> None:
    for content in (f"{answer} {' '.join([word] * times)} {answer}", f"{' '.join([word] * times)} {answer}", (word + " ") * times):
        assert "resent-prefix" not in rules({"content": content}, finish_reason="stop"), content


# ------------------------------------------------------------------------------------------ empty-turn


@SETTINGS
@given(blank=st.sampled_from(["", " ", "\n\n", None]), thought=st.none() | thoughts)
def test_an_empty_turn_is_caught(blank: str | None, thought: str | None) -> None:
    assert "empty-turn" in rules({"content": blank, "reasoning_content": thought}, finish_reason="stop")


@SETTINGS
@given(answer=answers, calls=calls_st, finish=st.sampled_from(["length", "tool_calls", None]))
def test_a_turn_with_something_in_it_or_cut_short_is_not_empty(answer: str, calls: list[ToolCall], finish: str | None) -> None:
    assert "empty-turn" not in rules({"content": answer}, finish_reason="stop")
    assert "empty-turn" not in rules({"content": "", "tool_calls": structured(calls)}, finish_reason="stop")
    assert "empty-turn" not in rules({"content": ""}, finish_reason=finish)


# ------------------------------------------------------------------------------------------ call-lost, param-lost


@SETTINGS
@given(calls=calls_st, answer=answers, strip=st.booleans())
def test_a_faithful_parse_loses_nothing(calls: list[ToolCall], answer: str, strip: bool) -> None:
    raw = render_completion(reasoning="thinking", content=answer, calls=calls)
    parsed = split_completion(raw, mode="strict").calls
    if strip:  # SGLang's detectors strip string values: the keys are all there
        parsed = [ToolCall(c.name, {k: v.strip() if isinstance(v, str) else v for k, v in c.arguments.items()}) for c in parsed]
    cross = {"call-lost", "param-lost", "value-cut"}
    found = rules({"content": answer, "tool_calls": structured(parsed)}, finish_reason="tool_calls", raw=raw)
    assert not cross & set(found), found
    # A block repeated whole, read once (the recipe reads the first block only): nothing lost either.
    twice = raw.replace("<｜end▁of▁sentence｜>", "") + raw.split("</think>", 1)[1]
    assert not cross & set(rules({"content": answer, "tool_calls": structured(parsed)}, raw=twice))


@SETTINGS
@given(calls=calls_st, answer=answers, data=st.data())
def test_a_dropped_call_is_caught(calls: list[ToolCall], answer: str, data: st.DataObject) -> None:
    assume(_distinct(calls))  # an invoke shown twice verbatim counts once (a repeated block)
    raw = render_completion(reasoning="thinking", content=answer, calls=calls)
    kept = list(calls)
    kept.pop(data.draw(st.integers(0, len(kept) - 1)))
    assert "call-lost" in rules({"content": answer, "tool_calls": structured(kept)}, finish_reason="tool_calls", raw=raw)


@SETTINGS
@given(calls=calls_st, answer=answers, data=st.data())
def test_a_dropped_parameter_is_caught(calls: list[ToolCall], answer: str, data: st.DataObject) -> None:
    with_args = [i for i, c in enumerate(calls) if c.arguments]
    assume(with_args and _distinct(calls))  # an invoke shown twice verbatim counts once (a repeated block)
    raw = render_completion(reasoning="thinking", content=answer, calls=calls)
    i = data.draw(st.sampled_from(with_args))
    key = data.draw(st.sampled_from(sorted(calls[i].arguments)))
    cut = list(calls)
    cut[i] = ToolCall(calls[i].name, {k: v for k, v in calls[i].arguments.items() if k != key})
    assert "param-lost" in rules({"content": answer, "tool_calls": structured(cut)}, finish_reason="tool_calls", raw=raw)


@SETTINGS
@given(calls=calls_st, answer=answers, data=st.data())
def test_a_value_cut_at_a_closer_inside_it_is_caught(calls: list[ToolCall], answer: str, data: st.DataObject) -> None:
    """The recipe ends a string value at a parameter closer inside it (closer_in_argument), keeping the head."""
    i = data.draw(st.integers(0, len(calls) - 1))
    key = data.draw(keys)
    value = data.draw(st.text(st.characters(exclude_categories=["Cs", "Cc", "Co", "Cn"], exclude_characters="｜|"), max_size=20)
                      .filter(lambda v: len(v.strip()) >= 2))
    calls = [*calls[:i], ToolCall(calls[i].name, {**calls[i].arguments, key: value}), *calls[i + 1 :]]
    assume(_distinct(calls))
    at = data.draw(st.integers(0, len(value.rstrip()) - 1))
    # A ">" right after would complete the closer: the raw text itself then ends the value there.
    assume(value[:at].strip() != value.strip() and not value[at:].startswith(">"))
    damaged = dict(calls[i].arguments)
    damaged[key] = value[:at] + "</｜DSML｜parameter" + value[at:]
    raw = render_completion(reasoning="thinking", content=answer, calls=[*calls[:i], ToolCall(calls[i].name, damaged), *calls[i + 1 :]])
    parsed = list(calls)
    parsed[i] = ToolCall(calls[i].name, {**calls[i].arguments, key: value[:at]})
    assert "value-cut" in rules({"content": answer, "tool_calls": structured(parsed)}, finish_reason="tool_calls", raw=raw)


@SETTINGS
@given(calls=calls_st, answer=answers, data=st.data())
def test_a_value_cut_at_a_whole_closer_inside_it_is_caught(calls: list[ToolCall], answer: str, data: st.DataObject) -> None:
    """A whole `</｜DSML｜parameter>` inside a string value (`Pa</｜DSML｜parameter>ris`) ends it on every parser; the
    raw text still shows the rest of the value before the parameter's own closer."""
    i = data.draw(st.integers(0, len(calls) - 1))
    key = data.draw(keys)
    value = data.draw(st.text(st.characters(exclude_categories=["Cs", "Cc", "Co", "Cn"], exclude_characters="｜|<>"),
                              min_size=2, max_size=20).filter(lambda v: len(v.strip()) >= 2))
    at = data.draw(st.integers(1, len(value.strip()) - 1))
    head, tail = value.strip()[:at], value.strip()[at:]
    damaged = {**calls[i].arguments, key: head + "</｜DSML｜parameter>" + tail}
    calls = [*calls[:i], ToolCall(calls[i].name, damaged), *calls[i + 1 :]]
    raw = render_completion(reasoning="thinking", content=answer, calls=calls)
    parsed = list(calls)
    parsed[i] = ToolCall(calls[i].name, {**calls[i].arguments, key: head})
    assume(_distinct(parsed))
    found = rules({"content": answer, "tool_calls": structured(parsed)}, finish_reason="tool_calls", raw=raw)
    assert "value-cut" in found


_MANY_CALLS = [{"function": {"name": "f", "arguments": json.dumps({"a": i})}} for i in range(5000)]
_MANY_INVOKES = "r</think>" + "".join(
    f'<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="false">{i}</｜DSML｜parameter>\n</｜DSML｜invoke>' for i in range(5000)
)


def test_large_adversarial_turns_are_judged() -> None:
    """Huge inputs for each new scan (quoted tags by the thousand, thousands of calls): near-linear, not quadratic."""
    tools = [{"type": "function", "function": {"name": "x", "parameters": {"type": "object", "properties": {"p": {}}}}}]
    assert "bare-tool-tags" not in check({"content": '`<invoke name="x">` ' * 20000}, tools=tools, finish_reason="stop").rules
    assert "duplicate-call" not in check({"content": None, "tool_calls": _MANY_CALLS}).rules
    assert check({"content": None, "tool_calls": _MANY_CALLS}, raw=_MANY_INVOKES).label == "clean"
    quoted_invokes = "r</think>" + "`a` " * 20000 + '`<｜DSML｜invoke name="x"/>` ' * 20000
    assert "call-lost" not in check({"content": "x"}, raw=quoted_invokes).rules
    assert "resent-prefix" not in check({"content": "ab" * 200_000}).rules
    assert "reasoning-replayed" in check({"content": "x" + "step one two. " * 20000, "reasoning_content": "step one two. " * 20000}).rules
