"""The matrix analysis on hand-made counts: causes, amplifiers, null factors, interactions, timeouts,
fractional designs, and the reports rendered from it."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable

import pytest

from repro.matrix.analysis import CellRun, MatrixAnalysis, analyse
from repro.matrix.design import cells, plan
from repro.matrix.report import write_reports
from repro.matrix.spec import MatrixSpec

Outcomes = Callable[[dict[str, str]], dict[str, int]]


def make_spec(factors: list[str], *, design: dict | None = None, labels: dict[str, str] | None = None) -> MatrixSpec:
    levels = {
        "hicache": ["off", "on"], "index_k": ["fp8", "bf16"], "overlap": ["on", "off"], "cuda_graph": ["on", "off"]
    }
    return MatrixSpec.model_validate(
        {
            "name": "hand-made",
            "factors": {
                f: {"label": (labels or {}).get(f), "levels": {lv: {} for lv in levels.get(f, ["a", "b"])}}
                for f in factors
            },
            "deployment": {"command": "true", "port": 1},
            "design": {"min_completed": 20, **(design or {})},
        }
    )


def analyse_counts(spec: MatrixSpec, outcomes: Outcomes, *, failed: set[str] = frozenset()) -> MatrixAnalysis:
    runs = []
    for run in plan(spec):
        if run.key in failed:
            runs.append(CellRun(key=run.key, cell=run.cell.as_dict(), replicate=run.replicate, order=run.order,
                                status="failed", message="did not start"))
            continue
        counts = outcomes(run.cell.as_dict())
        runs.append(CellRun(key=run.key, cell=run.cell.as_dict(), replicate=run.replicate, order=run.order,
                            status="finished", counts=counts, wedged=counts.pop("wedged", 0),
                            run_dir=f"cells/{run.key}"))
    return analyse(spec, runs, [c.as_dict() for c in cells(spec)], len(runs))


def hicache_story(cell: dict[str, str]) -> dict[str, int]:
    """The seeds' shape: corruption only with HiCache, more with a bf16 index-K; overlap does nothing."""
    corrupt = 0 if cell["hicache"] == "off" else (3 if cell["index_k"] == "fp8" else 11)
    return {"clean": 30 - corrupt, "corrupt": corrupt, "timeout": 0, "error": 0}


def verdicts(analysis: MatrixAnalysis) -> dict[str, str]:
    return {e.factor: e.verdict for e in analysis.factors}


def test_hicache_causes_bf16_widens_overlap_is_cleared_with_power() -> None:
    spec = make_spec(["hicache", "index_k", "overlap"], labels={"hicache": "HiCache", "index_k": "index-K"})
    analysis = analyse_counts(spec, hicache_story)
    assert verdicts(analysis) == {"hicache": "causes", "index_k": "widens", "overlap": "no detectable effect"}
    hicache, index_k, overlap = analysis.factors
    assert (hicache.treated.k, hicache.treated.n, hicache.reference.k, hicache.reference.n) == (28, 120, 0, 120)
    assert hicache.test == "stratified exact" and hicache.p_adjusted < 1e-6
    assert hicache.diff_low > 0.1 and hicache.log_odds > 0
    assert index_k.widens == "hicache" and index_k.conditional["within"] == "HiCache on"
    assert overlap.p == 1.0 and 0 < overlap.power < 1
    text = analysis.verdict
    assert text.startswith("HiCache on (vs off) causes corruption: 28/120 vs 0/120 sessions")
    assert "index-K bf16 (vs fp8) widens it: with HiCache on, 22/60 vs 6/60" in text
    assert "overlap off (vs on): no detectable effect" in text and "power to detect 10 points" in text
    assert [c.name for c in analysis.cells][0] == "hicache-off_index_k-fp8_overlap-on"
    json.dumps(analysis.to_json())


def test_a_factor_that_only_acts_together_with_another_is_named_with_it() -> None:
    spec = make_spec(["hicache", "index_k"])
    analysis = analyse_counts(
        spec, lambda c: {"clean": 20, "corrupt": 10 if c == {"hicache": "on", "index_k": "bf16"} else 0}
    )
    assert verdicts(analysis) == {"hicache": "causes", "index_k": "causes"}
    assert any("acts only together with index_k bf16" in r for r in analysis.factors[0].reasons)


def test_timeouts_at_the_baseline_make_a_cause_inconclusive_and_are_analysed_on_their_own() -> None:
    # HiCache off recomputes evicted prefixes: slower, so under a tight budget it times out (the seeds' 80/80).
    def outcomes(cell: dict[str, str]) -> dict[str, int]:
        if cell["hicache"] == "off":
            return {"clean": 12, "corrupt": 0, "timeout": 18, "error": 0}
        return {"clean": 20, "corrupt": 10, "timeout": 0, "error": 0, "wedged": 6}

    analysis = analyse_counts(make_spec(["hicache", "index_k"]), outcomes)
    hicache = analysis.factors[0]
    assert hicache.verdict == "inconclusive"
    assert hicache.reasons[0] == "not significant if the 36 timeouts with hicache off had been corrupt"
    timeouts = {e.factor: e for e in analysis.timeouts}
    assert timeouts["hicache"].verdict == "reduces" and timeouts["index_k"].verdict == "no detectable effect"
    wedges = {e.factor: e for e in analysis.wedges}
    assert wedges["hicache"].verdict == "causes" and wedges["hicache"].treated.k == 12
    assert "hicache on (vs off) lowers timeouts: 0/60 vs 36/60" in analysis.verdict
    assert all(c.inconclusive for c in analysis.cells if c.levels["hicache"] == "off")


def test_an_amplifier_seen_only_among_completed_sessions_is_inconclusive_when_its_timeouts_could_be_clean() -> None:
    # PD wedges end sessions before they can corrupt: among completed sessions PD looks like it widens
    # HiCache's corruption (23/24 vs 23/32), but with its 8 timeouts counted clean it is 23/32 vs 23/32.
    def outcomes(cell: dict[str, str]) -> dict[str, int]:
        if cell["hicache"] == "off":
            return {"clean": 22, "corrupt": 0, "timeout": 10 if cell["index_k"] == "bf16" else 0, "error": 0}
        if cell["index_k"] == "bf16":
            return {"clean": 1, "corrupt": 23, "timeout": 8, "error": 0}
        return {"clean": 9, "corrupt": 23, "timeout": 0, "error": 0}

    analysis = analyse_counts(make_spec(["hicache", "index_k"], labels={"hicache": "HiCache"}), outcomes)
    hicache, index_k = analysis.factors
    assert hicache.verdict == "causes"
    assert index_k.verdict == "inconclusive" and index_k.widens is None
    assert index_k.reasons[0] == "not significant (with HiCache on) if the 8 timeouts with index_k bf16 had been clean"
    assert "widens" not in analysis.verdict
    # Without the timeouts the same rise is an amplifier.
    clean = analyse_counts(make_spec(["hicache", "index_k"]), lambda c: {**outcomes(c), "timeout": 0})
    assert verdicts(clean)["index_k"] == "widens"


def test_too_few_sessions_is_inconclusive_never_no_effect() -> None:
    analysis = analyse_counts(make_spec(["hicache", "index_k"]), lambda c: {"clean": 5, "corrupt": 0})
    assert set(verdicts(analysis).values()) == {"inconclusive"}
    assert "only 10 sessions completed (minimum 20)" in analysis.factors[0].reasons[0]


@pytest.mark.parametrize(
    "counts",
    [
        [(0, 30), (0, 30), (3, 27), (11, 19)],  # the seeds' shape
        [(0, 8), (0, 8), (0, 8), (4, 8)],  # thin and lopsided
        [(5, 25), (5, 25), (5, 25), (5, 25)],  # a base rate, no effect anywhere
        [(12, 18), (0, 30), (0, 30), (12, 18)],  # a pure interaction
    ],
)
def test_a_factor_without_effect_is_never_named(counts: list[tuple[int, int]]) -> None:
    # Whatever hicache and index_k do, the "noise" factor's levels see identical counts in every stratum.
    spec = make_spec(["hicache", "index_k", "noise"])
    table = {("off", "fp8"): counts[0], ("off", "bf16"): counts[1], ("on", "fp8"): counts[2], ("on", "bf16"): counts[3]}

    def outcomes(cell: dict[str, str]) -> dict[str, int]:
        corrupt, clean = table[(cell["hicache"], cell["index_k"])]
        return {"clean": clean, "corrupt": corrupt}

    analysis = analyse_counts(spec, outcomes)
    assert verdicts(analysis)["noise"] in ("practically equivalent", "no detectable effect", "inconclusive")
    for word in ("causes", "widens", "reduces"):
        assert f"noise b (vs a) {word}" not in analysis.verdict
    assert not any(e.verdict != "no detectable effect" for e in analysis.interactions if "noise" in e.term)


def test_half_fraction_falls_back_to_firth_regression() -> None:
    spec = make_spec(["hicache", "index_k", "overlap", "cuda_graph"], design={"type": "half"})
    assert len(cells(spec)) == 8

    def outcomes(cell: dict[str, str]) -> dict[str, int]:
        corrupt = 12 if cell["hicache"] == "on" else 0
        return {"clean": 40 - corrupt, "corrupt": corrupt}

    analysis = analyse_counts(spec, outcomes)
    assert verdicts(analysis)["hicache"] == "causes"
    assert {v for f, v in verdicts(analysis).items() if f != "hicache"} <= {"practically equivalent", "no detectable effect", "inconclusive"}
    assert analysis.factors[0].test == "Firth likelihood ratio"


def test_interactions_from_firth_regression_in_a_full_factorial() -> None:
    spec = make_spec(["hicache", "index_k"])

    def outcomes(cell: dict[str, str]) -> dict[str, int]:
        corrupt = {("off", "fp8"): 4, ("off", "bf16"): 4, ("on", "fp8"): 4, ("on", "bf16"): 30}[
            (cell["hicache"], cell["index_k"])
        ]
        return {"clean": 60 - corrupt, "corrupt": corrupt}

    analysis = analyse_counts(spec, outcomes)
    (interaction,) = analysis.interactions
    assert interaction.term == "hicache=on×index_k=bf16"
    assert interaction.verdict == "causes" and interaction.log_odds_low > 0
    assert "The interaction hicache on × index_k bf16 raises corruption" in analysis.verdict


def test_failed_runs_are_counted_not_analysed_and_reports_escape_names(tmp_path: Path) -> None:
    spec = make_spec(["hicache", "index_k"], labels={"hicache": "<b>HiCache</b>"})
    failed = {next(r.key for r in plan(spec) if r.cell.as_dict() == {"hicache": "on", "index_k": "bf16"})}
    analysis = analyse_counts(spec, hicache_story, failed=failed)
    assert analysis.runs == {"planned": 4, "finished": 3, "failed": 1}
    runs = [CellRun(key=k, cell={"hicache": "on", "index_k": "bf16"}, replicate=1, order=0, status="failed",
                    message="cell x: enable_hierarchical_cache is False, the spec asked for True <script>")
            for k in failed]
    linked = tmp_path / analysis.cells[0].run_dirs[0]
    linked.mkdir(parents=True)
    (linked / "report.html").write_text("<html></html>")
    report = write_reports(tmp_path, analysis, ["hicache", "index_k"], runs)
    html = report.html.read_text()
    assert "<b>HiCache</b>" not in html and "&lt;b&gt;HiCache&lt;/b&gt;" in html
    assert "<script>" not in html and "the spec asked for True &lt;script&gt;" in html
    assert html.count('href="cells/') == 1 and f'href="{analysis.cells[0].run_dirs[0]}/report.html"' in html
    assert "data:image/png;base64," in html
    suite = ET.parse(report.junit).getroot().find("testsuite")
    assert suite is not None and int(suite.get("tests")) == 4 + 2
    assert "| off | fp8 |" in report.markdown.read_text()


def test_a_level_that_never_acted_is_not_exercised_rather_than_without_effect() -> None:
    # HiCache is on but no cell ever loaded back (a device pool the load never overflowed): a bf16 index-K
    # cannot have shown anything, and neither can HiCache.
    spec = MatrixSpec.model_validate({
        "name": "idle",
        "factors": {
            "hicache": {"label": "HiCache", "levels": {"off": {"confirm": {"enable_hierarchical_cache": False}},
                                                       "on": {"confirm": {"enable_hierarchical_cache": True}}}},
            "index_k": {"label": "index-K", "levels": {"fp8": {"confirm": {"index_k_dtype": "fp8"}},
                                                       "bf16": {"confirm": {"index_k_dtype": "bf16"}}}},
        },
        "deployment": {"command": "true", "port": 1},
        "design": {"min_completed": 20, "replicates": 2},
    })

    def runs(load_backs: float | None) -> list[CellRun]:
        return [CellRun(key=run.key, cell=run.cell.as_dict(), replicate=run.replicate, order=run.order,
                        status="finished", counts={"clean": 30, "corrupt": 0, "timeout": 0, "error": 0},
                        run_dir=f"cells/{run.key}", exercised={"host_load_back_tokens": load_backs})
                for run in plan(spec)]

    order = [c.as_dict() for c in cells(spec)]
    idle = analyse(spec, runs(0.0), order, 8)
    assert verdicts(idle) == {"hicache": "not exercised", "index_k": "not exercised"}
    assert "index-K bf16 (vs fp8): not exercised (tokens loaded back from the host tier stayed 0 in all 4 runs with " \
           "index-K bf16)" in idle.verdict
    # Unknown (a server without the metric) is not proof of idleness: the verdict stands as it was (120 clean
    # sessions per arm put the whole difference within the default ±5 points).
    assert verdicts(analyse(spec, runs(None), order, 8)) == {"hicache": "practically equivalent",
                                                             "index_k": "practically equivalent"}
    assert verdicts(analyse(spec, runs(4096.0), order, 8)) == {"hicache": "practically equivalent",
                                                               "index_k": "practically equivalent"}


def test_the_matrix_report_agrees_with_itself(tmp_path: Path) -> None:
    """Cells are not held to the arms' minimum; every "no detectable effect" states its power; a widening
    shows the within-cause counts the verdict names and the pooled ones; a log-odds says where it is measured."""
    spec = make_spec(["hicache", "index_k"], labels={"hicache": "HiCache", "index_k": "index-K"},
                     design={"min_completed": 40, "replicates": 1})
    analysis = analyse_counts(spec, hicache_story)  # 30 sessions per cell, 60 per arm
    assert verdicts(analysis) == {"hicache": "causes", "index_k": "widens"}
    assert not any(cell.inconclusive for cell in analysis.cells), [cell.reasons for cell in analysis.cells]
    for effect in (*analysis.timeouts, *analysis.wedges, *analysis.interactions):
        if effect.verdict == "no detectable effect":
            assert effect.power is not None, effect.label
    index_k = analysis.factors[1]
    within, pooled = index_k.conditional, index_k
    assert (within["treated"]["k"], within["treated"]["n"]) == (11, 30)
    assert (pooled.treated.k, pooled.treated.n) == (11, 60)
    assert "with HiCache on, 11/30 vs 3/30 sessions" in analysis.verdict
    assert "over every HiCache level: 11/60 vs 3/60 sessions" in analysis.verdict
    html = write_reports(tmp_path, analysis, list(spec.factors), []).html.read_text(encoding="utf-8")
    assert "minimum 40" not in html and "cell caveats" in html
    row = html[html.index("index-K bf16 vs fp8"):]
    row = row[:row.index("</tr>")]
    assert "<td>11/30<br><small>all: 11/60</small></td>" in row and "<td>3/30<br><small>all: 3/60</small></td>" in row
    # Its log-odds is the regression's term at HiCache off, where neither arm corrupted: said so beside it.
    assert "at hicache off: 0/30 vs 0/30" in row
    nulls = [row for row in html.split("<tr>") if "no detectable effect" in row]
    assert nulls
    for row in nulls:  # the power column, second to last, is a number
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        assert re.fullmatch(r"0\.\d\d|1\.00", cells[-2]), row
