"""The documentation stays true: every `repro` and `dsml-check` command line shown in docs/ and the READMEs
takes only options the CLI accepts, and every relative link resolves (to a file, and to a heading when it
names one)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from repro.cli import app
from repro.errors import UsageError
from repro.sim.config import parse_flags

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "examples" / "README.md", *(ROOT / "docs").glob("*.md")])
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
SHELL_BLOCKS = {"sh", "bash", "shell", "console"}
SEPARATORS = {"|", "||", "&&", ";", "&"}
NO_SUCH_OPTION = "No such option:"


def command_lines(text: str) -> list[str]:
    """Shell command lines of the fenced sh/console blocks: console lines after `$ `, continuations joined."""
    lines: list[str] = []
    for language, body in FENCE.findall(text):
        if language not in SHELL_BLOCKS:
            continue
        if language == "console":
            # A command shown to demonstrate the parser's refusal is left out, with its output.
            body = "\n".join(part for part in re.split(r"^(?=\$ )", body, flags=re.M) if NO_SUCH_OPTION not in part)
        pending = ""
        for raw in body.splitlines():
            if language == "console" and not pending:
                if not raw.startswith("$ "):
                    continue
                raw = raw[2:]
            line = pending + raw
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            try:
                shlex.split(line)
            except ValueError:  # a quoted argument spans lines (python -c "...")
                pending = line + "\n"
                continue
            pending = ""
            if line.strip() and not line.lstrip().startswith("#"):
                lines.append(line.split(" #", 1)[0])
    return lines


def invocations(line: str, program: str) -> list[list[str]]:
    """The argument lists given to `program` in one shell line (pipelines and lists split apart)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;")
    lexer.whitespace_split = True
    found, words = [], []
    for token in [*lexer, ";"]:
        if token in SEPARATORS:
            while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                words.pop(0)  # VAR=value before the command
            if words and words[0].rsplit("/", 1)[-1] == program:
                found.append(words[1:])
            words = []
        else:
            words.append(token)
    return found


def is_synopsis(args: list[str]) -> bool:
    """A usage line (`[--flag X]`, `A|B`, `...`) rather than a command to run."""
    return any(arg.startswith("[") or arg.endswith("]") or arg in ("...", "…") or "|" in arg for arg in args)


def resolve(args: list[str]) -> tuple[Any, list[str], str]:
    """The (sub)command the arguments name, what is left of them, and its name. Typer ships its own copy
    of click, so commands are recognised by what they have, not by click's classes."""
    command = typer.main.get_command(app)
    path = "repro"
    while args and args[0] in getattr(command, "commands", {}):
        path += f" {args[0]}"
        command, args = command.commands[args[0]], args[1:]
    return command, args, path


def option_names(command: Any) -> set[str]:
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts) if name.startswith("-")}


def concrete(args: list[str]) -> list[str]:
    """A usage line as a command: brackets and ellipses dropped, the first of `A|B` alternatives kept."""
    words = [arg.strip("[]").split("|")[0] for arg in args if arg not in ("...", "…")]
    return [word for word in words if word]


def check_repro(args: list[str]) -> None:
    command, rest, path = resolve(args)
    if path == "repro sim serve":  # its flags are the simulator's own parser's, not click's
        try:
            parse_flags(concrete(rest))
        except UsageError as err:
            raise AssertionError(f"{path} refuses {shlex.join(rest)}: {err}") from None
        return
    if is_synopsis(rest):
        unknown = {flag.split("=")[0] for flag in re.findall(r"--[a-z][a-z0-9-]*", " ".join(rest))} - option_names(command)
        assert not unknown, f"{path}: no such option {sorted(unknown)}"
        return
    try:
        command.make_context(path, list(rest), resilient_parsing=False)
    except Exception as err:  # the parser's usage errors: an unknown option, a value of the wrong type
        message = err.format_message() if hasattr(err, "format_message") else repr(err)
        raise AssertionError(f"{path} {shlex.join(rest)}: {message}") from None


@pytest.fixture(scope="module")
def dsml_check_options() -> set[str]:
    done = subprocess.run([sys.executable, "-c", "from dsml_checker.cli import main; main(['--help'])"],
                          capture_output=True, text=True, timeout=60)
    return set(re.findall(r"--[a-z][a-z0-9-]*", done.stdout))


def shown_commands(program: str) -> list[tuple[str, list[str]]]:
    return [(f"{page.relative_to(ROOT)}: {line}", args) for page in PAGES
            for line in command_lines(page.read_text(encoding="utf-8")) for args in invocations(line, program)]


def test_the_docs_show_commands_at_all() -> None:
    shown = {where.split(":")[0] for where, _ in shown_commands("repro")}
    assert {"docs/getting-started.md", "docs/run.md", "docs/replay.md", "docs/matrix.md", "README.md"} <= shown


@pytest.mark.parametrize("where, args", shown_commands("repro"), ids=lambda v: v if isinstance(v, str) else "")
def test_every_repro_command_shown_is_accepted_by_the_cli(where: str, args: list[str]) -> None:
    check_repro(args)


@pytest.mark.parametrize("where, args", shown_commands("dsml-check"), ids=lambda v: v if isinstance(v, str) else "")
def test_every_dsml_check_command_shown_is_accepted(where: str, args: list[str], dsml_check_options: set[str]) -> None:
    unknown = {flag for flag in re.findall(r"--[a-z][a-z0-9-]*", " ".join(args))} - dsml_check_options
    assert not unknown, f"{where}: dsml-check has no option {sorted(unknown)}"


def test_the_checker_catches_a_made_up_option() -> None:
    with pytest.raises(AssertionError, match="No such option: --sesions"):
        check_repro(["run", "--sesions", "4"])
    with pytest.raises(AssertionError, match="no such option"):
        check_repro(["gate", "RUN_DIR", "[--tolerance", "R]"])
    with pytest.raises(AssertionError, match="refuses"):
        check_repro(["sim", "serve", "--no-such-flag"])
    with pytest.raises(UsageError):
        parse_flags(["--time-scale", "-1"])


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def links() -> list[tuple[Path, str]]:
    found = []
    for page in PAGES:
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        found += [(page, target) for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]
    return found


@pytest.mark.parametrize("page, target", links(), ids=lambda v: v if isinstance(v, str) else v.name)
def test_every_relative_link_resolves(page: Path, target: str) -> None:
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    assert file.exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
    if anchor and file.suffix == ".md":
        assert anchor in anchors(file), f"{page.relative_to(ROOT)} links to #{anchor}, no such heading in {file.name}"


def test_nothing_points_outside_the_project() -> None:
    outside = "/".join(("", "shared", ""))  # spelt so that this file does not match itself
    offenders = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and p.suffix in {".md", ".py", ".yaml", ".yml"}
                 and ".venv" not in p.parts and outside in p.read_text(encoding="utf-8", errors="replace")]
    assert not offenders, f"files referring to notes outside the repository: {offenders}"
