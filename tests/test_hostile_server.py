"""`repro run` and `repro report` against hostile server output (issue 11): every fault is classified, the run
keeps every finished session, and what is stored and reported stays whole, UTF-8 and bounded in size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from faulty_servers import CHAOS
from hypothesis import example, given
from hypothesis import strategies as st
from run_builders import SENTINEL, run, sse

from repro.errors import UsageError
from repro.report import render_report
from repro.run.options import RunOptions
from repro.store.records import FindingRecord, Manifest, SessionRecord, TurnRecord
from repro.store.rundir import RunWriter, load_run
from repro.untrusted import (
    MAX_DEPTH,
    NestingError,
    json_depth,
    parse_json,
    scrub_surrogates,
)
from repro.workload import sandbox
from repro.workload.scenario import load_workload


def repro_cli(*args: str | bytes, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", "from repro.cli import main; main()", *args], capture_output=True, timeout=timeout, check=False
    )


def test_parse_json_bounds_nesting_whatever_the_stack() -> None:
    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    for text in ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "[" * 100_000 + "]" * 100_000, '{"a":' * 400 + "1" + "}" * 400):
        with pytest.raises(NestingError):
            parse_json(text)
        with pytest.raises(NestingError):
            parse_json(text.encode())
    # Brackets inside strings are text, not nesting.
    assert parse_json(json.dumps({"a": "[" * 10_000})) == {"a": "[" * 10_000}


@given(depth=st.integers(0, 3 * MAX_DEPTH), leaf=st.sampled_from(["1", '"x"', "[]", "{}"]), as_bytes=st.booleans())
def test_parse_json_accepts_exactly_what_nests_within_the_bound(depth: int, leaf: str, as_bytes: bool) -> None:
    opens = "".join("[" if i % 2 == 0 else '{"k":' for i in range(depth))
    closes = "".join("]}"[i % 2] for i in reversed(range(depth)))
    text = opens + leaf + closes
    expected = json.loads(text)
    if json_depth(expected) <= MAX_DEPTH:
        assert parse_json(text.encode() if as_bytes else text) == expected
    else:
        with pytest.raises(NestingError):
            parse_json(text.encode() if as_bytes else text)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(st.characters(exclude_categories=())),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


def _outcome(parse: object, data: str | bytes) -> tuple[str, object]:
    try:
        return "value", repr(parse(data))  # repr: NaN is not equal to itself
    except (ValueError, RecursionError) as err:
        return type(err).__name__, str(err)


@given(
    value=_json_values,
    encoding=st.sampled_from([None, "utf-8", "utf-16-le", "utf-32-be"]),
    damage=st.sampled_from(["", " ", "}", "x", "\x00", "\n", ",1", "\udc80"]),
    at_end=st.booleans(),
)
@example(value={"a": 1}, encoding="utf-8", damage="\x00", at_end=False)
@example(value=[1], encoding="utf-8", damage="}", at_end=True)
@example(value={"a": 1}, encoding=None, damage="\udc80", at_end=True)
def test_parse_json_gives_json_loads_values_and_errors(value: object, encoding: str | None, damage: str, at_end: bool) -> None:
    """Streamed events take a shortcut past json.loads' Python layers; whatever the text, the answer is json.loads'."""
    text = json.dumps(value, ensure_ascii=False)
    text = text + damage if at_end else damage + text
    data: str | bytes = text if encoding is None else text.encode(encoding, "surrogatepass")
    assert _outcome(parse_json, data) == _outcome(json.loads, data)


@given(st.text(st.characters(exclude_categories=())))  # surrogates included
@example("a\ud800b\udfff")
def test_scrubbed_text_is_always_utf8_and_unchanged_when_it_already_was(text: str) -> None:
    scrubbed = scrub_surrogates(text)
    scrubbed.encode("utf-8")
    assert len(scrubbed) == len(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        assert "\ufffd" in scrubbed
    else:
        assert scrubbed is text


def test_deeply_nested_tool_arguments_get_an_error_result_like_any_bad_json() -> None:
    workload = load_workload(None).workload
    name = workload.tool_names()[0]
    for arguments in ("[" * 5000 + "]" * 5000, '{"a":' * 300 + "1" + "}" * 300):
        assert sandbox.execute(workload, name, arguments) == "error: arguments are not valid JSON"


def test_deeply_nested_arguments_make_a_corrupt_turn_and_the_session_goes_on(faulty: str, tmp_path: Path) -> None:
    result, _ = run(tmp_path / "run", base_url=f"{faulty}/deep-args/v1", sessions=3)
    sessions = load_run(result.path).sessions
    assert len(sessions) == 3 and result.summary.sessions == 3
    for session in sessions:
        first = session.turns[0]
        assert first.verdict == "corrupt" and "args-not-object" in [f.rule for f in first.findings]
        assert session.outcome == "corrupt" and session.finished and len(session.turns) > 1


def test_deeply_nested_extra_body_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="extra_body: nested deeper than 64"):
        RunOptions.parse({"extra_body": '{"a":' * 5000 + "1" + "}" * 5000})


def test_deeply_nested_model_list_is_one_line_and_exit_3(faulty: str, tmp_path: Path) -> None:
    done = repro_cli("run", "--base-url", f"{faulty}/deep-models/v1", "--out", str(tmp_path / "never"))
    err = done.stderr.decode()
    assert done.returncode == 3, err
    assert err.strip().count("\n") == 0 and "did not return an OpenAI model list" in err


def test_lone_surrogates_are_stored_as_replacement_characters_and_the_report_is_whole(
    faulty: str, tmp_path: Path
) -> None:
    result, _ = run(tmp_path / "run", base_url=f"{faulty}/surrogate/v1", sessions=2)
    assert result.exit_code == 0
    text = (result.path / "sessions.jsonl").read_text(encoding="utf-8")  # strict UTF-8: would raise on a surrogate
    sessions = load_run(result.path).sessions
    assert [s.outcome for s in sessions] == ["corrupt", "corrupt"] and "\ufffd" in text
    first = sessions[0].turns[0]
    assert first.request_id == "chatcmpl-\ufffd"
    raw = (result.path / str(first.raw_path)).read_bytes()
    assert b"\\ud800" in raw  # the raw file keeps the server's exact escape
    report = (result.path / "report.html").read_text(encoding="utf-8")
    assert "</html>" in report and "src/\ufffd.py" in report


def test_records_with_lone_surrogates_serialise_anywhere_they_hide() -> None:
    lone = json.loads('"a\\ud800b"')
    manifest = Manifest(name=lone, run_id="r", command=["repro", "\udcff"], options={lone: {lone: [lone]}},
                        workload={}, target={}, started_at="t")
    assert Manifest.model_validate_json(manifest.model_dump_json(indent=2)).options == {"a\ufffdb": {"a\ufffdb": ["a\ufffdb"]}}
    turn = TurnRecord(index=0, status="ok", start_s=0.0)
    turn.tool_calls, turn.error = [lone], lone  # assigned after construction, as the session loop does
    assert json.loads(turn.model_dump_json())["tool_calls"] == ["a\ufffdb"]
    assert turn.model_dump()["error"] == lone  # Python-side dumps are untouched


def test_non_utf8_argv_reaches_the_manifest(faulty: str, tmp_path: Path) -> None:
    out = os.fsencode(tmp_path) + b"/run-\xff"
    done = repro_cli("run", "--base-url", f"{faulty}/good/v1", "--sessions", "1", "--name", b"name-\xfe", "--out", out)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    run_dir = Path(os.fsdecode(out))
    manifest = Manifest.model_validate_json((run_dir / "manifest.json").read_text(encoding="utf-8"))
    assert manifest.name == "name-\ufffd" and "name-\ufffd" in manifest.command
    assert (run_dir / "report.html").stat().st_size > 0


def test_a_response_past_max_turn_bytes_is_cut_recorded_and_classified(faulty: str, tmp_path: Path) -> None:
    result, _ = run(tmp_path / "run", base_url=f"{faulty}/comments/v1", sessions=2, max_turn_bytes=200_000)
    sessions = load_run(result.path).sessions
    assert [s.outcome for s in sessions] == ["error", "error"] and result.summary.counts["error"] == 2
    for session in sessions:
        turn = session.turns[0]
        assert turn.status == "error" and turn.error == "response exceeded 200000 bytes; reading stopped there"
        assert turn.truncated_at == 200_000 == (result.path / str(turn.raw_path)).stat().st_size


def _run_with_a_finding(path: Path, loop_chars: int) -> Path:
    """A run directory whose one corrupt turn has findings spanning a `loop_chars` repetition loop, and long texts."""
    loop = ("src/a.py " * (loop_chars // 9 + 1))[:loop_chars]
    content = f"Let me check.\n\n<{SENTINEL}tool_calls>" + loop
    writer = RunWriter(path)
    writer.write_manifest(Manifest(
        name="huge", run_id="huge", command=["repro", "run"], options={}, workload={"name": "w"},
        target={"base_url": "http://127.0.0.1:9/v1", "model": "m", "embedded": False}, started_at="2026-12-01T00:00:00Z",
    ))
    raw = writer.write_raw(0, 0, sse(content, pieces=64))
    long_text = "x" * loop_chars
    findings = [
        FindingRecord(rule=rule, field="content", start=0, end=len(content), excerpt=content[:200], severity="hard")
        for rule in ("duplicated-output", "sentinel", "wrapper-tag")
    ]
    writer.append_session(SessionRecord(
        session_id=0, task=long_text, outcome="corrupt", start_s=0.0, end_s=1.0, first_corrupt_turn=0,
        rules=["sentinel", long_text], error=long_text,
        turns=[TurnRecord(index=0, status="ok", verdict="corrupt", start_s=0.0, findings=findings, raw_path=raw,
                          finish_reason="stop", request_id=long_text, tool_calls=[long_text])],
    ))
    writer.append_session(SessionRecord(
        session_id=1, task=long_text, outcome="error", start_s=0.0, end_s=1.0, error=long_text,
        turns=[TurnRecord(index=0, status="error", start_s=0.0, error=long_text)],
    ))
    writer.close()
    return path


def test_a_huge_finding_keeps_every_report_small(tmp_path: Path) -> None:
    sizes = {}
    for loop in (1_000, 2_000_000):
        run_dir = _run_with_a_finding(tmp_path / f"run-{loop}", loop)
        files = (tmp_path / f"{loop}.html", tmp_path / f"{loop}.md", tmp_path / f"{loop}.xml")
        render_report([run_dir], files[0], markdown=files[1], junit=files[2])
        sizes[loop] = [file.stat().st_size for file in files]
    html = (tmp_path / "2000000.html").read_text(encoding="utf-8")
    assert "more bytes of this span" in html and " more bytes" in (tmp_path / "2000000.md").read_text(encoding="utf-8")
    # 2,000 times the loop, three findings over it, six texts of its length: the reports barely grow.
    for small, large in zip(sizes[1_000], sizes[2_000_000]):
        assert large < small + 60_000, (small, large)


def test_deep_nesting_in_a_stream_is_an_error_and_the_report_shows_it_escaped(faulty: str, tmp_path: Path) -> None:
    result, _ = run(tmp_path / "run", base_url=f"{faulty}/deep/v1", sessions=2)
    sessions = load_run(result.path).sessions
    assert [s.outcome for s in sessions] == ["error", "error"] and result.summary.sessions == 2
    assert all(str(s.error).startswith("malformed stream: event is not JSON (JSON nested deeper") for s in sessions)
    report = (result.path / "report.html").read_text(encoding="utf-8")
    assert "[[[[" in report and "JSON nested deeper" in report


def test_a_report_reads_a_deeply_nested_raw_file_and_shows_it_escaped(tmp_path: Path) -> None:
    run_dir = _run_with_a_finding(tmp_path / "run", 100)
    deep = b"data: " + b"[" * 50_000 + b"]" * 50_000 + b"\n\n"
    # A corrupt session's later turn that failed on a deep event: the drill-down reads its raw bytes.
    sessions = load_run(run_dir).sessions
    corrupt = sessions[0]
    corrupt.turns.append(TurnRecord(index=1, status="error", start_s=0.5, error="malformed stream",
                                    raw_path="raw/s0000-t01.sse"))
    (run_dir / "raw" / "s0000-t01.sse").write_bytes(deep + sse("<b>&amp;</b>", pieces=1))
    (run_dir / "sessions.jsonl").write_text(
        "".join(s.model_dump_json() + "\n" for s in [corrupt, *sessions[1:]]), encoding="utf-8")
    render_report([run_dir], tmp_path / "report.html")
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "data: [[[[" in html and "&lt;b&gt;&amp;amp;&lt;/b&gt;" in html


EXPECTED = {
    # fault: (outcome, what the session's error or first turn must say)
    "good": ("clean", None),
    "deep": ("error", "malformed stream: event is not JSON (JSON nested deeper"),
    "deep-args": ("corrupt", "args-not-object"),
    "surrogate": ("corrupt", "sentinel"),
    "comments": ("error", "response exceeded 4000000 bytes; reading stopped there"),
    "early-hints": ("clean", None),
    "redirect": ("error", "HTTP 307 redirect to '/good/v1/chat/completions' (not followed)"),
    "drip-headers": ("error", "headers not complete after 30s"),
    "huge-loop": ("corrupt", "args-not-object"),
    "raw-malformed": ("error", "malformed stream: event is not JSON"),
    "raw-reset": ("error", "connection "),
    "cancelled": ("error", "stream ended without a finish reason"),
}


def test_chaos_a_whole_run_against_every_fault_at_once_ends_whole(faulty: str, tmp_path: Path) -> None:
    assert set(EXPECTED) == set(CHAOS)
    sessions = 2 * len(CHAOS)
    out = tmp_path / "chaos"
    done = repro_cli(
        "run", "--base-url", f"{faulty}/chaos/v1", "--sessions", str(sessions), "--out", str(out),
        # Budgets no healthy turn comes near at any load (the client parses two 4 MB loops meanwhile): only
        # the faults that never end reach them.
        "--stall-timeout", "30", "--turn-timeout", "120", "--timeout", "240", "--max-turn-bytes", "4000000",
        timeout=280,
    )
    err = done.stderr.decode(errors="replace")
    assert done.returncode in (0, 1, 125) and "Traceback" not in err, err
    run_dir = load_run(out)
    assert run_dir.summary is not None and run_dir.summary.sessions == sessions
    assert sorted(s.session_id for s in run_dir.sessions) == list(range(sessions))
    for session in run_dir.sessions:
        fault = CHAOS[session.session_id % len(CHAOS)]
        outcome, words = EXPECTED[fault]
        assert session.outcome == outcome, (fault, session.outcome, session.error)
        if outcome == "error":
            assert session.error is not None and session.error.startswith(words), (fault, session.error)
            turn = session.turns[-1]
            assert turn.raw_path is not None and (out / turn.raw_path).exists()
        elif outcome == "corrupt":
            assert words in session.rules, (fault, session.rules)
            assert session.finished and len(session.turns) > 1  # the session went on after the bad turn
    comments = [s for s in run_dir.sessions if CHAOS[s.session_id % len(CHAOS)] == "comments"]
    assert all(s.turns[0].truncated_at == 4_000_000 for s in comments)
    report = (out / "report.html").read_text(encoding="utf-8")
    assert "</html>" in report and "more bytes of this span" in report
    assert len(report) < 2_000_000  # two 2 MB loops, shown as bounded excerpts


def test_endless_server_info_and_metrics_neither_hang_nor_fill_the_run(faulty: str, tmp_path: Path) -> None:
    result, _ = run(tmp_path / "run", base_url=f"{faulty}/endless-side/v1", sessions=2)
    assert result.exit_code == 0 and [s.outcome for s in load_run(result.path).sessions] == ["clean", "clean"]
    assert load_run(result.path).manifest.server_info is None and not (result.path / "metrics.csv").exists()
