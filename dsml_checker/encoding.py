"""Render a whole conversation as the prompt text DeepSeek's reference encoders build (V4, V4.1, V3.2).

Byte-identical to the encoders vLLM ships (`vllm/tokenizers/deepseek_v4_encoding.py`,
`deepseek_v41_encoding.py`, `deepseek_v32_encoding.py`), including their quirks: the harness sends
this text to a server's raw completion endpoint (`/v1/completions`, SGLang's `/generate`) and must get
the same prompt the chat endpoint would have built. Assistant turns reuse `formats.render_calls`.
Messages are OpenAI-shaped dicts; tool calls may carry `arguments` as a JSON string or an object.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Sequence

from dsml_checker.formats import DSML_FORMATS, EOS, THINK_CLOSE, ToolCall, render_calls, to_json

BOS = "<｜begin▁of▁sentence｜>"
THINK_OPEN = "<think>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
SYSTEM = "<｜System｜>"
LATEST_REMINDER = "<｜latest_reminder｜>"
IMAGE_PLACEHOLDER = "<｜deepseek_image｜>"
TASK_TOKENS = {
    "action": "<｜action｜>",
    "query": "<｜query｜>",
    "authority": "<｜authority｜>",
    "domain": "<｜domain｜>",
    "title": "<｜title｜>",
    "read_url": "<｜read_url｜>",
}
ENCODER_FORMATS = ("v4", "v41", "v32")

_RESPONSE_FORMAT = "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{schema}"

_V4_TOOLS = """## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "{opener}" block like the following:

{opener}
{invoke} name="$TOOL_NAME">
{param} name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE{param_close}
...
{invoke_close}
{invoke} name="$TOOL_NAME2">
...
{invoke_close}
{closer}

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {think_open}), you MUST output your complete reasoning inside {think_open}...{think_close} BEFORE any tool calls or final response.

Otherwise, output directly after {think_close} with tool calls or final response.

### Available Tool Schemas

{schemas}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""

_V32_TOOLS = """## Tools
You have access to a set of tools you can use to answer the user's question.
You can invoke functions by writing a "{opener}" block like the following as part of your reply to the user:
{opener}
{invoke} name="$FUNCTION_NAME">
{param} name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE{param_close}
...
{invoke_close}
{invoke} name="$FUNCTION_NAME2">
...
{invoke_close}
{closer}
String and scalar parameters should be specified as is without any escaping or quotes, while lists and objects should use JSON format. The "string" attribute should be set to "true" for string type parameters and "false" for other types (numbers, booleans, arrays, objects).
If the thinking_mode is enabled, then after function results you should strongly consider outputting a thinking block. Here is an example:
{opener}
...
{closer}
<function_results>
...
</function_results>
{think_open}...thinking about results{think_close}
Here are the functions available in JSONSchema format:
<functions>
{schemas}
</functions>
"""

V4_EFFORT_PROMPTS = {
    "low": "",
    "high": (
        "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
        "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause,"
        " rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n"
        "Explicitly write out your entire deliberation process, documenting every intermediate step, considered"
        " alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
    ),
    "max": (
        "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
        "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose"
        " the problem into its most fundamental components, trace every causal chain to its root, and resolve the"
        " underlying cause rather than any surface symptom.\n"
        "Do not stop reasoning until you have independently verified the solution from multiple angles and are certain"
        " that no assumption remains unchecked and no error remains undiscovered.\n\n"
    ),
}
_V41_EFFORT_BUDGETS = {"low": 50, "high": 75, "xhigh": 75, "max": 100}
_KEEP_ROLES = {"user", "system", "tool", "latest_reminder", "direct_search_results"}


def render_tools(functions: Sequence[dict[str, Any]], fmt: str = "v4") -> str:
    """The tools section of the system prompt, for function schemas (the `function` part of OpenAI tools)."""
    tags = DSML_FORMATS[fmt]
    template = _V32_TOOLS if fmt == "v32" else _V4_TOOLS
    return template.format(
        opener=tags.opener, closer=tags.closer, invoke=tags.invoke_open, invoke_close=tags.invoke_close,
        param=tags.param_open, param_close=tags.param_close, think_open=THINK_OPEN, think_close=THINK_CLOSE,
        schemas="\n".join(to_json(f) for f in functions),
    )


def _reasoning_key(fmt: str) -> str:
    return "reasoning_content" if fmt == "v41" else "reasoning"


def _arguments(raw: Any, fmt: str) -> dict[str, Any]:
    if fmt != "v41":
        return json.loads(raw) if isinstance(raw, str) else raw
    # V4.1 tolerates JSON strings, double-encoded ones too, and wraps anything else.
    value = raw
    for _ in range(2):
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value)
        except ValueError:
            break
    return value if isinstance(value, dict) else {"arguments": raw}


def _tool_block(tool_calls: list[dict[str, Any]], fmt: str) -> str:
    calls = [ToolCall(tc["function"]["name"], _arguments(tc["function"]["arguments"], fmt)) for tc in tool_calls]
    return "\n\n" + render_calls(calls, fmt)


def _flatten(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    parts = []
    for block in content:
        if not isinstance(block, dict):
            parts.append(str(block))
        elif block.get("type") in ("image", "image_url"):
            parts.append(IMAGE_PLACEHOLDER)
        elif block.get("type") == "text":
            parts.append(block.get("text", ""))
        else:
            raise ValueError(f"Unsupported content block type: {block.get('type')!r}")
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------------------------- V4 / V4.1


def _merge_tool_messages(messages: list[dict[str, Any]], fmt: str) -> list[dict[str, Any]]:
    """Tool results become `<tool_result>` blocks of a user turn; consecutive user turns merge."""
    merged: list[dict[str, Any]] = []
    for msg in messages:
        msg = copy.deepcopy(msg)
        role = msg.get("role")
        joinable = bool(merged) and merged[-1].get("role") == "user" and "content_blocks" in merged[-1]
        if role == "tool":
            block = {"type": "tool_result", "tool_use_id": msg.get("tool_call_id", ""), "content": msg.get("content", "")}
            if fmt == "v41":
                block["_image_indices"] = msg.get("_image_indices", [])
            if joinable:
                merged[-1]["content_blocks"].append(block)
            else:
                merged.append({"role": "user", "content_blocks": [block]})
        elif role == "user":
            if fmt == "v41":
                blocks = msg.get("content_blocks")
                if blocks is None:
                    blocks = [{"type": "text", "text": msg.get("content", ""), "_image_indices": msg.get("_image_indices", [])}]
            else:
                text = _flatten(msg.get("content", ""))
                blocks = [{"type": "text", "text": text}]
            if joinable and merged[-1].get("task") is None:
                merged[-1]["content_blocks"].extend(blocks)
            elif fmt == "v41":
                msg["content_blocks"] = blocks
                merged.append(msg)
            else:
                new = {"role": "user", "content": text, "content_blocks": blocks}
                new.update({key: msg[key] for key in ("task", "wo_eos", "mask") if key in msg})
                merged.append(new)
        else:
            merged.append(msg)
    return merged


def _sort_tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool results in the order of the calls of the assistant turn before them."""
    order: dict[str, int] = {}
    for msg in messages:
        if msg.get("role") == "assistant" and msg.get("tool_calls"):
            order = {}
            for idx, tc in enumerate(msg["tool_calls"]):
                tc_id = tc.get("id") or tc.get("function", {}).get("id", "")
                if tc_id:
                    order[tc_id] = idx
        elif msg.get("role") == "user" and msg.get("content_blocks"):
            results = [b for b in msg["content_blocks"] if b.get("type") == "tool_result"]
            if len(results) > 1 and order:
                ranked = iter(sorted(results, key=lambda b: order.get(b.get("tool_use_id", ""), 0)))
                msg["content_blocks"] = [next(ranked) if b.get("type") == "tool_result" else b for b in msg["content_blocks"]]
    return messages


def _last_user_index(messages: list[dict[str, Any]], fmt: str) -> int:
    for idx in range(len(messages) - 1, -1, -1):
        role = messages[idx].get("role")
        if fmt != "v41":
            if role in ("user", "developer"):
                return idx
            continue
        if role in ("user", "developer") or (role == "system" and idx > 0):
            blocks = messages[idx].get("content_blocks")
            # V4.1: a user turn holding only tool results does not start a new turn.
            if blocks and not any(b.get("type") in ("text", "image", "image_url") for b in blocks):
                continue
            return idx
    return -1


def _drop_thinking(messages: list[dict[str, Any]], fmt: str) -> list[dict[str, Any]]:
    last_user = _last_user_index(messages, fmt)
    keep = _KEEP_ROLES if fmt != "v32" else {"user", "system", "tool"}
    kept = []
    for idx, msg in enumerate(messages):
        role = msg.get("role")
        if role in keep or idx >= last_user:
            kept.append(msg)
        elif role == "assistant":
            msg = copy.copy(msg)
            msg.pop(_reasoning_key(fmt), None)
            kept.append(msg)
    return kept


def _effort_prompt(index: int, thinking_mode: str, effort: Any, fmt: str) -> str:
    if fmt == "v4":
        effort = effort or "low"
        if effort not in V4_EFFORT_PROMPTS:
            raise ValueError(f"Invalid reasoning effort: {effort}, expected one of {list(V4_EFFORT_PROMPTS)}")
        return V4_EFFORT_PROMPTS[effort] if index == 0 and thinking_mode == "thinking" else ""
    effort = "high" if effort is None else effort
    if not ((type(effort) is int and 1 <= effort <= 100) or effort in _V41_EFFORT_BUDGETS):
        raise ValueError(f"Invalid reasoning effort for deepseek_v41: {effort}")
    budget = _V41_EFFORT_BUDGETS[effort] if isinstance(effort, str) else effort
    if index == 0 and thinking_mode == "thinking":
        return f"Reasoning Effort: {budget} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
    return ""


def _user_text(msg: dict[str, Any], content: Any, fmt: str) -> str:
    blocks = msg.get("content_blocks")
    if not blocks:
        return content or ""
    parts = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            parts.append(block.get("text", ""))
        elif kind in ("image", "image_url") and fmt == "v4":
            parts.append(IMAGE_PLACEHOLDER)
        elif kind == "tool_result":
            result = block.get("content", "")
            if isinstance(result, list):
                result = "\n\n".join(
                    b.get("text", "") if b.get("type") == "text" else f"[Unsupported {b.get('type')}]" for b in result
                )
            parts.append(f"<tool_result>{result}</tool_result>")
        else:
            parts.append(f"[Unsupported {kind}]")
    return "\n\n".join(parts)


def _render_v4(index: int, messages: list[dict[str, Any]], fmt: str, thinking_mode: str, drop_thinking: bool,
               effort: Any, last_user: int) -> str:
    msg = messages[index]
    role = msg.get("role")
    content = _flatten(msg.get("content")) if fmt == "v4" else msg.get("content")
    tools = [t["function"] for t in msg["tools"]] if msg.get("tools") else None
    response_format = msg.get("response_format")
    effort_prompt = _effort_prompt(index, thinking_mode, effort, fmt)
    prompt = SYSTEM if fmt == "v41" and index == 0 and (effort_prompt or role == "system") else ""
    prompt += effort_prompt
    extras = ("\n\n" + render_tools(tools, fmt) if tools else "") + (
        "\n\n" + _RESPONSE_FORMAT.format(schema=to_json(response_format)) if response_format else "")
    if role == "system":
        prompt += (SYSTEM if fmt == "v41" and index > 0 else "") + (content or "") + extras
    elif role == "developer":
        if not content:
            raise ValueError(f"Invalid message for role `{role}`: {msg}")
        prompt += USER + content + extras
    elif role == "user":
        prompt += USER + _user_text(msg, content, fmt)
    elif role == "latest_reminder":
        prompt += LATEST_REMINDER + f"{content}"
    elif role == "assistant":
        calls = _tool_block(msg["tool_calls"], fmt) if msg.get("tool_calls") else ""
        thinking = ""
        prev_has_task = index >= 1 and messages[index - 1].get("task") is not None
        if thinking_mode == "thinking" and not prev_has_task and (not drop_thinking or index > last_user):
            thinking = (msg.get(_reasoning_key(fmt)) or "") + THINK_CLOSE
        prompt += thinking + (content or "") + calls + ("" if msg.get("wo_eos", False) else EOS)
    elif role == "tool":
        raise ValueError("tool messages must be merged into user turns first")
    else:
        raise ValueError(f"Invalid role: {role}")

    if index + 1 < len(messages) and messages[index + 1].get("role") not in ("assistant", "latest_reminder"):
        return prompt
    task = msg.get("task")
    if task is not None:
        if task not in TASK_TOKENS:
            raise ValueError(f"Invalid task: {task!r}. Valid tasks are: {list(TASK_TOKENS)}")
        if task != "action":
            return prompt + TASK_TOKENS[task]
        return prompt + ASSISTANT + (THINK_CLOSE if thinking_mode != "thinking" else THINK_OPEN) + TASK_TOKENS[task]
    if fmt == "v4":
        opens = role == "system" and (index == len(messages) - 1 or messages[index + 1].get("role") == "assistant")
    else:
        opens = role == "system" and index > 0
    if role in ("user", "developer") or opens:
        prompt += ASSISTANT
        if thinking_mode == "thinking" and (not drop_thinking or index >= last_user):
            prompt += THINK_OPEN
        else:
            prompt += THINK_CLOSE
    return prompt


def _encode_v4(messages: list[dict[str, Any]], context: list[dict[str, Any]], fmt: str, thinking_mode: str,
               drop_thinking: bool, add_bos: bool, effort: Any) -> str:
    merged = _sort_tool_results(context + _merge_tool_messages(messages, fmt))[len(context):]
    if context:
        context = _sort_tool_results(_merge_tool_messages(context, fmt))
    full = context + merged
    prompt = BOS if add_bos and not context else ""
    if any(m.get("tools") for m in full):
        drop_thinking = False
    if thinking_mode == "thinking" and drop_thinking:
        full = _drop_thinking(full, fmt)
        count = len(full) - len(_drop_thinking(context, fmt))
        start = len(full) - count
    else:
        count, start = len(merged), len(context)
    last_user = _last_user_index(full, fmt)
    for idx in range(count):
        prompt += _render_v4(idx + start, full, fmt, thinking_mode, drop_thinking, effort, last_user)
    return prompt


# ---------------------------------------------------------------------------------------------- V3.2


def _render_v32(index: int, messages: list[dict[str, Any]], thinking_mode: str, last_user: int) -> str:
    msg = messages[index]
    role, content = msg.get("role"), msg.get("content")
    tools = [t["function"] for t in msg["tools"]] if msg.get("tools") else None
    response_format = msg.get("response_format")
    extras = ("\n\n" + render_tools(tools, "v32") if tools else "") + (
        "\n\n" + _RESPONSE_FORMAT.format(schema=to_json(response_format)) if response_format else "")
    opener = THINK_OPEN if index == last_user and thinking_mode == "thinking" else THINK_CLOSE
    if role == "system":
        return (content or "") + extras
    if role == "developer":
        if not content:
            raise ValueError(f"Invalid message for role `{role}`: {msg}")
        return f"{USER}{extras}\n\n# The user's message is: {content}{ASSISTANT}{opener}"
    if role == "user":
        return f"{USER}{content}{ASSISTANT}{opener}"
    if role == "tool":
        prev = index - 1
        assistant = messages[prev]
        while prev >= 0 and assistant.get("role") == "tool":
            prev -= 1
            assistant = messages[prev]
        if not (index == 0 or prev >= 0 and assistant.get("role") == "assistant"):
            raise ValueError(f"Invalid messages at {index}:\n{assistant}")
        order = index - prev
        calls = assistant.get("tool_calls")
        if not (calls and len(calls) >= order):
            raise ValueError("No tool calls but found tool output")
        prompt = ("\n\n<function_results>" if order == 1 else "") + f"\n<result>{content}</result>"
        if order == len(calls):
            prompt += "\n</function_results>\n\n"
            prompt += THINK_OPEN if index >= last_user and thinking_mode == "thinking" else THINK_CLOSE
        return prompt
    if role == "assistant":
        calls = _tool_block(msg["tool_calls"], "v32") if msg.get("tool_calls") else ""
        thinking = ""
        if thinking_mode == "thinking" and index > last_user:
            if not (msg.get("reasoning") or msg.get("tool_calls")):
                raise ValueError(f"ThinkingMode: {thinking_mode}, invalid message without reasoning/tool_calls `{msg}` "
                                 "after last user message")
            thinking = (msg.get("reasoning") or "") + THINK_CLOSE
        if not msg.get("tool_calls") and msg.get("prefix", False):
            return content or ""
        return thinking + (content or "") + calls + EOS
    raise ValueError(f"Invalid role: {role}")


def _encode_v32(messages: list[dict[str, Any]], context: list[dict[str, Any]], thinking_mode: str,
                drop_thinking: bool, add_bos: bool) -> str:
    full = context + messages
    prompt = BOS if add_bos and not context else ""
    if thinking_mode == "thinking" and drop_thinking:
        full = _drop_thinking(full, "v32")
    last_user = _last_user_index(full, "v32")
    return prompt + "".join(_render_v32(idx + len(context), full, thinking_mode, last_user) for idx in range(len(messages)))


# ---------------------------------------------------------------------------------------------- public


def _with_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    # vLLM's chat preprocessing stores an assistant turn's reasoning under both keys
    # (renderers/chat_utils/chat_message.py); SGLang responses name it `reasoning_content`.
    if message.get("role") != "assistant":
        return message
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    return message if reasoning is None else {**message, "reasoning": reasoning, "reasoning_content": reasoning}


def attach_tools(messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]], fmt: str) -> list[dict[str, Any]]:
    """The request's OpenAI `tools` placed where vLLM's DeepSeek tokenizers put them before encoding.

    V3.2 gets a new leading system message; V4 and V4.1 attach them to the first system message, adding
    one at the front when there is none.
    """
    messages = list(messages)
    if fmt == "v32":
        return [{"role": "system", "tools": list(tools)}, *messages]
    at = next((i for i, m in enumerate(messages) if m.get("role") == "system"), None)
    if at is None:
        messages.insert(0, {"role": "system"} if fmt == "v4" else {"role": "system", "content": ""})
        at = 0
    messages[at] = {**messages[at], "tools": list(tools)}
    return messages


def encode_messages(
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    fmt: str = "v4",
    thinking: bool = True,
    context: Sequence[dict[str, Any]] | None = None,
    drop_thinking: bool = True,
    add_default_bos_token: bool = True,
    reasoning_effort: str | int | None = None,
) -> str:
    """The prompt text DeepSeek's reference encoder `fmt` builds for a conversation, ending where the model
    starts to write (`<｜Assistant｜><think>` in thinking mode).

    `thinking` is the reference's `thinking_mode` ("thinking" or "chat"); `context`, `drop_thinking`,
    `add_default_bos_token` and `reasoning_effort` are the reference's parameters (V3.2 has no effort).
    `tools` are OpenAI tools, placed in `messages` (never in `context`) as `attach_tools` does; messages may
    also carry `tools` themselves, as the reference takes them.
    An assistant turn's past reasoning may be given as `reasoning` or `reasoning_content`: like vLLM's chat
    preprocessing, the encoder fills both before the reference logic reads its own key.
    Raises ValueError where the reference raises.
    """
    if fmt not in ENCODER_FORMATS:
        raise ValueError(f"unknown encoder format {fmt!r}; expected one of {', '.join(ENCODER_FORMATS)}")
    msgs = [_with_reasoning(m) for m in messages]
    if tools:
        msgs = attach_tools(msgs, tools, fmt)
    mode = "thinking" if thinking else "chat"
    ctx = list(context or [])
    if fmt == "v32":
        if reasoning_effort is not None:
            raise ValueError("the V3.2 encoder takes no reasoning effort")
        return _encode_v32(msgs, ctx, mode, drop_thinking, add_default_bos_token)
    return _encode_v4(msgs, ctx, fmt, mode, drop_thinking, add_default_bos_token, reasoning_effort)


__all__ = ["BOS", "ENCODER_FORMATS", "attach_tools", "encode_messages", "render_tools"]
