"""Names on disk: a file-name-safe slug, and where a command's output lands by default.

Standard library only, so the CLI can name a default directory without loading the run's models.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path


def slug(text: str) -> str:
    """A file-name-safe form of a run or cell name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"


def default_dir(*words: str) -> Path:
    """`reports/<UTC timestamp>-<words…>`: where a command writes when no --out names a place (not made here)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("reports") / "-".join([stamp, *(slug(word) for word in words)])
