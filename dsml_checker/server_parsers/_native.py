"""SGLang 0.5.23's DeepSeek-V4 chat output path, run on DeepSeek's own parser: the `deepseek-recipe` package.

SGLang serves DeepSeek-V4 chat through recipe's Rust `StreamProcessor` (its `DeepSeekRecipeOutputParser`,
`serving_deepseek_recipe.parse_chat_response`). This module takes the same steps:
- the processor is built as SGLang builds it: tool-call parsing on when the request has tools and
  `tool_choice` is not "none"; thinking mode starts it in reasoning (`ReasoningStart`), otherwise in
  the answer; the image token spelt as SGLang spells the checkpoint's;
- the generated text goes in as one text chunk (no checkpoint tokenizer here: the markers it spells
  count as the tokens the model sampled, as SGLang's own `parse_output_text` does), then the engine's
  finish reason;
- the chunks become one delta as SGLang's `_deltas` merges them (role chunks skipped, reasoning
  separated), and whole calls as its `whole_tool_calls` joins their argument pieces by index.
The server's finish reason ("stop" with calls becomes "tool_calls") is `parse_as`'s, the same rule.

The package is imported at call time only, so `dsml_checker` stays standard-library only and its own
judging never runs it: this is the parser under test, not the judge.
"""

from __future__ import annotations

import functools
import json
from types import ModuleType
from typing import Any

from dsml_checker.server_parsers._common import Parsed

PACKAGE = "deepseek-recipe"
IMAGE_TOKEN = "<｜deepseek_image｜>"
"""The checkpoint tokenizer's image token, which SGLang hands recipe in place of its own spelling."""


class NativeParserError(RuntimeError):
    """The native parser raised on a text (say, one it cannot encode); the message says why."""


@functools.cache
def _module() -> ModuleType | None:
    try:
        import deepseek_recipe  # noqa: PLC0415  (optional, and only the parser under test needs it)
    except ImportError:
        return None
    return deepseek_recipe


def version() -> str | None:
    """The installed deepseek-recipe version, or None when it is not installed (the emulation runs instead)."""
    module = _module()
    return None if module is None else str(module.__version__)


def _deltas(chunks: list[Any], out: Parsed) -> None:
    reasoning: list[str] = []
    content: list[str] = []
    calls: dict[int, list[str]] = {}
    for chunk in chunks:
        choice = json.loads(chunk.to_json())["choices"][0]
        piece = choice["delta"]
        if piece.get("role"):  # SGLang emits its own role chunk
            continue
        reasoning.append(piece.get("reasoning_content") or "")
        content.append(piece.get("content") or "")
        for call in piece.get("tool_calls") or ():
            function = call["function"]
            if function.get("name") is not None:
                calls[call["index"]] = [function["name"], function["arguments"]]
            else:
                calls[call["index"]][1] += function["arguments"]
    out.reasoning = "".join(reasoning) or None
    out.content = "".join(content)
    out.calls.extend((name, arguments) for _, (name, arguments) in sorted(calls.items()))


def parse(text: str, tools: list[dict[str, Any]], tool_choice: Any, *, engine_finish: str, thinking: bool) -> Parsed:
    """`text` (the stop token already cut) through recipe as SGLang 0.5.23 drives it; NativeParserError
    when the package raises, RuntimeError when it is not installed."""
    recipe = _module()
    if recipe is None:
        raise RuntimeError(f"{PACKAGE} is not installed")
    try:
        options = recipe.ParsingOptions(
            parse_tool_calls=bool(tools) and tool_choice != "none",
            thinking_initial_stage=recipe.ThinkingInitialStage.ReasoningStart if thinking else None,
            special_tokens=recipe.SpecialTokens(image=IMAGE_TOKEN),
        )
        # The generator only frames chunks; what is parsed follows `options` (as in SGLang).
        request = recipe.ConversationRequest(recipe.Conversation(), recipe.ModelVersion.DeepseekV4Pro)
        generator = recipe.ChatCompletionRequest.chunk_generator(request, "", "DeepSeek-V4-Pro")
        processor = recipe.StreamProcessor(generator, options, None)
        chunks = list(processor.push(recipe.InferenceChunk.text(text))) if text else []
        reason = recipe.InferenceFinishReason.Stop if engine_finish == "stop" else recipe.InferenceFinishReason.Length
        chunks += processor.push(recipe.InferenceChunk.finish(reason))
        out = Parsed(None, "", actions=[f"{PACKAGE}-{recipe.__version__}"])
        _deltas(chunks, out)
    except Exception as err:  # noqa: BLE001  (any failure of the native code is the parser's answer)
        raise NativeParserError(f"{PACKAGE} raised {type(err).__name__}: {str(err)[:200]}") from None
    return out
