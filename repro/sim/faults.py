"""The ground truth: every fault the simulator injected (JSON lines and in memory), and every PD wedge."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO


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
