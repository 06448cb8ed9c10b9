"""Trace files: recorded conversations, one per line in the OpenAI chat format, for `repro run --workload X.jsonl`.

Each line holds one conversation: its `messages` (system, user, assistant with `tool_calls`, tool results),
the `tools` it was offered, and optionally per-message `timestamp`s. Replay (repro.run.replay) sends the recorded
history up to each recorded assistant turn and judges what the model answers there; the recorded assistant
message, not the new answer, then continues the history, so the server sees the production prompts and their
prefix sharing whatever the model says.

A trace is read as a stream, line by line: every line is validated (a bad one anywhere stops the run before
anything is sent, named by its line number), the file is hashed and its conversations and turns counted,
but only the conversations the run's sessions replay are kept. Memory is bounded by those and the longest
line, not by the file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from repro.errors import UsageError, describe_validation_error
from repro.jsonl import stream_lines
from repro.untrusted import parse_json

DEFAULT_MAX_TOKENS = 1024

SENT_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")
"""The message keys sent to the server; anything else a log carries (a timestamp, a refusal) stays local."""


class TraceMessage(BaseModel):
    """One recorded message. Other keys a log carries are allowed and not sent."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    """Who said it; each `assistant` message after the first message is a turn that replay judges afresh."""
    content: str | list[dict[str, Any]] | None = None
    """The text (or OpenAI content parts) as recorded."""
    name: str | None = None
    """Sent as recorded."""
    tool_calls: list[dict[str, Any]] | None = None
    """An assistant message's calls, as OpenAI writes them (`id`, `type`, `function.name`, `function.arguments`)."""
    tool_call_id: str | None = None
    """A tool message's answer to this call id."""
    reasoning_content: str | None = None
    """The assistant's reasoning, where the server returned it; sent as recorded."""
    timestamp: float | str | None = None
    """When the message was recorded: Unix seconds, or ISO 8601 with a zone. `--replay timing` needs them on
    assistant messages."""

    @field_validator("timestamp")
    @classmethod
    def _time(cls, value: float | str | None) -> float | str | None:
        if isinstance(value, str):
            try:
                stamp = datetime.fromisoformat(value)
            except ValueError:
                raise ValueError("not ISO 8601 (e.g. 2026-05-01T12:00:03.250Z) nor Unix seconds") from None
            if stamp.tzinfo is None:
                raise ValueError("an ISO 8601 timestamp needs a zone (Z or +00:00)")
        return value

    @model_validator(mode="after")
    def _answers_a_call(self) -> "TraceMessage":
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs `tool_call_id`, the id of the call it answers")
        return self

    def seconds(self) -> float | None:
        """The timestamp as Unix seconds."""
        if isinstance(self.timestamp, str):
            return datetime.fromisoformat(self.timestamp).timestamp()
        return self.timestamp

    def sent(self) -> dict[str, Any]:
        """The message as the request carries it."""
        return {key: value for key in SENT_KEYS if (value := getattr(self, key)) is not None}


class Conversation(BaseModel):
    """One line of a trace file: a recorded conversation and the request settings it was made with."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    id: str | None = None
    """A name for the conversation (default: `line-N`); a session's `task` in sessions.jsonl."""
    messages: list[TraceMessage] = Field(min_length=2)
    """The whole conversation, in order."""
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """The OpenAI `tools` list the conversation was offered."""
    tool_choice: str | dict[str, Any] = "auto"
    """Sent with the tools."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Default 1024."""
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    """Default 0, so a replay is as repeatable as the server allows."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form; kept out of requests."""

    @field_validator("tools")
    @classmethod
    def _function_tools(cls, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # The checker and the sandbox read every tool's function name and parameters: a tool of another
        # shape must be refused here, by line and position, not found broken mid-run.
        for position, tool in enumerate(tools):
            function = tool.get("function")
            if tool.get("type", "function") != "function" or not isinstance(function, dict):
                raise ValueError(f"item {position}: expected {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
            if not isinstance(function.get("name"), str) or not function["name"]:
                raise ValueError(f"item {position}: function.name: expected a non-empty string")
            if not isinstance(function.get("parameters", {}), dict):
                raise ValueError(f"item {position}: function.parameters: expected a JSON Schema object")
        return tools

    @field_validator("messages")
    @classmethod
    def _has_turns(cls, messages: list[TraceMessage]) -> list[TraceMessage]:
        if not any(message.role == "assistant" for message in messages[1:]):
            raise ValueError("no assistant message after the first message, so nothing to replay")
        return messages

    def settings(self) -> dict[str, Any]:
        """The request's settings beside the messages: the recorded tools and choice, and the sampling."""
        settings: dict[str, Any] = {
            "max_tokens": self.max_tokens or DEFAULT_MAX_TOKENS,
            "temperature": self.temperature or 0.0,
        }
        if self.tools:
            settings |= {"tools": self.tools, "tool_choice": self.tool_choice}
        return settings

    def turn_positions(self) -> list[int]:
        """Where the recorded assistant turns are: each is replayed with the messages before it."""
        return [i for i, message in enumerate(self.messages) if message.role == "assistant" and i > 0]


@dataclass(frozen=True)
class Trace:
    """A validated trace file: the conversations its sessions replay, in file order, and what the file holds."""

    name: str
    conversations: list[Conversation]
    """The first conversations of the file, as many as the sessions replay (all, when they outnumber them)."""
    count: int
    """Conversations in the file."""
    turns: int
    """Recorded assistant turns in the file."""
    path: str
    sha256: str
    timing: bool = False
    """Keep the recorded gaps between assistant turns (`--replay timing`)."""

    def manifest_entry(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "sha256": self.sha256,
            "kind": "trace",
            "conversations": self.count,
            "turns": self.turns,
            "replay": "timing" if self.timing else "fast",
        }

    def conversation(self, session_id: int) -> Conversation:
        """Session i replays conversation i modulo their number, so --sessions may exceed the file's lines."""
        index = session_id % self.count
        if index >= len(self.conversations):
            raise ValueError(f"session {session_id} replays conversation {index + 1} of {self.path}, which was not "
                             f"kept (the trace was loaded for {len(self.conversations)} sessions)")
        return self.conversations[index]


def is_trace(path: str | Path | None) -> bool:
    """A `--workload` path names a trace when it ends in .jsonl."""
    return path is not None and str(path).endswith(".jsonl")


def json_object_line(text: str, where: str, expected: str) -> dict[str, Any]:
    """One JSON-lines line that must hold an object; a UsageError at `where` otherwise, saying what was `expected`."""
    try:
        data = parse_json(text)
    except ValueError as err:
        raise UsageError(f"{where}: not JSON: {err}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{where}: {expected} (got {type(data).__name__})")
    return data


def parse_line(text: str, *, source: str, line: int) -> Conversation:
    """One line of a trace file; a UsageError names the file, line and field at fault."""
    where = f"{source}:{line}"
    data = json_object_line(text, where, "a trace line must be a JSON object with `messages`")
    try:
        conversation = Conversation.model_validate(data)
    except ValidationError as err:
        raise UsageError(describe_validation_error(err, source=where)) from None
    if conversation.id is None:
        conversation = conversation.model_copy(update={"id": f"line-{line}"})
    return conversation


def load_trace(path: str | Path, *, timing: bool = False, keep: int | None = None) -> Trace:
    """Read and validate a trace file; with `timing`, every assistant message must carry a timestamp.

    Every line is validated, but only the first `keep` conversations are kept (None: all); a run keeps as
    many as it has sessions, since session i replays conversation i modulo their number.
    """
    file = Path(path)
    digest = hashlib.sha256()
    conversations: list[Conversation] = []
    count = turns = 0
    for number, line_text in stream_lines(file, f"--workload {file}", digest.update):
        conversation = parse_line(line_text, source=str(file), line=number)
        positions = conversation.turn_positions()
        if timing:
            for position in positions:
                if conversation.messages[position].timestamp is None:
                    raise UsageError(
                        f"{file}:{number}: messages.{position}.timestamp: missing; --replay timing needs a "
                        "timestamp on every assistant message"
                    )
        count += 1
        turns += len(positions)
        if keep is None or len(conversations) < keep:
            conversations.append(conversation)
    if not count:
        raise UsageError(f"--workload {file}: no conversations (a trace holds one JSON object per line)")
    return Trace(name=file.stem, conversations=conversations, count=count, turns=turns, path=str(file),
                 sha256=digest.hexdigest(), timing=timing)
