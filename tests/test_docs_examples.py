"""The examples of docs/ run as written: every fenced shell block marked runnable is run, command by command,
against the embedded simulator, in a scratch directory per page, so that no example can rot.

The marker is an HTML comment on the line before the fence (invisible on the rendered page):

    <!-- runnable -->                               every command must exit 0
    <!-- runnable: exit=2 -->                       every command must exit 2 (examples of errors)
    <!-- runnable: --sessions 60 => --sessions 8 --> run with this substitution (the page says so in its text)

Options are separated by `;`. In a `console` block the commands are the lines after `$ `; in an `sh` block
every line that is not a comment; a line ending in `\\` continues on the next. A page's blocks run in order
in one directory that holds the repository's examples/, matrices/ and experiments/, with this checkout's
`repro` first on PATH. A substitution that matches nothing in its block is a failure too (it went stale).
In a `console` block, an output line the page shows as `repro: error: …` must be the command's own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MARKER = re.compile(r"^<!--\s*runnable(?::(?P<options>.*?))?\s*-->\s*$")
FENCE = re.compile(r"^```(?P<lang>\w*)\s*$")
SHELL_LANGS = ("console", "sh", "bash", "shell")
SHARED = ("examples", "matrices", "experiments")
COMMAND_TIMEOUT = 600.0
"""Seconds one command may take (an 8-session run against the simulator takes about 20 on a loaded machine)."""


@dataclass
class Example:
    """One runnable block of a page."""

    page: str
    line: int
    """1-based line of its fence."""
    commands: list[str]
    exit_code: int = 0
    substitutions: list[tuple[str, str]] = field(default_factory=list)
    errors: list[list[str]] = field(default_factory=list)
    """Per command, the `repro: error:` lines the page shows after it."""


def _options(text: str, where: str) -> tuple[int, list[tuple[str, str]]]:
    exit_code, substitutions = 0, []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        if item.startswith("exit="):
            exit_code = int(item.removeprefix("exit="))
        elif "=>" in item:
            old, _, new = item.partition("=>")
            substitutions.append((old.strip(), new.strip()))
        else:
            raise ValueError(f"{where}: unknown runnable option {item!r}")
    return exit_code, substitutions


def _commands(lang: str, body: list[str]) -> tuple[list[str], list[list[str]]]:
    """The block's commands, and per command the error lines the page shows after it."""
    commands: list[str] = []
    errors: list[list[str]] = []
    pending = ""
    for raw in body:
        if pending:
            line = raw
        elif lang == "console":
            if not raw.startswith("$ "):
                if commands and raw.startswith("repro: error:"):
                    errors[-1].append(raw.strip())
                continue
            line = raw[2:]
        else:
            line = raw
            if not line.strip() or line.lstrip().startswith("#"):
                continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        commands.append(pending + line)
        errors.append([])
        pending = ""
    return commands, errors


def examples(page: str, text: str) -> list[Example]:
    """The runnable blocks of one page's Markdown text."""
    found = []
    lines = text.splitlines()
    for index, line in enumerate(lines):
        marker = MARKER.match(line)
        if marker is None:
            continue
        where = f"{page}:{index + 1}"
        fence = FENCE.match(lines[index + 1]) if index + 1 < len(lines) else None
        if fence is None or fence.group("lang") not in SHELL_LANGS:
            raise ValueError(f"{where}: a runnable marker must sit right above a {'/'.join(SHELL_LANGS)} fence")
        end = next(i for i in range(index + 2, len(lines)) if lines[i].startswith("```"))
        exit_code, substitutions = _options(marker.group("options") or "", where)
        commands, errors = _commands(fence.group("lang"), lines[index + 2:end])
        if not commands:
            raise ValueError(f"{where}: a runnable block without a command")
        found.append(Example(page, index + 2, commands, exit_code, substitutions, errors))
    return found


def _substituted(example: Example) -> list[str]:
    commands = list(example.commands)
    for old, new in example.substitutions:
        if not any(old in command for command in commands):
            raise AssertionError(f"{example.page}:{example.line}: substitution {old!r} matches no command (stale)")
        commands = [command.replace(old, new) for command in commands]
    return commands


def run_examples(found: list[Example], workdir: Path) -> list[str]:
    """Run every example in `workdir` (prepared with the shared directories); one line per failure."""
    for name in SHARED:
        if not (workdir / name).exists():
            (workdir / name).symlink_to(ROOT / name)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("REPRO_PROCESS_TAG", None)
    failures = []
    for example in found:
        commands = _substituted(example)
        for number, command in enumerate(commands):
            done = subprocess.run(["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True,
                                  timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL)
            said = [line.strip() for line in done.stderr.splitlines()]
            if done.returncode != example.exit_code:
                tail = " | ".join(said[-3:])
                failures.append(f"{example.page}:{example.line}: `{command}` exited {done.returncode}, "
                                f"expected {example.exit_code}: {tail}")
                break
            shown = example.errors[number] if example.errors else []
            for line in (line for line in shown if line not in said):
                failures.append(f"{example.page}:{example.line}: `{command}` did not say {line!r}; it said "
                                f"{' | '.join(said[-3:])!r}")
    return failures


def runnable_pages() -> list[Path]:
    return sorted(page for page in DOCS.glob("*.md")
                  if any(MARKER.match(line) for line in page.read_text(encoding="utf-8").splitlines()))


@pytest.mark.parametrize("page", runnable_pages(), ids=lambda p: p.name)
def test_the_runnable_examples_of_a_page_work(page: Path, tmp_path: Path) -> None:
    found = examples(page.name, page.read_text(encoding="utf-8"))
    assert found
    assert run_examples(found, tmp_path) == []


def test_the_pages_that_must_have_runnable_examples_have_them() -> None:
    pages = {page.name for page in runnable_pages()}
    assert {"getting-started.md", "replay.md", "deployments.md", "sequential.md", "matrix.md", "troubleshooting.md",
            "schema.md"} <= pages


def test_a_renamed_flag_makes_the_runner_report_the_example(tmp_path: Path) -> None:
    text = (DOCS / "replay.md").read_text(encoding="utf-8")
    renamed = text.replace("repro trace convert examples/log.jsonl -o traces.jsonl",
                           "repro trace convert examples/log.jsonl --output-file traces.jsonl")
    assert renamed != text
    failures = run_examples(examples("replay.md", renamed), tmp_path)
    assert len(failures) == 1
    assert "--output-file" in failures[0] and "exited 2, expected 0" in failures[0]


def test_an_error_message_that_changed_makes_the_runner_report_the_example(tmp_path: Path) -> None:
    page = """\
<!-- runnable: exit=2 -->
```console
$ repro schema nope
repro: error: schema: no schema called 'nope'
```
"""
    [failure] = run_examples(examples("p.md", page), tmp_path)
    assert "did not say \"repro: error: schema: no schema called 'nope'\"" in failure


def test_markers_and_their_options_are_read_as_documented() -> None:
    page = """\
<!-- runnable: --sessions 60 => --sessions 8; exit=1 -->
```console
$ repro run --sessions 60 \\
    --out reports/x
output line
$ repro gate reports/x
repro: error: it went wrong
```
"""
    [example] = examples("p.md", page)
    assert example.commands == ["repro run --sessions 60      --out reports/x", "repro gate reports/x"]
    assert example.errors == [[], ["repro: error: it went wrong"]]
    assert example.exit_code == 1 and example.substitutions == [("--sessions 60", "--sessions 8")]
    with pytest.raises(ValueError, match="right above"):
        examples("p.md", "<!-- runnable -->\n\ntext\n")
    with pytest.raises(AssertionError, match="stale"):
        _substituted(Example("p.md", 1, ["repro run"], substitutions=[("--sessions 60", "--sessions 8")]))
