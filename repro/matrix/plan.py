"""plan.json: a matrix's run order, written once when the matrix starts and checked by `--resume`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PlannedEntry(BaseModel):
    """One launch of one cell in the randomised order."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    key: str
    """The run's directory name under cells/ and logs/ (`<cell>-r<replicate>`)."""
    cell: dict[str, str]
    """Factor name to level name."""
    replicate: int = Field(ge=1)
    order: int = Field(ge=0)
    """0-based position in the run order."""


class Plan(BaseModel):
    """The whole plan: `--resume` refuses a matrix directory whose fingerprint differs from the spec's."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    name: str
    fingerprint: str
    """sha256 of the validated spec (variables resolved) and of its workload's content: a changed spec or
    workload cannot resume an old matrix (repro.matrix.fingerprint)."""
    workload_sha256: str | None = None
    """sha256 of the workload file's bytes (absent from plans of earlier versions)."""
    repro_version: str | None = None
    """The repro that started the matrix (absent from plans of earlier versions)."""
    variables: dict[str, str]
    runs: list[PlannedEntry]
