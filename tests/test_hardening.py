"""Inputs and outputs that once broke the harness's own promises: each test reproduces one such case.

JSON-lines records split only at "\\n"; CSV cells never start a formula; outputs are never aimed at records;
bad input is one line and exit 2; model text reaches no terminal raw.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from run_builders import make_run, run_main

from repro.bisect.gitrepo import commit_range, prepare
from repro.bisect.probe import ProbeResult
from repro.jsonl import read_journal
from repro.matrix.deploy import resolve
from repro.matrix.design import plan
from repro.matrix.spec import MatrixSpec
from repro.procs import logcap
from repro.workload.convert import convert
from repro.workload.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "traces.jsonl"
SEPARATORS = "\u2028 line, \u2029 paragraph, \x85 next line, \x1c file, \x0b vertical tab"
"""Characters str.splitlines() splits on and a JSON string may hold raw."""


def _conversation() -> dict:
    return json.loads(EXAMPLE.read_text(encoding="utf-8").split("\n")[0])


# JSON-lines readers split at "\n" only.

def test_a_trace_holding_unicode_line_separators_loads_whole(tmp_path: Path) -> None:
    conversation = _conversation()
    conversation["messages"][1]["content"] += SEPARATORS
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(conversation, ensure_ascii=False) + "\n", encoding="utf-8")
    loaded = load_trace(trace)
    assert len(loaded.conversations) == 1
    assert loaded.conversations[0].messages[1].content.endswith(SEPARATORS)


def test_trace_convert_reads_back_what_it_wrote_with_separators_inside(tmp_path: Path) -> None:
    conversation = _conversation()
    messages = conversation["messages"]
    position = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    answer = {"role": "assistant", "content": "done" + SEPARATORS}
    request = {"model": "m", "messages": [{"role": m["role"], "content": m["content"] + SEPARATORS}
                                          for m in messages[:position] if m["role"] in ("system", "user")]}
    response = {"id": "r0", "object": "chat.completion", "created": 1_700_000_000,
                "choices": [{"index": 0, "message": answer, "finish_reason": "stop"}]}
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"request": request, "response": response}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert convert(log, tmp_path / "trace.jsonl") == (1, 1)
    rebuilt = load_trace(tmp_path / "trace.jsonl")
    assert rebuilt.conversations[0].messages[-1].content == "done" + SEPARATORS


def test_a_commit_subject_with_a_line_separator_is_one_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=60)
    for subject in ("good", "odd\u2028subject\x85here", "bad"):
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", subject], check=True, timeout=60)
    shas = subprocess.run([*git, "rev-list", "--reverse", "HEAD"], check=True, capture_output=True, text=True,
                          timeout=60).stdout.split()
    commits = commit_range(repo, shas[0], shas[-1])
    assert [c.sha for c in commits] == shas
    # One commit, its subject whole; the separators are shown as U+FFFD like every control character.
    assert commits[1].subject == "odd\ufffdsubject\ufffdhere"


def test_a_journal_with_a_tail_torn_inside_a_character_keeps_its_whole_records(tmp_path: Path) -> None:
    journal = tmp_path / "progress.jsonl"
    whole = json.dumps({"k": "caf\u00e9 \u2028"}, ensure_ascii=False) + "\n"
    journal.write_bytes(whole.encode() + whole.encode()[:5] + "\u00e9".encode()[:1])
    assert read_journal(journal, json.loads) == [{"k": "caf\u00e9 \u2028"}]


# CSV cells never start a formula.

@pytest.mark.parametrize("task", ["=HYPERLINK(\"http://x\",\"y\")", "+1+1", "-2+3", "@SUM(A1)", "\tx", "\uff1d1+1"])
def test_export_csv_writes_formula_text_behind_a_quote(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                       task: str) -> None:
    run = make_run(tmp_path / "r", clean=1, corrupt=1, task=task)
    code, out, err = run_main(capsys, "export", str(run))
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out, newline="")))
    assert rows and all(row["task"] == "'" + task for row in rows)
    # Numbers stay numbers, and JSON lines keep the text exactly.
    assert all(row["session_id"].isdigit() for row in rows)
    code, out, _ = run_main(capsys, "export", str(run), "--format", "jsonl")
    assert {json.loads(line)["task"] for line in out.split("\n") if line} == {task}


# Every process the harness starts writes a capped log.

def test_a_bisect_build_that_only_prints_leaves_a_capped_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logcap, "DEFAULT_MAX_BYTES", 200_000)
    src, probe = tmp_path / "src", tmp_path / "probe"
    src.mkdir()
    probe.mkdir()
    flood = "python3 -c \"import sys; [sys.stdout.write('x' * 999 + chr(10)) for _ in range(5000)]\""
    plan = prepare(deploy="true", build=flood, rev="r", src=src, probe_dir=probe, build_timeout=120, ready_timeout=10)
    assert not isinstance(plan, ProbeResult)  # the build succeeded
    on_disk = sum(f.stat().st_size for f in probe.iterdir() if f.name.startswith("build.log"))
    assert on_disk <= 200_000 + 1_000 < 5_000_000
    assert "capped at 200000 bytes" in (probe / "build.log").read_text()


# The simulator takes a lone surrogate as a server's tokenizer does.

def test_the_simulator_answers_a_message_holding_a_lone_surrogate(sim_server) -> None:
    sim = sim_server("--time-scale", "0")
    body = b'{"messages": [{"role": "user", "content": "half a pair: \\ud800 here"}], "max_tokens": 64}'
    for stream in (b"false", b"true"):
        answer = httpx.post(f"{sim.base_url}/chat/completions", content=body[:-1] + b', "stream": ' + stream + b"}",
                            headers={"Content-Type": "application/json"}, timeout=60)
        assert answer.status_code == 200, answer.text


# Matrix variables are quoted in commands and hooks as bisect quotes them.

def test_a_matrix_variable_is_one_word_in_a_command_and_a_hook_never_code(tmp_path: Path) -> None:
    mark = tmp_path / "pwned"
    value = f"$(touch {mark}); `touch {mark}` two words"
    levels = {"levels": {"off": {}, "on": {"flags": "--enable-hierarchical-cache"}}}
    process = {"command": 'bash -c "printf %s ${x} > /dev/null" ${x}', "port": "${port}"}
    external = {"url": "http://127.0.0.1:9", "setup": "printf %s ${x} ${flags} > /dev/null",
                "teardown": "echo ${x} > /dev/null"}
    for deployment in (process, {"external": external}):
        spec = MatrixSpec.model_validate({"name": "q", "variables": {"port": "auto", "x": value},
                                          "factors": {"f": levels}, "deployment": deployment})
        launch = resolve(spec, plan(spec)[-1], log_dir=tmp_path)
        if launch.processes[0].argv is not None:
            argv = launch.processes[0].argv
            assert argv[-2] == value and argv[-1] == "--enable-hierarchical-cache"
            subprocess.run(argv[:3], check=True, timeout=60)
        else:
            for hook in (launch.setup, launch.teardown):
                subprocess.run(hook, check=True, timeout=60)
    assert not mark.exists()


# No output overwrites a record or an input.

def test_no_writing_command_overwrites_records_or_its_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", clean=2, corrupt=1)
    (run / "sim.log").write_text("the server's log\n", encoding="utf-8")
    before = {f.name: f.read_bytes() for f in run.iterdir() if f.is_file()}
    # schema --write into a run directory, and into a matrix directory.
    code, _, err = run_main(capsys, "schema", "--write", str(run))
    assert code == 2 and "would overwrite a record of the run directory" in err and err.count("\n") == 1
    matrix = tmp_path / "m"
    matrix.mkdir()
    for name in ("plan.json", "spec.yaml", "matrix.json"):
        (matrix / name).write_text("{}\n", encoding="utf-8")
    code, _, err = run_main(capsys, "schema", "--write", str(matrix))
    assert code == 2 and "matrix directory" in err
    assert all((matrix / name).read_text() == "{}\n" for name in ("plan.json", "matrix.json"))
    # export -o onto sim.log, and onto a hard link to summary.json.
    code, _, err = run_main(capsys, "export", str(run), "-o", str(run / "sim.log"))
    assert code == 2 and "would overwrite a record" in err
    link = tmp_path / "elsewhere.csv"
    link.hardlink_to(run / "summary.json")
    code, _, err = run_main(capsys, "export", str(run), "-o", str(link))
    assert code == 2 and "summary.json" in err
    assert {f.name: f.read_bytes() for f in run.iterdir() if f.is_file()} == before
    # trace convert LOG -o LOG, directly or through a symbolic link.
    log = tmp_path / "log.jsonl"
    log.write_text('{"request": {"messages": []}}\n', encoding="utf-8")
    (tmp_path / "alias.jsonl").symlink_to(log)
    for out in (log, tmp_path / "alias.jsonl"):
        code, _, err = run_main(capsys, "trace", "convert", str(log), "-o", str(out))
        assert code == 2 and "would overwrite its input" in err
    assert log.read_text() == '{"request": {"messages": []}}\n'
    # A new file beside the records, and the schemas' usual home, are fine.
    code, _, err = run_main(capsys, "export", str(run), "-o", str(run / "turns.csv"))
    assert code == 0, err
    code, _, err = run_main(capsys, "schema", "--write", str(tmp_path / "docs" / "schemas"))
    assert code == 0, err
    code, _, err = run_main(capsys, "schema", "--write", str(tmp_path / "docs" / "schemas"))
    assert code == 0, err


# Bad input: one line, exit 2 (a probe exits 255 so that git bisect stops), nothing half-made.

def test_a_trace_tool_of_another_shape_is_refused_by_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    conversation = _conversation()
    conversation["tools"] = [{"x": 1}]
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(conversation) + "\n", encoding="utf-8")
    code, _, err = run_main(capsys, "run", "--workload", str(trace), "--base-url", "http://127.0.0.1:9/v1",
                            "--out", str(tmp_path / "never"))
    assert code == 2 and err.startswith(f"repro: error: {trace}:1: tools") and err.count("\n") == 1
    assert not (tmp_path / "never").exists()


def test_trace_convert_keeps_a_lone_surrogate_as_its_escape(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"request": {"messages": [{"role": "user", "content": "a\\ud800"}]}, '
                   '"response": {"choices": [{"message": {"role": "assistant", "content": "x"}}]}}\n', encoding="utf-8")
    code, _, err = run_main(capsys, "trace", "convert", str(log), "-o", str(tmp_path / "t.jsonl"))
    assert code == 0, err
    assert load_trace(tmp_path / "t.jsonl").conversations[0].messages[0].content == "a\ud800"


def test_a_damaged_bisect_setup_or_journal_is_one_line(tmp_path: Path) -> None:
    from repro.bisect.journal import Journal
    from repro.errors import UsageError

    (tmp_path / "setup.json").write_text("[1]", encoding="utf-8")
    with pytest.raises(UsageError, match="setup.json is damaged"):
        Journal(tmp_path, {"kind": "flags"}, resume=True)
    (tmp_path / "setup.json").write_text('{"kind": "flags"}', encoding="utf-8")
    (tmp_path / "probes.jsonl").mkdir()
    with pytest.raises(UsageError, match="probes.jsonl: cannot read"):
        Journal(tmp_path, {"kind": "flags"}, resume=True).probes()


@pytest.mark.parametrize("record", ["summary.json", "sessions.jsonl"])
def test_a_record_linked_to_an_endless_device_is_damaged_not_read(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                                   record: str) -> None:
    run = make_run(tmp_path / "r", clean=2)
    (run / record).unlink()
    (run / record).symlink_to("/dev/zero")
    code, _, err = run_main(capsys, "export", str(run))
    assert code == 2 and err == f"repro: error: {run / record}: not a regular file\n"


def test_export_to_a_closed_standard_output_is_a_usage_error(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", clean=2)
    # `repro export RUN >&-`: the shell starts it with file descriptor 1 closed.
    done = subprocess.run(["bash", "-c", f'"$0" -c "from repro.cli import main; main()" export {run} >&-',
                           sys.executable], stderr=subprocess.PIPE, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and done.stderr == "repro: error: export: standard output is closed; give -o FILE\n"


@pytest.mark.parametrize("args, expected", [
    (["--sessions", "0"], "--sessions 0: must be at least 1"),
    (["--max-rounds", "0"], "--max-rounds 0: must be at least 1"),
    (["--alpha", "2"], "--alpha 2: must lie strictly between 0 and 1"),
    (["--bad-rate", "0"], "--bad-rate 0: must lie above 0 and at most 1"),
    (["--deploy", "serve ${nope}"], "--deploy: unknown variable ${nope}"),
])
def test_probe_options_out_of_range_stop_before_anything_is_made(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                                  args: list[str], expected: str) -> None:
    out = tmp_path / "probe"
    code, _, err = run_main(capsys, "probe", "--deploy", "true", "--bad-rate", "0.2", "--out", str(out), *args)
    assert code == 255 and err.startswith(f"repro: error: {expected}") and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize("args, expected", [
    (["--max-probes", "0"], "--max-probes 0: must be at least 1"),
    (["--deploy", "serve ${nope} ${port}"], "--deploy: unknown variable ${nope}"),
])
def test_bisect_flags_options_out_of_range_stop_before_the_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                                     args: list[str], expected: str) -> None:
    out = tmp_path / "b"
    code, _, err = run_main(capsys, "bisect", "flags", "--good", "", "--bad", "--index-k-dtype bf16", "--out", str(out),
                            *args)
    assert code == 2 and err.startswith(f"repro: error: {expected}") and err.count("\n") == 1
    assert not out.exists()


def test_margin_without_baseline_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_main(capsys, "run", "--margin", "0.1", "--out", str(tmp_path / "r"))
    assert code == 2 and "--margin needs --baseline" in err
    assert not (tmp_path / "r").exists()


# Escapes from commit subjects reach neither the terminal nor report.md.

def test_terminal_escapes_in_a_commit_subject_are_replaced_for_terminal_and_markdown(tmp_path: Path) -> None:
    from repro.report.markdown import md_escape

    repo = tmp_path / "repo"
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=60)
    hostile = "fix \x1b[2J\x1b]0;pwned\x07\x9b31m cache"
    for subject in ("good", hostile):
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", subject], check=True, timeout=60)
    shas = subprocess.run([*git, "rev-list", "--reverse", "HEAD"], check=True, capture_output=True, text=True,
                          timeout=60).stdout.split()
    label = commit_range(repo, shas[0], shas[1])[1].label(1)
    assert not any(ch in label for ch in "\x1b\x07\x9b") and label.endswith("fix \ufffd[2J\ufffd]0;pwned\ufffd\ufffd31m cache")
    assert not any(ch in md_escape(hostile) for ch in "\x1b\x07\x9b")


# A --ray-address that answers but is no Ray head: exit 2 in bounded time, nothing made.

@pytest.mark.parametrize("behaviour", ["silent", "http1"])
def test_a_ray_address_that_is_not_a_ray_head_is_refused_before_anything_is_made(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, behaviour: str
) -> None:
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            if behaviour == "http1":
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    try:
        for command in (["run", "--executor", "ray", "--workers", "2", "--sessions", "2"], ["sweep", "--executor", "ray"]):
            out = tmp_path / command[0]
            code, _, err = run_main(capsys, *command, "--ray-address", f"127.0.0.1:{port}", "--out", str(out))
            assert code == 2 and "not a Ray head" in err and err.count("\n") == 1, err
            assert not out.exists()
    finally:
        listener.close()
        for conn in held:
            conn.close()


# Sizes are counted before they are built.

def test_a_sweep_range_of_a_hundred_million_levels_is_refused_before_it_is_built(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import tracemalloc

    tracemalloc.start()
    code, _, err = run_main(capsys, "sweep", "--concurrency", "1-100000000:+1", "--out", str(tmp_path / "s"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert code == 2 and "a sweep needs 2 to 32 levels" in err and err.count("\n") == 1
    assert peak < 50_000_000 and not (tmp_path / "s").exists()


@pytest.mark.parametrize("factors, replicates", [(20, 1), (1, 100_000_000)])
def test_a_matrix_of_too_many_runs_is_refused_before_it_is_planned(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                                   factors: int, replicates: int) -> None:
    spec = {"name": "huge", "variables": {"port": "auto"},
            "factors": {f"f{i}": {"levels": {"a": {}, "b": {}}} for i in range(factors)},
            "deployment": {"command": "true", "port": "${port}"}, "design": {"replicates": replicates}}
    path = tmp_path / "huge.yaml"
    path.write_text(json.dumps(spec), encoding="utf-8")
    code, _, err = run_main(capsys, "matrix", str(path), "--out", str(tmp_path / "m"))
    assert code == 2 and "a matrix runs at most 10000" in err and err.count("\n") == 1
    assert not (tmp_path / "m").exists()
