"""`repro trace convert`: rebuild conversations from an OpenAI request/response log into a trace file.

The log holds one JSON object per line with `request` (a chat-completions request body) and `response`
(the `chat.completion` it got), the pair an OpenAI-compatible gateway or client wrapper logs per call.
This shape is chosen because every such log can produce it and because it loses nothing: each request
carries the whole history, tool results included, so a conversation is exactly its last request plus
the answer, and the calls before it are its prefixes. Those earlier calls give the assistant messages
their timestamps (`response.created`, or the line's own `timestamp`), which `--replay timing` keeps.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.errors import UsageError, read_text
from repro.jsonl import numbered_lines
from repro.untrusted import scrub_surrogates
from repro.workload.trace import SENT_KEYS, json_object_line, parse_line

REQUEST_KEYS = ("tools", "tool_choice", "max_tokens", "temperature")
"""The request settings a trace line keeps beside the messages."""


@dataclass
class _Call:
    line: int
    request: dict[str, Any]
    answer: dict[str, Any]
    time: float | None
    history: list[dict[str, Any]]

    @property
    def whole(self) -> list[dict[str, Any]]:
        return [*self.history, self.answer]


def _prefix_keys(messages: list[dict[str, Any]]) -> list[str]:
    """The identity of every prefix of a conversation, in one pass: keys[i] names messages[: i + 1] as sent
    (timestamps aside). Chained, so a prefix's key costs its last message, not the whole prefix again."""
    digest = hashlib.sha256()
    keys = []
    for message in messages:
        sent = json.dumps({k: message[k] for k in SENT_KEYS if message.get(k) is not None}, sort_keys=True)
        # json.dumps escapes line breaks, so "\n" cannot occur inside one message's text.
        digest.update(sent.encode("utf-8", "surrogatepass") + b"\n")
        keys.append(digest.copy().hexdigest())
    return keys


def _read(line_text: str, source: str, line: int) -> _Call:
    where = f"{source}:{line}"
    entry = json_object_line(line_text, where, "expected an object with `request` and `response`")
    request, response = entry.get("request"), entry.get("response")
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        raise UsageError(f"{where}: request.messages: missing or not a list (expected the chat-completions request body)")
    choices = response.get("choices") if isinstance(response, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise UsageError(f"{where}: response.choices: missing or empty (expected the chat.completion object)")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise UsageError(f"{where}: response.choices.0.message: missing or not an object")
    stamp = entry.get("timestamp", response.get("created"))
    if stamp is not None and not isinstance(stamp, (int, float, str)):
        raise UsageError(f"{where}: timestamp: expected Unix seconds or ISO 8601")
    answer = {key: message[key] for key in SENT_KEYS if message.get(key) is not None} | {"role": "assistant"}
    if stamp is not None:
        answer["timestamp"] = stamp
    history = [dict(m) for m in request["messages"] if isinstance(m, dict)]
    if len(history) != len(request["messages"]):
        raise UsageError(f"{where}: request.messages: every message must be an object")
    return _Call(line, request, answer, stamp, history)


def convert(log: Path, out: Path) -> tuple[int, int]:
    """Write the conversations of `log` to `out` as a trace; (calls read, conversations written)."""
    text = read_text(log, f"trace convert {log}")
    calls = [_read(t, str(log), n) for n, t in numbered_lines(text)]
    if not calls:
        raise UsageError(f"trace convert {log}: no request/response lines")
    # A call continues another when the other's history plus answer is a prefix of its own history.
    # Each call's history is hashed once, prefix by prefix: linear in the log's size.
    finished = {_prefix_keys(call.whole)[-1]: call for call in calls}
    continued: set[int] = set()
    for call in calls:
        keys = _prefix_keys(call.history)
        for cut in range(1, len(call.history)):
            if call.history[cut].get("role") == "assistant":
                parent = finished.get(keys[cut])
                if parent is not None and parent is not call:
                    continued.add(id(parent))
                    # The parent's answer is this history's assistant message: give it the parent's time.
                    if parent.time is not None and call.history[cut].get("timestamp") is None:
                        call.history[cut]["timestamp"] = parent.time
    lines = []
    for call in calls:
        if id(call) in continued:
            continue
        conversation = {"id": f"log-line-{call.line}", "messages": call.whole}
        conversation |= {key: call.request[key] for key in REQUEST_KEYS if call.request.get(key) is not None}
        rendered = json.dumps(conversation, ensure_ascii=False)
        if scrub_surrogates(rendered) is not rendered:
            # A lone surrogate (the log escaped it) has no UTF-8 form: kept exactly, as its JSON escape.
            rendered = json.dumps(conversation)
        parse_line(rendered, source=f"{log} (converted)", line=call.line)  # what cannot be replayed is named now
        lines.append(rendered)
    try:
        out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    except OSError as err:
        raise UsageError(f"trace convert -o {out}: cannot write: {err.strerror or err}") from None
    return len(calls), len(lines)
