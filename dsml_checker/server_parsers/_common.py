"""What every emulation returns, and the few facts of the request they all read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dsml_checker.formats import DSML_FORMATS

TAGS = DSML_FORMATS["v4"]
THINK_OPEN = "<think>"


@dataclass
class Parsed:
    """An emulation's answer: reasoning, content, (name, arguments string) per call, its actions."""

    reasoning: str | None
    content: str
    calls: list[tuple[str, str]] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    stop_with_calls: bool = False
    """The server reports finish "stop" even with calls (vLLM, for a named tool_choice)."""


def tool_names(tools: list[dict[str, Any]]) -> list[str]:
    return [f["name"] for t in tools if isinstance(f := t.get("function"), dict) and isinstance(f.get("name"), str)]


def tool_properties(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The `properties` of the named tool's parameter schema, {} when it has none."""
    for tool in tools:
        function = tool.get("function")
        if isinstance(function, dict) and function.get("name") == name:
            params = function.get("parameters") or {}
            props = params.get("properties") if isinstance(params, dict) else None
            return props if isinstance(props, dict) else {}
    return {}
