"""A matrix across versions and workloads: `--resume` refuses what it cannot continue and says why, and
`repro reanalyse` applies today's analysis to a matrix directory in an earlier version's format.

The earlier format is written here as an earlier repro wrote it: plan.json without `repro_version` or
`workload_sha256`, its fingerprint over the spec alone, progress.jsonl lines with only the fields it knew.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from run_builders import run_main

from repro.errors import UsageError
from repro.matrix.design import plan
from repro.matrix.runner import MatrixRunner
from repro.matrix.fingerprint import workload_sha256
from repro.matrix.spec import load_spec, read_spec

ROOT = Path(__file__).resolve().parent.parent


def _spec_file(tmp_path: Path, workload: Path) -> Path:
    spec = {
        "name": "versions",
        "variables": {"port": "auto"},
        "factors": {"hicache": {"levels": {"off": {}, "on": {"flags": "--enable-hierarchical-cache"}}},
                    "index_k": {"levels": {"fp8": {}, "bf16": {"flags": "--index-k-dtype bf16"}}}},
        "deployment": {"command": "${python} -m repro.sim serve --port ${port}", "port": "${port}"},
        "load": {"workload": str(workload), "sessions": 40},
        "design": {"replicates": 1, "min_completed": 20},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def _workload(tmp_path: Path) -> Path:
    workload = tmp_path / "workload.yaml"
    workload.write_bytes((ROOT / "experiments" / "agentic_coding.yaml").read_bytes())
    return workload


def _start(spec_path: Path, out: Path, *, resume: bool) -> MatrixRunner:
    source = read_spec(spec_path)
    return MatrixRunner(source, out, workload_sha256=workload_sha256(source.spec), resume=resume,
                        keep_going=False, cell_reports=False, console=Console(quiet=True), executor="local",
                        ray_address=None)


def test_resume_refuses_a_matrix_whose_workload_file_was_edited(tmp_path: Path) -> None:
    workload = _workload(tmp_path)
    spec_path = _spec_file(tmp_path, workload)
    out = tmp_path / "m"
    _start(spec_path, out, resume=False)
    _start(spec_path, out, resume=True)  # unchanged: it resumes
    workload.write_text(workload.read_text(encoding="utf-8") + "\n# edited between two sessions of the matrix\n", encoding="utf-8")
    with pytest.raises(UsageError, match="the workload file changed since this matrix started"):
        _start(spec_path, out, resume=True)


def _old_matrix(tmp_path: Path) -> tuple[Path, Path]:
    """A matrix directory as an earlier repro left it: HiCache corrupting, bf16 widening it."""
    workload = _workload(tmp_path)
    spec_path = _spec_file(tmp_path, workload)
    spec = load_spec(spec_path)
    out = tmp_path / "old"
    (out / "cells").mkdir(parents=True)
    (out / "spec.yaml").write_bytes(spec_path.read_bytes())
    runs = plan(spec)
    old_fingerprint = hashlib.sha256(spec.model_dump_json(exclude={"resources"}).encode()).hexdigest()
    (out / "plan.json").write_text(json.dumps({
        "name": spec.name, "fingerprint": old_fingerprint, "variables": spec.variables,
        "runs": [{"key": r.key, "cell": r.cell.as_dict(), "replicate": r.replicate, "order": r.order} for r in runs],
    }), encoding="utf-8")
    corrupt = {("off", "fp8"): 0, ("off", "bf16"): 0, ("on", "fp8"): 6, ("on", "bf16"): 14}
    lines = []
    for r in runs:
        cell = r.cell.as_dict()
        k = corrupt[(cell["hicache"], cell["index_k"])]
        lines.append(json.dumps({"key": r.key, "cell": cell, "replicate": r.replicate, "order": r.order,
                                 "status": "finished", "run_dir": f"cells/{r.key}",
                                 "counts": {"clean": 40 - k, "corrupt": k, "timeout": 0, "error": 0, "interrupted": 0}}))
    (out / "progress.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out, spec_path


def test_resume_of_an_earlier_versions_matrix_names_the_version_and_reanalyse(tmp_path: Path) -> None:
    out, spec_path = _old_matrix(tmp_path)
    with pytest.raises(UsageError) as refused:
        _start(spec_path, out, resume=True)
    message = str(refused.value)
    assert "recorded by an earlier repro" in message and f"repro reanalyse {out}" in message
    assert "the spec or its variables changed" not in message


def test_reanalyse_applies_todays_analysis_to_an_earlier_versions_matrix(capsys: pytest.CaptureFixture[str],
                                                                         tmp_path: Path) -> None:
    out, _ = _old_matrix(tmp_path)
    recorded = {name: (out / name).read_bytes() for name in ("plan.json", "progress.jsonl", "spec.yaml")}
    code, stdout, err = run_main(capsys, "reanalyse", str(out))
    assert code == 0, err
    assert "recorded by an earlier repro" in stdout
    result = json.loads((out / "reanalysis" / "matrix.json").read_text(encoding="utf-8"))
    factors = {f["factor"]: f["verdict"] for f in result["factors"]}
    assert factors["hicache"] == "causes", result["verdict"]
    assert (out / "reanalysis" / "report.html").exists() and (out / "reanalysis" / "report.md").exists()
    assert {name: (out / name).read_bytes() for name in recorded} == recorded
    # Not a matrix directory: one line, exit 2, nothing made.
    code, _, err = run_main(capsys, "reanalyse", str(tmp_path / "nowhere"))
    assert code == 2 and "not a matrix directory" in err and not (tmp_path / "nowhere").exists()
