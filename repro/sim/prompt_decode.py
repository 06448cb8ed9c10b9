"""Read a DeepSeek-V4 prompt back into the conversation it encodes, for the raw completion endpoints.

A client that talks to `/generate` or `/v1/completions` renders the prompt itself
(`dsml_checker.encoding.encode_messages`, V4). The simulator recovers the messages and tools from it so
that its scripted model answers exactly as it would over chat. What the encoding drops cannot come
back: tool-call ids, `None` contents (read back as ""), reasoning the encoder left out, and the split
between consecutive user turns it merged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dsml_checker.encoding import ASSISTANT, BOS, THINK_OPEN, USER, V4_EFFORT_PROMPTS, render_tools
from dsml_checker.formats import EOS, THINK_CLOSE, DSMLParseError, split_completion, to_json

_RESULT_OPEN, _RESULT_CLOSE = "<tool_result>", "</tool_result>"
_SCHEMA_MARK = {"name": "\x00"}
_TOOLS_HEAD, _TOOLS_TAIL = render_tools([_SCHEMA_MARK]).split(to_json(_SCHEMA_MARK))


class PromptDecodeError(ValueError):
    """The prompt is not a DeepSeek-V4 conversation as the reference encoder writes one."""


@dataclass(frozen=True)
class DecodedPrompt:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    thinking: bool


def _system(preamble: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    head = preamble.find("\n\n" + _TOOLS_HEAD)
    if head < 0:
        return ([{"role": "system", "content": preamble}] if preamble else []), []
    start = head + 2 + len(_TOOLS_HEAD)
    end = preamble.find(_TOOLS_TAIL, start)
    if end < 0:
        raise PromptDecodeError("the tools section of the system prompt is not terminated")
    try:
        functions = [json.loads(line) for line in preamble[start:end].split("\n")]
    except ValueError:
        raise PromptDecodeError("a tool schema in the system prompt is not valid JSON") from None
    tools = [{"type": "function", "function": f} for f in functions]
    # The encoder adds an empty system message to carry tools when the request had none.
    content = preamble[:head] + preamble[end + len(_TOOLS_TAIL):]
    return ([{"role": "system", "content": content}] if content else []), tools


def _user_turn(text: str) -> list[dict[str, Any]]:
    """A user turn: tool results first (as the encoder merges them), then the user's own text if any."""
    messages: list[dict[str, Any]] = []
    rest: str | None = text
    while rest is not None and rest.startswith(_RESULT_OPEN):
        end = rest.find(_RESULT_CLOSE)
        if end < 0:
            raise PromptDecodeError("a <tool_result> is not closed")
        messages.append({"role": "tool", "content": rest[len(_RESULT_OPEN):end]})
        rest = rest[end + len(_RESULT_CLOSE):]
        rest = rest[2:] if rest.startswith("\n\n") else (None if rest == "" else rest)
    if rest is not None:
        messages.append({"role": "user", "content": rest})
    return messages


def _assistant(text: str, thinking: bool) -> dict[str, Any]:
    reasoning = None
    if thinking:
        reasoning, found, text = text.partition(THINK_CLOSE)
        if not found:
            raise PromptDecodeError("an assistant turn in thinking mode has no </think>")
    try:
        done = split_completion(text, mode="strict", fmt="v4")
    except DSMLParseError:
        # Renderers other than the reference (SGLang's deepseek-recipe) write zero-argument calls more tightly.
        try:
            done = split_completion(text, mode="tolerant", fmt="v4")
        except DSMLParseError as err:
            raise PromptDecodeError(f"an assistant turn's tool calls do not parse: {err}") from None
    message: dict[str, Any] = {"role": "assistant", "content": done.content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if done.calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for c in done.calls
        ]
    return message


def decode_prompt(prompt: str) -> DecodedPrompt:
    """The conversation, tools and thinking mode of a V4 prompt that ends where the model starts writing."""
    text = prompt.removeprefix(BOS)
    for effort in V4_EFFORT_PROMPTS.values():
        if effort and text.startswith(effort):
            text = text[len(effort):]
    if text.endswith(ASSISTANT + THINK_OPEN):
        thinking, text = True, text[: -len(ASSISTANT + THINK_OPEN)]
    elif text.endswith(ASSISTANT + THINK_CLOSE):
        thinking, text = False, text[: -len(ASSISTANT + THINK_CLOSE)]
    else:
        raise PromptDecodeError("the prompt does not end with <｜Assistant｜><think> or <｜Assistant｜></think>")
    preamble, *turns = text.split(USER)
    if not turns:
        raise PromptDecodeError("the prompt holds no <｜User｜> turn")
    messages, tools = _system(preamble)
    for turn in turns:
        user, found, answered = turn.partition(ASSISTANT)
        messages += _user_turn(user)
        if not found:
            continue
        opened = answered.startswith(THINK_OPEN)
        if not (opened or answered.startswith(THINK_CLOSE)):
            raise PromptDecodeError("an assistant turn does not start with <think> or </think>")
        body = answered[len(THINK_OPEN) if opened else len(THINK_CLOSE):]
        if not body.endswith(EOS):
            raise PromptDecodeError("an assistant turn in the history does not end with end-of-sentence")
        messages += [_assistant(part, opened) for part in body.split(EOS)[:-1]]
    return DecodedPrompt(messages, tools, thinking)
