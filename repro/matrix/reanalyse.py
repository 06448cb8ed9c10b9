"""`repro reanalyse MATRIX_DIR`: today's analysis over a matrix directory recorded by any version.

A matrix's cells can take hours of GPU time; a fixed or improved analysis must be applicable to them
without rerunning any. This reads what every version records (spec.yaml as given, the variables in
plan.json, the cells' lines in progress.jsonl), runs this version's analysis and writes matrix.json and
the reports into a directory of their own (default MATRIX_DIR/reanalysis/), leaving what was recorded
untouched. A sequential matrix's effects are re-analysed; its stopping record is not recomputed.
"""

from __future__ import annotations

from pathlib import Path

from repro import __version__
from repro.errors import UsageError
from repro.jsonl import read_journal, read_json_object
from repro.matrix import sequential
from repro.matrix.analysis import CellRun, MatrixAnalysis, analyse
from repro.matrix.design import cells, plan
from repro.matrix.report import write_reports
from repro.matrix.sidechannels import add_side_channels
from repro.matrix.runner import PLAN, PROGRESS, SPEC_COPY
from repro.matrix.spec import load_spec
from repro.store.rundir import check_output, dump_json

REANALYSIS = "reanalysis"
MATRIX_JSON = "matrix.json"


def reanalyse(path: Path, out: Path | None = None) -> tuple[MatrixAnalysis, Path, str | None]:
    """Analyse the matrix in `path` anew; (the analysis, where it was written, the repro version that recorded
    it: None for versions that did not say)."""
    root = Path(path)
    plan_file, spec_file = root / PLAN, root / SPEC_COPY
    if not plan_file.is_file() or not spec_file.is_file():
        raise UsageError(f"reanalyse {root}: not a matrix directory (no {PLAN} and {SPEC_COPY})")
    recorded = read_json_object(plan_file, f"reanalyse {root}")
    variables = recorded.get("variables")
    if not isinstance(variables, dict) or not all(isinstance(v, str) for v in variables.values()):
        raise UsageError(f"reanalyse {root}: {PLAN} is damaged (no variables)")
    spec = load_spec(spec_file, variables, files=False)  # its workload need not be beside the copy
    runs = list({r.key: r for r in read_journal(root / PROGRESS, CellRun.model_validate_json)}.values())
    target = Path(out) if out is not None else root / REANALYSIS
    check_output(target / MATRIX_JSON, [], "reanalyse --out")
    looked = sequential.look_spec(spec) if spec.design.sequential else spec
    analysis = add_side_channels(analyse(looked, runs, [c.as_dict() for c in cells(spec)], len(plan(spec))), root, runs)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"reanalyse --out {target}: cannot create: {err.strerror or err}") from None
    dump_json(target / MATRIX_JSON, {**analysis.to_json(), "reanalysed_by": __version__})
    write_reports(target, analysis, list(spec.factors), runs)
    version = recorded.get("repro_version")
    return analysis, target, version if isinstance(version, str) else None
