"""The OpenAI chat wire format as SGLang speaks it: request validation, prompt rendering, response bodies.

Pure functions and models, no I/O: the server validates with `ChatRequest`, renders the prompt whose
pages the engine caches, and builds non-streamed bodies and streamed chunks from a `Reply`.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from repro.sim.parser import ParsedOutput


class _Loose(BaseModel):
    # Clients send fields this server does not use (temperature, top_p, user, ...): accept them.
    model_config = ConfigDict(extra="allow")


class FunctionSpec(_Loose):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)


class ToolSpec(_Loose):
    type: Literal["function"] = "function"
    function: FunctionSpec


class Message(_Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Any] | None = None


class NamedChoice(_Loose):
    type: Literal["function"] = "function"
    function: dict[str, str]


class ChatRequest(_Loose):
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolSpec] = Field(default_factory=list)
    tool_choice: Literal["auto", "none", "required"] | NamedChoice = "auto"
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @model_validator(mode="after")
    def _named_tool_exists(self) -> "ChatRequest":
        if isinstance(self.tool_choice, NamedChoice):
            wanted = self.tool_choice.function.get("name")
            if wanted not in {t.function.name for t in self.tools}:
                raise ValueError(f"tool_choice names {wanted!r}, which is not among the request's tools")
        return self

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))

    def choice_value(self) -> str | dict[str, Any]:
        return self.tool_choice.model_dump() if isinstance(self.tool_choice, NamedChoice) else self.tool_choice


def render_prompt(request: ChatRequest) -> str:
    """The prompt as the engine sees it; conversations that share a beginning share its pages."""
    parts = ["<｜begin▁of▁sentence｜>"]
    tools = json.dumps([t.model_dump(exclude_none=True) for t in request.tools], sort_keys=True)
    for index, message in enumerate(request.messages):
        body = message.model_dump(exclude_none=True)
        role = body.pop("role")
        content = body.pop("content", "")
        text = content if isinstance(content, str) else json.dumps(content)
        extra = json.dumps(body, sort_keys=True) if body else ""
        parts.append(f"<｜{role}｜>{text}{extra}")
        if index == 0 and role in ("system", "developer"):
            parts.append(tools)
    if request.messages[0].role not in ("system", "developer"):
        parts.insert(1, tools)
    parts.append("<｜Assistant｜><think>")
    return "".join(parts)


@dataclass(frozen=True)
class Reply:
    """A finished answer as the server returns it."""

    request_id: str
    model: str
    created: int
    output: ParsedOutput
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    raw: str = ""
    """The text the model emitted (after any damage and the token limit), before the server parsed it."""
    logprobs: tuple[dict[str, Any] | None, ...] | None = None
    """Per pseudo-token of `raw` when the request asked for log-probabilities; None marks a withheld token."""

    def call_id(self, index: int) -> str:
        return "call_" + hashlib.sha256(f"{self.request_id}/{index}".encode()).hexdigest()[:24]

    def arguments(self, index: int) -> str:
        return self.output.arguments_text(index)

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def message(self) -> dict[str, Any]:
        """The assistant message of a non-streamed response."""
        calls = [
            {"id": self.call_id(i), "type": "function", "function": {"name": c.name, "arguments": self.arguments(i)}}
            for i, c in enumerate(self.output.calls)
        ]
        return {
            "role": "assistant",
            "content": self.output.content if self.output.content or not calls else None,
            "reasoning_content": self.output.reasoning or None,
            "tool_calls": calls or None,
        }

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        """The fields every response body and chunk starts with, then its choices."""
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def logprob_slice(self, start: int, end: int) -> dict[str, Any] | None:
        """`choices[0].logprobs` for the pseudo-tokens start..end; None when none of them is served."""
        if self.logprobs is None:
            return None
        served = [entry for entry in self.logprobs[start:end] if entry is not None]
        return {"content": served} if served or end - start == len(self.logprobs) else None

    def body(self) -> dict[str, Any]:
        logprobs = self.logprob_slice(0, len(self.logprobs or ()))
        choice = {"index": 0, "message": self.message(), "logprobs": logprobs, "finish_reason": self.finish_reason}
        return {**self._envelope("chat.completion", [choice]), "usage": self.usage()}

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None,
              logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._envelope("chat.completion.chunk",
                              [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}])

    def usage_chunk(self) -> dict[str, Any]:
        return {**self._envelope("chat.completion.chunk", []), "usage": self.usage()}


class StreamCursor:
    """Turns token progress into the deltas SGLang would have streamed by then.

    The answer is laid out as units: reasoning characters, content characters, then each call's
    argument characters (its id and name go out with its first piece). At `k` of `n` tokens, the
    first `k/n` of the units have been sent. Log-probabilities of the step's raw tokens ride on its first
    chunk, or on a chunk with an empty delta when the step sent nothing else (SGLang 0.5.23's shape).
    """

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        out = reply.output
        self.segments: list[tuple[str, int, str]] = [("reasoning_content", -1, out.reasoning), ("content", -1, out.content)]
        self.segments += [("tool_calls", i, reply.arguments(i)) for i in range(len(out.calls))]
        self.total = sum(len(text) for _, _, text in self.segments) + len(out.calls)
        self.sent = 0
        self.logprobs_sent = 0

    def advance(self, tokens_done: int, tokens_total: int) -> Iterator[dict[str, Any]]:
        """Chunks for the progress since the last call."""
        done = tokens_done >= tokens_total
        target = self.total if done else self.total * tokens_done // max(1, tokens_total)
        deltas = []
        offset = 0
        for kind, index, text in self.segments:
            size = len(text) + (1 if index >= 0 else 0)
            lo, hi = max(self.sent, offset) - offset, min(target, offset + size) - offset
            if hi > lo:
                deltas.append(self._delta(kind, index, text, lo, hi))
            offset += size
        self.sent = max(self.sent, target)
        count = len(self.reply.logprobs or ())
        upto = count if done else max(self.logprobs_sent, count * tokens_done // max(1, tokens_total))
        logprobs = self.reply.logprob_slice(self.logprobs_sent, upto) if upto > self.logprobs_sent else None
        self.logprobs_sent = upto
        if logprobs is not None and not deltas:
            deltas.append({})
        for delta in deltas:
            yield self.reply.chunk(delta, logprobs=logprobs)
            logprobs = None

    def _delta(self, kind: str, index: int, text: str, lo: int, hi: int) -> dict[str, Any]:
        if index < 0:
            return {kind: text[lo:hi]}
        # Unit 0 of a call is its header (id, type, name); units 1.. are its argument characters.
        arguments = text[max(0, lo - 1): hi - 1]
        if lo > 0:
            return {"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}
        name = self.reply.output.calls[index].name
        call = {"index": index, "id": self.reply.call_id(index), "type": "function",
                "function": {"name": name, "arguments": arguments}}
        return {"tool_calls": [call]}


class ChatStream:
    """A streamed chat answer: the role chunk, the cursor's deltas, then the finish and usage chunks."""

    def __init__(self, reply: Reply, *, include_usage: bool) -> None:
        self.reply = reply
        self.cursor = StreamCursor(reply)
        self.include_usage = include_usage

    def opening(self) -> list[dict[str, Any]]:
        return [self.reply.chunk({"role": "assistant", "content": ""})]

    def advance(self, tokens_done: int, tokens_total: int) -> Iterator[dict[str, Any]]:
        return self.cursor.advance(tokens_done, tokens_total)

    def closing(self) -> list[dict[str, Any]]:
        chunks = [self.reply.chunk({}, self.reply.finish_reason)]
        return chunks + [self.reply.usage_chunk()] if self.include_usage else chunks


def error_body(message: str, *, status: int, kind: str = "invalid_request_error", param: str | None = None) -> dict[str, Any]:
    """OpenAI-style error JSON."""
    return {"object": "error", "error": {"message": message, "type": kind, "param": param, "code": status}}


def now_s() -> int:
    return int(time.time())
