"""CPU time of the client's SSE reader against the size of one event: is it linear?

One streamed chat-completion event of SIZE bytes (a content delta; a runaway reply or a hostile
server can send megabytes without a newline) is fed to `repro.wire.client._SSEReader` in 16 KiB pieces,
as the network hands it over, then a `[DONE]`. "before" is the reader as it was until issue 11:
every piece appended to the buffer and the whole buffer re-split on newlines, so an event of n
pieces cost O(n²). "after" is the current reader, which searches only the new piece.

Usage: `python benchmarks/bench_sse_reader.py [--sizes 1,4,16,40] [--skip-before-above 16]`
(sizes in MB). Prints CPU seconds per size and the after/before ratios; linear means the "after"
seconds per MB stay flat as the size grows.
"""

from __future__ import annotations

import argparse
import time

from repro.wire.client import _Clock, _SSEReader

PIECE = 16 * 1024
MB = 1024 * 1024


class _ResplitReader(_SSEReader):
    """The reader before issue 11: the whole buffer re-split on every piece (kept here only to compare)."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__(clock)
        self.buffer = b""  # type: ignore[assignment]

    def feed(self, data: bytes) -> None:
        self.buffer += data  # type: ignore[operator]
        *lines, self.buffer = self.buffer.split(b"\n")  # type: ignore[assignment]
        for line in lines:
            self._line(line.rstrip(b"\r"))


def event(size: int) -> bytes:
    head = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"'
    tail = b'"},"finish_reason":"stop"}]}\n\n'
    return head + b"x" * (size - len(head) - len(tail)) + tail + b"data: [DONE]\n\n"


def cpu_seconds(reader_type: type[_SSEReader], body: bytes) -> float:
    reader = reader_type(_Clock())
    pieces = [body[i : i + PIECE] for i in range(0, len(body), PIECE)]
    start = time.process_time()
    for piece in pieces:
        reader.feed(piece)
    reader.finish()
    elapsed = time.process_time() - start
    assert reader.done and reader.accumulator.finish_reason == "stop"
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16,40", help="Event sizes in MB, comma-separated.")
    parser.add_argument("--skip-before-above", type=float, default=16.0,
                        help="Do not time the quadratic reader above this size in MB (it takes minutes).")
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    print(f"one event fed in {PIECE // 1024} KiB pieces; CPU seconds")
    print(f"{'event MB':>9} {'before s':>10} {'after s':>9} {'after s/MB':>11} {'before/after':>13}")
    for size_mb in sizes:
        body = event(int(size_mb * MB))
        after = cpu_seconds(_SSEReader, body)
        before = cpu_seconds(_ResplitReader, body) if size_mb <= args.skip_before_above else None
        ratio = f"{before / after:13.0f}" if before is not None and after > 0 else f"{'—':>13}"
        shown = f"{before:10.3f}" if before is not None else f"{'skipped':>10}"
        print(f"{size_mb:9g} {shown} {after:9.3f} {after / size_mb:11.4f} {ratio}")


if __name__ == "__main__":
    main()
