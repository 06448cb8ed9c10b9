"""A response's bytes as they arrive: in memory while small, past `SPOOL_AT` in an anonymous temporary file.

A streamed answer of tens of megabytes is needed whole only when its turn is kept (a verdict that is not
clean writes it to raw/); meanwhile its text, parsed from it, is what the client works on. Held in memory
too, the bytes were the largest copy of a big answer, so past the threshold they go to disk (the kernel's
page cache, not this process) and are read back only to be kept.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import tempfile
from typing import IO, Callable

SPOOL_AT = 4 * 1024 * 1024
"""Bytes kept in memory before the rest goes to a temporary file: ordinary turns never touch the disk."""


class Spooled:
    """The bytes of one big response, in an anonymous temporary file (gone when this object is)."""

    def __init__(self, head: bytes | bytearray) -> None:
        self.file: IO[bytes] = tempfile.TemporaryFile()
        self.file.write(head)
        self.size = len(head)

    def __len__(self) -> int:
        return self.size

    def append(self, data: bytes) -> None:
        self.file.write(data)
        self.size += len(data)

    def read(self) -> bytes:
        """The whole response (for keeping it: it is in memory only then)."""
        self.file.seek(0)
        data = self.file.read()
        self.file.seek(0, 2)
        return data

    def close(self) -> None:
        self.file.close()


def whole(raw: bytes | bytearray | Spooled) -> bytes | bytearray:
    """A response's bytes, read back from its spool file if it has one."""
    return raw.read() if isinstance(raw, Spooled) else raw


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018 (glibc's, or none of this applies)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()
_M_MMAP_THRESHOLD = -3
_MAPPED_FROM = 1 << 20


def map_big_blocks() -> None:
    """Blocks of a megabyte or more come straight from the system and go straight back when freed.

    glibc otherwise raises that threshold to the largest block freed so far (up to 32 MB), so after one
    big answer the checker's copies of the next one come from the heap, whose pages stay with the process.
    Set once per process; elsewhere than glibc this does nothing.
    """
    if _LIBC is not None:
        _LIBC.mallopt(_M_MMAP_THRESHOLD, _MAPPED_FROM)


def give_back() -> None:
    """Return the heap's free pages to the system, after a big answer's thousands of pieces were freed.

    The pieces (a few kilobytes each) come from the C heap, which keeps their pages once they are free;
    the answer's joined text and the checker's copies of it are then fresh pages on top. glibc's
    malloc_trim releases the free pages in place; elsewhere this does nothing.
    """
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
