"""Workload files: an agentic scenario (system prompt, tools, tasks, sandbox sizes) as a validated model.

A workload is YAML in `experiments/`. `repro/workload/builtin` is a symlink to that directory and
pyproject's package-data ships `repro/workload/builtin/*.yaml`, so there is one copy of each file and an
installed `repro` finds the default outside a clone.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from repro.errors import UsageError, describe_validation_error, load_yaml, yaml_lines
from repro.workload.trace import is_trace, load_trace

if TYPE_CHECKING:
    from repro.workload.trace import Trace

DEFAULT_WORKLOAD = "agentic_coding.yaml"
ToolKind = Literal["read_file", "grep", "list_dir", "edit_file", "run_tests", "finish", "echo"]
"""The sandbox behaviours (repro.workload.sandbox) a tool can have."""


class _Strict(BaseModel):
    # A misspelt key in a workload must be an error, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class FunctionSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_\-]{0,63}$")
    """The function's name, as the model calls it."""
    description: str = ""
    """What the tool does, as the model reads it."""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    """JSON Schema of the arguments."""


class ToolSpec(_Strict):
    """One OpenAI `tools` entry; `kind` names the sandbox behaviour that answers it."""

    type: Literal["function"] = "function"
    """Always `function`."""
    function: FunctionSpec
    """The function as OpenAI's `tools` entry describes it."""
    kind: ToolKind | None = None
    """Sandbox behaviour; defaults to the function's name when that is a known kind, else `echo`."""

    def openai(self) -> dict[str, Any]:
        return {"type": "function", "function": self.function.model_dump()}

    @property
    def behaviour(self) -> str:
        if self.kind is not None:
            return self.kind
        return self.function.name if self.function.name in get_args(ToolKind) else "echo"


class SandboxSizes(_Strict):
    """How big the deterministic tool results are: this is what makes the context grow turn by turn."""

    # Frozen, so hashable: the sandbox caches results per (call, sizes).
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    file_lines: int = Field(default=120, ge=1, le=100_000)
    """Lines of a `read_file` result."""
    line_width: int = Field(default=72, ge=8, le=1_000)
    """Characters per generated line."""
    grep_matches: int = Field(default=12, ge=0, le=10_000)
    """Matching lines of a `grep` result."""
    list_entries: int = Field(default=24, ge=0, le=10_000)
    """Entries of a `list_dir` result."""
    test_output_lines: int = Field(default=30, ge=0, le=100_000)
    """Lines of a `run_tests` result."""


class Workload(_Strict):
    name: str = Field(min_length=1)
    """Names the run (and its directory) unless `--name` does."""
    description: str = ""
    """For people; not sent."""
    system_prompt: str = Field(min_length=1)
    """Shared by every session: the common prefix that prefix caching and HiCache reuse."""
    tools: list[ToolSpec] = Field(min_length=1)
    """Offered in every request; the sandbox answers their calls."""
    tool_choice: Literal["auto", "required", "none"] = "auto"
    """Sent as the request's `tool_choice`."""
    tasks: list[str] = Field(min_length=1)
    """Session i works on tasks[i % len(tasks)]; its first user message also carries a unique ticket."""
    recovery_prompt: str = "Your last reply contained no usable tool call. Continue the task with a tool call."
    """Sent after a corrupt turn that brought no tool calls, so the session goes on."""
    max_tokens: int = Field(default=1024, ge=1)
    """Sent as the request's `max_tokens`."""
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    """Sent as the request's `temperature`."""
    sandbox: SandboxSizes = Field(default_factory=SandboxSizes)
    """How big the tool results are."""
    context_tokens: int = Field(default=0, ge=0, le=10_000_000)
    """About this many tokens of a project document, unique to each session, open its conversation (a user
    message before the task): each session's own long prefix. `repro run --pressure` sizes it to the server."""

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, tools: list[ToolSpec]) -> list[ToolSpec]:
        names = [tool.function.name for tool in tools]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"duplicate tool name(s): {', '.join(duplicates)}")
        return tools

    def tool_names(self) -> list[str]:
        return [tool.function.name for tool in self.tools]

    def openai_tools(self) -> list[dict[str, Any]]:
        return [tool.openai() for tool in self.tools]

    def tool(self, name: str) -> ToolSpec | None:
        return next((tool for tool in self.tools if tool.function.name == name), None)

    def task_for(self, session_id: int, seed: int) -> str:
        """The session's task text: unique per session, so the server sees distinct conversations."""
        base = self.tasks[session_id % len(self.tasks)]
        return f"{base}\n\nTicket: REPRO-{seed}-{session_id:04d}"


@dataclass(frozen=True)
class LoadedWorkload:
    workload: Workload
    path: str
    sha256: str

    def manifest_entry(self) -> dict[str, Any]:
        return {"name": self.workload.name, "path": self.path, "sha256": self.sha256}


def parse_workload(text: str, *, source: str) -> Workload:
    """Validate workload YAML; a UsageError names the file, line and field of the first problem."""
    data = load_yaml(text, source=source)
    if not isinstance(data, dict):
        raise UsageError(f"{source}: a workload must be a YAML mapping")
    try:
        return Workload.model_validate(data)
    except ValidationError as err:
        raise UsageError(describe_validation_error(err, source=source, lines=yaml_lines(text))) from None


def load_workload(path: str | Path | None = None) -> LoadedWorkload:
    """Read a workload file, or the packaged default when `path` is None."""
    if path is None:
        data = resources.files("repro").joinpath("workload", "builtin", DEFAULT_WORKLOAD).read_bytes()
        source = f"repro/workload/builtin/{DEFAULT_WORKLOAD}"
    else:
        file = Path(path)
        try:
            data = file.read_bytes()
        except OSError as err:
            raise UsageError(f"--workload {file}: cannot read: {err.strerror or err}") from None
        source = str(file)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{source}: not UTF-8 text") from None
    workload = parse_workload(text, source=source)
    return LoadedWorkload(workload=workload, path=source, sha256=hashlib.sha256(data).hexdigest())


@dataclass(frozen=True)
class LoadedScenario:
    """What `--workload` named: a scripted workload (YAML) or a trace of recorded conversations (.jsonl)."""

    scenario: "Workload | Trace"
    name: str
    entry: dict[str, Any]
    """manifest.json's `workload`."""

    def manifest_entry(self) -> dict[str, Any]:
        return self.entry


def load_scenario(path: str | Path | None, *, replay: str = "fast", sessions: int | None = None) -> LoadedScenario:
    """The workload or trace `--workload` names (a .jsonl file is a trace); `replay` applies to traces only.

    A trace keeps only the conversations `sessions` sessions replay (None: all); every line is validated."""
    if is_trace(path):
        assert path is not None
        trace = load_trace(path, timing=replay == "timing", keep=sessions)
        return LoadedScenario(scenario=trace, name=trace.name, entry=trace.manifest_entry())
    if replay != "fast":
        raise UsageError(f"--replay {replay}: only a trace workload (a .jsonl file of conversations) is replayed")
    loaded = load_workload(path)
    return LoadedScenario(scenario=loaded.workload, name=loaded.workload.name, entry=loaded.manifest_entry())
