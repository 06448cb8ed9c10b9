"""Replay of one recorded conversation (repro.workload.trace): the session that `repro run --workload X.jsonl` runs.

At each recorded assistant turn the recorded history up to it is sent and the model's answer is judged
like any agentic turn. The recorded assistant message and tool results, not the new answer, continue the
history: the server sees exactly the production prompts and their shared prefixes (what engages prefix
caching and HiCache), even where the model now answers differently, and no tool is executed.

Outcomes follow repro.run.session: corrupt as soon as one answer is judged corrupt, error or timeout when a
request fails (the replay stops there), clean once every recorded turn (up to `--turns`) was answered.
With `--replay timing` the k-th request leaves t_k - t_1 after the first one, t being the recorded
assistant messages' timestamps, or as soon as the previous answer is in when that is later.
"""

from __future__ import annotations

from typing import Any

import anyio

from repro.run.session import Session
from repro.store.records import SessionRecord
from repro.workload.trace import Conversation, Trace


class ReplaySession(Session):
    """A session whose requests are a recorded conversation's, turn by turn."""

    def __init__(self, session_id: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(session_id, *args, **kwargs)
        trace = self.config.workload
        assert isinstance(trace, Trace)
        self.trace = trace
        self.conversation: Conversation = trace.conversation(session_id)
        self.task = str(self.conversation.id)

    @property
    def _tools(self) -> list[dict[str, Any]]:
        return self.conversation.tools

    @property
    def _tool_choice(self) -> Any:
        return self.conversation.tool_choice

    def _payload(self) -> dict[str, Any]:
        return self.config.payload(self.messages, self.session_id)

    async def run(self) -> SessionRecord:
        config = self.config
        conversation = self.conversation
        positions = conversation.turn_positions()[: config.turns]
        first = conversation.messages[positions[0]].seconds()
        for index, position in enumerate(positions):
            if self.trace.timing and index and first is not None:
                recorded = conversation.messages[position].seconds()
                assert recorded is not None  # load_trace(timing=True) checked every assistant message
                wait = self.start_s + (recorded - first) - self._now()
                if wait > 0:
                    await anyio.sleep(min(wait, max(self._left(), 0.0)))
            remaining = self._left()
            if remaining <= 0:
                self.failure, self.error = "timeout", f"session budget of {config.timeout:g}s used up"
                break
            self.messages = [message.sent() for message in conversation.messages[:position]]
            if await self._exchange(index, min(config.turn_timeout, remaining)) is None:
                break
        else:
            self.finished = len(positions) == len(conversation.turn_positions())
        return self._record(None)
