"""Raw mode (`repro run --observe raw|parsed|both`): the generated text rebuilt and judged beside the parsed message.

Pure parts (repro.wire.rawtext) under hypothesis; the rest over real HTTP against the purpose-built servers of
tests/faulty_servers.py, whose raw modes know what they damaged: the truth is theirs, not the checker's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from faulty_servers import ORPHAN_CLOSER
from hypothesis import given
from hypothesis import strategies as st
from run_builders import make_run, run_main

from dsml_checker import ToolCall, render_completion
from dsml_checker.server_parsers import implementation
from repro.run.observe import ObservePlan, RenderError, judge, stated_thinking, text_request
from repro.wire.rawtext import CompletionText, GenerateText, LogprobText, RawText
from repro.store.records import FindingRecord, Manifest, ParserEffect, SessionRecord, TurnRecord, corrupt_seen
from repro.store.rundir import RunWriter, load_run

PRODUCTION_KEYS = {"model", "messages", "tools", "tool_choice", "max_tokens", "temperature", "stream", "stream_options"}


# ------------------------------------------------------------------------------------------------ pure


def _entries(data: bytes, cuts: list[int]) -> list[dict[str, Any]]:
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    pieces = [data[a:b] for a, b in zip(bounds, bounds[1:])]
    return [{"token": p.decode("utf-8", "replace"), "bytes": list(p)} for p in pieces]


@given(st.text(), st.lists(st.integers(min_value=0), max_size=20), st.integers(min_value=1, max_value=5))
def test_logprob_bytes_rebuild_the_text_wherever_tokens_cut_characters(
    text: str, cuts: list[int], per_chunk: int
) -> None:
    text = text.encode("utf-8", "replace").decode("utf-8")  # a model's text has no lone surrogates
    entries = _entries(text.encode(), cuts)
    collector = LogprobText()
    for at in range(0, len(entries), per_chunk):
        collector.add_chunk({"choices": [{"delta": {}, "logprobs": {"content": entries[at : at + per_chunk]}}]})
    collector.add_chunk({"choices": [], "usage": {"completion_tokens": len(entries)}})
    raw = collector.result({"content": text})
    assert raw.text == text
    assert raw.complete == bool(entries), raw.gap


def test_token_strings_are_used_when_an_entry_has_no_bytes() -> None:
    collector = LogprobText()
    collector.add_body(
        {
            "choices": [
                {
                    "message": {},
                    "logprobs": {
                        "content": [{"token": "Hel", "bytes": [72, 101, 108]}, {"token": "lo", "bytes": None}]
                    },
                }
            ]
        }
    )
    assert collector.result({"content": "Hello"}).text == "Hello"


@pytest.mark.parametrize(
    ("usage", "message", "gap"),
    [
        ({"completion_tokens": 5}, {"content": "ab"}, "logprobs for 2 of 5 generated tokens"),
        (None, {"content": "ab", "tool_calls": [{"function": {"name": "f"}}]}, "tool calls without their markup"),
    ],
)
def test_missing_tokens_make_the_text_incomplete(usage: Any, message: dict[str, Any], gap: str) -> None:
    collector = LogprobText()
    collector.add_chunk(
        {
            "choices": [{"logprobs": {"content": [{"token": "a", "bytes": [97]}, {"token": "b", "bytes": [98]}]}}],
            **({"usage": usage} if usage else {}),
        }
    )
    raw = collector.result(message)
    assert not raw.complete and raw.gap is not None and raw.gap.startswith(gap)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["token", "bytes", "content", "x"]), children, max_size=3)
    ),
    max_leaves=10,
)


@given(json_values)
def test_any_logprobs_value_is_classified_never_raised(value: Any) -> None:
    collector = LogprobText()
    collector.add_chunk({"choices": [{"delta": {}, "logprobs": value}]})
    collector.add_chunk({"choices": [{"delta": {}, "logprobs": {"content": value}}]})
    raw = collector.result({"content": "x"})
    assert isinstance(raw.text, str)
    assert raw.complete == (raw.gap is None)


@given(st.text(min_size=1), st.lists(st.integers(min_value=1), max_size=8))
def test_generate_text_is_the_same_cumulative_or_incremental(text: str, cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    cumulative, incremental = GenerateText(), GenerateText()
    for a, b in zip(bounds, bounds[1:]):
        cumulative.add_chunk({"text": text[:b], "meta_info": {"finish_reason": None}})
        incremental.add_chunk({"text": text[a:b], "meta_info": {"finish_reason": None}})
    if text[0] * 2 == text[:2]:
        return  # an incremental delta that repeats the whole text so far reads as cumulative: documented
    assert cumulative.result().text == text
    assert incremental.result().text == text


def test_completion_text_takes_deltas_finish_and_usage() -> None:
    collector = CompletionText()
    for piece in ("Plan.</think>", "Hi"):
        collector.add_chunk({"id": "c1", "choices": [{"text": piece, "finish_reason": None}]})
    collector.add_chunk({"id": "c1", "choices": [{"text": "", "finish_reason": "stop"}]})
    collector.add_chunk({"id": "c1", "choices": [], "usage": {"completion_tokens": 3}})
    assert (collector.result().text, collector.finish_reason, collector.usage, collector.problem()) == (
        "Plan.</think>Hi",
        "stop",
        {"completion_tokens": 3},
        None,
    )
    assert CompletionText().problem() is not None


# ------------------------------------------------------------------------------------------------ over HTTP


def _run(capsys: pytest.CaptureFixture[str], out: Path, url: str, *args: str) -> tuple[int, str]:
    code, _, err = run_main(
        capsys, "run", "--base-url", url, "--sessions", "3", "--turns", "5", "--out", str(out), *args
    )
    return code, err


def _summary(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_both_mode_counts_the_damage_the_parser_hid(
    faulty: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], stream: str
) -> None:
    code, err = _run(capsys, tmp_path / "run", f"{faulty}/lp-hide/v1", stream)
    assert code == 0, err
    run = load_run(tmp_path / "run")
    assert run.manifest.observe is not None
    assert (run.manifest.observe["mode"], run.manifest.observe["raw_source"]) == ("both", "logprobs")
    assert run.manifest.observe["probe"]["logprobs"] == "logprobs on every token, tool calls included"
    effect = _summary(tmp_path / "run")["parser_effect"]
    # The server damaged the first turn of every session, in its raw text only.
    assert effect["hidden_turns"] == effect["raw_corrupt_turns"] == 3 and effect["parsed_corrupt_turns"] == 0
    assert effect["hidden_sessions"] == 3 and effect["made_turns"] == 0
    for session in run.sessions:
        first = session.turns[0]
        assert (session.outcome, session.corrupt_seen, session.parser_effect) == ("corrupt", "raw", "hidden")
        assert (first.verdict, first.parsed_verdict, first.raw_verdict, first.raw_complete) == (
            "corrupt",
            "clean",
            "corrupt",
            True,
        )
        assert first.raw_findings and first.raw_findings[0].field == "raw"
        assert first.raw_text_path is not None
        assert (tmp_path / "run" / first.raw_text_path).read_text().count(ORPHAN_CLOSER) == 2
        assert all(t.verdict == t.raw_verdict == t.parsed_verdict == "clean" for t in session.turns[1:])


def test_made_damage_is_a_parser_bug_and_raw_mode_does_not_count_it(
    faulty: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(capsys, tmp_path / "both", f"{faulty}/lp-made/v1")
    assert code == 0, err
    effect = _summary(tmp_path / "both")["parser_effect"]
    assert (effect["made_turns"], effect["made_sessions"], effect["hidden_turns"]) == (3, 3, 0)
    assert {s.outcome for s in load_run(tmp_path / "both").sessions} == {"corrupt"}
    code, err = _run(capsys, tmp_path / "raw", f"{faulty}/lp-made/v1", "--observe", "raw")
    assert code == 0, err
    run = load_run(tmp_path / "raw")
    assert {s.outcome for s in run.sessions} == {"clean"}
    assert all(s.turns[0].parsed_verdict == "corrupt" and s.turns[0].raw_verdict == "clean" for s in run.sessions)
    assert _summary(tmp_path / "raw")["observe"] == "raw"


def _received(faulty: str, mode: str) -> list[dict[str, Any]]:
    return httpx.get(f"{faulty}/{mode}/received").json()


def test_parsed_mode_sends_exactly_the_production_requests(
    faulty: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(capsys, tmp_path / "run", f"{faulty}/lp~parsed/v1", "--observe", "parsed")
    assert code == 0, err
    bodies = _received(faulty, "lp~parsed")
    turns = sum(len(s.turns) for s in load_run(tmp_path / "run").sessions)
    assert len(bodies) == turns  # no probe request either
    assert all(set(body) == PRODUCTION_KEYS for body in bodies)
    manifest = load_run(tmp_path / "run").manifest
    assert manifest.observe is not None and manifest.observe["mode"] == "parsed" and manifest.observe["probe"] == {}
    assert _summary(tmp_path / "run")["parser_effect"] is None


def test_both_mode_adds_only_the_logprob_fields(
    faulty: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(capsys, tmp_path / "run", f"{faulty}/lp~both/v1")
    assert code == 0, err
    bodies = _received(faulty, "lp~both")
    turns = sum(len(s.turns) for s in load_run(tmp_path / "run").sessions)
    assert len(bodies) == turns + 1  # the capability probe
    assert all(set(body) == PRODUCTION_KEYS | {"logprobs", "top_logprobs"} for body in bodies)
    assert all(body["logprobs"] is True and body["top_logprobs"] == 0 for body in bodies)


def test_a_target_without_raw_text(faulty: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, tmp_path / "raw", f"{faulty}/good/v1", "--observe", "raw")
    assert code == 2
    assert err.startswith("repro: error: --observe raw: the target shows no raw text") and err.count("\n") == 1
    assert not (tmp_path / "raw").exists()
    code, err = _run(capsys, tmp_path / "default", f"{faulty}/good/v1")
    assert code == 0, err
    manifest = load_run(tmp_path / "default").manifest
    assert manifest.observe is not None and manifest.observe["mode"] == "parsed"
    assert manifest.observe["warnings"] and "only parsed messages are judged" in manifest.observe["warnings"][0]
    assert _summary(tmp_path / "default")["observe"] == "parsed"


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_garbage_logprobs_are_classified_never_crash_the_run(
    faulty: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], stream: str
) -> None:
    code, err = _run(capsys, tmp_path / "run", f"{faulty}/lp-garbage/v1", stream)
    assert code == 0, err
    run = load_run(tmp_path / "run")
    assert {s.outcome for s in run.sessions} == {"clean"}
    later = [t for s in run.sessions for t in s.turns[1:]]
    assert later and all(t.raw_complete is False and t.raw_verdict is None and t.verdict == "clean" for t in later)
    assert all(t.raw_gap and "malformed" in t.raw_gap for t in later)
    assert _summary(tmp_path / "run")["parser_effect"]["raw_incomplete_turns"] == len(later)


@pytest.mark.parametrize(
    ("mode", "args", "source"),
    [
        ("lp-notools~a", [], "completions"),
        ("text~b", ["--raw-endpoint", "generate"], "generate"),
        ("text~c", ["--no-stream"], "completions"),
    ],
)
def test_without_tool_call_logprobs_the_raw_text_comes_from_a_raw_endpoint(
    faulty: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str, args: list[str], source: str
) -> None:
    code, err = _run(capsys, tmp_path / "run", f"{faulty}/{mode}/v1", *args)
    assert code == 0, err
    run = load_run(tmp_path / "run")
    observe = run.manifest.observe
    assert observe is not None and (observe["mode"], observe["raw_source"], observe["client_parser"]) == (
        "both",
        source,
        "sglang-0.5.23",
    )
    assert "run client-side" in observe["parsed_verdict_on"]
    assert observe["client_parser_implementation"] == implementation("sglang-0.5.23")
    if mode.startswith("lp-notools"):
        assert observe["probe"]["logprobs"].startswith("incomplete: ")
    # The session loop went on with the calls parsed client-side, to the final answer.
    for session in run.sessions:
        assert (session.outcome, session.finished) == ("clean", True)
        assert [t.tool_calls for t in session.turns] == [["read_file"]] * 3 + [[]]
        assert all(t.raw_source == source and t.raw_complete and t.raw_verdict == "clean" for t in session.turns)
        assert session.turns[0].finish_reason == "tool_calls" and session.turns[-1].finish_reason == "stop"
    prompt_key = "text" if source == "generate" else "prompt"
    bodies = [b for b in _received(faulty, mode) if prompt_key in b][1:]  # after the probe's
    assert len(bodies) == sum(len(s.turns) for s in run.sessions)
    assert all(b[prompt_key].endswith("<｜Assistant｜><think>") and "messages" not in b for b in bodies)
    assert not bodies[0][prompt_key].startswith("<｜begin▁of▁sentence｜>")


EXTRA = {"regex": "(Looking|Done)\\.", "top_k": 5}


@pytest.mark.parametrize(
    ("mode", "args"),
    [
        ("lp~x", ["--observe", "parsed"]),
        ("lp~y", []),
        ("text~x", ["--raw-endpoint", "completions"]),
        ("text~y", ["--raw-endpoint", "completions", "--no-stream"]),
        ("text~z", ["--raw-endpoint", "generate"]),
    ],
)
def test_every_request_path_carries_the_extra_body(
    faulty: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str, args: list[str]
) -> None:
    code, err = _run(capsys, tmp_path / "run", f"{faulty}/{mode}/v1", "--extra-body", json.dumps(EXTRA), *args)
    assert code == 0, err
    bodies = _received(faulty, mode)
    assert bodies
    for body in bodies:  # the probes' requests too
        if "text" in body:  # SGLang's /generate: every sampling field in sampling_params
            assert {key: body["sampling_params"].get(key) for key in EXTRA} == EXTRA, body
            assert body["sampling_params"]["max_new_tokens"] and "max_tokens" not in body["sampling_params"]
        else:
            assert {key: body.get(key) for key in EXTRA} == EXTRA, body
    if "--raw-endpoint" in args:
        assert any("prompt" in body or "text" in body for body in bodies)


def _faults(sim_url: str) -> list[dict[str, Any]]:
    return httpx.get(f"{sim_url.removesuffix('/v1')}/debug/faults").json()["faults"]


@pytest.mark.parametrize("coverage", ["full", "no-tool-calls"])
def test_raw_verdicts_agree_with_the_simulators_fault_log(
    sim_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], coverage: str
) -> None:
    # On the virtual clock: the faults to compare are the seed's, at any machine load.
    sim = sim_server("--enable-hierarchical-cache", "--index-k-dtype", "bf16", "--logprobs-coverage", coverage,
                     "--clock", "virtual")
    code, _, err = run_main(
        capsys, "run", "--base-url", sim.base_url, "--sessions", "60", "--turns", "8", "--out", str(tmp_path / "run")
    )
    assert code == 0, err
    run = load_run(tmp_path / "run")
    assert run.manifest.observe is not None
    assert run.manifest.observe["raw_source"] == ("logprobs" if coverage == "full" else "completions")
    faults = _faults(sim.base_url)
    assert faults, "the simulator injected no fault: nothing to compare"
    turns = {t.request_id: t for s in run.sessions for t in s.turns if t.status == "ok"}
    # A damaged call the parser returned cannot be rendered into the next prompt: that session ends there,
    # corrupt (its evidence came first).
    for session in run.sessions:
        for turn in session.turns:
            assert (
                turn.status == "ok" or (turn.error or "").startswith("cannot render") and session.outcome == "corrupt"
            )
    # The simulator's log is the truth: every fault it injected shows in the raw text, nothing else does.
    assert {rid for rid, t in turns.items() if t.raw_verdict == "corrupt"} == {f["request_id"] for f in faults}
    # A fault the simulator's parser absorbed (its output identical to the undamaged text's) was hidden.
    absorbed = [f["request_id"] for f in faults if f["parser_effect"] == "absorbed"]
    assert all(turns[rid].parser_effect == "hidden" for rid in absorbed)
    effect = _summary(tmp_path / "run")["parser_effect"]
    assert effect["hidden_turns"] >= len(absorbed) and effect["raw_corrupt_turns"] == len(faults)
    assert len(turns) > 2 * len(run.sessions)  # the loop went on with the parsed calls


# ------------------------------------------------------------------------------------------------ records and report

HOSTILE = "<script>alert(1)</script>"


def _hidden_run(path: Path) -> Path:
    """A run directory of one session whose first turn's raw text (hostile markup in it) was corrupt and parsed clean."""
    writer = RunWriter(path)
    writer.write_manifest(
        Manifest(
            name="raw",
            run_id="raw-id",
            command=["repro", "run"],
            options={},
            workload={"name": "w"},
            target={"base_url": "http://127.0.0.1:9/v1", "model": "m", "embedded": False},
            observe={"mode": "both", "raw_source": "logprobs"},
            started_at="2026-12-01T10:00:00Z",
        )
    )
    text = f"Plan {HOSTILE}</think>Looking.\n\n<｜DSML｜tool_calls>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    at = text.index("</｜DSML｜invoke>")
    turns = [
        TurnRecord(
            index=0,
            status="ok",
            verdict="corrupt",
            parsed_verdict="clean",
            raw_verdict="corrupt",
            raw_source="logprobs",
            raw_complete=True,
            start_s=0.0,
            request_id="req-0",
            raw_path=writer.write_raw(0, 0, b'{"choices": [{"message": {"content": "Looking."}}]}', suffix="json"),
            raw_text_path=writer.write_raw(0, 0, text.encode(), suffix="txt"),
            raw_findings=[
                FindingRecord(
                    rule="raw-orphan-closer",
                    field="raw",
                    start=at,
                    end=at + len("</｜DSML｜invoke>"),
                    excerpt=text[at : at + 15],
                    severity="hard",
                ),
                # On the faithful parse's content ("Looking."): placed in the raw text by its excerpt.
                FindingRecord(rule="wrapper-tag", field="content", start=0, end=7, excerpt="Looking.", severity="hard"),
            ],
        ),
        TurnRecord(
            index=1,
            status="ok",
            verdict="clean",
            parsed_verdict="clean",
            raw_complete=False,
            raw_gap=f"no logprobs {HOSTILE}",
            raw_source="logprobs",
            start_s=1.0,
        ),
    ]
    writer.append_session(
        SessionRecord(
            session_id=0,
            task=f"task {HOSTILE}",
            outcome="corrupt",
            start_s=0.0,
            end_s=2.0,
            turns=turns,
            first_corrupt_turn=0,
            rules=["raw-orphan-closer"],
            corrupt_seen=corrupt_seen(turns),
        )
    )
    writer.close()
    return path


def test_the_report_shows_both_verdicts_and_the_hidden_share_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _hidden_run(tmp_path / "run")
    code, _, err = run_main(capsys, "report", str(run), "--markdown", str(tmp_path / "r.md"))
    assert code == 0, err
    html = (run / "report.html").read_text()
    assert HOSTILE not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "hidden by the server&#39;s parser" in html or "hidden by the server's parser" in html
    assert "parsed message: clean · raw text (logprobs): corrupt" in html
    assert "<mark>&lt;/｜DSML｜invoke&gt;</mark>" in html  # the raw finding, cut out of the rebuilt text
    assert "The server&#39;s parser hid the damage of 1 of 1 sessions" in html
    markdown = (tmp_path / "r.md").read_text()
    assert "| both | 1/1 = 100% | 0/0 = — |" in markdown and "<script" not in markdown


def test_a_corrupt_turn_shows_raw_text_and_parsed_message_side_by_side(tmp_path: Path) -> None:
    from repro.report import render_report

    run = _hidden_run(tmp_path / "run")
    html = render_report([run], tmp_path / "report.html").html.read_text(encoding="utf-8")
    assert html.count('<div class="side-by-side">') == 1  # the corrupt turn only
    side = html[html.index('<div class="side-by-side">'):html.index('class="muted legend"')]
    raw, parsed = side.split("Parsed message: what the server's parser returned")
    # The raw column: the rebuilt text, what the parser hid marked as such, the hostile text escaped.
    assert "marked spans hidden by the server's parser" in raw
    assert '<mark class="hidden" title="raw-orphan-closer">&lt;/｜DSML｜invoke&gt;</mark>' in raw
    assert '<mark class="hidden" title="wrapper-tag">Looking</mark>' in raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in raw and HOSTILE not in html
    # The parsed column: the message the server returned, field by field, and nothing of the raw markup.
    assert "<code>content</code></p><pre class=\"marked\">Looking.</pre>" in parsed and "DSML" not in parsed
    # The file is linked: no finding may say it is missing.
    assert "not on disk" not in html and "raw/s0000-t00.txt" in html
    assert "hard in the raw text (<code>content</code> of a faithful parse of it)</p>" in html
    # DSML's fullwidth bars carry their own font, allowed by the page's policy.
    assert "unicode-range: U+FF5C" in html and "font-src data:;" in html


def test_run_directories_from_before_raw_mode_still_load(tmp_path: Path) -> None:
    path = make_run(tmp_path / "old", clean=2, corrupt=1)
    lines = (path / "sessions.jsonl").read_text().splitlines()
    old = [json.loads(line) for line in lines]
    for session in old:  # as an older repro wrote them: none of raw mode's fields
        session.pop("corrupt_seen", None)
        for turn in session["turns"]:
            for key in [k for k in turn if k.startswith("raw_") and k != "raw_path" or k == "parsed_verdict"]:
                turn.pop(key)
    (path / "sessions.jsonl").write_text("".join(json.dumps(s) + "\n" for s in old))
    run = load_run(path)
    assert [s.corrupt_seen for s in run.sessions] == [None] * 3
    assert all(t.parser_effect is None and t.raw_findings == [] for s in run.sessions for t in s.turns)
    assert run.summary is not None and run.summary.observe is None and run.summary.parser_effect is None
    assert run.manifest.observe is None
    effect = ParserEffect.of(run.sessions)
    assert (effect.judged_turns, effect.hidden_sessions, effect.hidden_share) == (0, 0, None)


@pytest.mark.parametrize("arguments", ['{"path": "a', "[1]", "null", 3])
def test_a_history_the_encoder_cannot_write_is_a_render_error(arguments: Any) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "read_file", "arguments": arguments}}
    payload = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c", "content": "x"},
        ],
    }
    with pytest.raises(RenderError, match="read_file"):
        text_request("completions", payload, fmt="v4", thinking=True)


def test_what_the_parse_lost_is_the_parsers_damage_not_what_the_agent_saw() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
            },
        }
    ]
    text = render_completion(reasoning="Read it.", content="Looking.", calls=[ToolCall("read_file", {"path": "a.py"})])
    dropped = {"role": "assistant", "content": "Looking.", "reasoning_content": "Read it."}  # the parser lost the call
    for mode in ("both", "raw"):
        verdicts = judge(
            ObservePlan(mode, "logprobs"),
            dropped,
            finish_reason="stop",
            tools=tools,
            tool_choice="auto",
            rawtext=RawText("logprobs", text, True),
        )
        assert verdicts.parsed.label == "clean" and "call-lost" not in verdicts.parsed.rules
        assert verdicts.raw is not None and verdicts.raw.label == "clean"
        assert verdicts.lost is not None and verdicts.lost.rules == ("call-lost",)
        # A clean raw text the parser lost a call of: corrupt in both mode (a parser bug), clean in raw mode.
        assert verdicts.verdict == ("corrupt" if mode == "both" else "clean")
    unjudged = judge(
        ObservePlan("both", "logprobs"),
        dropped,
        finish_reason="stop",
        tools=tools,
        tool_choice="auto",
        rawtext=RawText("logprobs", text, False, "no logprobs in the response"),
    )
    assert (unjudged.verdict, unjudged.raw, unjudged.lost) == ("clean", None, None)


def test_a_lost_call_is_hidden_when_the_model_broke_it_and_made_when_the_parser_did() -> None:
    lost = [FindingRecord(rule="call-lost", field="tool_calls", start=0, end=4, excerpt="grep", severity="hard")]
    broken = TurnRecord(
        index=0,
        status="ok",
        verdict="corrupt",
        parsed_verdict="clean",
        raw_verdict="corrupt",
        lost_findings=lost,
        start_s=0.0,
    )  # typographic quotes: the model's damage, dropped
    dropped = TurnRecord(
        index=0,
        status="ok",
        verdict="corrupt",
        parsed_verdict="clean",
        raw_verdict="clean",
        lost_findings=lost,
        start_s=0.0,
    )  # a clean invoke the parser lost
    for turn, effect, seen in ((broken, "hidden", "both"), (dropped, "made", "parsed")):
        session = SessionRecord(
            session_id=0,
            task="t",
            outcome="corrupt",
            start_s=0.0,
            end_s=1.0,
            turns=[turn],
            corrupt_seen=corrupt_seen([turn]),
        )
        assert (turn.parser_effect, session.parser_effect, session.corrupt_seen) == (effect, effect, seen)


def test_the_requests_thinking_mode_reaches_the_raw_verdict() -> None:
    # Thinking was on, the model never wrote </think>: every reasoning parser files the whole answer under
    # reasoning_content. Only the request's thinking mode tells the raw check that the close is missing.
    text = "Hello! How can I help?" + "<｜end▁of▁sentence｜>"
    message = {"role": "assistant", "content": "Hello! How can I help?", "reasoning_content": None}
    # Stated by the requests (chat_template_kwargs): judged; not stated: the server's default decides, not assumed.
    for stated, label in ((True, "corrupt"), (False, "clean"), (None, "clean")):
        plan = ObservePlan("both", "logprobs", thinking=stated is not False, thinking_stated=stated)
        verdicts = judge(plan, message, finish_reason="stop", tools=None, tool_choice=None,
                         rawtext=RawText("logprobs", text, True))
        assert verdicts.raw is not None and verdicts.raw.label == label
        assert ("raw-think-missing" in verdicts.raw.rules) is (stated is True)
        assert verdicts.verdict == label
    assert stated_thinking({"chat_template_kwargs": {"thinking": True}}) is True
    assert stated_thinking({"chat_template_kwargs": {"enable_thinking": False}}) is False
    assert stated_thinking({"model": "m"}) is None


def test_a_client_parser_error_is_a_turn_verdict_with_its_reason() -> None:
    text = "Plan.</think>Fine." + "<｜end▁of▁sentence｜>"
    reason = "deepseek-recipe raised UnicodeEncodeError: surrogates not allowed"
    verdicts = judge(ObservePlan("both", "completions"), {"role": "assistant", "content": ""}, finish_reason="stop",
                     tools=None, tool_choice=None, rawtext=RawText("completions", text, True), parser_error=reason)
    assert verdicts.verdict == "corrupt" and verdicts.parsed.rules == ("parser-error",)
    assert verdicts.parsed.findings[0].excerpt == reason
    assert verdicts.raw is not None and verdicts.raw.label == "clean"
