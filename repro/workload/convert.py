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
from typing import Any, Iterator

from repro.errors import UsageError
from repro.jsonl import stream_lines
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


def _calls(log: Path) -> Iterator[_Call]:
    """The log's calls, one line at a time."""
    for number, text in stream_lines(log, f"trace convert {log}"):
        yield _read(text, str(log), number)


def _assistant_cuts(call: _Call, keys: list[str]) -> Iterator[tuple[int, str]]:
    """(position, key of the history up to it) of each assistant message inside the call's history."""
    for cut in range(1, len(call.history)):
        if call.history[cut].get("role") == "assistant":
            yield cut, keys[cut]


def convert(log: Path, out: Path) -> tuple[int, int]:
    """Write the conversations of `log` to `out` as a trace; (calls read, conversations written).

    Two passes over the log, one line at a time, so memory follows the conversations' count, not the log's
    size (each call repeats its whole history). The first validates every line and keys each call by its whole
    conversation (history plus answer) and the histories before its assistant messages; the second writes the
    calls that no other call continues. Nothing is left at `out` unless every line converted.
    """
    if log.exists() and not log.is_file():
        raise UsageError(f"trace convert {log}: not a regular file (the log is read twice: save a pipe's output "
                         "to a file first)")
    # A call continues another when the other's history plus answer is a prefix of its own history.
    # Each call's history is hashed once, prefix by prefix: linear in the log's size.
    finished: dict[str, tuple[int, float | str | None]] = {}
    """Whole-conversation key -> (line, time) of the last call that ended there."""
    referenced: set[str] = set()
    """Keys of the histories before an assistant message, in any call: the conversations some call continues."""
    calls = 0
    for call in _calls(log):
        calls += 1
        keys = _prefix_keys(call.whole)
        finished[keys[-1]] = (call.line, call.time)
        referenced.update(key for _, key in _assistant_cuts(call, keys))
    if not calls:
        raise UsageError(f"trace convert {log}: no request/response lines")
    continued = {finished[key][0] for key in referenced if key in finished}
    written = again = 0
    partial = out.with_name(f".{out.name}.partial")
    try:
        with open(partial, "w", encoding="utf-8") as fh:
            for number, text in stream_lines(log, f"trace convert {log}"):
                again += 1
                if number in continued:
                    continue  # most calls of an agent's log: skipped before parsing the line again
                call = _read(text, str(log), number)
                keys = _prefix_keys(call.whole)
                for cut, key in _assistant_cuts(call, keys):
                    # The parent's answer is this history's assistant message: give it the parent's time.
                    parent = finished.get(key)
                    if parent is not None and parent[1] is not None and call.history[cut].get("timestamp") is None:
                        call.history[cut]["timestamp"] = parent[1]
                fh.write(_rendered(call, log) + "\n")
                written += 1
        if again != calls:
            # A log still being written grows: the second pass must see the first's lines.
            raise UsageError(f"trace convert {log}: {calls} calls on the first reading, {again} on the second: "
                             "convert a regular file that is not being written to")
        partial.replace(out)
    except OSError as err:
        raise UsageError(f"trace convert -o {out}: cannot write: {err.strerror or err}") from None
    finally:
        partial.unlink(missing_ok=True)
    return calls, written


def _rendered(call: _Call, log: Path) -> str:
    """The trace line of a conversation that ends with `call`; a UsageError when it cannot be replayed."""
    conversation = {"id": f"log-line-{call.line}", "messages": call.whole}
    conversation |= {key: call.request[key] for key in REQUEST_KEYS if call.request.get(key) is not None}
    rendered = json.dumps(conversation, ensure_ascii=False)
    if scrub_surrogates(rendered) is not rendered:
        # A lone surrogate (the log escaped it) has no UTF-8 form: kept exactly, as its JSON escape.
        rendered = json.dumps(conversation)
    parse_line(rendered, source=f"{log} (converted)", line=call.line)  # what cannot be replayed is named now
    return rendered
