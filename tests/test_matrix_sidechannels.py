"""Side channels in the matrix, end to end on the simulator (virtual clock: the same counts at any machine
load). One factor makes the model loop (`--model-loop-rate`, the simulator's model-intrinsic loops: cut by
max_tokens, never counted as corrupt), which shifts the finish_reason mix and output length while no cell
corrupts; the other (`--disable-cuda-graph`) changes only decode speed, so no channel may shift for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from repro.matrix.analysis import Arm, CellRun, Effect, MatrixAnalysis
from repro.matrix.reanalyse import reanalyse
from repro.matrix.sidechannels import add_side_channels, pooled
from repro.matrix.spec import SpecLoader
from repro.report.sidechannels import Channels
from repro.store.rundir import read_sessions

ROOT = Path(__file__).resolve().parent.parent
REPRO = [sys.executable, "-c", "from repro.cli import main; main()"]


def _spec(tmp_path: Path) -> Path:
    spec: dict[str, Any] = yaml.load((ROOT / "matrices" / "sim_hicache_bf16.yaml").read_text(), Loader=SpecLoader)
    spec["name"] = "sim-side-channels"
    spec["factors"] = {
        "loops": {"label": "model <i>loops</i>", "levels": {"none": {"flags": "--model-loop-rate 0"},
                                                     "some": {"flags": "--model-loop-rate 0.3"}}},
        "cuda_graph": {"label": "CUDA graph", "levels": {
            "on": {"confirm": {"disable_cuda_graph": False}},
            "off": {"flags": "--disable-cuda-graph", "confirm": {"disable_cuda_graph": True}}}},
    }
    spec["load"] = {**spec["load"], "workload": str(ROOT / "experiments" / "agentic_coding.yaml"), "sessions": 16,
                    "concurrency": 16, "turns": 8}
    spec["variables"] = {**spec.get("variables", {}), "final_after": "10", "clock": "virtual"}
    spec["design"] = {**spec.get("design", {}), "seed": 3, "min_completed": 20, "replicates": 1,
                      "baseline": {"loops": "none", "cuda_graph": "on"}}
    spec["deployment"]["command"] += " --index-k-gate"
    path = tmp_path / "side.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_the_matrix_flags_a_silent_shift_and_only_where_one_happened(tmp_path: Path) -> None:
    out = tmp_path / "m"
    done = subprocess.run([*REPRO, "matrix", str(_spec(tmp_path)), "--out", str(out), "--no-cell-reports"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "matrix.json").read_text())
    assert all(c["counts"]["corrupt"] == 0 for c in result["cells"]), result["cells"]
    sides = {s["factor"]: s for s in result["side_channels"]}
    verdicts = {f["factor"]: f["verdict"] for f in result["factors"]}
    assert set(sides) == {"loops", "cuda_graph"}

    # Truth from the sessions themselves, not the harness's tests: the looping arm's turns end on max_tokens.
    cut = {level: sum(t.finish_reason == "length" for run in out.glob(f"cells/loops-{level}_*")
                      for s in read_sessions(run) for t in s.turns) for level in ("none", "some")}
    assert cut["none"] == 0 and cut["some"] >= 10, cut

    loops = {t["channel"]: t for t in sides["loops"]["tests"]}
    assert verdicts["loops"] not in ("causes", "widens", "reduces") and sides["loops"]["corruption"] == verdicts["loops"]
    assert loops["finish_reason mix"]["shifted"] and loops["output length"]["shifted"], loops
    assert loops["finish_reason mix"]["p_adjusted"] < 0.001 and loops["output length"]["p_adjusted"] < 0.001
    assert sides["loops"]["silent"] == ["finish_reason mix", "output length"]
    # The simulator exports no speculative-decoding metrics: that channel is left out, not reported as equal.
    assert "speculative acceptance" not in loops

    control = sides["cuda_graph"]
    assert [t["shifted"] for t in control["tests"]] == [False, False] and control["silent"] == [], control
    assert all(t["p_adjusted"] > 0.2 for t in control["tests"]), control

    assert "side channels: model <i>loops</i> some vs none: silent regression? finish_reason mix" in \
        " ".join(done.stderr.split())
    html = (out / "report.html").read_text()
    assert "<h2>Side channels</h2>" in html and html.count("SHIFTED: silent regression?") == 2
    assert "<i>loops</i>" not in html and "model &lt;i&gt;loops&lt;/i&gt; some vs none" in html
    markdown = (out / "report.md").read_text()
    assert "| finish\\_reason mix | model &lt;i&gt;loops&lt;/i&gt; some vs none |" in markdown
    assert markdown.count("SHIFTED: silent regression?") == 2

    # The same side channels from the recorded cells, by today's analysis.
    again, _, _ = reanalyse(out)
    assert [(s.factor, s.silent) for s in again.side_channels] == [(s["factor"], s["silent"]) for s in result["side_channels"]]


def test_an_arm_pools_its_runs_and_counts_acceptance_only_where_every_run_exported_it() -> None:
    one = Channels({"stop": 3, "length": 1}, [10.0, 12.0], accepted=40, drafted=100)
    two = Channels({"stop": 2}, [11.0], accepted=30, drafted=50)
    both = pooled([one, two])
    assert both.finish_reasons == {"stop": 5, "length": 1} and both.lengths == [10.0, 12.0, 11.0]
    assert (both.accepted, both.drafted) == (70, 150)
    # A run without the counters: summing the others would compare an arm against part of itself.
    partial = pooled([one, Channels({"stop": 1}, [9.0])])
    assert (partial.accepted, partial.drafted) == (None, None)
    assert pooled([Channels({}, [], accept_samples=[0.5]), Channels({}, [], accept_samples=[0.7])]).accept_samples \
        == [0.5, 0.7]


def test_a_cell_whose_sessions_cannot_be_read_is_left_out_with_a_note(tmp_path: Path) -> None:
    runs = [CellRun(key=f"f-{level}-r1", cell={"f": level}, replicate=1, order=i, status="finished",
                    run_dir=f"cells/f-{level}-r1") for i, level in enumerate(("a", "b"))]
    for run in runs:
        (tmp_path / str(run.run_dir)).mkdir(parents=True)
    (tmp_path / "cells" / "f-b-r1" / "sessions.jsonl").write_text("not a record\n{}\n")
    analysis = MatrixAnalysis(name="m", alpha=0.05, correction="holm", baseline={"f": "a"}, cells=[], factors=[],
                              interactions=[], timeouts=[], wedges=[], verdict="", runs={})
    analysis.factors = [Effect(term="f=b", factor="f", level="b", baseline="a", label="f b vs a", outcome="corruption",
                               treated=Arm(0, 0), reference=Arm(0, 0), test="stratified exact", p=None,
                               verdict="inconclusive")]
    add_side_channels(analysis, tmp_path, runs)
    [side] = analysis.side_channels
    assert [t.pvalue for t in side.tests] == [None, None] and side.silent == []
    assert any(n.startswith("side channels: f-b-r1 left out: ") and "not a session record" in n for n in analysis.notes)
