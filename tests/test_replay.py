"""Trace replay (`repro run --workload X.jsonl`) over real HTTP, trace loading errors, and `repro trace convert`.

A purpose-built server keeps every request body, so the tests see exactly what replay sent: the recorded
history up to each recorded assistant turn, never the model's new answers, and no local-only keys.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from run_builders import run as run_in_process
from run_builders import run_main

from repro.run.finish import RunResult
from repro.store.rundir import load_run
from repro.workload.convert import convert
from repro.workload.trace import SENT_KEYS, load_trace

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "traces.jsonl"


def run(out: Path, **options: Any) -> RunResult:
    return run_in_process(out, report=False, **options)[0]


def received(root: str, mode: str) -> list[dict[str, Any]]:
    return httpx.get(f"{root}/{mode}/received", timeout=10).json()


def recorded(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def sent_form(message: dict[str, Any]) -> dict[str, Any]:
    return {key: message[key] for key in SENT_KEYS if message.get(key) is not None}


def test_replay_sends_the_recorded_history_at_every_assistant_turn(faulty: str, tmp_path: Path) -> None:
    conversations = recorded(EXAMPLE)[:2]
    result = run(tmp_path / "run", base_url=f"{faulty}/good~replay/v1", workload=EXAMPLE, observe="parsed",
                 sessions=len(conversations), concurrency=1)
    assert result.exit_code == 0
    bodies = received(faulty, "good~replay")
    expected = []
    for conversation in conversations:
        messages = conversation["messages"]
        for position, message in enumerate(messages):
            if message["role"] == "assistant":
                expected.append(([sent_form(m) for m in messages[:position]], conversation["tools"]))
    # One session at a time, so the requests arrive in the trace's order: every one is the recorded prefix,
    # whatever the server answered before it (it answered its own tool calls, never the recorded ones).
    assert [(body["messages"], body["tools"]) for body in bodies] == expected
    assert all(body["max_tokens"] == 1024 and body["temperature"] == 0.0 for body in bodies)

    loaded = load_run(result.path)
    assert loaded.manifest.workload["kind"] == "trace" and loaded.manifest.workload["replay"] == "fast"
    assert loaded.manifest.workload["turns"] == 4 * 15
    by_id = {c["id"]: sum(m["role"] == "assistant" for m in c["messages"]) for c in conversations}
    for session in loaded.sessions:
        assert session.outcome == "clean" and session.finished
        assert len(session.turns) == by_id[session.task]
        assert all(turn.status == "ok" and turn.verdict == "clean" for turn in session.turns)


def test_a_corrupt_answer_makes_the_session_corrupt_and_the_replay_goes_on(faulty: str, tmp_path: Path) -> None:
    # `leak` answers the first turn of a conversation (no assistant message yet) with DSML in its content.
    result = run(tmp_path / "run", base_url=f"{faulty}/leak~replay/v1", workload=EXAMPLE, observe="parsed",
                 sessions=4, turns=3)
    loaded = load_run(result.path)
    assert {s.outcome for s in loaded.sessions} == {"corrupt"}
    for session in loaded.sessions:
        assert session.first_corrupt_turn == 0 and session.rules
        assert [t.verdict for t in session.turns][1:] == ["clean"] * (len(session.turns) - 1)
        assert len(session.turns) == 3 and not session.finished  # --turns 3 of 15 recorded
        assert session.turns[0].raw_path is not None
    assert result.summary.counts["corrupt"] == 4


def test_replay_timing_keeps_the_recorded_gap_between_turns(faulty: str, tmp_path: Path) -> None:
    conversation = recorded(EXAMPLE)[1]
    turns = [i for i, m in enumerate(conversation["messages"]) if m["role"] == "assistant"]
    messages = conversation["messages"]
    messages[turns[0]]["timestamp"] = 1_000.0
    messages[turns[1]]["timestamp"] = "1970-01-01T00:16:41.500Z"  # 1,001.5 s: ISO 8601 is accepted too
    for later in turns[2:]:
        messages[later]["timestamp"] = 1_001.5
    trace = tmp_path / "timed.jsonl"
    trace.write_text(json.dumps(conversation) + "\n", encoding="utf-8")

    timed = run(tmp_path / "timed", base_url=f"{faulty}/good~timed/v1", workload=trace, observe="parsed",
                sessions=1, turns=3, replay="timing")
    starts = [turn.start_s for turn in load_run(timed.path).sessions[0].turns]
    assert starts[1] - starts[0] >= 1.5 - 0.01  # the recorded gap, at least
    assert starts[2] - starts[1] < 1.5  # no gap recorded: sent as soon as the answer was in
    assert load_run(timed.path).manifest.workload["replay"] == "timing"


def line_with(change: Any) -> str:
    conversation = recorded(EXAMPLE)[0]
    change(conversation)
    return json.dumps(conversation)


BAD_TRACES = [
    ("not JSON", lambda: "{\"messages\": [", "t.jsonl:2: not JSON"),
    ("a list", lambda: "[1, 2]", "t.jsonl:2: a trace line must be a JSON object with `messages` (got list)"),
    ("bad role", lambda: line_with(lambda c: c["messages"][1].update(role="robot")), "t.jsonl:2: messages.1.role: Input should be"),
    ("no assistant", lambda: line_with(lambda c: c.update(messages=c["messages"][:2])),
     "t.jsonl:2: messages: no assistant message after the first message, so nothing to replay"),
    ("orphan tool", lambda: line_with(lambda c: c["messages"][3].pop("tool_call_id")),
     "t.jsonl:2: messages.3: a tool message needs `tool_call_id`, the id of the call it answers"),
    ("bad stamp", lambda: line_with(lambda c: c["messages"][2].update(timestamp="yesterday")),
     "t.jsonl:2: messages.2.timestamp: not ISO 8601"),
    ("typo", lambda: line_with(lambda c: c.update(tool=[])), "t.jsonl:2: tool: Extra inputs are not permitted"),
]


@pytest.mark.parametrize("bad, expected", [(make, expected) for _, make, expected in BAD_TRACES],
                         ids=[name for name, _, _ in BAD_TRACES])
def test_a_malformed_trace_line_is_named_by_line_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, bad: Any, expected: str
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(EXAMPLE.read_text(encoding="utf-8").splitlines()[0] + "\n" + bad() + "\n", encoding="utf-8")
    code, _, err = run_main(capsys, "run", "--workload", str(trace), "--base-url", "http://127.0.0.1:9/v1",
                            "--out", str(tmp_path / "never"))
    assert code == 2
    assert err.startswith(f"repro: error: {tmp_path}/{expected}") and err.count("\n") == 1
    assert not (tmp_path / "never").exists()


def test_a_trace_keeps_only_the_conversations_its_sessions_replay(faulty: str, tmp_path: Path) -> None:
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines * 10) + "\n", encoding="utf-8")
    kept = load_trace(trace, keep=3)
    whole = load_trace(trace)
    # Every line was read, validated and hashed; three conversations were built and kept.
    assert [c.id for c in kept.conversations] == [c.id for c in whole.conversations[:3]]
    assert len(whole.conversations) == kept.count == 40 and kept.turns == whole.turns == 600
    assert kept.sha256 == whole.sha256 == hashlib.sha256(trace.read_bytes()).hexdigest()
    assert kept.manifest_entry() == whole.manifest_entry()
    with pytest.raises(ValueError, match="was not kept"):
        kept.conversation(3)
    # A run keeps as many as it has sessions, and they are the ones it replays.
    result = run(tmp_path / "run", base_url=f"{faulty}/good~kept/v1", workload=trace, observe="parsed",
                 sessions=2, concurrency=1, turns=1)
    assert result.exit_code == 0
    assert load_run(result.path).manifest.workload["conversations"] == 40
    first_turns = []
    for conversation in recorded(EXAMPLE)[:2]:
        position = next(i for i, m in enumerate(conversation["messages"]) if i and m["role"] == "assistant")
        first_turns.append([sent_form(m) for m in conversation["messages"][:position]])
    assert [body["messages"] for body in received(faulty, "good~kept")] == first_turns


@pytest.mark.parametrize("bad, expected", [(lambda: "{\"messages\": [", "not JSON"),
                                           (lambda: b"\xff{}", "not UTF-8 text")], ids=["json", "utf8"])
def test_a_bad_line_after_the_replayed_conversations_still_stops_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, bad: Any, expected: str
) -> None:
    # Validate all, keep what is used: a trace is checked to its last line before anything is sent, so a
    # run of 2 sessions refuses a trace whose 40th line is bad, naming it.
    lines = [line.encode() for line in EXAMPLE.read_text(encoding="utf-8").splitlines() * 10]
    line = bad()
    lines[39] = line if isinstance(line, bytes) else line.encode()
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(b"\n".join(lines) + b"\n")
    code, _, err = run_main(capsys, "run", "--workload", str(trace), "--sessions", "2", "--base-url",
                            "http://127.0.0.1:9/v1", "--out", str(tmp_path / "never"))
    assert code == 2
    assert err.startswith(f"repro: error: {trace}:40: {expected}") and err.count("\n") == 1
    assert not (tmp_path / "never").exists()


def test_replay_timing_needs_timestamps_and_a_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    conversation = recorded(EXAMPLE)[0]
    del conversation["messages"][2]["timestamp"]
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(conversation) + "\n", encoding="utf-8")
    code, _, err = run_main(capsys, "run", "--workload", str(trace), "--replay", "timing")
    assert code == 2 and f"{trace}:1: messages.2.timestamp: missing; --replay timing needs a timestamp" in err
    code, _, err = run_main(capsys, "run", "--replay", "timing")
    assert code == 2 and "--replay timing: only a trace workload (a .jsonl file of conversations) is replayed" in err


def test_convert_rebuilds_the_conversations_of_a_request_response_log(tmp_path: Path) -> None:
    conversations = recorded(EXAMPLE)
    log_lines = []
    for conversation in conversations:
        messages = conversation["messages"]
        for position, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            created = 1_700_000_000 + 10 * len(log_lines)
            message["timestamp"] = created
            request = {"model": "m", "messages": [sent_form(m) for m in messages[:position]],
                       "tools": conversation["tools"], "tool_choice": "auto", "max_tokens": 1024}
            response = {"id": f"r{len(log_lines)}", "object": "chat.completion", "created": created,
                        "choices": [{"index": 0, "message": sent_form(message), "finish_reason": "stop"}]}
            log_lines.append(json.dumps({"request": request, "response": response}))
    random.Random(7).shuffle(log_lines)  # a log interleaves conversations
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(log_lines) + "\n", encoding="utf-8")

    calls, written = convert(log, tmp_path / "trace.jsonl")
    assert (calls, written) == (len(log_lines), len(conversations))
    rebuilt = load_trace(tmp_path / "trace.jsonl", timing=True)
    original = {c["id"]: c for c in conversations}
    for conversation in rebuilt.conversations:
        match = [c for c in original.values() if [sent_form(m) for m in c["messages"]] ==
                 [m.sent() for m in conversation.messages]]
        assert len(match) == 1
        stamps = [m.timestamp for m in conversation.messages if m.role == "assistant"]
        assert stamps == [m["timestamp"] for m in match[0]["messages"] if m["role"] == "assistant"]
        assert conversation.tools == match[0]["tools"] and conversation.max_tokens == 1024


def test_convert_names_the_log_line_at_fault(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"request": {"messages": []}, "response": {"choices": [{"message": {"content": "x"}}]}}\n'
                   '{"request": {"messages": []}}\n', encoding="utf-8")
    code, _, err = run_main(capsys, "trace", "convert", str(log), "-o", str(tmp_path / "t.jsonl"))
    assert code == 2
    assert err == f"repro: error: {log}:2: response.choices: missing or empty (expected the chat.completion object)\n"


def test_convert_that_fails_on_a_later_conversation_leaves_nothing(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    # The log streams through twice: every line reads, and the second conversation cannot be replayed (a lone
    # answer), found while the first is already written. Neither a half trace nor its partial file is left,
    # and a trace already at the output is kept as it was.
    good = {"request": {"messages": [{"role": "user", "content": "hi"}]},
            "response": {"choices": [{"message": {"role": "assistant", "content": "hello"}}]}}
    lone = {"request": {"messages": []}, "response": {"choices": [{"message": {"role": "assistant", "content": "x"}}]}}
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps(good) + "\n" + json.dumps(lone) + "\n", encoding="utf-8")
    out = tmp_path / "t.jsonl"
    out.write_text("kept\n", encoding="utf-8")
    code, _, err = run_main(capsys, "trace", "convert", str(log), "-o", str(out))
    assert code == 2 and err.startswith(f"repro: error: {log} (converted):2: messages: ") and err.count("\n") == 1
    assert out.read_text(encoding="utf-8") == "kept\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl", "t.jsonl"]


def test_convert_refuses_a_pipe_it_could_read_only_once(tmp_path: Path) -> None:
    # The log is read twice: a named pipe is refused in one line before it is opened (opening would wait for
    # a writer), and nothing is written.
    pipe = tmp_path / "log.fifo"
    os.mkfifo(pipe)
    done = subprocess.run([sys.executable, "-c", "from repro.cli import main; main()", "trace", "convert", str(pipe),
                           "-o", str(tmp_path / "t.jsonl")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == f"repro: error: trace convert {pipe}: not a regular file (the log is read twice: save a pipe's output to a file first)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.fifo"]
