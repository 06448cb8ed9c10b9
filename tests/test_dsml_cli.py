"""The `dsml-check` command, run as a real process: verdict lines, summary, exit codes, unreadable input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dsml_checker import ToolCall, render_calls

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "responses.jsonl"
SCRIPT = Path(sys.executable).parent / "dsml-check"
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "dsml_checker.cli"]


def dsml_check(*args: str, stdin: str | bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return subprocess.run([*COMMAND, *args], input=data, capture_output=True, timeout=60)


def lines(done: subprocess.CompletedProcess[bytes]) -> list[dict]:
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def test_bundled_examples_mix_clean_suspect_and_corrupt() -> None:
    done = dsml_check(str(EXAMPLES))
    assert done.returncode == 1
    verdicts = lines(done)
    assert len(verdicts) == len(EXAMPLES.read_text(encoding="utf-8").splitlines())
    assert {v["label"] for v in verdicts} == {"clean", "suspect", "corrupt"}
    assert all({"line", "label", "findings"} <= set(v) for v in verdicts)
    summary = done.stderr.decode().strip()
    assert summary.count("\n") == 0 and summary.startswith("dsml-check: ")
    counts = {label: sum(v["label"] == label for v in verdicts) for label in ("clean", "corrupt", "suspect")}
    assert f"{counts['clean']} clean, {counts['corrupt']} corrupt, {counts['suspect']} suspect" in summary


def test_clean_and_suspect_inputs_exit_zero_unless_strict() -> None:
    rows = [
        {"message": {"role": "assistant", "content": "All good."}, "finish_reason": "stop"},
        {"message": {"role": "assistant", "content": "x " + "0" * 90}, "finish_reason": "stop"},
    ]
    text = "\n".join(json.dumps(r) for r in rows) + "\n\n"
    done = dsml_check("-", stdin=text)
    assert done.returncode == 0, done.stderr
    assert [v["label"] for v in lines(done)] == ["clean", "suspect"]
    assert dsml_check("--strict", "-", stdin=text).returncode == 1


def test_request_tools_and_tool_choice_are_used() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "required": ["city"]}}}]
    response = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None,
                     "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_forecast", "arguments": "{}"}}]}}],
        "request": {"tools": tools, "tool_choice": "none"},
    }
    done = dsml_check("-", stdin=json.dumps(response))
    assert done.returncode == 1
    (verdict,) = lines(done)
    assert verdict["id"] == "chatcmpl-1"
    assert {"unknown-tool", "tool-choice-none"} <= {f["rule"] for f in verdict["findings"]}


def test_model_text_is_kept_verbatim_in_json_output() -> None:
    content = 'Sure <script>alert("x")</script>\n\n' + render_calls([ToolCall("f", {"a": "b"})])
    done = dsml_check("-", stdin=json.dumps({"message": {"content": content}, "finish_reason": "stop"}))
    (verdict,) = lines(done)
    assert verdict["label"] == "corrupt"
    assert any("｜DSML｜" in f["excerpt"] for f in verdict["findings"])


@pytest.mark.parametrize(
    ("stdin", "fragment"),
    [
        ('{"message": {"content": "ok"}}\n{not json\n', "<stdin>:2: not valid JSON"),
        ('{"message": {"content": "ok"}}\n[1, 2]\n', "<stdin>:2: expected a JSON object"),
        ('{"hello": 1}\n', "<stdin>:1: expected a chat.completion object"),
        ('{"choices": []}\n', '<stdin>:1: "choices" must be a non-empty list'),
        ('{"message": {}, "request": 3}\n', '<stdin>:1: "request" must be an object'),
        (b'{"message": {"content": "\xff"}}\n', "<stdin>:1: not UTF-8"),
    ],
)
def test_unreadable_input_exits_two_naming_the_line(stdin: str | bytes, fragment: str) -> None:
    done = dsml_check("-", stdin=stdin)
    assert done.returncode == 2
    err = done.stderr.decode()
    assert fragment in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_verdicts_before_a_bad_line_are_still_printed(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"message": {"content": "fine"}}\n{"message": {"content": "fine"}}\noops\n', encoding="utf-8")
    done = dsml_check(str(path))
    assert done.returncode == 2
    assert len(lines(done)) == 2
    assert f"{path}:3: not valid JSON" in done.stderr.decode()


def test_missing_file_is_a_usage_error() -> None:
    done = dsml_check("/nonexistent/responses.jsonl")
    assert done.returncode == 2
    assert "cannot read /nonexistent/responses.jsonl" in done.stderr.decode()


def test_bad_option_is_a_usage_error() -> None:
    done = dsml_check("--no-such-flag", "x")
    assert done.returncode == 2 and "Traceback" not in done.stderr.decode()


def test_terminal_control_characters_in_model_text_are_escaped() -> None:
    content = "x\u009b31m \u202eevil\u202c <｜DSML｜invoke"
    done = dsml_check("-", stdin=json.dumps({"message": {"content": content}}))
    out = done.stdout.decode()
    assert "\u009b" not in out and "\u202e" not in out
    assert "\\u009b" in out and "\\u202e" in out
    assert "｜DSML｜" in out  # ordinary non-ASCII stays readable
    assert json.loads(out)["label"] == "corrupt"


def test_a_closed_pipe_ends_quietly() -> None:
    rows = "".join(json.dumps({"message": {"content": f"answer {i}"}}) + "\n" for i in range(20000))
    reader = subprocess.Popen(["head", "-n", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        writer = subprocess.run([*COMMAND, "-"], input=rows.encode(), stdout=reader.stdin, stderr=subprocess.PIPE, timeout=120)
        reader.stdin.close()
        first = reader.stdout.read()
        reader.wait(timeout=30)
    finally:
        reader.kill()
        reader.wait(timeout=30)
    assert json.loads(first)["label"] == "clean"
    assert writer.returncode == 0
    assert b"Traceback" not in writer.stderr


def test_lone_surrogates_in_model_text_do_not_break_the_output() -> None:
    done = dsml_check("-", stdin='{"message": {"content": "\\ud800 then <｜DSML｜invoke name=\\"f\\">"}}\n')
    assert done.returncode == 1, done.stderr
    (verdict,) = lines(done)
    assert verdict["label"] == "corrupt"
    assert "\\ud800" in done.stdout.decode()


def test_rules_can_be_listed_and_a_file_is_otherwise_required() -> None:
    from dsml_checker import RULES

    listed = dsml_check("--list-rules")
    assert listed.returncode == 0
    rows = listed.stdout.decode().splitlines()
    assert [row.split()[0] for row in rows] == list(RULES)
    missing = dsml_check()
    assert missing.returncode == 2 and b"FILE" in missing.stderr and b"Traceback" not in missing.stderr


GOOD_LINE = json.dumps({"message": {"content": "héllo ｜ world"}}, ensure_ascii=False).encode()


def _damaged(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind}.jsonl"
    if kind == "torn-multibyte":  # a writer killed in the middle of a fullwidth bar
        path.write_bytes(GOOD_LINE + b"\n" + GOOD_LINE[: GOOD_LINE.index("｜".encode()) + 1])
    elif kind == "binary-tail":
        path.write_bytes(GOOD_LINE + b"\n" + bytes(range(128, 256)) * 8)
    elif kind == "not-utf8":
        path.write_bytes(json.dumps({"message": {"content": "café"}}, ensure_ascii=False).encode("latin-1") + b"\n")
    elif kind == "nested-bomb":  # json.loads raises RecursionError, not ValueError, on this
        path.write_bytes(GOOD_LINE + b'\n{"message": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    elif kind == "directory":
        path.mkdir()
    return path


@pytest.mark.parametrize(
    ("kind", "fragment"),
    [
        ("torn-multibyte", ":2: the last line ends inside a UTF-8 character"),
        ("binary-tail", ":2: not UTF-8"),
        ("not-utf8", ":1: not UTF-8"),
        ("nested-bomb", ":2: JSON nested too deeply to read"),
        ("directory", "cannot read"),
    ],
)
def test_damaged_input_exits_two_with_one_line(tmp_path: Path, kind: str, fragment: str) -> None:
    done = dsml_check(str(_damaged(tmp_path, kind)))
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert fragment in err and "Traceback" not in err and err.count("\n") == 1
    if kind not in ("not-utf8", "directory"):
        assert [v["label"] for v in lines(done)] == ["clean"]  # the good line before the damage was judged


def test_a_read_error_mid_file_is_an_input_error() -> None:
    # Reading /proc/self/mem from offset 0 fails with EIO: a real read error, not a bug and not a verdict.
    done = dsml_check("/proc/self/mem")
    err = done.stderr.decode()
    assert done.returncode == 2 and "cannot read /proc/self/mem" in err and "Traceback" not in err, err


def test_argument_json_bomb_is_a_verdict_not_a_crash() -> None:
    row = {"message": {"tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[" * 100_000}}]}}
    done = dsml_check("-", stdin=json.dumps(row))
    assert done.returncode == 1 and b"Traceback" not in done.stderr, done.stderr
    (verdict,) = lines(done)
    assert "args-not-object" in {f["rule"] for f in verdict["findings"]}


def test_an_ascii_only_output_gets_json_escapes() -> None:
    done = subprocess.run(
        [*COMMAND, "-"], input=json.dumps({"message": {"content": "｜DSML｜ x"}}).encode(), capture_output=True,
        timeout=60, env={**os.environ, "PYTHONIOENCODING": "ascii"},
    )
    assert done.returncode == 1 and b"Traceback" not in done.stderr, done.stderr
    assert done.stdout.isascii() and "\\uff5cDSML\\uff5c" in done.stdout.decode()
    assert json.loads(done.stdout)["label"] == "corrupt"


def test_an_internal_error_has_its_own_exit_code() -> None:
    # A bug cannot be produced on demand, so one is planted: the checker raises. `git bisect run` must not read
    # the crash as "corrupt" (1), "clean" (0) or bad input (2): 255 makes it stop.
    plant = (
        "import dsml_checker.cli as cli\n"
        "def broken(*args, **kwargs):\n    raise RuntimeError('planted\\nfailure')\n"
        "cli.check = broken\ncli.main(['-'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", plant], input=b'{"message": {"content": "ok"}}\n', capture_output=True, timeout=60
    )
    err = done.stderr.decode()
    assert done.returncode == 255, err
    assert err == "dsml-check: internal error: RuntimeError: planted failure\n"


RAW_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]


def _raw_rows() -> list[dict]:
    from dsml_checker import render_completion

    good = render_completion(reasoning="think", content="Reading.", calls=[ToolCall("read_file", {"path": "a.py"})])
    call = {"id": "c", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": "a.py"})}}
    request = {"tools": RAW_TOOLS}
    return [
        # raw and message agree, clean
        {"message": {"content": "Done."}, "finish_reason": "stop", "raw": "Done.<｜end▁of▁sentence｜>"},
        # hid: typographic quotes around the invoke name; the parser dropped the call, the message looks final
        {"message": {"content": "Reading.", "reasoning_content": "think"}, "finish_reason": "stop", "request": request,
         "raw": good.replace('name="read_file"', "name=“read_file”")},
        # made: the raw text is clean, the parser returned its call twice
        {"message": {"content": "Reading.", "reasoning_content": "think", "tool_calls": [call, call]},
         "finish_reason": "tool_calls", "request": request, "raw": good},
        # no raw text: judged as before
        {"message": {"content": "ok"}, "finish_reason": "stop"},
    ]


def test_raw_text_next_to_the_message_gets_its_own_verdict() -> None:
    done = dsml_check("-", stdin="\n".join(json.dumps(r, ensure_ascii=False) for r in _raw_rows()) + "\n")
    assert done.returncode == 1, done.stderr
    agree, hid, made, plain = lines(done)
    assert (agree["label"], agree["parsed"], agree["raw"]["label"], agree["parser"]) == ("clean", "clean", "clean", None)
    assert (hid["label"], hid["parsed"], hid["raw"]["label"], hid["parser"]) == ("corrupt", "clean", "corrupt", "hid")
    assert hid["findings"] == [] and "raw-attr-quotes" in {f["rule"] for f in hid["raw"]["findings"]}
    assert [f["rule"] for f in hid["lost"]["findings"]] == ["call-lost"]
    assert (made["label"], made["parsed"], made["raw"]["label"], made["parser"]) == ("corrupt", "corrupt", "clean", "made")
    assert [f["rule"] for f in made["findings"]] == ["duplicate-call"]
    assert set(plain) == {"line", "id", "label", "findings"} and plain["label"] == "clean"
    summary = done.stderr.decode()
    assert "4 inputs: 2 clean, 2 corrupt, 0 suspect; with raw text 3: the parser hid 1, made 1" in summary


def test_a_corrupt_raw_text_alone_makes_the_line_corrupt() -> None:
    row = {"message": {"content": "Reading."}, "finish_reason": "stop", "raw": "Reading.\n\n<｜DSML｜tool_calls>\n<｜DSML｜inv"}
    done = dsml_check("-", stdin=json.dumps(row, ensure_ascii=False))
    assert done.returncode == 1
    (verdict,) = lines(done)
    assert verdict["parsed"] == "clean" and verdict["raw"]["label"] == "corrupt" and verdict["parser"] == "hid"


def test_raw_text_in_another_format() -> None:
    from dsml_checker import render_completion

    raw = render_completion(reasoning=None, content="", calls=[ToolCall("read_file", {"path": "a.py"})], fmt="v31")
    call = {"id": "c", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
    row = {"message": {"content": "", "tool_calls": [call]}, "finish_reason": "tool_calls", "raw": raw}
    line = json.dumps(row, ensure_ascii=False)
    assert lines(dsml_check("--format", "v31", "-", stdin=line))[0]["label"] == "clean"
    assert lines(dsml_check("-", stdin=line))[0]["raw"]["label"] == "corrupt"  # v4's grammar does not read it


def test_raw_that_is_not_a_string_is_an_input_error() -> None:
    done = dsml_check("-", stdin='{"message": {"content": "ok"}, "raw": ["not", "text"]}\n')
    assert done.returncode == 2
    assert '<stdin>:1: "raw" must be a string' in done.stderr.decode()


def test_the_requests_thinking_mode_judges_a_missing_think_close() -> None:
    def row(thinking: bool | None) -> dict[str, Any]:
        request = {} if thinking is None else {"chat_template_kwargs": {"thinking": thinking}}
        return {"message": {"content": "Done."}, "finish_reason": "stop", "raw": "Done.<｜end▁of▁sentence｜>", "request": request}

    done = dsml_check("-", stdin="\n".join(json.dumps(row(t), ensure_ascii=False) for t in (True, False, None)) + "\n")
    on, off, unstated = lines(done)
    assert on["raw"]["label"] == "corrupt" and "raw-think-missing" in {f["rule"] for f in on["raw"]["findings"]}
    assert off["raw"]["label"] == unstated["raw"]["label"] == "clean"
