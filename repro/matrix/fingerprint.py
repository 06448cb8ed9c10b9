"""What a matrix directory was started with, and why `--resume` may refuse to continue it.

The fingerprint covers the validated spec (variables resolved; not where runs are placed) and the
content of the workload file its load names, so editing the workload between two sessions of one matrix
cannot mix cells measured under two workloads. The plan also records which repro made it: a matrix
from another version is not resumed (its spec model, so its fingerprint, differ), but its cells can
still be re-analysed with today's analysis (`repro reanalyse`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from repro import __version__
from repro.matrix.spec import MatrixSpec
from repro.workload.scenario import load_workload
from repro.workload.trace import is_trace, load_trace


def workload_sha256(spec: MatrixSpec) -> str:
    """sha256 of the bytes of the workload the spec's load runs (the packaged default when it names none)."""
    workload = spec.load.get("workload")
    if isinstance(workload, str) and is_trace(workload):
        return load_trace(workload, keep=0).sha256  # validated and hashed as it streams, nothing kept
    return load_workload(workload if isinstance(workload, str) else None).sha256


def fingerprint(spec: MatrixSpec, workload: str) -> str:
    """The spec without its resources (a matrix may resume on other nodes), and the workload's content."""
    text = spec.model_dump_json(exclude={"resources"}) + "\n" + workload
    return hashlib.sha256(text.encode()).hexdigest()


def plan_fields(spec: MatrixSpec, workload: str) -> dict[str, str]:
    """The plan's identity fields for a matrix started now; `workload` is its workload_sha256."""
    return {"fingerprint": fingerprint(spec, workload), "workload_sha256": workload, "repro_version": __version__}


def resume_refusal(recorded: dict[str, Any], spec: MatrixSpec, workload: str, path: str) -> str | None:
    """Why the matrix recorded in `recorded` (its plan.json) cannot be resumed with `spec` and the workload
    whose workload_sha256 is `workload`; None when it can."""
    now = plan_fields(spec, workload)
    if recorded.get("fingerprint") == now["fingerprint"]:
        return None
    version = recorded.get("repro_version")
    if version != __version__:
        made_by = f"repro {version}" if isinstance(version, str) else "an earlier repro (one that did not record its version)"
        return (f"--resume {path}: this matrix was recorded by {made_by}, and this is repro {__version__}: its plan "
                f"cannot be continued by another version. `repro reanalyse {path}` applies this version's analysis "
                "to its finished cells without rerunning them; to add runs, start a new matrix directory")
    if recorded.get("workload_sha256") != now["workload_sha256"]:
        return (f"--resume {path}: the workload file changed since this matrix started (sha256 "
                f"{str(recorded.get('workload_sha256'))[:12]}…, now {now['workload_sha256'][:12]}…): cells measured "
                "under two workloads cannot be analysed together; restore it, or start a new matrix directory")
    return (f"--resume {path}: the spec or its variables changed since this matrix started; "
            "resume with the same spec, or start a new matrix directory")
