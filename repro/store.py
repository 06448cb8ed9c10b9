"""The run directory on disk: create it, append sessions as they end, keep raw bytes, read it back.

Layout (design.md): manifest.json, sessions.jsonl, summary.json, raw/, metrics.csv, report.html.
Writers flush and fsync each session line so a crash (even SIGKILL) loses nothing that finished;
JSON files are replaced atomically so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from repro.errors import UsageError
from repro.records import Manifest, SessionRecord, Summary

MANIFEST = "manifest.json"
SESSIONS = "sessions.jsonl"
SUMMARY = "summary.json"
RAW = "raw"
METRICS = "metrics.csv"
REPORT = "report.html"

ModelT = TypeVar("ModelT", bound=BaseModel)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def check_new_run_dir(path: Path) -> None:
    """A run never writes into a used directory: UsageError unless `path` is absent or an empty directory."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UsageError(f"--out {path}: exists and is not an empty directory; choose a new path")


class RunWriter:
    """Writes one run directory. Not thread-safe: use it from one event loop."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        check_new_run_dir(self.path)
        (self.path / RAW).mkdir(parents=True, exist_ok=True)
        self._sessions = open(self.path / SESSIONS, "a", encoding="utf-8")

    def write_manifest(self, manifest: Manifest) -> None:
        _atomic_write(self.path / MANIFEST, manifest.model_dump_json(indent=2) + "\n")

    def append_session(self, record: SessionRecord) -> None:
        self._sessions.write(record.model_dump_json() + "\n")
        self._sessions.flush()
        os.fsync(self._sessions.fileno())

    def write_raw(self, session_id: int, turn: int, data: bytes, *, suffix: str = "sse") -> str:
        """Keep a turn's exact response bytes; returns the path relative to the run directory."""
        rel = f"{RAW}/s{session_id:04d}-t{turn:02d}.{suffix}"
        target = self.path / rel
        with open(target, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return rel

    def write_summary(self, summary: Summary) -> None:
        _atomic_write(self.path / SUMMARY, summary.model_dump_json(indent=2) + "\n")

    def close(self) -> None:
        self._sessions.close()


@dataclass(frozen=True)
class Run:
    """A run directory read back."""

    path: Path
    manifest: Manifest
    sessions: list[SessionRecord]
    summary: Summary | None
    """None when the run never finished (crashed before writing it)."""

    @property
    def name(self) -> str:
        return self.manifest.name


def read_sessions(path: Path) -> list[SessionRecord]:
    """Every complete line of sessions.jsonl; a torn last line (crash mid-write) is skipped."""
    file = Path(path) / SESSIONS
    if not file.exists():
        return []
    records: list[SessionRecord] = []
    text = file.read_text(encoding="utf-8")
    lines = text.split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(SessionRecord.model_validate_json(line))
        except ValidationError as err:
            # Every line is written whole with its newline; only a crash can leave an unterminated tail.
            if number == len(lines) and not text.endswith("\n"):
                continue
            raise UsageError(f"{file}:{number}: not a session record: {err.errors()[0]['msg']}") from None
    return records


def load_run(path: Path | str) -> Run:
    """Read a run directory; a UsageError names what is missing or malformed."""
    root = Path(path)
    if not root.is_dir():
        raise UsageError(f"{root}: not a run directory (no such directory)")
    manifest_file = root / MANIFEST
    if not manifest_file.exists():
        raise UsageError(f"{root}: not a run directory (no {MANIFEST})")
    manifest = _read_model(manifest_file, Manifest)
    summary_file = root / SUMMARY
    summary = _read_model(summary_file, Summary) if summary_file.exists() else None
    return Run(path=root, manifest=manifest, sessions=read_sessions(root), summary=summary)


def _read_model(file: Path, model: type[ModelT]) -> ModelT:
    try:
        return model.model_validate_json(file.read_text(encoding="utf-8"))
    except ValidationError as err:
        raise UsageError(f"{file}: {err.errors()[0]['loc']}: {err.errors()[0]['msg']}") from None


def slug(text: str) -> str:
    """A file-name-safe form of a run or cell name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"


def dump_json(path: Path, data: object) -> None:
    """Atomically write plain JSON (for files outside the run directory's models, e.g. matrix.json)."""
    _atomic_write(Path(path), json.dumps(data, indent=2, sort_keys=False) + "\n")
