"""A run's life and the evidence it leaves (issue 11): damaged and unfinished run directories, repeated
interrupts, a full disk, secrets, bad input, outputs aimed at the records, and a run's start and end.

Real processes and real HTTP on 127.0.0.1 (the faulty servers); real signals; a real full filesystem
(a small tmpfs, mounted when the tests run as root).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Iterator

import pytest
from run_builders import make_run, run_main

from repro.errors import EXIT_INTERNAL
from repro.run.options import RunOptions
from repro.run.runner import run_directory
from repro.store.rundir import load_run

ROOT = Path(__file__).resolve().parent.parent
REPRO = [sys.executable, "-c", "from repro.cli import main; main()"]
NOWHERE = "http://127.0.0.1:9/v1"
"""A base URL no run gets to: the errors under test come before the target is asked anything."""


def one_line_error(code: int, err: str, expected: int, *words: str) -> None:
    assert code == expected, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def popen(*args: str, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([*REPRO, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def wait_for_sessions(proc: subprocess.Popen[str], out: Path, count: int) -> None:
    """Poll until `count` session lines are on disk (the run's own output), as long as the process lives."""
    file = out / "sessions.jsonl"
    while not (file.exists() and file.read_bytes().count(b"\n") >= count):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)


def read_line(stream: IO[str]) -> str:
    line = stream.readline()
    assert line, "the process ended without printing the line"
    return line


# 4. The gate never says 1 (FAIL) because it could not read its evidence.


def test_gate_skips_a_tail_torn_inside_a_character(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "r", clean=30, task="café ☕")
    line = (run / "sessions.jsonl").read_bytes().splitlines()[0]
    cut = line.index("☕".encode()) + 1  # inside the three bytes of one character
    with open(run / "sessions.jsonl", "ab") as fh:
        fh.write(line[:cut])
    code, out, err = run_main(capsys, "gate", str(run), "--max-corruption-rate", "0.2")
    assert code == 0, err
    assert out.splitlines()[-1] == "gate: PASS (exit 0)"


def _binary_line(run: Path) -> None:
    with open(run / "sessions.jsonl", "ab") as fh:
        fh.write(b"\x00\xff\xfe binary \x80\n")


def _latin1_manifest(run: Path) -> None:
    manifest = run / "manifest.json"
    manifest.write_bytes(manifest.read_text(encoding="utf-8").replace('"run"', '"r\u00e9sum\u00e9"').encode("latin-1"))


def _directory(name: str):
    def damage(run: Path) -> None:
        path = run / name
        path.unlink()
        path.mkdir()

    return damage


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (_binary_line, "sessions.jsonl:31: not a session record: not UTF-8 text"),
        (_latin1_manifest, "manifest.json: not UTF-8 text"),
        (_directory("sessions.jsonl"), "sessions.jsonl: cannot read: Is a directory"),
        (_directory("summary.json"), "summary.json: cannot read: Is a directory"),
    ],
    ids=["binary-line", "latin1-manifest", "sessions-dir", "summary-dir"],
)
def test_gate_on_damaged_records_is_inconclusive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Any, words: str
) -> None:
    run = make_run(tmp_path / "r", clean=30)
    damage(run)
    code, out, err = run_main(capsys, "gate", str(run), "--max-corruption-rate", "0.2")
    assert code == 125, err
    lines = out.splitlines()
    assert lines[0].startswith("records: INCONCLUSIVE: ") and words in lines[0]
    assert lines[-1] == "gate: INCONCLUSIVE (exit 125)"
    # Every other command names the damage in one line, exit 2.
    code, _, err = run_main(capsys, "report", str(run), "-o", str(tmp_path / "r.html"))
    one_line_error(code, err, 2, words)


POKE = """
from repro import cli

@cli.app.command("poke")
def poke() -> None:
    {}.pop("missing")

cli.main()
"""


def test_a_bug_has_its_own_exit_code_never_0_or_1() -> None:
    done = subprocess.run([sys.executable, "-c", POKE, "poke"], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_INTERNAL == 255
    assert done.stderr == "repro: internal error (a bug; REPRO_DEBUG=1 shows the traceback): KeyError: 'missing'\n"
    debug = subprocess.run([sys.executable, "-c", POKE, "poke"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "REPRO_DEBUG": "1"})
    assert debug.returncode == 255 and "Traceback" in debug.stderr


# 7. The gate does not pass a run that did not finish.


def test_gate_is_inconclusive_on_an_unfinished_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    crashed = make_run(tmp_path / "crashed", clean=40, summary=False)
    code, out, _ = run_main(capsys, "gate", str(crashed), "--max-corruption-rate", "0.2")
    assert code == 125
    assert out.splitlines()[0] == ("finished: INCONCLUSIVE: no summary.json: the run did not finish (crashed or "
                                   "killed); 40 sessions recorded (--allow-partial judges what was recorded)")
    short = make_run(tmp_path / "short", clean=40, options={"sessions": 60})
    code, out, _ = run_main(capsys, "gate", str(short), "--max-corruption-rate", "0.2")
    assert code == 125 and "only 40 of 60 planned sessions recorded" in out.splitlines()[0]
    code, out, _ = run_main(capsys, "gate", str(short), "--max-corruption-rate", "0.2", "--allow-partial")
    assert code == 0 and out.splitlines()[0].startswith("finished: PARTIAL (allowed by --allow-partial): only 40")
    # Evidence still wins: corruption shown above the limit fails a partial run.
    bad = make_run(tmp_path / "bad", clean=10, corrupt=10, summary=False)
    code, out, _ = run_main(capsys, "gate", str(bad), "--max-corruption-rate", "0.05")
    assert code == 1, out


def test_gate_after_sigterm_is_inconclusive_unless_partial_is_allowed(
    faulty: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    proc = popen("run", "--base-url", f"{faulty}/slow:0.05/v1", "--sessions", "30", "--concurrency", "2",
                 "--out", str(out))
    wait_for_sessions(proc, out, 3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    recorded = sum(s.outcome != "interrupted" for s in load_run(out).sessions)
    assert 3 <= recorded < 30
    code, text, _ = run_main(capsys, "gate", str(out), "--max-corruption-rate", "0.5")
    assert code == 125
    first = text.splitlines()[0]
    assert first.startswith("finished: INCONCLUSIVE: the run did not finish: the run was interrupted ("), text
    assert f"sessions in flight); {recorded} sessions recorded" in first, text
    code, text, _ = run_main(capsys, "gate", str(out), "--max-corruption-rate", "0.9", "--allow-partial",
                             "--min-completed", "3")
    assert code == 0, text


def test_ctrl_c_after_the_last_session_still_saves_the_summary_and_the_report(faulty: str, tmp_path: Path) -> None:
    # The run's last /metrics scrape hangs until its timeout: the Ctrl-C lands after every session is
    # recorded and before summary.json exists, the window where it used to lose both.
    out = tmp_path / "run"
    proc = popen("run", "--base-url", f"{faulty}/hang-metrics/v1", "--sessions", "4", "--turns", "2",
                 "--out", str(out))
    wait_for_sessions(proc, out, 4)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "stopping: saving" in err and err.rstrip().endswith("repro: interrupted"), err
    run = load_run(out)
    assert run.summary is not None and not run.summary.interrupted and run.summary.sessions == 4
    assert (out / "report.html").exists()


# 9. Secrets are never echoed nor written; a URL with a password is refused.


def test_a_key_with_a_carriage_return_is_a_usage_error_that_never_shows_it(
    faulty: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPRO_CRLF_KEY", "sk-very-secret\r")
    code, out, err = run_main(capsys, "run", "--base-url", f"{faulty}/good/v1", "--api-key-env", "REPRO_CRLF_KEY",
                              "--out", str(tmp_path / "run"))
    one_line_error(code, err, 2, "REPRO_CRLF_KEY", "'\\r' at position 15 of 15", "Windows line endings")
    assert "very-secret" not in out + err and not (tmp_path / "run").exists()


def test_a_key_echoed_by_the_server_is_never_written(faulty: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run([*REPRO, "run", "--base-url", f"{faulty}/echokey/v1", "--api-key-env", "REPRO_KEY",
                           "--sessions", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "REPRO_KEY": "sk-echo-me"})
    assert done.returncode == 0, done.stderr
    assert "sk-echo-me" not in done.stdout + done.stderr
    run = load_run(out)
    assert [s.outcome for s in run.sessions] == ["error", "error"]
    raw = [out / turn.raw_path for s in run.sessions for turn in s.turns if turn.raw_path]
    assert raw and all(b"invalid credentials: Bearer [REDACTED]" in path.read_bytes() for path in raw)
    assert not [path for path in out.rglob("*") if path.is_file() and b"sk-echo-me" in path.read_bytes()]


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://alice:hunter2@127.0.0.1:9/v1", "must not carry a user name or password"),
        ("http://127.0.0.1:9/v1?api_key=hunter2", "must not have a query string"),
        ("http://127.0.0.1:9/v1#hunter2", "must not have a query string or fragment"),
        ("http://127.0.0.1:9/my models/v1", "must not contain spaces"),
        ("http://127.0.0.1:9/v1\r\nX-Injected: hunter2", "control characters (CR, LF, tab)"),
    ],
    ids=["password", "query", "fragment", "space", "crlf"],
)
def test_bad_base_urls_are_refused_without_echoing_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, words: str
) -> None:
    code, out, err = run_main(capsys, "run", "--base-url", url, "--out", str(tmp_path / "run"))
    one_line_error(code, err, 2, "base_url", words)
    assert "hunter2" not in out + err and not (tmp_path / "run").exists()


# 10. A full disk: one line, readable records, the summary.


@contextlib.contextmanager
def small_filesystem(path: Path, size: str, *options: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path`; skips the test when this process may not mount one."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> None:
    """Write until the filesystem says it is full."""
    with open(directory / "filler", "wb", buffering=0) as fh:
        with contextlib.suppress(OSError):
            while True:
                fh.write(bytes(64 * 1024))
        with contextlib.suppress(OSError):
            while True:
                fh.write(b"x")


def test_a_full_disk_stops_the_run_with_one_line_and_readable_records(
    faulty: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with small_filesystem(tmp_path / "disk", "4m") as disk:
        out = disk / "run"
        proc = popen("run", "--base-url", f"{faulty}/slow:0.02/v1", "--sessions", "200", "--concurrency", "4",
                     "--out", str(out))
        wait_for_sessions(proc, out, 2)
        fill(disk)
        stdout, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        assert err.count("\n") == 1 and "Traceback" not in err + stdout, err
        assert err.startswith(f"repro: error: run stopped: cannot write to {out}: No space left on device; ")
        assert err.rstrip().endswith("summary.json written")
        run = load_run(out)  # every line whole: nothing torn
        assert run.summary is not None and run.summary.interrupted and run.summary.inconclusive
        assert any(r.startswith("the run stopped early: cannot write (No space left on device)")
                   for r in run.summary.inconclusive_reasons)
        assert run.summary.sessions == len(run.sessions) < 200
        assert sum(s.outcome == "interrupted" for s in run.sessions) == run.summary.counts["interrupted"] >= 1
        assert (out / "sessions.jsonl").read_bytes().endswith(b"\n")
        assert not (out / ".space-reserve").exists() and not list(out.glob(".*.tmp"))
        code, text, _ = run_main(capsys, "gate", str(out), "--max-corruption-rate", "0.5")
        assert code == 125 and "the run stopped early" in text


# 11. A second interrupt does not cut the saving short; a third quits and says what was lost.


def interrupted_run(faulty: str, out: Path) -> subprocess.Popen[str]:
    proc = popen("run", "--base-url", f"{faulty}/slow:0.05/v1", "--sessions", "40", "--concurrency", "4",
                 "--out", str(out))
    wait_for_sessions(proc, out, 1)
    proc.send_signal(signal.SIGINT)
    assert proc.stderr is not None
    assert read_line(proc.stderr).startswith("repro: stopping: saving the records of the sessions in flight")
    return proc


def test_a_second_ctrl_c_does_not_abort_the_saving(faulty: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = interrupted_run(faulty, out)
    proc.send_signal(signal.SIGINT)
    assert proc.stderr is not None
    assert read_line(proc.stderr).startswith("repro: interrupted again: still saving ")
    stdout, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in rest, rest
    run = load_run(out)
    assert run.summary is not None and run.summary.interrupted
    assert run.summary.counts["interrupted"] == sum(s.outcome == "interrupted" for s in run.sessions) >= 1
    assert (out / "report.html").stat().st_size > 0 and "Report:" in stdout


def test_a_third_ctrl_c_quits_and_names_what_was_not_saved(faulty: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = interrupted_run(faulty, out)
    assert proc.stderr is not None
    proc.send_signal(signal.SIGINT)
    read_line(proc.stderr)
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert rest.startswith("repro: quit: not saved: "), rest
    load_run(out)  # what was saved is whole


def test_a_ctrl_c_during_start_up_says_so_and_leaves_nothing(tmp_path: Path) -> None:
    # A server that accepts and never answers holds the run in its start-up (the first request to the target).
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(60)
        out = tmp_path / "run"
        proc = popen("run", "--base-url", f"http://127.0.0.1:{listener.getsockname()[1]}/v1", "--sessions", "3",
                     "--out", str(out))
        connection, _ = listener.accept()
        with connection:
            proc.send_signal(signal.SIGINT)
            stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err == "repro: interrupted\n" and "Traceback" not in stdout, err
    assert not out.exists()


# 13. Bad input is one line and exit 2, never a traceback.


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda d: (d / "file").write_text("x") and d / "file" / "run", "Not a directory"),
        (lambda d: Path("/proc/repro-run"), "No such file or directory"),
        (lambda d: os.symlink(d / "loop", d / "loop") or d / "loop" / "run", "Too many levels of symbolic links"),
        (lambda d: os.symlink(d / "loop", d / "loop") or d / "loop", "Too many levels of symbolic links"),
    ],
    ids=["under-a-file", "under-proc", "under-a-symlink-loop", "a-symlink-loop"],
)
def test_unusable_out_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, words: str) -> None:
    out = make(tmp_path)
    code, _, err = run_main(capsys, "run", "--base-url", NOWHERE, "--out", str(out))
    one_line_error(code, err, 2, f"--out {out}", words)


def test_out_on_a_read_only_filesystem_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with small_filesystem(tmp_path / "ro", "1m", "ro") as disk:
        code, _, err = run_main(capsys, "run", "--base-url", NOWHERE, "--out", str(disk / "run"))
        one_line_error(code, err, 2, "Read-only file system")


def test_files_that_are_not_utf8_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    code, _, err = run_main(capsys, "run", "--config", str(config), "--out", str(tmp_path / "run"))
    one_line_error(code, err, 2, f"--config {config}: not UTF-8 text")
    spec = tmp_path / "m.yaml"
    spec.write_bytes((ROOT / "matrices" / "sim_hicache_bf16.yaml").read_bytes() + "# caf\u00e9\n".encode("latin-1"))
    code, _, err = run_main(capsys, "matrix", str(spec), "--out", str(tmp_path / "m"))
    one_line_error(code, err, 2, f"{spec}: not UTF-8 text")


@pytest.mark.parametrize("plan", [b"{not json", b"\xff\xfe", b"[1, 2]"], ids=["torn", "binary", "not-an-object"])
def test_a_corrupt_plan_on_resume_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], plan: bytes) -> None:
    matrix = tmp_path / "m"
    matrix.mkdir()
    (matrix / "plan.json").write_bytes(plan)
    code, _, err = run_main(capsys, "matrix", str(ROOT / "matrices" / "sim_hicache_bf16.yaml"), "--out", str(matrix),
                            "--resume")
    one_line_error(code, err, 2, f"--resume {matrix}: plan.json is damaged")


def test_metrics_csv_that_is_a_directory_is_noted_in_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path / "r", clean=5)
    (run / "metrics.csv").mkdir()
    code, _, err = run_main(capsys, "report", str(run))
    assert code == 0, err
    assert "metrics.csv could not be read (IsADirectoryError)" in (run / "report.html").read_text(encoding="utf-8")


# 14. Outputs never overwrite the records they are made from.


@pytest.mark.parametrize(
    "args",
    [
        ["report", "{run}", "-o", "{run}/sessions.jsonl"],
        ["report", "{run}", "--markdown", "{run}/manifest.json"],
        ["report", "{run}", "--junit", "{run}/raw/s0001-t01.sse"],
        ["report", "{run}", "-o", "{link}/summary.json"],
        ["gate", "{run}", "--max-corruption-rate", "0.1", "--junit", "{run}/sessions.jsonl"],
    ],
    ids=["output", "markdown", "junit-raw", "through-a-symlink", "gate-junit"],
)
def test_outputs_aimed_at_the_records_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    run = make_run(tmp_path / "r", clean=3, corrupt=2)
    (tmp_path / "link").symlink_to(run)
    before = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    argv = [arg.format(run=run, link=tmp_path / "link") for arg in args]
    code, _, err = run_main(capsys, *argv)
    one_line_error(code, err, 2, "would overwrite the records of run")
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == before


# 16. A failed start leaves nothing behind; default run directories are never shared.


def test_a_failed_start_leaves_no_half_made_run_directory(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "run"
    empty = tmp_path / "empty"
    empty.mkdir()
    for target in (out, empty):
        done = subprocess.run([*REPRO, "run", "--out", str(target), "--sim-args", "--no-such-flag"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 3, done.stderr
        assert "unrecognized arguments: --no-such-flag" in done.stderr
    assert not out.exists()
    assert empty.is_dir() and not any(empty.iterdir())


def test_default_run_directories_are_claimed_when_chosen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    options = RunOptions.parse({})
    first, created = run_directory(options, "same name")
    second, _ = run_directory(options, "same name")
    assert created and first != second
    assert first.is_dir() and second.is_dir() and first.parent == second.parent == Path("reports")


# 17 (and 1's --extra-body half). Values that parse but cannot be used.


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--ramp-up", "1e12"], "ramp_up: Input should be less than or equal to 86400"),
        (["--ramp-up", "inf"], "ramp_up: Input should be a finite number"),
        (["--timeout", "inf"], "timeout: Input should be a finite number"),
        (["--extra-body", '{"temperature": NaN}'], "extra_body: NaN and Infinity are not JSON"),
        (["--extra-body", '{"a": [-Infinity]}'], "extra_body: NaN and Infinity are not JSON"),
        (["--extra-body", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"], "extra_body: nested deeper than 64"),
        (["--extra-body", '{"a": ' + "[" * 100 + "]" * 100 + "}"], "extra_body: nested deeper than 64"),
    ],
    ids=["ramp-up-huge", "ramp-up-inf", "timeout-inf", "nan", "infinity", "deep-recursion", "deep"],
)
def test_useless_values_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    code, _, err = run_main(capsys, "run", "--base-url", NOWHERE, "--out", str(tmp_path / "run"), *args)
    one_line_error(code, err, 2, words)


def test_nan_from_yaml_config_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("extra_body:\n  temperature: .nan\n", encoding="utf-8")
    code, _, err = run_main(capsys, "run", "--config", str(config), "--base-url", NOWHERE)
    one_line_error(code, err, 2, "extra_body: NaN and Infinity are not JSON")


def test_yaml_nested_past_the_parsers_recursion_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("extra_body:\n  a: " + "[" * 5000 + "]" * 5000 + "\n", encoding="utf-8")
    code, _, err = run_main(capsys, "run", "--config", str(config), "--base-url", NOWHERE)
    one_line_error(code, err, 2, f"--config {config}: not usable YAML: nested too deeply")


def test_duplicate_yaml_keys_are_refused_with_their_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = tmp_path / "w.yaml"
    text = (ROOT / "experiments" / "agentic_coding.yaml").read_text(encoding="utf-8")
    workload.write_text(text + "max_tokens: 1\n", encoding="utf-8")
    line = text.count("\n") + 1
    first = next(i for i, row in enumerate(text.splitlines(), 1) if row.startswith("max_tokens:"))
    code, _, err = run_main(capsys, "run", "--workload", str(workload), "--base-url", NOWHERE)
    duplicate = f"{workload}:{line}: not valid YAML: duplicate key 'max_tokens' (first at line {first})"
    one_line_error(code, err, 2, duplicate)

    spec = tmp_path / "m.yaml"
    spec_text = (ROOT / "matrices" / "sim_hicache_bf16.yaml").read_text(encoding="utf-8")
    spec.write_text(spec_text + "name: again\n", encoding="utf-8")
    code, _, err = run_main(capsys, "matrix", str(spec), "--out", str(tmp_path / "m"))
    one_line_error(code, err, 2, f"{spec}:{spec_text.count(chr(10)) + 1}: not valid YAML: duplicate key 'name'")

    config = tmp_path / "c.yaml"
    config.write_text("sessions: 5\nturns: 2\nsessions: 50\n", encoding="utf-8")
    code, _, err = run_main(capsys, "run", "--config", str(config))
    one_line_error(code, err, 2, f"--config {config}:3: not valid YAML: duplicate key 'sessions' (first at line 1)")
