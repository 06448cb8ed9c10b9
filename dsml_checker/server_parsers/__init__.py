"""What a serving framework's DeepSeek-V4 parser makes of raw model text, version by version.

`parse_as(parser, raw, tools=, tool_choice=)` behaves as that version's non-streaming chat path does on
the same text (thinking mode on): its repairs, silent drops, duplicated calls, truncations, stripped
strings, replayed reasoning appended to content, unknown tools kept or dropped, text after the block
dropped. The emulations are checked line by line against fixtures that the real parsers produced
(tests/fixtures/real_parsers/). Pure and standard-library only, like the rest of dsml_checker.

- `sglang-0.5.23`: SGLang serves DeepSeek-V4 chat through DeepSeek's deepseek-recipe parser.
- `sglang-0.5.20`: SGLang's deepseek-v4 reasoning parser, then its deepseekv4 text detector.
- `vllm-0.33`: vLLM's lexer engine (vllm/parser/deepseek_v4.py), schema coercion included.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dsml_checker.formats import EOS, THINK_CLOSE, ToolCall
from dsml_checker.server_parsers import _detector, _native, _recipe, _vllm
from dsml_checker.server_parsers._common import Parsed
from dsml_checker.server_parsers._native import NativeParserError

PARSERS = ("sglang-0.5.23", "sglang-0.5.20", "vllm-0.33")
DEFAULT_PARSER = PARSERS[0]
_EMULATIONS = {"sglang-0.5.23": _recipe.parse, "sglang-0.5.20": _detector.parse, "vllm-0.33": _vllm.parse}
_NATIVE = {"sglang-0.5.23"}
"""The parsers whose real code can run here (deepseek-recipe, when installed)."""
EMULATION = "emulation"


def implementation(parser: str) -> str:
    """What `parse_as(parser, …)` runs: `deepseek-recipe <version>` (the real parser) or `emulation`."""
    native = _native.version() if parser in _NATIVE else None
    return f"{_native.PACKAGE} {native}" if native else EMULATION


@dataclass(frozen=True)
class ServerParse:
    """One completion as the server returns it, and what its parser did to get there.

    `arguments` holds each call's arguments string exactly as the server sends it (it may be invalid
    JSON: the recipe pastes `string="false"` values verbatim); `calls` holds them parsed, `{}` where
    the string is not a JSON object. `actions` names the parser's repairs and drops, for logs.
    """

    reasoning: str | None
    content: str
    calls: tuple[ToolCall, ...]
    arguments: tuple[str, ...]
    finish_reason: str
    actions: tuple[str, ...]
    implementation: str = EMULATION
    """Which code parsed: `deepseek-recipe <version>` or `emulation` (see `implementation()`)."""

    def message(self) -> dict[str, Any]:
        """The OpenAI-style assistant message of a non-streamed response (call ids left out)."""
        calls = [{"type": "function", "function": {"name": c.name, "arguments": a}}
                 for c, a in zip(self.calls, self.arguments)]
        return {"role": "assistant", "content": self.content if self.content or not calls else None,
                "reasoning_content": self.reasoning or None, "tool_calls": calls or None}


def _as_object(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def parse_as(parser: str, raw: str, *, tools: Any, tool_choice: Any = None, fmt: str = "v4",
             finish_reason: str | None = None, thinking: bool = True, emulate: bool = False) -> ServerParse:
    """Parse `raw` (the generated text) as `parser` does; ValueError on an unknown parser or format.

    `tools` and `tool_choice` are the request's, `thinking` its thinking mode (the text starts with
    reasoning). `finish_reason` is the engine's ("stop" or "length"); by default "stop" when `raw` ends
    with the end-of-sentence token, else "length" (a max_tokens cut). The returned finish reason is the
    server's: "tool_calls" when a stop came with calls. The real parser runs where it is installed
    unless `emulate`; NativeParserError when it raises on the text (the server would answer an error).
    """
    if parser not in _EMULATIONS:
        raise ValueError(f"unknown tool parser {parser!r}; expected one of {', '.join(PARSERS)}")
    if fmt != "v4":
        raise ValueError(f"the {parser} emulation reads DeepSeek-V4 DSML only, not {fmt!r}")
    engine_finish = finish_reason or ("stop" if raw.endswith(EOS) else "length")
    text = raw.removesuffix(EOS)  # the engine cuts the stop token before the parser runs
    tool_list = [t for t in tools or [] if isinstance(t, dict)]
    used = EMULATION if emulate else implementation(parser)
    if used != EMULATION:
        done: Parsed = _native.parse(text, tool_list, tool_choice, engine_finish=engine_finish, thinking=thinking)
    else:
        # The emulations read thinking-mode text; outside it the whole text is the answer, as after `</think>`.
        done = _EMULATIONS[parser](text if thinking else THINK_CLOSE + text, tool_list, tool_choice)
    calls = tuple(ToolCall(name, _as_object(args)) for name, args in done.calls)
    finish = "tool_calls" if calls and engine_finish == "stop" and not done.stop_with_calls else engine_finish
    return ServerParse(done.reasoning or None, done.content, calls, tuple(a for _, a in done.calls), finish,
                       tuple(done.actions), used)


__all__ = ["DEFAULT_PARSER", "EMULATION", "PARSERS", "NativeParserError", "ServerParse", "implementation", "parse_as"]
