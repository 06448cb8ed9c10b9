"""The simulator's server-side parsing: the configured framework version's DeepSeek-V4 parser.

Which text becomes reasoning, which becomes content, which calls survive, and the repairs and drops on
the way are the real parser's: for `sglang-0.5.23`, DeepSeek's own (deepseek-recipe) where it is
installed, else emulated by dsml_checker.server_parsers (checked against the real ones). That includes
SGLang's serving policies: no tool parsing without tools or with tool_choice "none", and reasoning held
until `</think>` in thinking mode.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from dsml_checker.formats import ToolCall
from dsml_checker.server_parsers import DEFAULT_PARSER, NativeParserError, parse_as

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParsedOutput:
    """What the server returns for one completion; `arguments` holds each call's arguments as sent."""

    reasoning: str
    content: str
    calls: tuple[ToolCall, ...]
    arguments: tuple[str, ...] = ()

    def arguments_text(self, index: int) -> str:
        """Call `index`'s arguments string on the wire (the parser's own, which may be invalid JSON)."""
        if self.arguments:
            return self.arguments[index]
        return json.dumps(self.calls[index].arguments, ensure_ascii=False)


def parse_output(raw: str, *, tools: list[dict[str, Any]], tool_choice: Any, parser: str = DEFAULT_PARSER,
                 truncated: bool = False) -> tuple[ParsedOutput, str]:
    """(output, finish_reason) for raw V4 text, as the `parser` version's chat serving path returns them."""
    finish = "length" if truncated else "stop"
    try:
        done = parse_as(parser, raw, tools=tools, tool_choice=tool_choice, finish_reason=finish)
    except NativeParserError as err:
        # The simulator's own texts are valid strings, so this does not happen; should it, the answer still
        # comes back, from the emulation, and the log says so.
        log.warning("%s; answering from the emulation", err)
        done = parse_as(parser, raw, tools=tools, tool_choice=tool_choice, finish_reason=finish, emulate=True)
    return ParsedOutput(done.reasoning or "", done.content, done.calls, done.arguments), done.finish_reason
