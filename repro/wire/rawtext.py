"""The text the model generated, rebuilt on the client from what one response carries.

Three sources, one collector each, all fed by `repro.wire.client` with every parsed stream event
(`add_chunk`) or the parsed non-streamed body (`add_body`):
- `LogprobText`: a chat completion asked with `logprobs: true, top_logprobs: 0`; every generated
  token's string is in `choices[0].logprobs.content`, streamed or not (SGLang 0.5.23 and vLLM 0.33
  cover reasoning, `</think>`, the DSML block and the end-of-sentence token). The text is rebuilt
  from each entry's `bytes` (exact where a token is a piece of a UTF-8 character), from the `token`
  strings when any entry lacks bytes.
- `CompletionText`: OpenAI `/v1/completions`, whose `choices[0].text` is the raw generated text.
- `GenerateText`: SGLang's native `/generate`, whose `text` is cumulative by default and a delta
  with `--incremental-streaming-output`; both are accepted.

Pure: no I/O. Server output is untrusted: anything of the wrong shape is counted, never raised,
and makes the rebuilt text incomplete rather than wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

RawSource = Literal["logprobs", "completions", "generate"]

SENTINEL = "｜DSML｜"
"""Every DSML tag carries it: a turn with tool calls whose rebuilt text lacks it lost the block's tokens."""


@dataclass(frozen=True)
class RawText:
    """The rebuilt text of one turn and whether it is whole enough to be judged."""

    source: RawSource
    text: str
    complete: bool
    gap: str | None = None
    """Why the text is not whole (no logprobs, tokens missing, malformed entries); None when complete."""


def _first_choice(obj: Any) -> dict[str, Any] | None:
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


def _usage_int(usage: Any, key: str) -> int | None:
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class LogprobText:
    """Token strings from chat-completion logprobs; `chat` is True: the client still assembles the message."""

    source: RawSource = "logprobs"
    chat = True

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.pieces: list[bytes] = []
        self.exact = True
        """Every entry so far had valid `bytes`: the text is rebuilt from them."""
        self.malformed = 0
        self.usage: dict[str, Any] | None = None

    def add_chunk(self, chunk: dict[str, Any]) -> None:
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choice = _first_choice(chunk)
        if choice is not None:
            self._add(choice.get("logprobs"))

    add_body = add_chunk

    def _add(self, logprobs: Any) -> None:
        if logprobs is None:
            return
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        if content is None and isinstance(logprobs, dict):
            return  # `{"content": null}`: a step without tokens
        if not isinstance(content, list):
            self.malformed += 1
            return
        for entry in content:
            token = entry.get("token") if isinstance(entry, dict) else None
            if not isinstance(token, str):
                self.malformed += 1
                continue
            self.tokens.append(token)
            if self.exact:
                self._add_bytes(entry.get("bytes"))

    def _add_bytes(self, piece: Any) -> None:
        # null (vLLM, for a token without text) or not a list of bytes: the token strings are all there is.
        # Only a list is converted: bytes(n) of an integer n would allocate n zero bytes.
        if not isinstance(piece, list):
            self.exact = False
            return
        try:
            self.pieces.append(bytes(piece))
        except (TypeError, ValueError):
            self.exact = False

    def problem(self) -> str | None:
        """Missing logprobs are a gap in the raw text, not a failed turn."""
        return None

    def result(self, message: dict[str, Any] | None) -> RawText:
        """The rebuilt text; incomplete when tokens are missing, malformed, or the tool-call markup is absent."""
        if self.exact:
            text = b"".join(self.pieces).decode("utf-8", errors="replace")
        else:
            text = "".join(self.tokens)
        gap = None
        expected = _usage_int(self.usage, "completion_tokens")
        if self.malformed:
            gap = f"{self.malformed} malformed logprob entr{'y' if self.malformed == 1 else 'ies'}"
        elif not self.tokens:
            gap = "no logprobs in the response"
        elif expected is not None and len(self.tokens) < expected:
            gap = f"logprobs for {len(self.tokens)} of {expected} generated tokens"
        elif isinstance(message, dict) and message.get("tool_calls") and SENTINEL not in text:
            gap = "tool calls without their markup in the logprob tokens"
        return RawText(self.source, text, gap is None, gap)


class _TextEndpoint:
    """A raw-text endpoint's answer: the text, its finish reason and usage; no message (`chat` is False)."""

    source: RawSource
    chat = False

    def __init__(self) -> None:
        self.text = ""
        self.seen = False
        """Some event or body carried a text field."""
        self.malformed = 0
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.request_id: str | None = None

    def problem(self) -> str | None:
        """Without any text the endpoint did not answer: the turn fails as malformed output."""
        return None if self.seen else f"malformed response: no generated text from the {self.source} endpoint"

    def result(self, message: dict[str, Any] | None = None) -> RawText:
        gap = f"{self.malformed} malformed event(s)" if self.malformed else None
        return RawText(self.source, self.text, gap is None, gap)


class CompletionText(_TextEndpoint):
    """OpenAI `/v1/completions`: `choices[0].text` deltas (streamed) or the whole text (body)."""

    source: RawSource = "completions"

    def add_chunk(self, chunk: dict[str, Any]) -> None:
        if self.request_id is None and isinstance(chunk.get("id"), str):
            self.request_id = chunk["id"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choice = _first_choice(chunk)
        if choice is None:
            if chunk.get("choices") not in (None, []):
                self.malformed += 1
            return
        text = choice.get("text")
        if isinstance(text, str):
            self.text += text
            self.seen = True
        elif text is not None:
            self.malformed += 1
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]

    add_body = add_chunk


class GenerateText(_TextEndpoint):
    """SGLang `/generate`: `text` cumulative (default) or incremental, `meta_info` with finish reason and counts."""

    source: RawSource = "generate"

    def add_chunk(self, chunk: dict[str, Any]) -> None:
        text = chunk.get("text")
        if isinstance(text, str):
            # Cumulative output repeats what came before; an incremental delta does not.
            self.text = text if text.startswith(self.text) else self.text + text
            self.seen = True
        elif text is not None:
            self.malformed += 1
        meta = chunk.get("meta_info")
        if not isinstance(meta, dict):
            return
        if self.request_id is None and isinstance(meta.get("id"), str):
            self.request_id = meta["id"]
        finish = meta.get("finish_reason")
        kind = finish.get("type") if isinstance(finish, dict) else finish
        if isinstance(kind, str):
            self.finish_reason = kind
        counts = {key: _usage_int(meta, key) for key in ("prompt_tokens", "completion_tokens")}
        if any(value is not None for value in counts.values()):
            usage: dict[str, Any] = {key: value for key, value in counts.items() if value is not None}
            cached = _usage_int(meta, "cached_tokens")
            if cached is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            self.usage = usage

    add_body = add_chunk


RawCollector = LogprobText | CompletionText | GenerateText


def collector(source: RawSource) -> RawCollector:
    """A fresh collector for one turn's response from `source`."""
    return {"logprobs": LogprobText, "completions": CompletionText, "generate": GenerateText}[source]()
