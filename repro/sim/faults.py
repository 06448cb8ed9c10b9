"""The ground truth: every fault the simulator injected (JSON lines and in memory), and every PD wedge.

Each fault records what the model emitted (the operator, and `check_raw`'s verdict on the damaged text)
and what the server's parser made of it (`parser_effect`, `parsed_verdict`): the parser may repair the
damage away, drop or duplicate a call, cut its arguments, or let it through for the checker to see.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Literal

from repro.sim.parser import ParsedOutput

ParserEffect = Literal["visible", "absorbed", "dropped-call", "duplicated", "truncated", "altered"]
PARSER_EFFECTS: tuple[ParserEffect, ...] = ("visible", "absorbed", "dropped-call", "duplicated", "truncated", "altered")


@dataclass(frozen=True)
class FaultRecord:
    """One corrupted response: which request, which conversation, what was injected and why."""

    request_id: str
    conversation: str
    turn: int
    operator: str
    layer: int
    read_time_s: float
    copy_done_s: float
    load_back_tokens: int
    link_share: int
    index_k_dtype: str
    tool_parser: str = ""
    raw_verdict: str = ""
    """`dsml_checker.check_raw` on the damaged text the parser received: what the model emitted."""
    raw_rules: list[str] = field(default_factory=list)
    parsed_verdict: str = ""
    """`dsml_checker.check` on the message the parser made of it: what a client sees."""
    parser_effect: str = ""
    """One of PARSER_EFFECTS: see `parser_effect`."""


def parser_effect(meant: ParsedOutput, got: ParsedOutput, *, visible: bool) -> ParserEffect:
    """What the parser did with a fault, given its output for the undamaged text (`meant`).

    visible: the parsed verdict is corrupt. Otherwise: absorbed (identical output), dropped-call (fewer
    calls), duplicated (more), truncated (the same calls with other arguments), altered (the same calls,
    other reasoning or content).
    """
    if visible:
        return "visible"
    if got == meant:
        return "absorbed"
    if len(got.calls) != len(meant.calls):
        return "dropped-call" if len(got.calls) < len(meant.calls) else "duplicated"
    if got.calls != meant.calls or got.arguments != meant.arguments:
        return "truncated"
    return "altered"


@dataclass(frozen=True)
class WedgeRecord:
    """One PD request whose completion notice was lost: it will get no first token (served at /debug/wedges)."""

    request_id: str
    conversation: str
    turn: int
    state: str
    slot: int
    sim_time_s: float
    cause: str
    by_request_id: str
    in_flight: int


class FaultLog:
    """Appends each fault to the `--fault-log` file (flushed at once) and keeps it for `/debug/faults`."""

    def __init__(self, path: Path | None) -> None:
        self.records: list[FaultRecord] = []
        self._file: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")

    def add(self, record: FaultRecord) -> None:
        self.records.append(record)
        if self._file is not None:
            self._file.write(json.dumps(asdict(record)) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_fault_log(path: Path) -> list[FaultRecord]:
    """The records of a fault-log file, for tests and tools that compare verdicts with the truth."""
    with open(path, encoding="utf-8") as fh:
        return [FaultRecord(**json.loads(line)) for line in fh if line.strip()]
