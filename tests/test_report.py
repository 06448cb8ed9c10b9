"""`repro report`: HTML, Markdown and JUnit rendered from real run directories written with RunWriter.

The run directories come from tests/run_builders.py, written the way `repro run` writes them.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from repro.run.gate import evaluate
from repro.store.records import Summary
from repro.report import render_report
from repro.report.model import build_model

from run_builders import METRICS_CSV, SENTINEL, make_run, run_main


def test_corrupt_run_gets_a_corrupt_banner_with_numbers_and_a_highlighted_drilldown(tmp_path: Path) -> None:
    run = make_run(tmp_path / "bad", name="hicache-on", clean=47, corrupt=11, timeout=2, metrics=METRICS_CSV)
    result = render_report([run], tmp_path / "report.html")
    html = result.html.read_text(encoding="utf-8")
    assert "CORRUPT: 11 of 58 completed sessions (19%, 95% CI 9.9–31%) returned broken tool-call markup." in html
    # The offending span is highlighted inside its context, escaped.
    assert f"<mark>{SENTINEL}</mark>tool_calls&gt;" in html
    assert "Let me check." in html
    assert "raw bytes: raw/s0047-t01.sse" in html
    assert html.count('class="session corrupt-session"') == 11
    # Plots are inline images: outcomes, latency, timeline, turn index, metrics.
    assert html.count('<img src="data:image/png;base64,') == 5
    assert "http://" not in html.replace("http://127.0.0.1:9/v1", "")
    assert "<script" not in html.lower()


def test_timeouts_dominate_inconclusive_never_zero_percent(tmp_path: Path) -> None:
    run = make_run(tmp_path / "off", name="hicache-off", clean=26, timeout=34)
    result = render_report([run], tmp_path / "r.html", markdown=tmp_path / "s.md")
    verdict = result.model.runs[0].verdict
    assert verdict.kind == "inconclusive"
    assert verdict.headline.startswith("INCONCLUSIVE: 34 of 60 sessions (57%) timed out (limit 20%)")
    assert verdict.headline.endswith("0 of 26 completed were corrupt, which proves nothing.")
    for text in (result.html.read_text(encoding="utf-8"), (tmp_path / "s.md").read_text(encoding="utf-8")):
        assert "0% corruption" not in text
        assert "CLEAN" not in text
    # The timed-out sessions show how far they got cleanly.
    html = result.html.read_text(encoding="utf-8")
    assert "Timed-out sessions (34)" in html
    assert "clean turns before it stopped" in html


def test_clean_run_states_the_upper_bound(tmp_path: Path) -> None:
    run = make_run(tmp_path / "ok", name="fixed", clean=60)
    assert build_model([run]).runs[0].verdict.headline == (
        "CLEAN: 0 of 60 completed sessions corrupt; the corruption rate is below 4.9% (95% upper bound)."
    )


def test_comparison_table_has_boschloo_fisher_and_holm(tmp_path: Path) -> None:
    off = make_run(tmp_path / "off", name="hicache-off", clean=60)
    on = make_run(tmp_path / "on", name="hicache-on", clean=49, corrupt=11)
    bf16 = make_run(tmp_path / "bf16", name="bf16", clean=58, corrupt=2)
    result = render_report([off, on, bf16], tmp_path / "r.html", markdown=tmp_path / "s.md",
                           junit=tmp_path / "j.xml")
    rows = {row.name: row for row in result.model.comparisons}
    assert set(rows) == {"hicache-on", "bf16"}
    assert rows["hicache-on"].result.p_boschloo < rows["hicache-on"].result.p_fisher < 0.001
    # Holm: the smaller of two p-values is doubled.
    assert rows["hicache-on"].p_holm == 2 * rows["hicache-on"].result.p_boschloo
    assert rows["bf16"].p_holm > 0.05
    html = result.html.read_text(encoding="utf-8")
    assert 'id="comparisons"' in html and "Holm-adjusted" in html and "+18.3 pts" in html
    markdown = (tmp_path / "s.md").read_text(encoding="utf-8")
    assert "| hicache-on | 11/60 | 0/60 | +18.3 pts" in markdown
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "3" and suite.get("failures") == "2"
    case = suite.find("testcase[@name='hicache-on']")
    assert case is not None and case.find("failure") is not None
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["corrupt"] == "11" and props["verdict"] == "corrupt"


def test_crashed_run_without_summary_and_torn_metrics_still_reports(tmp_path: Path) -> None:
    run = make_run(tmp_path / "crash", name="crashed", clean=30, corrupt=1, summary=False,
                   metrics="t_s,metric\n1,2\n")
    with open(run / "sessions.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"session_id": 99, "task": "x", "outc')  # a torn last line, as after SIGKILL
    result = render_report([run], tmp_path / "r.html")
    view = result.model.runs[0]
    assert view.counts.total == 31 and view.verdict.kind == "corrupt"
    html = result.html.read_text(encoding="utf-8")
    assert "the run did not finish" in html
    assert "metrics.csv lacks columns labels, value" in html


def test_raw_path_outside_the_run_dir_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-CONTENT", encoding="utf-8")
    run = make_run(tmp_path / "r", clean=20, corrupt=1)
    lines = (run / "sessions.jsonl").read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[-1])
    record["turns"][1]["raw_path"] = "../secret.txt"
    lines[-1] = json.dumps(record)
    (run / "sessions.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    html = render_report([run], tmp_path / "r.html").html.read_text(encoding="utf-8")
    assert "TOP-SECRET-CONTENT" not in html
    assert "raw bytes ../secret.txt: missing" in html
    assert "stored excerpt: this field" in html


def test_large_raw_file_is_truncated_with_its_size_stated(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", clean=20, corrupt=1, leak="x" * 20000 + SENTINEL + "tool_calls>")
    html = render_report([run], tmp_path / "r.html").html.read_text(encoding="utf-8")
    size = (run / "raw" / "s0020-t01.sse").stat().st_size
    assert f"({size} bytes; showing the first and last parts, {size - 8000} bytes omitted)" in html
    # The highlight still finds the span: the text is rebuilt from the whole file, not the excerpt.
    assert f"<mark>{SENTINEL}</mark>tool_calls&gt;" in html


def test_cli_report_writes_files_and_the_github_step_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run(tmp_path / "r", name="ci", clean=40, corrupt=3)
    summary = tmp_path / "step.md"
    summary.write_text("earlier step\n", encoding="utf-8")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, err = run_main(capsys, "report", str(run), "-o", str(tmp_path / "out.html"),
                              "--junit", str(tmp_path / "j.xml"))
    assert code == 0, err
    assert (tmp_path / "out.html").exists() and (tmp_path / "j.xml").exists()
    text = summary.read_text(encoding="utf-8")
    assert text.startswith("earlier step\n") and "CORRUPT: 3 of 43 completed sessions" in text
    assert f"report: wrote {tmp_path / 'out.html'}" in out


def test_cli_report_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "report", str(tmp_path / "nope"), "-o", str(tmp_path / "x.html"))
    assert code == 2
    assert re.fullmatch(r"repro: error: .*nope: not a run directory \(no such directory\)\n", err)
    run = make_run(tmp_path / "r", clean=1)
    code, _, err = run_main(capsys, "report", str(run), "-o", str(tmp_path / "no-such-dir" / "x.html"))
    assert code == 2 and err.count("\n") == 1 and "cannot write" in err
    code, _, err = run_main(capsys, "report", str(run), str(run))
    assert code == 2 and "--output is required with several run directories" in err
    (run / "manifest.json").write_text("{}", encoding="utf-8")
    code, _, err = run_main(capsys, "report", str(run))
    assert code == 2 and err.count("\n") == 1 and "manifest.json" in err


def test_gate_stored_by_repro_run_shows_in_html_and_junit(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", name="gated", clean=58, corrupt=2)
    gate = evaluate(run, max_corruption_rate=0.05)
    summary = Summary.model_validate_json((run / "summary.json").read_text(encoding="utf-8"))
    (run / "summary.json").write_text(summary.model_copy(update={"gate": gate.as_record()}).model_dump_json(),
                                      encoding="utf-8")
    result = render_report([run], tmp_path / "r.html", markdown=tmp_path / "s.md", junit=tmp_path / "j.xml")
    html = result.html.read_text(encoding="utf-8")
    assert "Gate: gated" in html and "corruption-rate: INCONCLUSIVE: 2 of 60 completed sessions corrupt" in html
    assert "## repro: CORRUPT: tool-call corruption report" in (tmp_path / "s.md").read_text(encoding="utf-8")
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    assert suite is not None
    names = [(case.get("classname"), case.get("name")) for case in suite.iter("testcase")]
    assert names == [("repro.run", "gated"), ("repro.gate.gated", "finished"), ("repro.gate.gated", "evidence"),
                     ("repro.gate.gated", "corruption-rate")]
    rate = suite.findall("testcase")[3]
    assert rate.find("skipped") is not None
    assert {p.get("name"): p.get("value") for p in rate.iter("property")}["k"] == "2"


def test_empty_run_and_tex_like_names_render(tmp_path: Path) -> None:
    # "$" in a run name or a metric label must not reach matplotlib's mathtext parser (it raises on bad TeX).
    empty = make_run(tmp_path / "empty", name="empty $\\frac{a")
    labels = '"{""model"": ""$x^$""}"'
    odd = make_run(tmp_path / "odd", name="x$^$_", clean=3, corrupt=1,
                   metrics=f"t_s,metric,labels,value\n1,sglang:num_running_reqs,{labels},3\n2,sglang:num_running_reqs,{labels},4\n")
    result = render_report([empty, odd], tmp_path / "r.html")
    assert [run.verdict.headline for run in result.model.runs] == [
        "INCONCLUSIVE: the run recorded no sessions.",
        "CORRUPT: 1 of 4 completed sessions (25%, 95% CI 0.6–81%) returned broken tool-call markup.",
    ]
    # With an empty reference arm there is nothing to compare: p-values are 1, no difference is claimed.
    row = result.model.comparisons[0]
    assert row.result.difference is None and row.p_holm == 1.0
    assert "Server metrics: x$^$_" in result.html.read_text(encoding="utf-8")


def test_vllm_metrics_are_plotted_under_their_own_names(tmp_path: Path) -> None:
    rows = "".join(f"{t},vllm:num_requests_running,{{}},{t}\n{t},vllm:cache_config_info,{{}},1\n" for t in range(1, 4))
    run = make_run(tmp_path / "v", name="v", clean=2, metrics="t_s,metric,labels,value\n" + rows)
    result = render_report([run], tmp_path / "r.html")
    assert "Server metrics: v" in result.html.read_text(encoding="utf-8")
