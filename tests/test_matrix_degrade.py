"""The matrix analysis degrades, never crashes, once the sessions are spent: statistics that cannot be
computed become "inconclusive" effects with the reason, and a bug in the analysis keeps every cell's
data on disk with the command that re-analyses it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_matrix_analysis import analyse_counts, make_spec

import repro.matrix.runner as matrix_runner
from repro.errors import EXIT_INTERNAL, InternalError
from repro.matrix.analysis import MatrixAnalysis
from repro.matrix.cell import CELLS
from repro.matrix.runner import MatrixRunner, run_matrix
from repro.matrix.fingerprint import workload_sha256
from repro.matrix.spec import MatrixSpec, read_spec
from repro.store.records import RateEstimate, Summary

SEPARABLE = {
    ("off", "off", "off", "bf16"): 21,
    ("off", "on", "off", "bf16"): 11,
    ("on", "off", "off", "bf16"): 13,
    ("on", "on", "off", "bf16"): 16,
}
"""Issue 16's counts of 30 sessions per cell (hicache, overlap, cuda_graph, index_k); every other cell 0/30."""

FACTORS = ["hicache", "overlap", "cuda_graph", "index_k"]


def separable(cell: dict[str, str]) -> dict[str, int]:
    corrupt = SEPARABLE.get(tuple(cell[f] for f in FACTORS), 0)
    return {"clean": 30 - corrupt, "corrupt": corrupt, "timeout": 0, "error": 0}


def assert_well_formed(analysis: MatrixAnalysis) -> None:
    """Every p-value written is in [0, 1] or null, and matrix.json is standard JSON (no NaN, no Infinity)."""
    for effect in [*analysis.factors, *analysis.interactions, *analysis.timeouts, *analysis.wedges]:
        for p in (effect.p, effect.p_adjusted, effect.firth_p):
            assert p is None or 0.0 <= p <= 1.0, (effect.term, p)
        if effect.p is None:
            assert effect.verdict == "inconclusive" and effect.reasons, effect.term
    json.dumps(analysis.to_json(), allow_nan=False)


def test_a_separable_interaction_is_inconclusive_and_the_main_effects_still_get_verdicts() -> None:
    spec = make_spec(FACTORS)
    assert spec.baseline() == {"hicache": "off", "overlap": "on", "cuda_graph": "on", "index_k": "fp8"}
    analysis = analyse_counts(spec, separable)
    assert_well_formed(analysis)
    verdicts = {e.factor: e.verdict for e in analysis.factors}
    assert verdicts == {
        "hicache": "no detectable effect", "overlap": "no detectable effect",
        "cuda_graph": "causes", "index_k": "causes",
    }
    cuda_graph = next(e for e in analysis.factors if e.factor == "cuda_graph")
    assert "acts only together with index_k bf16" in cuda_graph.reasons
    (unfittable,) = [e for e in analysis.interactions if e.p is None]
    assert unfittable.term == "cuda_graph=off×index_k=bf16"
    assert "could not estimate this term" in unfittable.reasons[0]
    assert unfittable.reasons[-1] == "left out of the holm adjustment"
    # The adjustment ran over the fittable interactions only.
    assert all(e.p_adjusted is not None for e in analysis.interactions if e is not unfittable)
    assert "The interaction cuda_graph off × index_k bf16: inconclusive (the Firth fit could not" in analysis.verdict


SINGULAR_REFIT = {("b", "b", "a", "a"): 1, ("b", "b", "a", "b"): 3, ("b", "b", "b", "a"): 28, ("b", "b", "b", "b"): 1}
"""Counts (of 30 per cell) on which the profile-likelihood refits of firthmodels raise LinAlgError ("Weighted
design matrix is rank deficient"): corruption only where f0 and f1 are both set, peaking in one corner."""


def test_a_singular_profile_refit_leaves_that_term_inconclusive_and_the_rest_estimated() -> None:
    spec = make_spec(["f0", "f1", "f2", "f3"])
    analysis = analyse_counts(spec, lambda cell: {
        "clean": 30 - SINGULAR_REFIT.get(tuple(cell[f] for f in spec.factors), 0),
        "corrupt": SINGULAR_REFIT.get(tuple(cell[f] for f in spec.factors), 0), "timeout": 0, "error": 0,
    })
    assert_well_formed(analysis)
    assert any(e.p is not None for e in analysis.factors + analysis.interactions)


def _level_names(index: int, count: int) -> list[str]:
    return [f"l{index}{chr(ord('a') + i)}" for i in range(count)]


@st.composite
def count_tables(draw: st.DrawFn) -> tuple[MatrixSpec, dict[tuple[str, ...], dict[str, int]]]:
    """A 2–5 factor design and per-cell counts with the corner cases weighted up: all-zero cells, all-corrupt
    cells, corruption confined to where two factors are set together, timeouts everywhere, empty cells."""
    n_factors = draw(st.integers(2, 5))
    level_counts = [draw(st.sampled_from([2, 2, 2, 3])) if n_factors <= 3 else 2 for _ in range(n_factors)]
    factors = {f"f{i}": _level_names(i, n) for i, n in enumerate(level_counts)}
    spec = MatrixSpec.model_validate({
        "name": "property",
        "factors": {f: {"levels": {lv: {} for lv in levels}} for f, levels in factors.items()},
        "deployment": {"command": "true", "port": 1},
        "design": {"min_completed": draw(st.sampled_from([1, 5, 20])), "replicates": 1},
    })
    shape = draw(st.sampled_from(["random", "zero", "all-corrupt", "separable", "timeouts", "sparse"]))
    sessions = draw(st.sampled_from([1, 3, 30]))
    tables: dict[tuple[str, ...], dict[str, int]] = {}
    for levels in itertools.product(*factors.values()):
        together = levels[0] != factors["f0"][0] and levels[1] != factors["f1"][0]
        if shape == "zero":
            corrupt, timeout = 0, 0
        elif shape == "all-corrupt":
            corrupt, timeout = sessions, 0
        elif shape == "separable":
            corrupt, timeout = (draw(st.integers(1, sessions)) if together else 0), 0
        elif shape == "timeouts":
            timeout = draw(st.integers(sessions // 2, sessions))
            corrupt = draw(st.integers(0, sessions - timeout))
        elif shape == "sparse" and draw(st.booleans()):
            corrupt, timeout = 0, 0
            tables[levels] = {"clean": 0, "corrupt": 0, "timeout": 0, "error": draw(st.integers(0, sessions))}
            continue
        else:
            corrupt = draw(st.integers(0, sessions))
            timeout = draw(st.integers(0, sessions - corrupt))
        tables[levels] = {
            "clean": sessions - corrupt - timeout, "corrupt": corrupt, "timeout": timeout, "error": 0,
            "wedged": draw(st.integers(0, timeout)),
        }
    return spec, tables


# Derandomized, 15 tables: the same every run, so the cost (exact power per effect, up to 480 sessions an arm)
# is fixed and well under the timeout on a loaded machine.
@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(count_tables())
def test_analyse_never_raises_and_writes_only_valid_p_values(table: tuple[MatrixSpec, dict]) -> None:
    spec, tables = table
    analysis = analyse_counts(spec, lambda cell: dict(tables[tuple(cell[f] for f in spec.factors)]))
    assert_well_formed(analysis)
    assert len(analysis.factors) == sum(len(f.levels) - 1 for f in spec.factors.values())


def _summary(counts: dict[str, int]) -> Summary:
    completed = counts["clean"] + counts["corrupt"]
    return Summary(
        sessions=sum(counts.values()),
        counts=counts,
        wedged=0,
        corruption_rate=RateEstimate(
            k=counts["corrupt"], n=completed, estimate=counts["corrupt"] / completed if completed else None,
            ci_low=0.0, ci_high=1.0, method="clopper-pearson",
        ),
    )


def finished_matrix(tmp_path: Path) -> tuple[Path, Path]:
    """A matrix directory whose 16 cells have all run with issue 16's counts: `--resume` only re-analyses."""
    spec = make_spec(FACTORS)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False), encoding="utf-8")
    source = read_spec(spec_path)
    out = tmp_path / "matrix"
    runner = MatrixRunner(source, out, workload_sha256=workload_sha256(source.spec))
    for run in runner.runs:
        run_dir = out / CELLS / run.key
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(_summary(separable(run.cell.as_dict())).model_dump_json())
    return spec_path, out


def test_resume_reanalyses_the_separable_table_end_to_end(tmp_path: Path) -> None:
    spec_path, out = finished_matrix(tmp_path)
    result = run_matrix(spec_path, out=out, resume=True)
    written: dict[str, Any] = json.loads((out / "matrix.json").read_text())
    assert {e["factor"]: e["verdict"] for e in written["factors"]}["cuda_graph"] == "causes"
    assert any(e["p"] is None and e["verdict"] == "inconclusive" for e in written["interactions"])
    assert result.analysis_error is None and (out / "report.html").stat().st_size > 0


def test_a_bug_in_the_analysis_is_its_own_error_and_keeps_the_cells(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec_path, out = finished_matrix(tmp_path)
    real = matrix_runner.analyse

    def failing(*args: Any, effects: bool = True, **kwargs: Any) -> MatrixAnalysis:
        if effects:
            raise ZeroDivisionError("a bug in the statistics")
        return real(*args, effects=effects, **kwargs)

    monkeypatch.setattr(matrix_runner, "analyse", failing)
    with pytest.raises(InternalError) as caught:
        run_matrix(spec_path, out=out, resume=True)
    assert caught.value.exit_code == EXIT_INTERNAL > 127  # `git bisect run` stops rather than blaming a commit
    message = str(caught.value)
    assert "ZeroDivisionError: a bug in the statistics" in message
    assert f"repro matrix {spec_path} --out {out} --resume" in message
    cells = json.loads((out / "matrix.json").read_text())["cells"]
    assert len(cells) == 16 and sum(c["counts"]["corrupt"] for c in cells) == sum(SEPARABLE.values())
    # The command it names works once the bug is gone.
    monkeypatch.setattr(matrix_runner, "analyse", real)
    assert run_matrix(spec_path, out=out, resume=True).analysis_error is None
