"""The pure parts of `repro run`: workload files, the sandbox, the summary, the metrics parser, options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.errors import UsageError
from repro.run.metrics import metrics_url, parse_samples, server_root
from repro.run.options import RunOptions
from repro.store.records import SessionRecord, TurnRecord
from repro.store.summary import summarize
from repro.workload import sandbox
from repro.workload.scenario import load_workload, parse_workload

ROOT = Path(__file__).resolve().parent.parent


def test_packaged_default_is_the_experiments_file() -> None:
    loaded = load_workload()
    assert loaded.workload.name == "agentic_coding"
    assert loaded.workload.tool_names() == ["read_file", "grep", "list_dir", "edit_file", "run_tests", "finish"]
    assert (ROOT / "experiments" / "agentic_coding.yaml").read_bytes() == (ROOT / "repro/workload/builtin/agentic_coding.yaml").read_bytes()
    assert len(loaded.workload.system_prompt) > 2000


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").glob("*.yaml")), ids=lambda p: p.name)
def test_every_experiment_validates(path: Path) -> None:
    workload = load_workload(path).workload
    for tool in workload.tools:
        assert tool.function.parameters["type"] == "object"


def test_workload_error_names_line_and_field() -> None:
    text = "name: x\nsystem_prompt: hi\ntools:\n  - function: {name: f}\ntasks: [t]\nmax_tokens: -1\n"
    with pytest.raises(UsageError, match=r"^w\.yaml:6: max_tokens: "):
        parse_workload(text, source="w.yaml")
    with pytest.raises(UsageError, match="colour"):
        parse_workload(text.replace("max_tokens: -1", "colour: red"), source="w.yaml")
    with pytest.raises(UsageError, match="duplicate tool name"):
        parse_workload(text.replace("tasks:", "  - function: {name: f}\ntasks:"), source="w.yaml")
    with pytest.raises(UsageError, match="cannot read"):
        load_workload("/nonexistent/workload.yaml")


def test_task_text_is_unique_per_session() -> None:
    workload = load_workload().workload
    texts = {workload.task_for(i, seed=7) for i in range(50)}
    assert len(texts) == 50


def test_sandbox_is_deterministic_and_sized() -> None:
    workload = load_workload().workload
    first = sandbox.execute(workload, "read_file", json.dumps({"path": "src/cache/evict.py"}))
    again = sandbox.execute(workload, "read_file", '{"path": "src/cache/evict.py"}')
    other = sandbox.execute(workload, "read_file", '{"path": "src/other.py"}')
    assert first == again != other
    assert len(first.splitlines()) == workload.sandbox.file_lines + 1
    assert max(len(line) for line in first.splitlines()[1:]) <= workload.sandbox.line_width + 7
    grep = sandbox.execute(workload, "grep", '{"pattern": "evict"}')
    assert grep.startswith(f"{workload.sandbox.grep_matches} matches")
    assert sandbox.execute(workload, "nope", "{}").startswith("error: unknown tool")
    assert sandbox.execute(workload, "grep", "{not json").startswith("error:")
    assert sandbox.execute(workload, "grep", "[1, 2]").startswith("error:")


def _session(i: int, outcome: str, *, wedged: bool = False, verdicts: tuple[str, ...] = ("clean",)) -> SessionRecord:
    turns = [
        TurnRecord(index=n, status="ok", verdict=v, start_s=n, ttft_s=0.1 * (n + 1), e2e_s=0.5, queue_s=0.0)  # type: ignore[arg-type]
        for n, v in enumerate(verdicts)
    ]
    return SessionRecord(session_id=i, task="t", outcome=outcome, wedged=wedged, start_s=0, end_s=2.0, turns=turns)  # type: ignore[arg-type]


def test_summary_counts_rates_and_bounds() -> None:
    sessions = (
        [_session(i, "clean") for i in range(49)]
        + [_session(49 + i, "corrupt", verdicts=("clean", "corrupt")) for i in range(11)]
        + [_session(60 + i, "timeout", wedged=i == 0) for i in range(3)]
        + [_session(63, "error", verdicts=())]
        + [_session(64, "clean", verdicts=("suspect",))]
    )
    summary = summarize(sessions, loop_lag_s=[0.001, 0.002], duration_s=12.0)
    assert summary.counts == {"clean": 50, "corrupt": 11, "timeout": 3, "error": 1, "interrupted": 0}
    assert summary.sessions == 65 and summary.wedged == 1 and summary.suspect_sessions == 1
    rate = summary.corruption_rate
    assert (rate.k, rate.n, rate.method) == (11, 61, "clopper-pearson")
    assert rate.ci_low < 11 / 61 < rate.ci_high
    assert summary.worst_case is not None and summary.worst_case.k == 14 and summary.worst_case.n == 64
    assert summary.best_case is not None and summary.best_case.k == 11
    assert summary.turn_counts == {"clean": 63, "corrupt": 11, "suspect": 1}
    assert summary.latency["ttft_s"].count == 75
    assert summary.loop_lag is not None and summary.loop_lag.max == 0.002
    assert not summary.inconclusive


def test_summary_of_mostly_timeouts_is_inconclusive_not_zero() -> None:
    sessions = [_session(i, "timeout") for i in range(50)] + [_session(50 + i, "clean") for i in range(10)]
    summary = summarize(sessions)
    assert summary.corruption_rate.k == 0 and summary.corruption_rate.n == 10
    assert summary.inconclusive and summary.inconclusive_reasons


def test_metrics_parsing_and_url() -> None:
    text = '# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name="m"} 3\n# TYPE x_total counter\nx_total 7\n'
    rows = parse_samples(text)
    assert ("sglang:num_running_reqs", '{"model_name": "m"}', 3.0) in rows
    assert metrics_url("http://h:1/v1") == "http://h:1/metrics"
    assert metrics_url("http://h:1/") == "http://h:1/metrics"
    assert server_root("http://h:1/v1/") == "http://h:1"


def test_options_validation_names_the_field(tmp_path: Path) -> None:
    assert RunOptions.parse({"extra_body": '{"top_k": 1}'}).extra_body == {"top_k": 1}
    assert RunOptions.parse({"sim_args": "--seed 3 --time-scale 0.5"}).sim_args == ["--seed", "3", "--time-scale", "0.5"]
    with pytest.raises(UsageError, match="extra_body"):
        RunOptions.parse({"extra_body": "[1]"})
    with pytest.raises(UsageError, match="sessions"):
        RunOptions.parse({"sessions": 0})
    with pytest.raises(UsageError, match="base_url"):
        RunOptions.parse({"base_url": "localhost:8000"})
    with pytest.raises(UsageError, match="bogus"):
        RunOptions.parse({"bogus": 1})
    config = tmp_path / "run.yaml"
    config.write_text("sessions: 5\nturn-timeout: 9\nseed: 4\n")
    merged = RunOptions.from_sources(config, {"sessions": 7, "seed": None})
    assert (merged.sessions, merged.turn_timeout, merged.seed) == (7, 9.0, 4)
    config.write_text("- not a mapping\n")
    with pytest.raises(UsageError, match="mapping"):
        RunOptions.from_sources(config, {})
