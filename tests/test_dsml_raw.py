"""check_raw: clean renders of DeepSeek's encoder are clean, every damage operator of the simulator is caught,
and each raw rule fires on its own shape while clean look-alikes stay clean."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dsml_checker import RULES, ToolCall, check, check_raw, render_completion
from dsml_checker.formats import EOS, SENTINEL, THINK_CLOSE
from repro.sim.corrupt import OPERATORS

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Words, not characters: distinct words cannot form a repetition loop or a repeated run, which are rules of
# their own. No word spells a tag, a token or the fullwidth bar; together they carry CJK, RTL, emoji, quotes,
# `<>&`, backticks and newlines.
_CONTENT_WORDS = ["Let", "me", "check", "the", "weather.", "天气", "很好", "مرحبا", "🙂", "🚀", '"quoted"', "it's", "3 < 5",
                  "a & b", "<b>bold</b>", "`code`", "line\n", "\n\n", "done!", "x > y", "Ünïcödé", "日本語"]
_REASONING_WORDS = ["I", "should", "look", "up", "both", "cities", "first;", "用户", "想要", "🤔", "'maybe'", "<", ">",
                    "&&", "then", "answer.\n", "Wait,", "no."]
contents = st.lists(st.sampled_from(_CONTENT_WORDS), unique=True, max_size=10).map(" ".join)
reasonings = st.none() | st.lists(st.sampled_from(_REASONING_WORDS), unique=True, min_size=1, max_size=10).map(" ".join)
_VALUE_CHARS = st.characters(exclude_categories=["Cs", "Cc", "Co", "Cn"], exclude_characters="｜|‖", include_characters='\n"<>&')
strings = st.text(_VALUE_CHARS, max_size=10) | st.sampled_from(["  padded  ", "ends with newline\n", '{"a": 1}', "[1, 2]", "", "東京",
                                                                 "🙂 emoji", "</b> & <i>"])
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,15}", fullmatch=True)
keys = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
scalars = st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats(allow_nan=False, allow_infinity=False) | strings
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3), max_leaves=6)
# Distinct names: the same call twice is a rule of its own.
tool_calls = st.lists(st.builds(ToolCall, names, st.dictionaries(keys, json_values, max_size=4)), max_size=3, unique_by=lambda c: c.name)
formats = st.sampled_from(["v4", "v32", "v41", "v3", "v31"])


def _type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object", type(None): "null"}[type(value)]


def tools_for(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": c.name, "parameters": {
            "type": "object", "properties": {k: {"type": _type(v)} for k, v in c.arguments.items()}, "required": list(c.arguments)}}}
        for c in calls
    ]


@st.composite
def turns(draw: st.DrawFn, *, thinking: bool | None = None) -> tuple[str | None, str, list[ToolCall]]:
    reasoning = draw(reasonings) if thinking is None else draw(reasonings.filter(lambda r: r is not None)) if thinking else None
    calls = draw(tool_calls)
    content = draw(contents if calls else contents.filter(str.strip))  # a turn with nothing in it is `empty-turn`
    return reasoning, content, calls


@SETTINGS
@given(turn=turns(), fmt=formats, eos=st.booleans(), choice=st.sampled_from([None, "auto", "required"]))
def test_every_clean_render_is_clean(turn: tuple[str | None, str, list[ToolCall]], fmt: str, eos: bool, choice: str | None) -> None:
    reasoning, content, calls = turn
    raw = render_completion(reasoning=reasoning, content=content, calls=calls, fmt=fmt)
    raw = raw if eos else raw.removesuffix(EOS)
    tool_choice = choice if calls or choice != "required" else None
    verdict = check_raw(raw, tools=tools_for(calls) or None, tool_choice=tool_choice, finish_reason="tool_calls" if calls else "stop", fmt=fmt)
    assert verdict.label == "clean" and not verdict.findings, (raw, verdict.to_dict())


@SETTINGS
@given(turn=turns(), fmt=formats, data=st.data())
def test_a_clean_render_cut_anywhere_by_length_is_clean(turn: tuple[str | None, str, list[ToolCall]], fmt: str, data: st.DataObject) -> None:
    reasoning, content, calls = turn
    raw = render_completion(reasoning=reasoning, content=content, calls=calls, fmt=fmt).removesuffix(EOS)
    cut = raw[: data.draw(st.integers(0, len(raw)))]
    verdict = check_raw(cut, tools=tools_for(calls) or None, tool_choice="required" if calls else None, finish_reason="length", fmt=fmt)
    assert verdict.label == "clean", (cut, verdict.to_dict())
    assert set(verdict.rules) <= {"raw-truncated"}


# The sentinel with a bar dropped, or a bar's bytes lost at a token boundary (U+FFFD, or nothing at all): what
# a real streaming detokeniser produced when a character was split across tokens.
LOST_BARS = ["DSML｜", "｜DSML", "\ufffdDSML｜", "｜DSML\ufffd", "\ufffd\ufffd\ufffdDSML｜", "DSML"]


@SETTINGS
@given(turn=turns(thinking=True), fmt=st.sampled_from(["v4", "v32", "v41"]), data=st.data())
def test_a_sentinel_that_lost_a_bar_is_flagged_raw_and_parsed(turn: tuple[str | None, str, list[ToolCall]], fmt: str,
                                                              data: st.DataObject) -> None:
    reasoning, content, calls = turn
    assume(calls)
    raw = render_completion(reasoning=reasoning, content=content, calls=calls, fmt=fmt)
    sites = [i for i in range(len(raw)) if raw.startswith(SENTINEL, i)]
    lost = data.draw(st.sampled_from(LOST_BARS))
    at = data.draw(st.sampled_from(sites))
    damaged = raw[:at] + lost + raw[at + len(SENTINEL) :]
    verdict = check_raw(damaged, tools=tools_for(calls), finish_reason="tool_calls", fmt=fmt)
    assert verdict.label == "corrupt", (damaged, verdict.to_dict())
    # Every sentinel damaged so: a server that read none of the markup returns it all as content.
    everywhere = raw.replace(SENTINEL, lost).partition(THINK_CLOSE)[2].removesuffix(EOS)
    parsed = check({"role": "assistant", "content": everywhere}, finish_reason="stop", tools=tools_for(calls))
    assert "sentinel-variant" in parsed.rules, (everywhere, parsed.to_dict())


def _damaged(raw: str, op: str, tool: str) -> str | None:
    reasoning, _, body = raw.partition(THINK_CLOSE)
    damaged = OPERATORS[op](reasoning, body.removesuffix(EOS), tool)
    return None if damaged is None or damaged == raw else damaged


def _undetectable(op: str, content: str, calls: list[ToolCall]) -> bool:
    """repeated_text on a short answer with no block, beyond resent-prefix's reach: "ok.ok." or "weather.weather."
    reads as prose (a doubled word is no evidence); two copies of several words from 8 characters, or of 12+
    characters glued, are caught."""
    several_words = len(content) >= 8 and len(content.split()) > 1
    glued = len(content) >= 12 and not content[-1].isspace()
    return op == "repeated_text" and not calls and not (several_words or glued)


@SETTINGS
@given(turn=turns(thinking=True), op=st.sampled_from(sorted(OPERATORS)), tool=names)
def test_every_damage_operator_is_caught(turn: tuple[str | None, str, list[ToolCall]], op: str, tool: str) -> None:
    reasoning, content, calls = turn
    raw = render_completion(reasoning=reasoning, content=content, calls=calls, fmt="v4")
    damaged = _damaged(raw, op, tool)
    assume(damaged is not None and not _undetectable(op, content, calls))
    verdict = check_raw(damaged, tools=tools_for(calls) or None, finish_reason="stop")
    assert verdict.label == "corrupt", (op, damaged, verdict.to_dict())
    assert any(rule.startswith("raw-") for rule in verdict.rules) or op in ("leaked_invoke", "repeated_text"), verdict.rules


def test_operator_catch_rate_over_sampled_renders() -> None:
    """The figure for the report: every applicable operator over 300 drawn turns, short repeats included."""
    caught: Counter[str] = Counter()
    applied: Counter[str] = Counter()

    @settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(turn=turns(thinking=True), tool=names)
    def sample(turn: tuple[str | None, str, list[ToolCall]], tool: str) -> None:
        reasoning, content, calls = turn
        raw = render_completion(reasoning=reasoning, content=content, calls=calls, fmt="v4")
        for op in OPERATORS:
            damaged = _damaged(raw, op, tool)
            if damaged is not None:
                applied[op] += 1
                caught[op] += check_raw(damaged, tools=tools_for(calls) or None, finish_reason="stop").label == "corrupt"

    sample()
    print({op: f"{caught[op]}/{applied[op]}" for op in sorted(applied)})
    missed = {op: applied[op] - caught[op] for op in applied if caught[op] < applied[op]}
    assert set(missed) <= {"repeated_text"}, missed


# ------------------------------------------------------------------------------------------ rule by rule

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "submit", "parameters": {"type": "object", "properties": {}}}},
]
CALL = ToolCall("get_weather", {"city": "Paris", "days": 3})
GOOD = render_completion(reasoning="I should look it up.", content="Let me check.", calls=[CALL])
HEAD, BLOCK = GOOD.removesuffix(EOS).split("\n\n", 1)
INVOKE = BLOCK.split("\n", 1)[1].rsplit("\n", 1)[0]
ANSWER = render_completion(reasoning="The user greets me.", content="Hello! How can I help?", calls=[])


def _raw(text: str, finish: str | None = "stop", **kw: Any) -> dict[str, Any]:
    return {"raw": text, "finish_reason": finish, **kw}


# rule -> (raw texts that must fire it, clean look-alikes that must not)
RAW_CASES: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
    "raw-eos-early": ([_raw(GOOD + "again"), _raw(ANSWER.replace(EOS, EOS + " Hello"))], [_raw(GOOD), _raw(GOOD.removesuffix(EOS))]),
    # A missing </think> is judged only when the request's thinking mode is known to be on.
    "raw-think-missing": (
        [_raw(ANSWER.split(THINK_CLOSE)[1], thinking=True), _raw(GOOD.replace(THINK_CLOSE, "\n"), thinking=True),
         _raw(GOOD.replace(THINK_CLOSE, ""), finish=None, thinking=True)],
        [_raw(ANSWER, thinking=True), _raw(ANSWER.split(THINK_CLOSE)[1]), _raw(ANSWER.split(THINK_CLOSE)[1], thinking=False),
         _raw("The user greets me and I", finish="length", thinking=True)],
    ),
    "raw-think-replayed": (
        [_raw(ANSWER.replace(EOS, THINK_CLOSE + "The user greets me." + EOS)), _raw(GOOD.replace(EOS, THINK_CLOSE + EOS)),
         _raw(ANSWER.replace("Hello!", "Use `</think>` to end."))],
        [_raw(render_completion(reasoning="r", content="ok", calls=[ToolCall("get_weather", {"city": "a</think>b"})]))],
    ),
    "raw-dsml-in-reasoning": (
        [_raw("I think.\n\n" + BLOCK + THINK_CLOSE + "Let me check." + EOS)],
        [_raw("Reasoning about `<｜DSML｜invoke>` syntax." + THINK_CLOSE + "Done." + EOS)],
    ),
    "raw-sentinel-garbled": (
        [_raw(GOOD.replace("｜DSML｜", "|DSML|")), _raw(GOOD.replace("｜DSML｜invoke", "｜｜DSML｜｜invoke", 1))],
        [_raw(GOOD), _raw(ANSWER.replace("Hello!", "Pipes | DSML | are fine in prose."))],
    ),
    "raw-opener-misspelled": (
        [_raw(GOOD.replace("<｜DSML｜tool_calls>", "<｜DSML｜toolcalls>")), _raw(GOOD.replace("tool_calls>\n", "tool_calls >\n", 1)),
         _raw(GOOD.replace("tool_calls>", "function_calls>"))],
        [_raw(GOOD), _raw(render_completion(reasoning="r", content="x", calls=[CALL], fmt="v32"), fmt="v32")],
    ),
    "raw-opener-missing": (
        [_raw(HEAD + "\n\n" + INVOKE + EOS)],
        [_raw(GOOD)],
    ),
    "raw-bare-invoke": (
        [_raw(ANSWER.replace(EOS, '\n\n<｜DSML｜invoke name="get_weather">' + EOS))],
        [_raw(ANSWER), _raw(ANSWER.replace("Hello!", 'Quote `<｜DSML｜invoke name="x">` here.'))],
    ),
    "raw-block-marker": (
        [_raw(GOOD.replace("check.\n\n<", "check.<")), _raw(GOOD.replace("check.\n\n<", "check.\n<"))],
        [_raw(GOOD), _raw(render_completion(reasoning="r", content="", calls=[CALL]))],
    ),
    "raw-block-unterminated": (
        [_raw(GOOD.removesuffix(EOS)[:-10]), _raw(GOOD.removesuffix(EOS)[:-30], None)],
        [_raw(GOOD.removesuffix(EOS)[:-10], "length")],
    ),
    "raw-text-after-block": (
        [_raw(GOOD.replace(EOS, "\nDone." + EOS)), _raw(GOOD.replace(EOS, "\n"))],
        [_raw(GOOD)],
    ),
    "raw-orphan-closer": (
        [_raw(GOOD.replace(EOS, "\n</｜DSML｜invoke>" + EOS)), _raw(GOOD.replace(EOS, "</｜DSML｜tool_calls>" + EOS))],
        [_raw(GOOD)],
    ),
    "raw-second-block": (
        [_raw(GOOD.replace(EOS, "Let me check.\n\n" + BLOCK + EOS)), _raw(GOOD.replace(EOS, "\n" + BLOCK + EOS))],
        [_raw(render_completion(reasoning="r", content="x", calls=[CALL, ToolCall("submit", {})]))],
    ),
    "raw-attr-quotes": (
        [_raw(GOOD.replace('name="get_weather"', "name=“get_weather”")), _raw(GOOD.replace('string="true"', "string=”true”"))],
        [_raw(render_completion(reasoning="r", content="“Quoted” prose", calls=[ToolCall("get_weather", {"city": "“Paris”"})]))],
    ),
    "raw-string-attr": (
        [_raw(GOOD.replace('string="true"', 'string="invalid"')), _raw(GOOD.replace(' string="true"', ""))],
        [_raw(GOOD)],
    ),
    "raw-param-json": (
        [_raw(GOOD.replace(">3<", ">three<"))],
        [_raw(render_completion(reasoning="r", content="x", calls=[ToolCall("get_weather", {"city": "three", "days": [1, {"a": None}]})]))],
    ),
    "raw-param-duplicate": (
        [_raw(GOOD.replace('name="days" string="false">3', 'name="city" string="false">3'))],
        [_raw(render_completion(reasoning="r", content="x", calls=[ToolCall("get_weather", {"city": "a"}), ToolCall("submit", {"city": "a"})]))],
    ),
    "raw-invoke-name": (
        [_raw(GOOD.replace('name="get_weather"', 'name=""'))],
        [_raw(GOOD)],
    ),
    "raw-closer-in-value": (
        [_raw(GOOD.replace(">Paris<", ">Pa</｜DSML｜parameterris<")), _raw(GOOD.replace(">Paris<", ">Pa</｜DSML｜parameter>ris<"))],
        [_raw(render_completion(reasoning="r", content="x", calls=[ToolCall("get_weather", {"city": "</parameter> & </b>"})]))],
    ),
    "raw-markup-in-value": (
        [_raw(GOOD.replace(">Paris<", ">Pa｜DSML｜ris<"))],
        [_raw(render_completion(reasoning="r", content="x", calls=[ToolCall("get_weather", {"city": "Pa|DSML|ris ｜ bar"})]))],
    ),
    "raw-tag-fragment": (
        [_raw(GOOD.replace(">Paris<", ">Pa<｜DSML｜invokeris<")), _raw(GOOD.replace("</｜DSML｜invoke>", "</｜DSML｜invok>"))],
        [_raw(GOOD)],
    ),
    "raw-tag-grammar": (
        [_raw(GOOD.replace("</｜DSML｜parameter>\n<", "</｜DSML｜parameter>\n\n<")), _raw(GOOD.replace('<｜DSML｜invoke name="', '<｜DSML｜invoke  name="')),
         _raw(GOOD.replace("<｜DSML｜tool_calls>\n<", "<｜DSML｜tool_calls>\n\n<")),
         # an attribute pasted into a parameter name, which deepseek-recipe reads to its first blank
         _raw(GOOD.replace('name="city"', 'name="c string=ity"')), _raw(GOOD.replace('name="days"', 'name="d xays"'))],
        [_raw(GOOD), _raw(render_completion(reasoning="r", content="x", calls=[ToolCall("submit", {})])),
         _raw(render_completion(reasoning="r", content="x", calls=[ToolCall("get_weather", {"city": "a b=c", "days": 1})]))],
    ),
    "raw-truncated": (
        [_raw(GOOD.removesuffix(EOS)[:-10], "length"), _raw(GOOD[:24], "length"), _raw(ANSWER[:-len(EOS) - 2] + "\n\n<｜DS", "length")],
        [_raw(GOOD, "length"), _raw(ANSWER.removesuffix(EOS), "length")],
    ),
}

RAW_RULES = {rule for rule in RULES if rule.startswith("raw-")}
FIRES = [(rule, i, case) for rule, (positive, _) in RAW_CASES.items() for i, case in enumerate(positive)]
MISSES = [(rule, i, case) for rule, (_, negative) in RAW_CASES.items() for i, case in enumerate(negative)]


def judge(case: dict[str, Any]) -> Any:
    return check_raw(case["raw"], tools=case.get("tools", TOOLS), tool_choice=case.get("tool_choice"),
                     finish_reason=case["finish_reason"], fmt=case.get("fmt", "v4"), thinking=case.get("thinking"))


def test_every_raw_rule_has_cases() -> None:
    assert set(RAW_CASES) == RAW_RULES
    for rule, (positive, negative) in RAW_CASES.items():
        assert positive and negative, rule


@pytest.mark.parametrize(("rule", "index", "case"), FIRES, ids=[f"{r}-{i}" for r, i, _ in FIRES])
def test_raw_rule_fires(rule: str, index: int, case: dict[str, Any]) -> None:
    verdict = judge(case)
    assert rule in verdict.rules, verdict.to_dict()
    assert verdict.label == ("corrupt" if RULES[rule].severity == "hard" else "clean"), verdict.to_dict()


@pytest.mark.parametrize(("rule", "index", "case"), MISSES, ids=[f"{r}-{i}" for r, i, _ in MISSES])
def test_raw_look_alike_does_not_fire(rule: str, index: int, case: dict[str, Any]) -> None:
    verdict = judge(case)
    assert rule not in verdict.rules, verdict.to_dict()


def test_the_parsed_calls_meet_the_tools_and_tool_choice() -> None:
    unknown = render_completion(reasoning="r", content="", calls=[ToolCall("get_time", {})])
    assert "unknown-tool" in check_raw(unknown, tools=TOOLS).rules
    ghost = render_completion(reasoning="r", content="", calls=[ToolCall("get_weather", {"days": 2})])
    assert "args-schema" in check_raw(ghost, tools=TOOLS).rules
    assert "tool-choice-none" in check_raw(GOOD, tools=TOOLS, tool_choice="none").rules
    assert "tool-choice-required" in check_raw(ANSWER, tools=TOOLS, tool_choice="required").rules
    assert check_raw(ANSWER[:20], tools=TOOLS, tool_choice="required", finish_reason="length").label == "clean"


def test_findings_point_into_the_raw_text() -> None:
    damaged = GOOD.replace(EOS, "\n</｜DSML｜invoke>" + EOS)
    finding = next(f for f in check_raw(damaged).findings if f.rule == "raw-orphan-closer")
    assert finding.field == "raw" and damaged[finding.start : finding.end].startswith("</｜DSML｜invoke>")
    assert json.loads(json.dumps(check_raw(damaged).to_dict()))["label"] == "corrupt"


@pytest.mark.parametrize("raw", [b"bytes", None, 3])
def test_a_non_text_raw_is_judged_not_raised(raw: Any) -> None:
    assert check_raw(raw).label == "corrupt"


def test_an_unknown_format_is_a_usage_error() -> None:
    with pytest.raises(ValueError, match="unknown DSML format"):
        check_raw(GOOD, fmt="v9")


@pytest.mark.parametrize(
    "raw",
    ["x" + "<｜DSML｜invoke name=\"a\">" * 20000, "a</think>" + "\n\n<｜DSML｜tool_calls>\n" + "</｜DSML｜" * 30000,
     "r</think>" + "</think>" * 30000, "<｜DSML｜" * 40000],
    ids=["invokes", "closers", "thinks", "sentinels"],
)
def test_large_adversarial_raw_texts_are_judged(raw: str) -> None:
    assert check_raw(raw, finish_reason="stop").label == "corrupt"


def test_the_rules_document_lists_every_rule() -> None:
    """docs/checker-rules.md is the users' copy of RULES: every rule with its severity, nothing stale."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "checker-rules.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(" `"): line.split("|")[2].strip() for line in doc.splitlines() if line.startswith("| `")}
    assert rows == {rule: severity for rule, (severity, _) in RULES.items()}
