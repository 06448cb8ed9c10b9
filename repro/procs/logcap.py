"""Write a launched server's output to its log with a size cap: the first half of the cap stays in the
log (the start-up, where flags and errors show), the latest output rotates through two tail files.

`python -m repro.procs.logcap PATH MAX_BYTES` copies its stdin (the server's stdout and stderr) until
end-of-file, that is until every process holding the pipe has ended. A server printing 130 MB/s
(seen: 1.9 GB in 15 s) therefore leaves at most MAX_BYTES on disk: PATH holds the first MAX_BYTES/2
and a note saying it was capped, `PATH.tail.1` and `PATH.tail` the latest output, MAX_BYTES/4 each.
A separate process, so copying never competes with the harness's event loop for the interpreter.

Standard library only; it ignores SIGINT and SIGTERM, which are meant for the server: it ends when the
server's output does, so nothing the server says while shutting down is lost.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

CHUNK = 1 << 16
DEFAULT_MAX_BYTES = 200_000_000
"""The cap of every log the harness writes for a process it starts, unless the caller (a matrix spec's
`log_max_bytes`) sets another."""


def tail_paths(path: Path) -> tuple[Path, Path]:
    """The older and the newer tail file of a capped log."""
    return path.with_name(path.name + ".tail.1"), path.with_name(path.name + ".tail")


def is_capped(path: Path) -> bool:
    return tail_paths(Path(path))[1].exists()


def copy_capped(source: int, path: Path, max_bytes: int) -> int:
    """Copy `source` (a file descriptor) to `path` under the cap; returns how many bytes were dropped.

    A failing write (a full disk) drops output but keeps reading: the server must not die of a
    broken pipe because its log could not be written.
    """
    head_left = max_bytes // 2
    tail_size = max(1, max_bytes // 4)
    older, newer = tail_paths(path)
    dropped = 0
    tail_fd = -1
    written = 0
    with open(path, "ab") as head:
        while chunk := os.read(source, CHUNK):
            try:
                if head_left > 0:
                    part, chunk = chunk[:head_left], chunk[head_left:]
                    head.write(part)
                    head.flush()
                    head_left -= len(part)
                    if head_left == 0:
                        head.write(
                            f"\n[repro: this log is capped at {max_bytes} bytes: the first {max_bytes // 2} are "
                            f"above, the latest output is in {older.name} and {newer.name}]\n".encode()
                        )
                        head.flush()
                        tail_fd = os.open(newer, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                while chunk:
                    if written >= tail_size:
                        if older.exists():
                            dropped += older.stat().st_size
                        os.close(tail_fd)
                        os.replace(newer, older)
                        tail_fd = os.open(newer, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                        written = 0
                    n = os.write(tail_fd, chunk[: tail_size - written])
                    written += n
                    chunk = chunk[n:]
            except OSError:
                dropped += len(chunk)
        if tail_fd >= 0:
            os.close(tail_fd)
            note = f"[repro: the output ended; {dropped} bytes between the head and the tail were dropped]\n"
            head.write(note.encode())
    return dropped


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    copy_capped(sys.stdin.fileno(), Path(sys.argv[1]), int(sys.argv[2]))


if __name__ == "__main__":
    main()
