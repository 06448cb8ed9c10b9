"""Every checker rule: inputs that must fire it, and near misses that must not (docs/checker-rules.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dsml_checker import RULES, ToolCall, check, render_calls, render_completion
from dsml_checker.findings import Verdict
from dsml_checker.formats import EOS

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {"type": "function", "function": {"name": "submit", "parameters": {"type": "object", "properties": {}}}},
]
WEATHER, WEATHER_ROME = ToolCall("get_weather", {"city": "Paris", "days": 3}), ToolCall("get_weather", {"city": "Rome"})
BLOCK = render_calls([WEATHER])
RAW = render_completion(reasoning="I should look it up.", content="", calls=[WEATHER])
REASONING = "The user wants the weather in Paris; I already have the forecast data."
LONG_REASONING = " ".join(f"Step {i}: weigh option {i * 7 % 11} against the budget." for i in range(12))


def call(name: Any, args: Any, *, raw: bool = False) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": args if raw else json.dumps(args)}}


def judge(case: dict[str, Any]) -> Verdict:
    message = case.get("message", {})
    return check(
        message,
        finish_reason=case.get("finish_reason"),
        tools=case.get("tools", TOOLS),
        tool_choice=case.get("tool_choice"),
        raw=case.get("raw"),
    )


def text(content: str, **extra: Any) -> dict[str, Any]:
    return {"message": {"role": "assistant", "content": content}, **extra}


def calls(*entries: Any, content: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"message": {"role": "assistant", "content": content, "tool_calls": list(entries)}, **extra}


# rule -> (inputs that must fire it, near misses that must not)
CASES: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
    "sentinel": (
        [text("Let me check.\n\n" + BLOCK), text("x ｜DSML｜ y"), {"message": {"content": "", "reasoning_content": "a ｜DSML｜ b"}}],
        [text("the DSML format"), text("a ｜ DSM ｜ b"), text("Quoted: `<｜DSML｜invoke>` fine")],
    ),
    "sentinel-variant": (
        [text('<|DSML|invoke name="get_weather">'), text("<｜｜DSML｜｜tool_calls>"), text("< | DSML | tool_use>"),
         text("<‖DSML‖parameter"), text("<｜dsml｜invoca"), text('<｜DSLM｜invoke name="f">'), text("</|DMSL|tool_calls>"),
         # a bar dropped, or its bytes lost at a token boundary (U+FFFD or nothing), as a streaming detokeniser did
         text("Let me check.\n\n<DSML｜tool_calls>"), text("</｜DSMLinvoke>"), text('<\ufffdDSML｜invoke name="f">'),
         text("<｜DSML\ufffd\ufffdparameter"), text('<DSMLinvoke name="f">')],
        [text("|DSML| is a format name"), text("the dsml invoke step"), text("<｜DSML｜tool_calls>"),
         text("<|im_start|>tool"), text("a <|x|> b invoke"), text("the DSML invoke tag"), text("<DSML> is markup"),
         text("use <DSML-lite parameter files"), text("a <b>DSML</b> invoke"), text("DSML｜invoke without its bracket")],
    ),
    "wrapper-tag": (
        [text("<｜DSML｜tool_calls>"), text("<｜DSML｜toolcalls>\n"), text("</｜DSML｜function_calls>"), text("<｜DSML｜ calls>")],
        [text('<｜DSML｜invoke name="submit"/>')],
    ),
    "bare-invoke": (
        [text('Sure.\n<｜DSML｜invoke name="get_weather">\n</｜DSML｜invoke>'), text('<|DSML|invoke name="x">')],
        [text(BLOCK), text("</｜DSML｜invoke>")],
    ),
    "orphan-closer": (
        [calls(call("get_weather", {"city": "Rome"}), content="Done.</｜DSML｜invoke>", finish_reason="tool_calls"),
         text("x</｜DSML｜parameter>"), text(BLOCK + "\n</｜DSML｜tool_calls>")],
        [text(BLOCK)],
    ),
    "truncated-tag": (
        [text("Let me check.\n\n<｜DSML"), text("ok <｜DSML｜inv"), text('<｜DSML｜invoke name="ba'), text("text </｜DSML｜para"),
         text("ok <｜tool▁calls▁be"), text("done<｜end▁of▁sentence｜"), text("Hi <|")],
        [text("the prefix <｜DSM followed by prose"), text("3 < 5"), text("ends with a tag <b>")],
    ),
    "xml-tool-tags": (
        [text('<invoke name="get_weather">'), text("<function_calls>\n"), text("<function><name>get_weather</name>"),
         text('<parameter name="city" string="true">Paris</parameter>', tools=None)],
        [text('<invoke name="get_weather">', tools=None), text("an <invoke> is a word"), text('<parameter name="x">', tools=None)],
    ),
    "v3-special-tokens": (
        [text("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f"), text("<|tool_calls_begin|>"),
         text("x <｜tool▁sep｜> y")],
        [text("tool calls begin here"), text("<tool_calls_begin>")],
    ),
    "control-token-leak": (
        [text("done<｜end▁of▁sentence｜>"), text("<｜User｜>hi"), text("<｜Assistant｜>"), text("a</think>b"), text("<think>x"),
         {"message": {"content": "", "reasoning_content": "a</think>b"}}, text("call $TOOL_NAME with $PARAMETER_NAME"),
         text("<|end_of_sentence|>")],
        [text("the think tag"), text("costs $5"), text("$tool_name in bash"),
         {"message": {"content": "", "reasoning_content": "<think>plan"}}],
    ),
    "duplicated-output": (
        [text("The weather in Paris is sunny and warm today. " * 2),
         text("Intro <｜DSML｜invoke>\n" + "line one of the answer, long enough\nline two\n" * 2),
         text("A growing buffer re-sent by an old build. " + "A growing buffer re-sent by an old build. And more.")],
        [text("Short. Short."), text("The weather in Paris is sunny. The weather in Rome is cloudy and cold today."),
         text("0" * 200), text("ab" * 100), text("a header line here\nbody one\na header line here\nbody two, different\n"),
         text("Intro\n" + "a block repeated further in, without markup\n" * 2)],
    ),
    "message-shape": ([{"message": "not an object"}, {"message": None}], [text("hi")]),
    "tool-call-shape": (
        [{"message": {"content": None, "tool_calls": "x"}}, calls("junk"), calls({"id": "c", "function": None})],
        [calls(call("get_weather", {"city": "Paris"}))],
    ),
    "bad-tool-name": (
        [calls(call('get_weather">', {"city": "Paris"})), calls(call("get weather", {})), calls(call("", {})),
         calls(call(None, {})), calls(call("<｜DSML｜invoke", {}))],
        [calls(call("get_weather", {"city": "Paris"})), calls(call("ns.tool-1", {}), tools=None)],
    ),
    "unknown-tool": (
        [calls(call("get_forecast", {"city": "Paris"}))],
        [calls(call("get_forecast", {"city": "Paris"}), tools=None), calls(call("submit", {}))],
    ),
    "args-dsml": (
        [calls(call("get_weather", {"city": "Paris</｜DSML｜parameter"})),
         calls(call("get_weather", '{"city": "Paris</\\uff5cDSML\\uff5cparameter>"}', raw=True)),
         calls(call("get_weather", {"city": "<|DSML|invoke"}), tools=None),
         calls(call("get_weather", {"city": "Paris<｜tool▁call▁end｜>"})),
         calls(call("get_weather", {"city": "Paris<｜end▁of▁sentence｜>"})),
         calls(call("get_weather", '{"city": "Paris\\u003c\\uff5ctool\\u2581sep\\uff5c>"}', raw=True))],
        [calls(call("get_weather", {"city": "DSML town"})), calls(call("get_weather", {"city": "a | b < c"})),
         calls(call("get_weather", {"city": "caf\\u00e9"}))],
    ),
    "args-not-object": (
        [calls(call("get_weather", "[1, 2]", raw=True)), calls(call("get_weather", "{city: Paris}", raw=True)),
         calls(call("get_weather", '"Paris"', raw=True), tools=None), calls(call("get_weather", None, raw=True))],
        [calls(call("submit", "", raw=True)), calls(call("get_weather", {"city": "Paris"}, raw=True))],
    ),
    "ghost-call": (
        [calls(call("get_weather", {})), calls(call("get_weather", "", raw=True))],
        [calls(call("submit", {})), calls(call("get_weather", {}), tools=None)],
    ),
    "args-schema": (
        [calls(call("get_weather", {"city": 3})), calls(call("get_weather", {"city": "Paris", "days": 0})),
         calls(call("get_weather", {"city": "Paris", "extra": 1})), calls(call("get_weather", {"days": 2}))],
        [calls(call("get_weather", {"city": "Paris", "days": 2})), calls(call("get_weather", {"city": 3}), tools=None)],
    ),
    "finish-tool-calls-empty": (
        [text("Done.", finish_reason="tool_calls")],
        [calls(call("submit", {}), finish_reason="tool_calls"), text("Done.", finish_reason="stop")],
    ),
    "dsml-leak-finish": (
        [text("Let me check.\n\n" + BLOCK, finish_reason="stop"), text(BLOCK[:40], finish_reason="length"),
         {"message": {"content": "", "reasoning_content": BLOCK}, "finish_reason": "stop"}],
        [text("Let me check.\n\n" + BLOCK), text("fine", finish_reason="stop"),
         calls(call("get_weather", {"city": "Paris"}), content="x</｜DSML｜invoke>", finish_reason="stop")],
    ),
    "tool-choice-none": (
        [text(BLOCK, tool_choice="none"), calls(call("submit", {}), tool_choice="none")],
        [text("No tools needed.", tool_choice="none"), calls(call("submit", {}), tool_choice="auto")],
    ),
    "tool-choice-required": (
        [text("I will not call.", tool_choice="required"),
         text("Nope.", tool_choice={"type": "function", "function": {"name": "submit"}})],
        [calls(call("submit", {}), tool_choice="required"), text("fine", tool_choice="auto")],
    ),
    "tool-choice-mismatch": (
        [calls(call("get_weather", {"city": "Paris"}), tool_choice={"type": "function", "function": {"name": "submit"}})],
        [calls(call("submit", {}), tool_choice={"type": "function", "function": {"name": "submit"}})],
    ),
    "repetition-loop": (
        [text("The value is 1" + "0" * 80), text("and then " + "the " * 20 + "end"), calls(call("get_weather", {"city": "x" + "ab" * 40})),
         text("漢字" + "字" * 60)],
        [text("-" * 80), text("| a | b |\n" + "|---" * 20 + "|\n"), text("     " * 30 + "x"), text("1000 and 2000 and 3000")],
    ),
    "rare-chars": (
        [text("hello \ufffd\ufffd\ufffd world"), text("a\x00\x01\x02b"), text("x\ue000\ue001\ue002y")],
        [text("café naïve 東京 — “quotes”"), text("one \ufffd only"), text("tabs\tand\nnewlines\r\n")],
    ),
    "attr-damage": (
        [text('<｜DSML｜invoke name=“get_weather”>'), text('<｜DSML｜parameter name="city" string="invalid">x</｜DSML｜parameter>'),
         text('<｜DSML｜parameter name="city">x</｜DSML｜parameter>'), text("<｜DSML｜invoke name=get_weather>"),
         text('<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="true">1</｜DSML｜parameter>\n'
              '<｜DSML｜parameter name="a" string="true">2</｜DSML｜parameter>'),
         text('<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="true">1</｜DSML｜parameter>\nand then\n'
              '<｜DSML｜parameter name="b" string="true">2</｜DSML｜parameter>')],
        [text(BLOCK), text('<｜DSML｜invoke name="submit"/>')],
    ),
    "quoted-dsml": (
        [text("Use `<｜DSML｜invoke name=\"f\">` to call."), text("Example:\n```\n" + BLOCK + "\n```\nThat is all."),
         text("~~~xml\n" + BLOCK + "\n~~~"), text("Unclosed fence runs to the end:\n```\n" + BLOCK),
         text("Double ``a ` <｜DSML｜invoke> `` span")],
        [text("plain prose"), text("`code` only"), text("a lone ` then <｜DSML｜invoke name=\"f\">"),
         text("``mismatched` <｜DSML｜invoke>``` runs")],
    ),
    # what today's parsers make of damaged text
    "duplicate-call": (
        [calls(call("get_weather", {"city": "Paris"}), call("get_weather", {"city": "Paris"}), finish_reason="tool_calls"),
         calls(call("get_weather", {"city": "Paris", "days": 3}), call("submit", {}), call("get_weather", {"days": 3.0, "city": "Paris"}))],
        [calls(call("get_weather", {"city": "Paris"}), call("get_weather", {"city": "Rome"}), finish_reason="tool_calls"),
         calls(call("submit", {}), call("submit", {}), finish_reason="tool_calls"),
         calls(call("get_weather", {"city": "Paris", "days": 3}), call("get_weather", {"city": "Paris"}))],
    ),
    "reasoning-replayed": (
        [{"message": {"content": "It is sunny in Paris. " + REASONING, "reasoning_content": REASONING}, "finish_reason": "stop"},
         {"message": {"content": "Done." + LONG_REASONING[:230], "reasoning_content": LONG_REASONING}, "finish_reason": "length"}],
        [{"message": {"content": "I already have the forecast data: sunny.", "reasoning_content": REASONING}, "finish_reason": "stop"},
         {"message": {"content": "Say hello.", "reasoning_content": "Say hello."}, "finish_reason": "stop"},
         {"message": {"content": "Summary. " + LONG_REASONING[:150], "reasoning_content": LONG_REASONING}, "finish_reason": "stop"}],
    ),
    "bare-tool-tags": (
        [text('Calling now <parameter name="city">Paris</parameter>'), text("<invoke name='get_weather'>\n</invoke>"),
         {"message": {"content": "ok", "reasoning_content": '<parameter  name = "days">2</parameter>'}}],
        [text('```xml\n<parameter name="city">x</parameter>\n```'), text('<parameter name="color">red</parameter>'),
         {"message": {"content": '<parameter name="city">Paris</parameter>'}, "tools": None}, text("<parameters name='city'>")],
    ),
    "resent-prefix": (
        [text("Let me checkLet me check theLet me check the weather."), text("LetLet meLet me check the weather"),
         text("Hello there!Hello there! How are you?"), text("Let checkLet check")],
        [text("ha ha ha ha ha ha ha ha"), text("New York, New York is a song."), text("Tomorrow, and tomorrow, and tomorrow"),
         text("abab"), text("Bye bye!"), text("| col | col |\n|-----|-----|\n| 1 | 2 |\n" * 3), text("no no no, I said no")],
    ),
    "empty-turn": (
        [{"message": {"content": ""}, "finish_reason": "stop"}, {"message": {"content": None, "reasoning_content": "Thought."}, "finish_reason": "stop"},
         {"message": {"content": "  \n"}, "finish_reason": "stop"}],
        [{"message": {"content": ""}, "finish_reason": "length"}, calls(call("submit", {}), content="", finish_reason="tool_calls"),
         text("Done.", finish_reason="stop"), {"message": {"content": ""}}],
    ),
    "call-lost": (
        [text("Let me check.", finish_reason="stop", raw=RAW.replace('name="get_weather"', "name=“get_weather”")),
         calls(call("get_weather", {"city": "Paris", "days": 3}), content="Let me check.", finish_reason="tool_calls",
               raw=render_completion(reasoning="r", content="Let me check.", calls=[WEATHER, WEATHER_ROME]))],
        [calls(call("get_weather", {"city": "Paris", "days": 3}), content="Let me check.", raw=RAW.replace(EOS, "Let me check.\n\n" + BLOCK + EOS)),
         text("Use `<｜DSML｜invoke name=\"get_weather\">\n</｜DSML｜invoke>` to call it.", finish_reason="stop",
              raw="r</think>Use `<｜DSML｜invoke name=\"get_weather\">\n</｜DSML｜invoke>` to call it." + EOS),
         text("Let me check.", finish_reason="length", raw=RAW.removesuffix(EOS)[:-40])],
    ),
    "value-cut": (
        [calls(call("get_weather", {"city": "Pa", "days": 3}), finish_reason="tool_calls", raw=RAW.replace(">Paris<", ">Pa</｜DSML｜parameterris<")),
         calls(call("get_weather", {"city": "Par", "days": 3}), finish_reason="tool_calls", raw=RAW)],
        [calls(call("get_weather", {"city": " Paris\n", "days": 3}), finish_reason="tool_calls", raw=RAW.replace(">Paris<", "> Paris <")),
         calls(call("get_weather", {"city": "Rome", "days": 3}), finish_reason="tool_calls", raw=RAW),
         calls(call("get_weather", {"city": "Paris", "days": "3"}), finish_reason="tool_calls", raw=RAW)],
    ),
    "param-lost": (
        [calls(call("get_weather", {"city": "co"}), finish_reason="tool_calls", raw=RAW.replace(">Paris<", ">co</｜DSML｜parameterParis<")),
         calls(call("get_weather", {"city": "Paris"}), finish_reason="tool_calls", raw=RAW)],
        [calls(call("get_weather", {"city": " Paris ", "days": 3}), finish_reason="tool_calls", raw=RAW),
         calls(call("get_weather", {"city": "Paris", "days": 3}), finish_reason="tool_calls",
               raw=RAW.replace(BLOCK, BLOCK.split("\n")[0] + '\n<｜DSML｜invoke name="get_weather">{"city": "Paris", "days": 3}</｜DSML｜invoke>\n'
                               + BLOCK.split("\n")[-1]))],
    ),
}

FIRES = [(rule, i, case) for rule, (positive, _) in CASES.items() for i, case in enumerate(positive)]
MISSES = [(rule, i, case) for rule, (_, negative) in CASES.items() for i, case in enumerate(negative)]


def test_every_registered_rule_has_cases() -> None:
    assert set(CASES) == {rule for rule in RULES if not rule.startswith("raw-")}  # raw rules: test_dsml_raw.py
    for rule, (positive, negative) in CASES.items():
        assert positive and negative, rule


def test_registry_entries_are_well_formed() -> None:
    for rule, (severity, description) in RULES.items():
        assert rule == rule.lower() and " " not in rule and "_" not in rule
        assert severity in ("hard", "soft", "info") and RULES[rule].severity == severity
        assert description and "\n" not in description


@pytest.mark.parametrize(("rule", "index", "case"), FIRES, ids=[f"{r}-{i}" for r, i, _ in FIRES])
def test_rule_fires(rule: str, index: int, case: dict[str, Any]) -> None:
    verdict = judge(case)
    assert rule in verdict.rules, verdict.to_dict()
    severity = RULES[rule].severity
    assert all(f.severity == severity for f in verdict.findings if f.rule == rule)
    if severity == "hard":
        assert verdict.label == "corrupt"
    elif severity == "soft":
        assert verdict.label in ("suspect", "corrupt")


@pytest.mark.parametrize(("rule", "index", "case"), MISSES, ids=[f"{r}-{i}" for r, i, _ in MISSES])
def test_near_miss_does_not_fire(rule: str, index: int, case: dict[str, Any]) -> None:
    assert rule not in judge(case).rules, judge(case).to_dict()


TOLERATED_PROSE = [
    text("3 < 5 and 7 > 2, a <b>bold</b> word"),
    text("the prefix <｜DSM followed by prose"),
    text("Literal quotes \" and & and <angle> in prose"),
    calls(call("get_weather", {"city": 'Pa"r<i>s & co\nline two'}), finish_reason="tool_calls"),
    calls(call("submit", {}), call("submit", "", raw=True), finish_reason="tool_calls"),
    text("| col | col |\n|-----|-----|\n| 1 | 2 |\n" * 3),
]
TOLERATED_MARKUP = [
    BLOCK.replace("\n<", "\n    <"),
    BLOCK.replace("\n", "\n\n"),
    '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">{"city": "SF"}</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
    '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="submit"/>\n</｜DSML｜tool_calls>',
    render_calls([ToolCall("get_weather", {"city": 'a "quoted" <b> & c\nd'})]),
]


@pytest.mark.parametrize("case", TOLERATED_PROSE, ids=range(len(TOLERATED_PROSE)))
def test_tolerated_prose_and_calls_stay_clean(case: dict[str, Any]) -> None:
    verdict = judge(case)
    assert verdict.label == "clean" and not verdict.findings, verdict.to_dict()


@pytest.mark.parametrize("markup", TOLERATED_MARKUP, ids=range(len(TOLERATED_MARKUP)))
def test_tolerated_markup_shapes_add_no_damage_findings(markup: str) -> None:
    """Markup in content is a leak whatever its shape; a tolerated shape must not look damaged on top."""
    verdict = judge(text(markup))
    assert "sentinel" in verdict.rules
    assert not verdict.soft, verdict.to_dict()
    assert not {"orphan-closer", "bare-invoke", "truncated-tag"} & set(verdict.rules)


def test_finding_fields_locate_the_problem() -> None:
    content = "Let me check.\n\n" + BLOCK
    verdict = check({"content": content}, finish_reason="stop")
    sentinel = next(f for f in verdict.findings if f.rule == "sentinel")
    assert sentinel.field == "content"
    assert content[sentinel.start : sentinel.end] == "｜DSML｜"
    assert "｜DSML｜" in sentinel.excerpt
    assert sentinel.to_dict()["severity"] == "hard"
    assert verdict.to_dict()["label"] == "corrupt"
    assert {f["rule"] for f in verdict.to_dict()["findings"]} == set(verdict.rules)


def test_quoted_dsml_alone_is_clean_but_reported() -> None:
    verdict = check({"content": "Use `<｜DSML｜invoke name=\"f\">` to call."}, finish_reason="stop")
    assert verdict.label == "clean"
    assert verdict.rules == ("quoted-dsml",)
    assert verdict.findings[0].severity == "info"


def test_unquoted_markup_beside_quoted_markup_is_still_corrupt() -> None:
    verdict = check({"content": "Use `<｜DSML｜invoke>` like this: <｜DSML｜invoke name=\"f\">"}, finish_reason="stop")
    assert verdict.label == "corrupt"
    assert {"quoted-dsml", "sentinel"} <= set(verdict.rules)


def test_soft_findings_alone_make_a_suspect_turn() -> None:
    verdict = check({"content": "value " + "0" * 90}, finish_reason="stop")
    assert verdict.label == "suspect"
    assert verdict.soft and not verdict.hard


@pytest.mark.parametrize(
    "message",
    [{"content": 5}, {"content": [{"type": "text", "text": "<｜DSML｜invoke"}]}, {"tool_calls": [None, 3]}, {"reasoning": "a</think>b"}],
)
def test_odd_message_shapes_are_judged_not_raised(message: dict[str, Any]) -> None:
    verdict = check(message, finish_reason=7, tools=[None, {"function": "x"}], tool_choice=["odd"])
    assert verdict.label in ("clean", "corrupt", "suspect")


def test_text_parts_content_is_checked() -> None:
    verdict = check({"content": [{"type": "text", "text": "x <｜DSML｜invoke name=\"a\">"}]})
    assert "sentinel" in verdict.rules


@pytest.mark.parametrize(
    ("content", "label"),
    [
        (" ".join("`" * i for i in range(1, 400)) + " <｜DSML｜invoke", "corrupt"),
        ("".join(f"`<｜DSML｜invoke>` item {i}, " for i in range(5000)), "clean"),
        ("0" * 300_000, "suspect"),
        ('<｜DSML｜invoke name="x">\n' * 5000, "corrupt"),
        ("```\n" * 50_000, "suspect"),
        ("".join(f"line number {i} of the log\nfiller {i}\nline number {i} of the log\n" for i in range(5000)) + "<｜DSML｜", "corrupt"),
    ],
    ids=["backtick-runs", "many-quoted", "zeros", "many-invokes", "many-fences", "repeated-lines"],
)
def test_large_adversarial_inputs_are_judged(content: str, label: str) -> None:
    """Huge, repetitive model output must still get a verdict (the scans are near-linear, not quadratic)."""
    assert check({"content": content}, finish_reason="stop").label == label
