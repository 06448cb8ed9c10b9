"""`judge_turn()`: the three verdicts of a turn whose raw text is known, and what the server's parser did to it.

- `parsed`: the message alone, what an agent saw (`check` without the raw text's rules);
- `raw`: the text the model generated, against DeepSeek's grammar (`check_raw`);
- `lost`: what the parse lost of that text (`check`'s rules that need it: `CROSS_RULES`), parser damage
  that no agent sees in the message.

The turn is as bad as the worst of them. The parser **hid** damage when the raw text is corrupt and the
message is not; it **made** damage when the raw text is clean and the message or the parse is corrupt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsml_checker.check import check
from dsml_checker.findings import Label, Verdict
from dsml_checker.raw import check_raw

CROSS_RULES = frozenset({"call-lost", "param-lost", "value-cut"})
"""`check`'s rules that compare the parsed message with the raw text (they run only with `raw=`)."""

_RANK = {"clean": 0, "suspect": 1, "corrupt": 2}


@dataclass(frozen=True)
class TurnVerdicts:
    parsed: Verdict
    raw: Verdict
    lost: Verdict

    @property
    def label(self) -> Label:
        """The worst of the three."""
        return max(self.parsed.label, self.raw.label, self.lost.label, key=_RANK.__getitem__)

    @property
    def hid(self) -> bool:
        """The raw text is corrupt and the message looks clean: an agent saw nothing wrong."""
        return self.raw.label == "corrupt" and self.parsed.label != "corrupt"

    @property
    def made(self) -> bool:
        """The raw text is clean and the parser's side is corrupt: a parser bug."""
        return self.raw.label != "corrupt" and "corrupt" in (self.parsed.label, self.lost.label)


def judge_turn(
    message: Any,
    raw: str,
    *,
    finish_reason: str | None = None,
    tools: Any = None,
    tool_choice: Any = None,
    fmt: str = "v4",
    thinking: bool | None = None,
) -> TurnVerdicts:
    """The three verdicts of one turn (module docstring); any message or text is judged, never raised on
    (ValueError only for an unknown `fmt`). `thinking` is the request's thinking mode (None: unknown)."""
    seen = check(message, finish_reason=finish_reason, tools=tools, tool_choice=tool_choice, raw=raw)
    parsed = Verdict.of(tuple(f for f in seen.findings if f.rule not in CROSS_RULES))
    lost = Verdict.of(tuple(f for f in seen.findings if f.rule in CROSS_RULES))
    return TurnVerdicts(
        parsed, check_raw(raw, tools=tools, tool_choice=tool_choice, finish_reason=finish_reason, fmt=fmt,
                          thinking=thinking), lost
    )
