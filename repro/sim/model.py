"""The scripted "model": a deterministic answer for a conversation, rendered as DeepSeek-V4 DSML text.

The answer depends only on the seed, the conversation so far and the request's tools: tool calls drawn
from the request's own tools with arguments generated from their JSON schemas, or a final answer once
the conversation holds enough assistant turns. Reasoning comes first, as in thinking mode.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

from dsml_checker.formats import ToolCall, render_completion

_WORDS = (
    "cache", "layer", "batch", "prefix", "session", "config", "report", "index", "buffer", "page", "queue",
    "latency", "router", "worker", "kernel", "stream", "token", "shard", "node", "metric", "trace", "log",
    "build", "deploy", "commit", "branch", "module", "test", "schema", "record", "window", "budget",
)
_REASONING = (
    "The user wants progress on the task; the next useful step is {action}.",
    "I have enough context to continue. I should {action} before answering.",
    "Looking at what came back so far, it makes sense to {action}.",
    "Let me think about what is still missing: I need to {action}.",
)


@dataclass(frozen=True)
class Answer:
    """What the model means to say: reasoning, content and calls, and the raw text that says it."""

    reasoning: str
    content: str
    calls: tuple[ToolCall, ...]
    raw: str


def conversation_key(messages: list[dict[str, Any]]) -> str:
    """A conversation's identity: a hash of its first user message (where the harness puts the task)."""
    first = next((m.get("content") for m in messages if m.get("role") == "user"), "")
    text = first if isinstance(first, str) else repr(first)
    return "conv-" + hashlib.sha256(text.encode()).hexdigest()[:12]


def assistant_turns(messages: list[dict[str, Any]]) -> int:
    return sum(1 for m in messages if m.get("role") == "assistant")


def rng_for(seed: int, *parts: object) -> random.Random:
    """A random generator fixed by the seed and the given parts: the same inputs, the same draws."""
    digest = hashlib.sha256(repr((seed, *parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _phrase(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))


def value_for(schema: dict[str, Any], rng: random.Random, depth: int = 0) -> Any:
    """A value valid under a (simple) JSON schema: enums, consts, types, bounds, required properties."""
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return value_for(schema[key][0], rng, depth)
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "string":
        low, high = schema.get("minLength", 1), schema.get("maxLength", 40)
        text = _phrase(rng, 1, 4)
        while len(text) < low:
            text += " " + _phrase(rng, 1, 3)
        return text[:high] if high >= low else text
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema["exclusiveMinimum"] + 1 if "exclusiveMinimum" in schema else 1)
        high = schema.get("maximum", schema["exclusiveMaximum"] - 1 if "exclusiveMaximum" in schema else low + 50)
        if kind == "integer":
            return rng.randint(int(low), max(int(low), int(high)))
        return round(rng.uniform(low, max(low, high)), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        items = schema.get("items", {"type": "string"})
        count = max(schema.get("minItems", 1), min(schema.get("maxItems", 3), rng.randint(1, 3)))
        return [value_for(items, rng, depth + 1) for _ in range(count)]
    if kind == "object":
        return object_for(schema, rng, depth + 1)
    return _phrase(rng, 1, 2)


def object_for(schema: dict[str, Any], rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """An object with every required property and, near the top level, some optional ones."""
    props: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    chosen = [name for name in props if name in required or (depth < 2 and rng.random() < 0.5)]
    return {name: value_for(props[name], rng, depth) for name in chosen}


def _tool_function(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("function", {}) if isinstance(tool, dict) else {}


def answer(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    tool_choice: str | dict[str, Any],
    *,
    seed: int,
    final_after_turns: int,
) -> Answer:
    """The model's deterministic answer to a conversation."""
    turn = assistant_turns(messages)
    rng = rng_for(seed, conversation_key(messages), turn)
    functions = [f for f in map(_tool_function, tools) if f.get("name")]
    if isinstance(tool_choice, dict):
        wanted = tool_choice.get("function", {}).get("name")
        functions = [f for f in functions if f["name"] == wanted]
    must_call = tool_choice == "required" or isinstance(tool_choice, dict)
    final = not functions or tool_choice == "none" or (turn >= final_after_turns and not must_call)
    if final:
        reasoning = rng.choice(_REASONING).format(action="summarise the findings")
        sentences = [f"The {_phrase(rng, 2, 4)} looks fine after checking the {_phrase(rng, 1, 3)}." for _ in range(rng.randint(2, 4))]
        content = "Here is what I found. " + " ".join(sentences)
        calls: tuple[ToolCall, ...] = ()
    else:
        count = 1 if len(functions) == 1 or rng.random() < 0.7 else 2
        picked = [rng.choice(functions) for _ in range(count)]
        drawn = [ToolCall(f["name"], object_for(f.get("parameters", {}), rng)) for f in picked]
        # A sound model does not issue one call twice in a turn (the checker's duplicate-call rule): keep the first.
        calls = tuple(call for i, call in enumerate(drawn) if call not in drawn[:i])
        names = " and ".join(c.name for c in calls)
        reasoning = rng.choice(_REASONING).format(action=f"call {names}")
        content = rng.choice(("", "", f"Let me run {names}."))
    raw = render_completion(reasoning=reasoning, content=content, calls=list(calls), fmt="v4")
    return Answer(reasoning, content, calls, raw)
