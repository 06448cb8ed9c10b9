"""SGLang's server-side parsing policy for DeepSeek-V4 output, on top of dsml_checker's tolerant parser.

This module decides only what SGLang decides (dsml-format.md §4): which text becomes reasoning, which
becomes content, which calls survive, and the fallbacks to content when the markup does not parse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dsml_checker.formats import EOS, THINK_CLOSE, DSMLParseError, ToolCall, block_opener, split_completion


@dataclass(frozen=True)
class ParsedOutput:
    """What the server returns for one completion."""

    reasoning: str
    content: str
    calls: tuple[ToolCall, ...]


def parse_output(raw: str, *, tool_names: set[str], tools_enabled: bool) -> ParsedOutput:
    """Split raw V4 text the way SGLang's deepseek-v4 reasoning parser and deepseekv4 detector do."""
    if THINK_CLOSE not in raw:
        # In thinking mode the reasoning parser holds everything until `</think>`: DSML included.
        return ParsedOutput(raw.removesuffix(EOS), "", ())
    if not tools_enabled:
        reasoning, _, body = raw.partition(THINK_CLOSE)
        return ParsedOutput(reasoning, body.removesuffix(EOS), ())
    try:
        done = split_completion(raw, mode="tolerant", fmt="v4")
    except DSMLParseError as err:
        reasoning, _, body = raw.partition(THINK_CLOSE)
        body = body.removesuffix(EOS)
        if err.rule == "block-unterminated":
            # SGLang waits for the closer that never comes and drops the block without a word.
            return ParsedOutput(reasoning, body[: body.find(block_opener("v4"))].removesuffix("\n\n"), ())
        return ParsedOutput(reasoning, body, ())
    # An unknown tool's call is dropped silently, as SGLang's detector does.
    calls = tuple(call for call in done.calls if call.name in tool_names)
    return ParsedOutput(done.reasoning or "", done.content, calls)


def tools_enabled(tools: Sequence[object], tool_choice: object) -> bool:
    """SGLang runs its tool-call parser only when tools were sent and tool_choice is not "none"."""
    return bool(tools) and tool_choice != "none"
