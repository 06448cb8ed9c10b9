"""The harness's error types and the exit codes of design.md, so every command fails the same way."""

from __future__ import annotations

import signal
from types import FrameType
from typing import NoReturn

import yaml
from pydantic import ValidationError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TARGET = 3
EXIT_INTERNAL = 70
"""A bug in the harness (sysexits' EX_SOFTWARE): never 0 or 1, which a gate or `git bisect run` would read as a verdict."""
EXIT_INCONCLUSIVE = 125
EXIT_INTERRUPTED = 130


class ReproError(Exception):
    """An error the user can act on: printed as one line, mapped to an exit code, never a traceback."""

    exit_code: int = EXIT_FAILED

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(ReproError):
    """Bad options, a bad file, a bad spec: exit 2."""

    exit_code = EXIT_USAGE


class InternalError(ReproError):
    """The harness failed, not the input nor the target: exit 70, with what was kept and how to go on."""

    exit_code = EXIT_INTERNAL


class TargetError(ReproError):
    """The target is unreachable, serves no model, or failed to start: exit 3."""

    exit_code = EXIT_TARGET


_interrupt = {"requested": False}


def request_interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    """Handler for SIGINT and SIGTERM: remember that the user asked to stop, then raise KeyboardInterrupt."""
    _interrupt["requested"] = True
    raise KeyboardInterrupt


def handle_interrupts() -> None:
    """Route SIGINT through `request_interrupt` (main thread only, as `signal` requires)."""
    signal.signal(signal.SIGINT, request_interrupt)


def is_interrupt(err: BaseException) -> bool:
    """Whether `err` is how a Ctrl-C or SIGTERM surfaced.

    A KeyboardInterrupt raised inside a library's callback can come out as that library's own
    error (pydantic turns one raised while it serialises a Path into PydanticSerializationError),
    so once an interrupt was requested any exception counts as it.
    """
    return isinstance(err, KeyboardInterrupt) or _interrupt["requested"]


def describe_validation_error(err: ValidationError, *, source: str, lines: dict[tuple, int] | None = None) -> str:
    """One line naming the first invalid field of a pydantic model, and its line in `source` when known.

    `lines` maps a field path (a tuple of keys and indices, as pydantic reports `loc`) to a 1-based line.
    """
    first = err.errors()[0]
    loc = tuple(first.get("loc", ()))
    field = ".".join(str(part) for part in loc) or "(top level)"
    where = source
    if lines:
        for cut in range(len(loc), -1, -1):
            line = lines.get(loc[:cut])
            if line is not None:
                where = f"{source}:{line}"
                break
    extra = "" if len(err.errors()) == 1 else f" (and {len(err.errors()) - 1} more)"
    # A validator's own ValueError text says what is wrong; pydantic's "Value error, " prefix adds nothing.
    message = str(first["msg"]).removeprefix("Value error, ")
    return f"{where}: {field}: {message}{extra}"


def describe_yaml_error(err: Exception, *, source: str) -> str:
    """One line for a YAML syntax error: the file and line where the parser gave up, and why."""
    mark = getattr(err, "problem_mark", None)
    where = f"{source}:{mark.line + 1}" if mark is not None else source
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{where}: not valid YAML: {problem}"


def yaml_lines(text: str, loader: type[yaml.SafeLoader] = yaml.SafeLoader) -> dict[tuple, int]:
    """1-based line of every mapping key and sequence item of a YAML document, by its pydantic `loc`:
    the `lines` of describe_validation_error. The text must already have loaded without error."""
    lines: dict[tuple, int] = {}
    root = yaml.compose(text, Loader=loader)

    def walk(node: yaml.Node, loc: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                child = (*loc, key.value)
                lines[child] = key.start_mark.line + 1
                walk(value, child)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                child = (*loc, index)
                lines[child] = item.start_mark.line + 1
                walk(item, child)

    if root is not None:
        lines[()] = root.start_mark.line + 1
        walk(root, ())
    return lines
