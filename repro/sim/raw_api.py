"""SGLang's raw-text endpoints as the simulator speaks them: native `/generate` and OpenAI `/v1/completions`.

Both take a prompt the client rendered and return the generated text as the model wrote it: reasoning,
`</think>`, the DSML block, with no reasoning or tool-call parsing. As on SGLang, the end-of-sentence
token is left out unless the request sets `skip_special_tokens: false` and `no_stop_trim: true`, and
the defaults cut long answers (128 new tokens for `/generate`, 16 for `/v1/completions`).
Pure models and builders, no I/O.
"""

from __future__ import annotations

import zlib
from typing import Any, Iterator

from pydantic import BaseModel, ConfigDict, Field

from dsml_checker.formats import EOS
from repro.sim.protocol import Reply
from repro.sim.tokens import tokenize

EOS_TOKEN_ID = 1
"""DeepSeek's end-of-sentence id: what SGLang reports as the matched stop token."""


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class SamplingParams(_Loose):
    max_new_tokens: int = Field(128, ge=1)
    sampling_seed: int | None = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False


class GenerateRequest(_Loose):
    text: str
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    stream: bool = False
    rid: str | None = None


class CompletionRequest(_Loose):
    model: str | None = None
    prompt: str
    max_tokens: int = Field(16, ge=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    seed: int | None = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class RawText:
    """The reply's raw text as pseudo-tokens, with the end-of-sentence token dropped unless it is kept."""

    def __init__(self, reply: Reply, *, keep_eos: bool) -> None:
        tokens = tokenize(reply.raw)
        if tokens and tokens[-1] == EOS and not keep_eos:
            tokens.pop()
        self.tokens = tokens
        self.reply = reply

    def upto(self, tokens_done: int, tokens_total: int) -> int:
        """How many pseudo-tokens have been generated at `tokens_done` of `tokens_total` engine tokens."""
        if tokens_done >= tokens_total:
            return len(self.tokens)
        return len(self.tokens) * tokens_done // max(1, tokens_total)

    def text(self, start: int = 0, end: int | None = None) -> str:
        return "".join(self.tokens[start:end])

    def finish_reason(self) -> str:
        return "length" if self.reply.finish_reason == "length" else "stop"

    def ids(self, end: int) -> list[int]:
        return [zlib.crc32(token.encode()) % 128_000 for token in self.tokens[:end]]


def _sglang_finish(raw: RawText) -> dict[str, Any]:
    if raw.finish_reason() == "length":
        return {"type": "length", "length": raw.reply.completion_tokens}
    return {"type": "stop", "matched": EOS_TOKEN_ID}


def generate_body(raw: RawText, end: int | None = None, *, finished: bool = True) -> dict[str, Any]:
    """A `/generate` response (or, unfinished, a streamed step): the text so far, never a delta."""
    end = len(raw.tokens) if end is None else end
    reply = raw.reply
    tokens = reply.completion_tokens if finished else reply.completion_tokens * end // max(1, len(raw.tokens))
    meta = {
        "id": reply.request_id,
        "finish_reason": _sglang_finish(raw) if finished else None,
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": tokens,
        "cached_tokens": reply.cached_tokens,
        "weight_version": "default",
        "num_retractions": 0,
    }
    return {"text": raw.text(0, end), "output_ids": raw.ids(end), "meta_info": meta}


class GenerateCursor:
    """Streamed `/generate`: each step re-sends the whole text so far (SGLang without incremental output)."""

    def __init__(self, raw: RawText) -> None:
        self.raw = raw
        self.sent = 0

    def opening(self) -> list[dict[str, Any]]:
        return []

    def advance(self, tokens_done: int, tokens_total: int) -> Iterator[dict[str, Any]]:
        upto = self.raw.upto(tokens_done, tokens_total)
        if upto > self.sent and upto < len(self.raw.tokens):
            yield generate_body(self.raw, upto, finished=False)
        self.sent = max(self.sent, upto)

    def closing(self) -> list[dict[str, Any]]:
        return [generate_body(self.raw)]


def _completion_envelope(reply: Reply, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": reply.request_id, "object": "text_completion", "created": reply.created, "model": reply.model,
            "choices": choices}


def _completion_choice(raw: RawText, text: str, finished: bool) -> dict[str, Any]:
    reason = raw.finish_reason() if finished else None
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason,
            "matched_stop": EOS_TOKEN_ID if reason == "stop" else None}


def completion_body(raw: RawText) -> dict[str, Any]:
    """A non-streamed `/v1/completions` response."""
    return {**_completion_envelope(raw.reply, [_completion_choice(raw, raw.text(), True)]), "usage": raw.reply.usage()}


class CompletionCursor:
    """Streamed `/v1/completions`: text deltas, then a finish chunk and, when asked, a usage chunk."""

    def __init__(self, raw: RawText, *, include_usage: bool) -> None:
        self.raw = raw
        self.include_usage = include_usage
        self.sent = 0

    def opening(self) -> list[dict[str, Any]]:
        return []

    def advance(self, tokens_done: int, tokens_total: int) -> Iterator[dict[str, Any]]:
        upto = self.raw.upto(tokens_done, tokens_total)
        if upto > self.sent:
            choice = _completion_choice(self.raw, self.raw.text(self.sent, upto), False)
            yield _completion_envelope(self.raw.reply, [choice])
        self.sent = max(self.sent, upto)

    def closing(self) -> list[dict[str, Any]]:
        chunks = [_completion_envelope(self.raw.reply, [_completion_choice(self.raw, "", True)])]
        if self.include_usage:
            chunks.append({**_completion_envelope(self.raw.reply, []), "usage": self.raw.reply.usage()})
        return chunks
