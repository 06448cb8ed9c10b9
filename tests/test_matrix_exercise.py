"""`repro matrix` leaves out a cell that did not exercise its level, and names it; bad `exercise:` conditions are
bad input. Real `repro matrix` processes launching real simulator processes per cell."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from repro.matrix.spec import SpecLoader
from test_matrix_e2e import ONE, REPRO, ROOT, TINY, progress, sim_spec

pytestmark = pytest.mark.slow

HOST = 'sglang:cached_tokens_total{cache_source="host"}'


def big_pool_spec(tmp_path: Path, name: str) -> Path:
    """The simulator matrix on a device pool so large that nothing is ever evicted, so HiCache never loads back."""
    unsized = {key: value for key, value in TINY.items() if key != "pressure"}
    spec = sim_spec(tmp_path, name, load=unsized, design=ONE, variables={"time_scale": "0", "final_after": "2"})
    data = yaml.load(spec.read_text(), Loader=SpecLoader)
    data["deployment"]["command"] += " --max-total-tokens 5000000"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    return spec


def test_hicache_on_cells_without_load_backs_are_left_out_and_named(tmp_path: Path) -> None:
    matrix = tmp_path / "m"
    done = subprocess.run([*REPRO, "matrix", str(big_pool_spec(tmp_path, "idle")), "--out", str(matrix),
                           "--keep-going", "--no-cell-reports"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 3, done.stderr[-2000:]
    records = progress(matrix)
    failed = [r for r in records if r["status"] == "failed"]
    assert sorted(r["cell"]["hicache"] for r in failed) == ["on", "on"]
    assert all(r["cell"]["hicache"] == "off" for r in records if r["status"] == "finished")
    for record in failed:
        assert record["message"].startswith(f"not exercised: HiCache: on but NOT EXERCISED: {HOST} did not rise")
        # The run is kept aside for a look, and --resume would rerun the cell.
        assert ".partial-" in record["run_dir"] and (matrix / record["run_dir"] / "metrics.csv").exists()
    analysis = json.loads((matrix / "matrix.json").read_text())
    assert all(c["runs"] == 0 for c in analysis["cells"] if c["levels"]["hicache"] == "on")
    # Markdown escapes the metric's underscores.
    assert "not exercised: HiCache: on but NOT EXERCISED: sglang:cached\\_tokens\\_total" in (matrix / "report.md").read_text()


@pytest.mark.parametrize(("condition", "expected"), [
    ("delta(sglang:no_such_metric_total) > 0", "the target exports no metric 'sglang:no_such_metric_total'"),
    ("host_load_back_tokens >> 0", "cannot parse exercise condition 'host_load_back_tokens >> 0'"),
    ("loadbacks > 0", "unknown fact 'loadbacks'"),
])
def test_a_bad_exercise_condition_is_one_line_and_exit_2(tmp_path: Path, condition: str, expected: str) -> None:
    spec = sim_spec(tmp_path, "bad", load=TINY, design=ONE, variables={"time_scale": "0", "final_after": "2"})
    data = yaml.load(spec.read_text(), Loader=SpecLoader)
    for level in data["factors"]["hicache"]["levels"].values():
        level["exercise"] = condition
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    matrix = tmp_path / "m"
    done = subprocess.run([*REPRO, "matrix", str(spec), "--out", str(matrix), "--keep-going", "--no-cell-reports"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2, done.stderr[-2000:]
    # The error is the last line (a condition checked after a cell's load follows that cell's progress lines).
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("repro: error: ") and expected in line and "exercise" in line
    assert "Traceback" not in done.stderr
    # Not one cell was counted with a condition that could not be checked.
    assert not [r for r in progress(matrix) if r["status"] == "finished"]
