"""Help texts: every command, argument and option of `repro` (the whole click tree, and `repro sim serve`'s own
parser) says what it does; the top-level help lists the commands in a user's path."""

from __future__ import annotations

import argparse
import re
from typing import Iterator

import click
import typer.main
from typer.testing import CliRunner

from repro.cli import USER_PATH, app
from repro.sim.config import sim_parser

ONLY_A_DEFAULT = re.compile(r"^\s*\(default: [^)]*\)\s*$")


def _commands(command: click.Command, path: tuple[str, ...]) -> Iterator[tuple[str, click.Command]]:
    yield " ".join(path), command
    if hasattr(command, "commands"):  # a group (typer may bring a click of its own)
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))


def undescribed(root: click.Command | None = None) -> list[str]:
    """Every command, argument or option in the tree that has no description of its own."""
    missing = []
    for path, command in _commands(root or typer.main.get_command(app), ("repro",)):
        if not (command.help or command.short_help or "").strip():
            missing.append(f"{path}: the command")
        for param in command.params:
            text = getattr(param, "help", None) or ""
            if not text.strip() or ONLY_A_DEFAULT.match(text):
                missing.append(f"{path}: {'/'.join(param.opts) if param.param_type_name == 'option' else param.name}")
    for action in sim_parser()._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        if not (action.help or "").strip() or ONLY_A_DEFAULT.match(action.help or ""):
            missing.append(f"repro sim serve: {'/'.join(action.option_strings)}")
    return missing


def test_every_command_argument_and_option_is_described() -> None:
    assert undescribed() == []


def test_the_walk_finds_an_option_without_help() -> None:
    # The check itself must be able to fail: an option added with no help is named.
    command = typer.main.get_command(app)
    run = command.commands["run"]
    run.params.append(click.Option(["--undescribed-flag"]))
    run.params.append(click.Option(["--default-only"], help="(default: 3)"))
    missing = undescribed(command)
    assert "repro run: --undescribed-flag" in missing and "repro run: --default-only" in missing


def test_the_top_level_help_lists_commands_in_the_users_path() -> None:
    result = CliRunner().invoke(app, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    listed = [m.group(1) for m in re.finditer(r"^│ (\w+)\s{2,}", result.output, re.MULTILINE)]
    assert listed[:7] == ["run", "report", "gate", "matrix", "sweep", "bisect", "probe"]
    assert set(listed) == set(USER_PATH)


def test_probe_help_names_its_real_default_directory() -> None:
    # repro.bisect.cli names it default_dir("bisect", f"probe-{rev[:10]}"), relative to the working directory.
    probe = typer.main.get_command(app).commands["probe"]
    [out] = [param for param in probe.params if "--out" in getattr(param, "opts", ())]
    assert "reports/<UTC timestamp>-bisect-probe-<the first 10 characters of --src's HEAD>/" in out.help
    assert "current directory" in out.help
