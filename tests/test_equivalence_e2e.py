"""The equivalence verdict and the side channels end to end: real simulator runs judged by `repro gate` and
`repro report`, and a silent regression (speculative acceptance collapsing) flagged while the rate holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.run.gate import evaluate
from tests.run_builders import make_run, run, run_main

FIXED = "--index-k-gate --clock virtual"


@pytest.fixture(scope="module")
def fixed_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two runs of the fixed simulator (the index-K gate on) at different seeds, on the virtual clock."""
    root = tmp_path_factory.mktemp("fixed")
    runs = []
    for seed in (1, 2):
        out = root / f"seed{seed}"
        result, _ = run(out, sessions=30, concurrency=30, seed=seed, turns=4, sim_args=f"{FIXED} --seed {seed}",
                        timeout=600, turn_timeout=300, report=False)
        assert result.exit_code == 0 and result.summary.counts["clean"] == 30, result.summary.counts
        runs.append(out)
    return runs[0], runs[1]


def test_gate_states_equivalence_at_the_margin_the_data_allow(capsys: pytest.CaptureFixture[str],
                                                              fixed_runs: tuple[Path, Path]) -> None:
    one, two = fixed_runs
    # 0 of 30 against 0 of 30: each arm's 95% upper bound is 11.6%, so ±15 points holds and ±5 does not.
    # (The gate as a whole is inconclusive: 4 turns per session never make HiCache load back, `exercised`.)
    _, out, _ = run_main(capsys, "gate", str(two), "--max-corruption-rate", "0.2", "--baseline", str(one),
                         "--margin", "0.15")
    line = next(x for x in out.splitlines() if x.startswith("baseline:"))
    assert line.startswith("baseline: PASS:") and "practically equivalent" in line and "±15 points" in line
    side = next(x for x in out.splitlines() if x.startswith("side-channels:"))
    assert side.startswith("side-channels: ok:") and "finish_reason mix" in side and "output length" in side
    code, out, _ = run_main(capsys, "gate", str(two), "--max-corruption-rate", "0.2", "--baseline", str(one))
    assert code == 125
    assert "baseline: INCONCLUSIVE:" in out and "inconclusive at the ±5 points margin" in out
    assert "about 72 completed sessions per arm would decide it" in out


def test_report_shows_the_verdict_and_the_side_channels(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                        fixed_runs: tuple[Path, Path]) -> None:
    one, two = fixed_runs
    code, _, err = run_main(capsys, "report", str(one), str(two), "-o", str(tmp_path / "r.html"),
                            "--markdown", str(tmp_path / "r.md"), "--margin", "0.15")
    assert code == 0, err
    markdown = (tmp_path / "r.md").read_text()
    assert "Verdicts at a margin of ±15 points" in markdown
    assert "practically equivalent: the difference lies in" in markdown
    assert "finish\\_reason mix" in markdown and "no shift shown" in markdown
    html = (tmp_path / "r.html").read_text()
    assert 'id="equivalence"' in html and "practically equivalent" in html
    code, _, err = run_main(capsys, "report", str(one), str(two), "-o", str(tmp_path / "x.html"), "--margin", "1.5")
    assert code == 2 and "margin must be strictly between 0 and 1" in err


def _acceptance(accepted: int, drafted: int) -> str:
    rows = ["elapsed_s,metric,labels,value"]
    for t, share in ((0, 0.0), (60, 1.0)):
        labels = '"{""engine"": ""0""}"'
        rows.append(f"{t},vllm:spec_decode_num_draft_tokens_total,{labels},{int(drafted * share)}")
        rows.append(f"{t},vllm:spec_decode_num_accepted_tokens_total,{labels},{int(accepted * share)}")
    return "\n".join(rows) + "\n"


def test_acceptance_collapse_is_flagged_while_the_rate_holds(tmp_path: Path) -> None:
    base = make_run(tmp_path / "base", name="before", clean=100, metrics=_acceptance(7500, 10000))
    after = make_run(tmp_path / "after", name="after", clean=100, metrics=_acceptance(2500, 10000))
    result = evaluate(after, max_corruption_rate=0.2, baseline=base)
    checks = {check.name: check for check in result.checks}
    assert checks["baseline"].numbers["verdict"] == "practically equivalent" and result.exit_code == 0
    side = checks["side-channels"]
    assert side.line.startswith("side-channels: SHIFTED (speculative acceptance):")
    assert "2500/10000 draft tokens accepted (25%) vs 7500/10000 draft tokens accepted (75%)" in side.line
    assert side.numbers["speculative acceptance"]["shifted"] and not side.numbers["finish_reason mix"]["shifted"]
    same = make_run(tmp_path / "same", name="same", clean=100, metrics=_acceptance(7490, 10000))
    assert "side-channels: ok:" in {c.name: c for c in evaluate(same, max_corruption_rate=0.2, baseline=base).checks}[
        "side-channels"].line
