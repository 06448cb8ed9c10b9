"""Deterministic tool execution: the coding agent's tools answered from a synthetic repository.

The same call (tool name and arguments) always gives the same text, whatever the session, so
sessions that read the same file share token prefixes, and results have the workload's sizes, so
context grows turn by turn. Pure functions: no file system, no clock.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from typing import Any

from repro.untrusted import parse_json
from repro.workload.scenario import SandboxSizes, Workload

_WORDS = (
    "self config request response cache layer index buffer token batch prefix session "
    "result value count total offset length handler parser stream chunk event queue worker"
).split()
_STATEMENTS = (
    "{a} = {b}.get({c!r}, {n})",
    "if {a} is None:",
    "    return {b}[{n}:]",
    "for {a} in {b}.items():",
    "    {a}.append({b} + {n})",
    "def {a}_{b}(self, {c}):",
    "    raise ValueError(f'bad {a}: {{{b}}}')",
    "{a}.{b} = {c} * {n}",
    "assert {a} <= {b}, {c!r}",
    "# {a} {b} {c}: keep in sync with {a}_{c}",
    "with {a}.lock:",
    "    {a}, {b} = {b}, {a}",
)


def _rng(*parts: str) -> random.Random:
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _code_line(rng: random.Random, width: int) -> str:
    template = rng.choice(_STATEMENTS)
    line = template.format(a=rng.choice(_WORDS), b=rng.choice(_WORDS), c=rng.choice(_WORDS), n=rng.randrange(1, 512))
    return line[:width]


def _path(rng: random.Random) -> str:
    return f"src/{rng.choice(_WORDS)}/{rng.choice(_WORDS)}_{rng.choice(_WORDS)}.py"


def _read_file(args: dict[str, Any], sizes: SandboxSizes) -> str:
    path = str(args.get("path") or args.get("file") or "README.md")
    rng = _rng("read_file", path)
    lines = [f"{number:5d}  {_code_line(rng, sizes.line_width)}" for number in range(1, sizes.file_lines + 1)]
    return f"{path} ({sizes.file_lines} lines)\n" + "\n".join(lines)


def _grep(args: dict[str, Any], sizes: SandboxSizes) -> str:
    pattern = str(args.get("pattern") or args.get("query") or "")
    rng = _rng("grep", pattern, str(args.get("path", "")))
    hits = [
        f"{_path(rng)}:{rng.randrange(1, 900)}: {_code_line(rng, sizes.line_width)}" for _ in range(sizes.grep_matches)
    ]
    return f"{len(hits)} matches for {pattern!r}\n" + "\n".join(hits)


def _list_dir(args: dict[str, Any], sizes: SandboxSizes) -> str:
    path = str(args.get("path") or ".")
    rng = _rng("list_dir", path)
    entries = sorted({f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}.py" for _ in range(sizes.list_entries)})
    return f"{path}/\n" + "\n".join(f"  {entry}  {rng.randrange(200, 40_000)} bytes" for entry in entries)


def _edit_file(args: dict[str, Any], sizes: SandboxSizes) -> str:
    path = str(args.get("path") or "")
    rng = _rng("edit_file", json.dumps(args, sort_keys=True))
    return f"edited {path}: {rng.randrange(1, 40)} lines changed, {rng.randrange(0, 12)} removed"


def _run_tests(args: dict[str, Any], sizes: SandboxSizes) -> str:
    target = str(args.get("path") or args.get("target") or "tests")
    rng = _rng("run_tests", target)
    lines = [f"{_path(rng).replace('src/', 'tests/test_')}::test_{rng.choice(_WORDS)} PASSED" for _ in range(sizes.test_output_lines)]
    failed = rng.randrange(0, 3)
    lines += [f"FAILED tests/test_{rng.choice(_WORDS)}.py::test_{rng.choice(_WORDS)} - AssertionError" for _ in range(failed)]
    return "\n".join(lines) + f"\n{len(lines) - failed} passed, {failed} failed"


def _finish(args: dict[str, Any], sizes: SandboxSizes) -> str:
    return "Task closed."


def _echo(args: dict[str, Any], sizes: SandboxSizes) -> str:
    return "ok: " + json.dumps(args, sort_keys=True)


_BEHAVIOURS = {
    "read_file": _read_file,
    "grep": _grep,
    "list_dir": _list_dir,
    "edit_file": _edit_file,
    "run_tests": _run_tests,
    "finish": _finish,
    "echo": _echo,
}


def execute(workload: Workload, name: str, arguments: str) -> str:
    """The tool result for one call; bad calls get an error text, as a real agent's tool runner would."""
    tool = workload.tool(name)
    if tool is None:
        return f"error: unknown tool {name!r}; available: {', '.join(workload.tool_names())}"
    try:
        args = parse_json(arguments) if arguments.strip() else {}
    except ValueError:
        return "error: arguments are not valid JSON"
    if not isinstance(args, dict):
        return "error: arguments must be a JSON object"
    return _result(tool.behaviour, json.dumps(args, sort_keys=True), workload.sandbox)


@functools.lru_cache(maxsize=4096)
def _result(behaviour: str, canonical_args: str, sizes: SandboxSizes) -> str:
    # Sessions keep asking for the same files; generating a big result costs milliseconds of CPU.
    return _BEHAVIOURS[behaviour](json.loads(canonical_args), sizes)
