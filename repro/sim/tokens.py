"""Pseudo-tokens of the simulator's raw output, and the OpenAI-shaped log-probabilities served over them.

The split is deterministic and whole-character: the tokens concatenate back to the raw text exactly.
Like DeepSeek's tokenizer, it keeps `</think>`, the end-of-sentence token and a DSML tag's sentinel
(`<｜DSML｜`, `</｜DSML｜`) in one piece each; prose goes in short word pieces.
"""

from __future__ import annotations

import re
import zlib
from typing import Any, Literal

from dsml_checker.formats import SENTINEL, THINK_CLOSE

Coverage = Literal["full", "no-tool-calls", "none"]
COVERAGES: tuple[Coverage, ...] = ("full", "no-tool-calls", "none")

_TOKEN = re.compile(
    r"<｜end▁of▁sentence｜>|</think>|<think>|</?｜DSML｜|｜DSML｜|\n+|[ \t]?[^\W_]{1,6}|[ \t]+|.", re.DOTALL
)
_ALTERNATIVES = (" the", " a", "\n", ",", ".", " and", " to", "<", '"', " of", ">", " is", ":", " in", "_", " for",
                 " that", "(", ")", " it", " with")


def tokenize(text: str) -> list[str]:
    """The raw text's pseudo-tokens; `"".join(tokenize(t)) == t`."""
    return _TOKEN.findall(text)


def _logprob(index: int, token: str) -> float:
    return -round((zlib.crc32(f"{index}:{token}".encode()) % 2000) / 1000, 3)


def _entry(index: int, token: str, top: int) -> dict[str, Any]:
    chosen = _logprob(index, token)
    alternatives = [{"token": token, "logprob": chosen, "bytes": list(token.encode())}]
    for offset, other in enumerate(a for a in _ALTERNATIVES if a != token):
        if len(alternatives) >= top:
            break
        value = round(chosen - 0.5 - offset * 0.25, 3)
        alternatives.append({"token": other, "logprob": value, "bytes": list(other.encode())})
    return {"token": token, "logprob": chosen, "bytes": list(token.encode()), "top_logprobs": alternatives[:top]}


def _tool_call_start(tokens: list[str]) -> int:
    """Index of the first token of the tool-call block (its leading blank line included), or len(tokens)."""
    think = tokens.index(THINK_CLOSE) + 1 if THINK_CLOSE in tokens else 0
    at = next((i for i in range(think, len(tokens)) if SENTINEL in tokens[i]), len(tokens))
    if 0 < at < len(tokens) and not tokens[at - 1].strip():
        at -= 1
    return at


def token_logprobs(raw: str, *, top_logprobs: int, coverage: Coverage, has_calls: bool) -> list[dict[str, Any] | None]:
    """One entry per pseudo-token of `raw`, None where the coverage withholds it (`none` is the caller's:
    it serves no log-probabilities at all).

    `no-tool-calls` stands for a server that drops log-probabilities while its tool parser holds the
    block: every token from the block's start on, when the parser returned calls.
    """
    tokens = tokenize(raw)
    cut = _tool_call_start(tokens) if coverage == "no-tool-calls" and has_calls else len(tokens)
    return [_entry(i, token, top_logprobs) if i < cut else None for i, token in enumerate(tokens)]
