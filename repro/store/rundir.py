"""The run directory on disk: create it, append sessions as they end, keep raw bytes, read it back.

Layout (docs/run-directory.md): manifest.json, sessions.jsonl, summary.json, raw/, metrics.csv, report.html.
Writers write each session line as it ends, so a crash (even SIGKILL) loses nothing that finished, and
fsync it: on an event loop once for all the lines of one pass of the loop (group commit: thousands of
sessions ending within seconds would otherwise wait for thousands of fsyncs one after another); JSON files are replaced atomically so a reader never sees half a file. When the disk fills up, a
write that fails is undone (no torn line, no half raw file), and the space kept in reserve since
the start is given back so the records of the sessions in flight and the summary still fit.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from pydantic import BaseModel, ValidationError

from repro.errors import UsageError
from repro.store.records import Manifest, SessionRecord, Summary

MANIFEST = "manifest.json"
SESSIONS = "sessions.jsonl"
SUMMARY = "summary.json"
RAW = "raw"
METRICS = "metrics.csv"
REPORT = "report.html"
RECORDS = (MANIFEST, SESSIONS, SUMMARY, METRICS)
"""The files a run's outputs (reports, JUnit) must never overwrite; raw/ is protected as well."""
RESERVE = ".space-reserve"
RESERVE_BYTES = 1 << 20
"""Freed when the disk fills, for the in-flight sessions' records and summary.json."""
REDACTED = b"[REDACTED]"
"""What a secret echoed by the server becomes in every file written (raw bytes included)."""

ModelT = TypeVar("ModelT", bound=BaseModel)


class DamagedRun(UsageError):
    """A run directory whose files cannot be read back: unreadable, not UTF-8, not records."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _append(fd: int, data: bytes, *, sync: bool = True) -> int:
    """Append `data` whole or not at all, fsynced unless `sync` is False; the offset it starts at."""
    end = os.lseek(fd, 0, os.SEEK_END)
    try:
        _write_all(fd, data)
        if sync:
            os.fsync(fd)
    except OSError:
        os.ftruncate(fd, end)  # never leave a torn line behind
        raise
    return end


def append_whole(path: Path, data: bytes) -> None:
    """Append `data` to a file whole or not at all (a failed write is cut back off)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        _append(fd, data)
    finally:
        os.close(fd)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _cannot(path: Path, err: OSError, doing: str) -> UsageError:
    return UsageError(f"--out {path}: cannot {doing}: {err.strerror or err}")


def check_new_run_dir(path: Path) -> None:
    """A run never writes into a used directory: UsageError unless `path` is absent or an empty directory."""
    try:
        used = not stat.S_ISDIR(os.stat(path).st_mode) or any(path.iterdir())
    except FileNotFoundError:
        return
    except OSError as err:  # a symlink loop, a file in the way, no permission
        raise _cannot(path, err, "use it as a run directory") from None
    if used:
        raise UsageError(f"--out {path}: exists and is not an empty directory; choose a new path")


def make_run_dir(path: Path) -> bool:
    """Create the run directory (and its parents), or take an existing empty one; True if created here."""
    check_new_run_dir(path)
    try:
        path.mkdir(parents=True)
        return True
    except FileExistsError:
        check_new_run_dir(path)  # a directory that appeared in between must still be empty
        if not path.is_dir():  # a dangling symlink
            raise UsageError(f"--out {path}: exists and is not a directory; choose a new path") from None
        return False
    except OSError as err:
        raise _cannot(path, err, "create the run directory") from None


def new_run_dir(parent: Path, stem: str) -> Path:
    """Create `parent/stem`, or `stem-2`, `stem-3`…: the first this process made itself. mkdir is atomic,
    so two runs started in the same second never share a directory."""
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _cannot(parent, err, "create the reports directory") from None
    suffix = 1
    while True:
        path = parent / (stem if suffix == 1 else f"{stem}-{suffix}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            suffix += 1
        except OSError as err:
            raise _cannot(path, err, "create the run directory") from None


def raw_name(session_id: int, turn: int, suffix: str = "sse") -> str:
    """Where a kept response goes, relative to the run directory (also named by `--workers` processes)."""
    return f"{RAW}/s{session_id:04d}-t{turn:02d}.{suffix}"


class RunWriter:
    """Writes one run directory. Not thread-safe: use it from one event loop.

    `full` is the first write that failed (the disk is full, a quota or file-size limit): the caller
    should stop the run; `lost` counts the session records that could not be written even then.
    """

    def __init__(self, path: Path, *, reserve_bytes: int = RESERVE_BYTES, secrets: Sequence[str] = ()) -> None:
        self.path = Path(path)
        self.full: OSError | None = None
        self.lost = 0
        self._unsynced: list[bytes] = []
        """Session lines written since the last fsync (all of them after `_unsynced_from` in the file)."""
        self._unsynced_from = 0
        # A server may echo the key back ("invalid key sk-…"): it is cut out of everything written here.
        self._secrets = [form for secret in secrets if secret
                         for form in {secret.encode(), json.dumps(secret)[1:-1].encode()}]
        check_new_run_dir(self.path)
        try:
            (self.path / RAW).mkdir(parents=True, exist_ok=True)
            # O_EXCL: of two runs given the same --out at once, only one gets the directory.
            self._fd = os.open(self.path / SESSIONS, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        except FileExistsError:
            raise UsageError(f"--out {self.path}: another run is writing there; choose a new path") from None
        except OSError as err:
            raise _cannot(self.path, err, "write the run directory") from None
        try:
            if reserve_bytes:
                with open(self.path / RESERVE, "wb") as fh:
                    _write_all(fh.fileno(), bytes(reserve_bytes))
                    os.fsync(fh.fileno())
        except OSError as err:
            self.discard()
            raise _cannot(self.path, err, f"keep {reserve_bytes} bytes free for the summary") from None

    def _scrub(self, data: bytes) -> bytes:
        for secret in self._secrets:
            data = data.replace(secret, REDACTED)
        return data

    def scrub_text(self, text: str) -> str:
        """`text` with the run's secrets cut out, for what is shown rather than written."""
        return self._scrub(text.encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape")

    def _failed(self, err: OSError) -> None:
        """The first failed write: remember it, and give the reserve back for what must still be saved."""
        if self.full is None:
            self.full = err
        (self.path / RESERVE).unlink(missing_ok=True)

    def _retry(self, write: Callable[[], None]) -> None:
        try:
            write()
        except OSError as err:
            self._failed(err)
            write()

    def write_manifest(self, manifest: Manifest) -> None:
        text = self._scrub(manifest.model_dump_json(indent=2).encode()).decode() + "\n"
        self._retry(lambda: _atomic_write(self.path / MANIFEST, text))

    def append_session(self, record: SessionRecord) -> bool:
        """Append one line, whole or not at all; False when it could not be written (counted in `lost`).

        On a running event loop the line is written now and fsynced with the others of the same loop
        pass, by a callback run right after it (`sync`); elsewhere it is fsynced before this returns.
        """
        data = self._scrub(record.model_dump_json().encode("utf-8")) + b"\n"
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return self._append_synced(data)
        try:
            start = _append(self._fd, data, sync=False)
        except OSError:
            return self._append_synced(data)  # gives the reserve back, retries, counts the loss
        if not self._unsynced:
            self._unsynced_from = start
            loop.call_soon(self.sync)
        self._unsynced.append(data)
        return True

    def _append_synced(self, data: bytes) -> bool:
        try:
            self._retry(lambda: _append(self._fd, data))
        except OSError:
            self.lost += 1
            return False
        return True

    def sync(self) -> None:
        """fsync the session lines written since the last one; when that fails, they are cut off and appended
        again one by one, as a failed write is (so a line counts as written only once it was synced)."""
        lines, self._unsynced = self._unsynced, []
        if not lines or self._fd < 0:
            return
        try:
            os.fsync(self._fd)
        except OSError:
            os.ftruncate(self._fd, self._unsynced_from)
            for data in lines:
                self._append_synced(data)

    def write_raw(self, session_id: int, turn: int, data: bytes, *, suffix: str = "sse") -> str | None:
        """Keep a turn's exact response bytes; returns the path relative to the run directory, or None
        when they could not be written (the disk is full: the run is being stopped)."""
        rel = raw_name(session_id, turn, suffix)
        target = self.path / rel
        try:
            with open(target, "wb") as fh:
                _write_all(fh.fileno(), self._scrub(data))
                os.fsync(fh.fileno())
        except OSError as err:
            target.unlink(missing_ok=True)
            self._failed(err)
            return None
        return rel

    def write_summary(self, summary: Summary) -> None:
        self.sync()
        text = self._scrub(summary.model_dump_json(indent=2).encode()).decode() + "\n"
        self._retry(lambda: _atomic_write(self.path / SUMMARY, text))

    def close(self) -> None:
        if self._fd >= 0:
            self.sync()
            os.close(self._fd)
            self._fd = -1
        (self.path / RESERVE).unlink(missing_ok=True)

    def discard(self) -> None:
        """Undo a run that never started (no manifest yet): remove what this writer made, so the same
        --out can be used again."""
        self.close()
        for name in (RESERVE, SESSIONS):
            (self.path / name).unlink(missing_ok=True)
        (self.path / RAW).rmdir()


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


def read_regular(file: Path) -> bytes:
    """The bytes of a record file; DamagedRun when it is not a regular file (a link to /dev/zero, a FIFO),
    which would never end or never answer. OSError when it cannot be read."""
    mode = file.stat().st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # a directory fails the read below, and says so
        raise DamagedRun(f"{file}: not a regular file")
    return file.read_bytes()


def read_sessions(path: Path) -> list[SessionRecord]:
    """Every complete line of sessions.jsonl; a torn last line (crash mid-write) is skipped.

    Read as bytes: a tail torn inside a multi-byte character, or left as garbage by a crash, is still
    just a torn tail. DamagedRun names any other line that is not a session record.
    """
    file = Path(path) / SESSIONS
    if not file.exists():
        return []
    try:
        data = read_regular(file)
    except OSError as err:
        raise DamagedRun(f"{file}: cannot read: {err.strerror or err}") from None
    lines = data.split(b"\n")
    records: list[SessionRecord] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(SessionRecord.model_validate_json(line.decode("utf-8")))
        except (ValidationError, UnicodeDecodeError) as err:
            # Every line is written whole with its newline; only a crash can leave an unterminated tail.
            if number == len(lines):
                continue
            why = err.errors()[0]["msg"] if isinstance(err, ValidationError) else "not UTF-8 text"
            raise DamagedRun(f"{file}:{number}: not a session record: {why}") from None
    return records


def load_run(path: Path | str) -> Run:
    """Read a run directory: UsageError when it is not one, DamagedRun when its files are damaged."""
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
        return model.model_validate_json(read_regular(file).decode("utf-8"))
    except OSError as err:
        raise DamagedRun(f"{file}: cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise DamagedRun(f"{file}: not UTF-8 text") from None
    except ValidationError as err:
        raise DamagedRun(f"{file}: {err.errors()[0]['loc']}: {err.errors()[0]['msg']}") from None


RECORD_DIRS: dict[tuple[str, ...], str] = {
    (MANIFEST, SESSIONS): "run",
    ("plan.json", "spec.yaml"): "matrix",
    ("setup.json",): "bisect",
    ("sweep.json",): "sweep",
}
"""The files that make a directory one the harness recorded, and what it records."""
DERIVED = frozenset({REPORT, "report.md", "junit.xml", "sweep.md", "sweep.html", "bisect.md"})
"""Files of a record directory that are rendered from its records, so may be written again."""


def record_kind(directory: Path) -> str | None:
    """What `directory` records ("run", "matrix", "bisect", "sweep"), or None when it is no record directory."""
    for markers, kind in RECORD_DIRS.items():
        if all((directory / name).exists() for name in markers):
            return kind
    return None


def check_output(output: Path, sources: list[Path], option: str) -> None:
    """The one guard of every command that writes a file: refuse `output` when writing it would destroy
    evidence. That is a record of a run (or raw bytes) among `sources`, an input file among `sources`
    (itself, a symbolic or a hard link to it), any existing file of a record directory that is not a
    rendered report (sim.log, plan.json, setup.json, ...), or a file hard-linked to a top-level file of a
    source directory."""
    try:
        target = Path(output).resolve()
        existing = target.stat() if target.exists() else None
        for source in sources:
            root = Path(source).resolve()
            if root.is_file():
                if existing is not None and root.samefile(target):
                    raise UsageError(f"{option} {output}: would overwrite its input {source}; choose another path")
                continue
            record = target.parent == root and target.name in RECORDS
            if record or target == root or target.is_relative_to(root / RAW):
                raise UsageError(
                    f"{option} {output}: would overwrite the records of run {source}; choose another path"
                )
            if existing is not None and existing.st_nlink > 1 and root.is_dir():
                for file in root.iterdir():
                    if file.is_file() and file.samefile(target):
                        raise UsageError(f"{option} {output}: is a link to {file}, which it would overwrite; "
                                         "choose another path")
        kind = record_kind(target.parent)
        if kind is not None and existing is not None and target.name not in DERIVED:
            raise UsageError(f"{option} {output}: would overwrite a record of the {kind} directory {target.parent}; "
                             "choose another path")
    except (OSError, RuntimeError) as err:  # RuntimeError: a symlink loop, on Python 3.11
        why = getattr(err, "strerror", None) or err
        raise UsageError(f"{option} {output}: cannot resolve the path: {why}") from None


def dump_json(path: Path, data: object) -> None:
    """Atomically write plain JSON (for files outside the run directory's models, e.g. matrix.json)."""
    _atomic_write(Path(path), json.dumps(data, indent=2, sort_keys=False) + "\n")

