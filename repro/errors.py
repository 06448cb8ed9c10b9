"""The harness's error types and the exit codes of docs/troubleshooting.md, so every command fails the same way."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Iterator

import yaml
from pydantic import ValidationError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TARGET = 3
EXIT_INCONCLUSIVE = 125
EXIT_INTERRUPTED = 130
EXIT_INTERNAL = 255
"""A bug in repro, not a verdict: above 127, so `git bisect run` stops instead of marking the commit bad."""


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
    """The harness failed, not the input nor the target: exit 255, with what was kept and how to go on."""

    exit_code = EXIT_INTERNAL


class TargetError(ReproError):
    """The target is unreachable, serves no model, or failed to start: exit 3."""

    exit_code = EXIT_TARGET


_interrupt: dict = {"requested": False, "signals": 0, "on_first": None, "pending": "the partial results"}


def _tell(line: str) -> None:
    # os.write, not print: a signal handler can run while the main thread is inside a print to stderr.
    os.write(2, f"repro: {line}\n".encode("utf-8", "replace"))


def request_interrupt(signum: int, frame: FrameType | None) -> None:
    """Handler for SIGINT and SIGTERM. The first asks to stop: it calls the `stopping` callback while a
    load runs, else raises KeyboardInterrupt. The second is absorbed, so it cannot cut short the saving
    the first started; the third quits at once (exit 130), naming what was not saved."""
    _interrupt["signals"] += 1
    count = _interrupt["signals"]
    if count == 1:
        _interrupt["requested"] = True
        stop = _interrupt["on_first"]
        if stop is None:
            raise KeyboardInterrupt
        _tell(f"stopping: saving {_interrupt['pending']} (interrupt twice more to quit without them)")
        stop()
    elif count == 2:
        _tell(f"interrupted again: still saving {_interrupt['pending']} (once more quits without them)")
    else:
        _tell(f"quit: not saved: {_interrupt['pending']}")
        os._exit(EXIT_INTERRUPTED)


def handle_interrupts() -> None:
    """Route SIGINT and SIGTERM through `request_interrupt` (main thread only, as `signal` requires)."""
    signal.signal(signal.SIGINT, request_interrupt)
    signal.signal(signal.SIGTERM, request_interrupt)


@contextlib.contextmanager
def stopping(stop: Callable[[], None]) -> Iterator[None]:
    """While the block runs, the first SIGINT or SIGTERM calls `stop` (from the signal handler: it must
    only schedule work, e.g. with `loop.call_soon_threadsafe`) instead of raising KeyboardInterrupt.

    The handlers stay `request_interrupt` after the block when they were before it (the CLI's case),
    so later signals keep being counted while the results are saved. Blocks nest: when an inner
    block ends, the next signal calls the outer one's `stop` again.
    """
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    outer = _interrupt["on_first"]  # blocks nest: a run's waves each stop the load inside the run's own block
    _interrupt["on_first"] = stop
    handle_interrupts()
    try:
        yield
    finally:
        _interrupt["on_first"] = outer
        for sig, handler in previous.items():
            if handler is not None:  # None: a handler not installed from Python, which cannot be put back
                signal.signal(sig, handler)


@contextlib.contextmanager
def saving(what: str) -> Iterator[None]:
    """Name what the block saves, for the line a repeated interrupt prints."""
    before = _interrupt["pending"]
    _interrupt["pending"] = what
    try:
        yield
    finally:
        _interrupt["pending"] = before


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


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with a key twice: YAML says keys are unique, and PyYAML would
    silently keep the last one, so a setting written twice would quietly lose one of its values."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *defaults` then overriding one of its keys is what merge keys are for
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: SafeLoader itself names that error
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"duplicate key {key!r} (first at line {first})", key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def read_text(path: Path, label: str) -> str:
    """A user's text file, or a UsageError starting with `label`: cannot read it, or it is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as err:
        raise UsageError(f"{label}: cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{label}: not UTF-8 text") from None


def load_yaml(text: str, *, source: str, loader: type[yaml.SafeLoader] = UniqueKeyLoader) -> Any:
    """Parse YAML, turning every way it can fail (syntax, a duplicate key, nesting too deep for the
    parser's recursion) into one UsageError line that names `source`."""
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - SafeLoader subclasses only
    except yaml.YAMLError as err:
        raise UsageError(describe_yaml_error(err, source=source)) from None
    except RecursionError:
        raise UsageError(f"{source}: not usable YAML: nested too deeply") from None


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


def _from_keyboard_interrupt(err: BaseException) -> bool:
    """Whether a KeyboardInterrupt lies in the chain of exceptions that `err` was raised from or during."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_main(entry: Callable[[], object]) -> None:
    """A console entry point: ReproError becomes one line on stderr and its exit code, never a traceback.

    Anything else is a bug: one line and EXIT_INTERNAL, never 0 or 1, which a CI gate or `git bisect
    run` would read as a verdict. REPRO_DEBUG=1 prints the traceback too.
    """
    handle_interrupts()
    try:
        entry()
    except ReproError as err:
        _say(f"repro: error: {err}")
        sys.exit(err.exit_code)
    except BaseException as err:
        if isinstance(err, SystemExit):
            if err.code == EXIT_INTERRUPTED and _from_keyboard_interrupt(err):
                # typer turns a KeyboardInterrupt that reached it into a silent Exit(130)
                _say("repro: interrupted")
            raise
        if is_interrupt(err):
            _say("repro: interrupted")
            sys.exit(EXIT_INTERRUPTED)
        if os.environ.get("REPRO_DEBUG"):
            traceback.print_exc()
        detail = str(err).splitlines()[0] if str(err) else ""
        _say(f"repro: internal error (a bug; REPRO_DEBUG=1 shows the traceback): {type(err).__name__}: {detail}")
        sys.exit(EXIT_INTERNAL)
