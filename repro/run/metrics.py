"""Scrape the target's Prometheus `/metrics` every few seconds into the run directory's metrics.csv.

Long format, one row per sample: elapsed_s, metric, labels (JSON), value. Parsing is
prometheus_client's; a target without `/metrics` (or one that serves garbage) is simply not
scraped, never an error of the run.
"""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from repro.store.rundir import append_whole

if TYPE_CHECKING:
    import httpx  # imported where used: see repro.procs.process

HEADER = ("elapsed_s", "metric", "labels", "value")
SCRAPE_TIMEOUT_S = 5.0
SCRAPE_BYTES = 16 * 1024 * 1024
"""Most bytes read of one scrape (SGLang's are ~100 KB): an endless /metrics must not hang or fill the run."""


def server_root(base_url: str) -> str:
    """The server's root URL (where SGLang serves /metrics and /server_info) from an OpenAI base URL."""
    root = base_url.rstrip("/")
    return root.removesuffix("/v1")


def metrics_url(base_url: str) -> str:
    return server_root(base_url) + "/metrics"


def parse_samples(text: str) -> list[tuple[str, str, float]]:
    """(sample name, labels as sorted JSON, value) for every sample of a Prometheus text exposition."""
    # Imported here: a target without /metrics (or a run that never scrapes) need not load prometheus_client.
    from prometheus_client.parser import text_string_to_metric_families

    rows = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            rows.append((sample.name, json.dumps(dict(sorted(sample.labels.items()))), float(sample.value)))
    return rows


class MetricsScraper:
    """Appends a scrape to metrics.csv every `interval` seconds while `run()` is awaited."""

    def __init__(self, client: httpx.AsyncClient, url: str, path: Path, *, interval: float = 2.0) -> None:
        self.client = client
        self.url = url
        self.path = Path(path)
        self.interval = interval
        self.error: OSError | None = None
        """Why metrics.csv could not be written (a full disk): scraping stops, the run goes on."""

    async def scrape_once(self, origin: float) -> bool:
        import httpx

        try:
            body = bytearray()
            with anyio.fail_after(SCRAPE_TIMEOUT_S):
                async with self.client.stream("GET", self.url, timeout=SCRAPE_TIMEOUT_S) as response:
                    if response.status_code != 200:
                        return False
                    async for piece in response.aiter_bytes():
                        body += piece
                        if len(body) > SCRAPE_BYTES:
                            return False
            rows = parse_samples(body.decode("utf-8", errors="replace"))
        except (httpx.HTTPError, ValueError, TimeoutError):
            return False
        elapsed = round(time.perf_counter() - origin, 3)
        block = io.StringIO(newline="")
        writer = csv.writer(block)
        if not self.path.exists():
            writer.writerow(HEADER)
        writer.writerows((elapsed, name, labels, value) for name, labels, value in rows)
        try:
            append_whole(self.path, block.getvalue().encode("utf-8"))
        except OSError as err:
            self.error = err
            return False
        return True

    async def follow(self, origin: float) -> None:
        """Scrape every `interval` until cancelled or a write fails; the caller took the first scrape
        (before the load, so that counters are read as what the load added to them)."""
        while self.error is None:
            await anyio.sleep(self.interval)
            await self.scrape_once(origin)
