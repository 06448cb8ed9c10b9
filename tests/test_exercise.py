"""Exercise evidence: what the load made the server do, read from metric scrapes, and the verdicts built on it.

The scrapes are Prometheus expositions as SGLang and vLLM write them, parsed by the scraper's own parser.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import pytest
from rich.console import Console

from repro.errors import UsageError
from repro.report import render_report
from repro.run.gate import evaluate
from repro.run.metrics import parse_samples
from repro.run.pressure import Capacity, from_metrics, from_server_info, parse_factor, plan
from repro.run.runner import RunOptions, execute_run
from repro.sim.launch import SimHandle
from repro.store.exercise import Sample, assess
from repro.workload.scenario import load_workload
from run_builders import make_run

HICACHE_ON = {"enable_hierarchical_cache": True, "disable_cuda_graph": False, "disaggregation_mode": "null"}


def scrapes(*texts: str) -> list[Sample]:
    """One Prometheus exposition per scrape, 2 s apart."""
    return [Sample(2.0 * i, name, json.loads(labels), value)
            for i, text in enumerate(texts) for name, labels, value in parse_samples(text)]


def sglang(prompt: float, device: float, host: float | None, evicted: float, graph: float) -> str:
    """An SGLang exposition: the cached-token counter broken down by source, with no host series until one matched."""
    lines = [
        "# TYPE sglang:prompt_tokens_total counter", f'sglang:prompt_tokens_total{{model_name="m"}} {prompt}',
        "# TYPE sglang:cached_tokens_total counter",
        f'sglang:cached_tokens_total{{cache_source="device",model_name="m"}} {device}',
    ]
    if host is not None:
        lines.append(f'sglang:cached_tokens_total{{cache_source="host",model_name="m"}} {host}')
    lines += ["# TYPE sglang:evicted_tokens_total counter", f'sglang:evicted_tokens_total{{model_name="m"}} {evicted}',
              "# TYPE sglang:cuda_graph_passes_total counter",
              f'sglang:cuda_graph_passes_total{{mode="decode_cuda_graph",model_name="m"}} {graph}']
    return "\n".join(lines) + "\n"


def test_host_series_that_never_appears_is_zero_load_backs_and_hicache_not_exercised() -> None:
    result = assess(scrapes(sglang(100, 10, None, 0, 5), sglang(5000, 3000, None, 0, 90)), HICACHE_ON)
    assert result.facts["host_load_back_tokens"].value == 0
    assert result.facts["host_load_back_tokens"].metric == 'sglang:cached_tokens_total{cache_source="host"}'
    assert result.facts["prefix_cache_hit_rate"].value == (3000 - 10) / (5000 - 100)
    assert result.facts["cuda_graph_passes"].value == 85
    hicache = next(f for f in result.features if f.feature == "HiCache")
    assert hicache.status == "not exercised"
    assert 'sglang:cached_tokens_total{cache_source="host"}' in hicache.line
    assert [f.feature for f in result.idle()] == ["HiCache"]
    # Facts no metric shows are unknown, not 0.
    assert result.facts["pd_transfer_mb"].value is None and result.facts["spec_accept_rate"].value is None


def test_a_host_series_that_appears_mid_run_counted_from_zero() -> None:
    result = assess(scrapes(sglang(100, 10, None, 0, 5), sglang(900, 300, 256, 512, 9)), HICACHE_ON)
    assert result.facts["host_load_back_tokens"].value == 256
    assert result.facts["evicted_tokens"].value == 512
    assert result.facts["prefix_cache_hit_rate"].value == (300 + 256 - 10) / 800
    assert {f.feature: f.status for f in result.features} == {"HiCache": "exercised", "CUDA graph": "exercised"}


def test_a_counter_that_falls_is_a_restarted_server_counted_from_zero() -> None:
    result = assess(scrapes(sglang(100, 10, 50, 0, 5), sglang(200, 20, 90, 0, 6), sglang(40, 5, 30, 0, 1)), HICACHE_ON)
    assert result.facts["host_load_back_tokens"].value == 40 + 30


def test_older_sglang_without_the_breakdown_reads_load_back_tokens() -> None:
    text = ("# TYPE sglang:load_back_tokens_total counter\nsglang:load_back_tokens_total 0\n"
            "# TYPE sglang:evicted_tokens_total counter\nsglang:evicted_tokens_total 0\n")
    result = assess(scrapes(text, text), {"enable_hierarchical_cache": True})
    assert result.facts["host_load_back_tokens"].value == 0
    assert result.facts["host_load_back_tokens"].metric == "sglang:load_back_tokens_total"
    assert result.features[0].status == "not exercised"


def test_a_server_with_no_cache_metrics_says_unknown_never_not_exercised() -> None:
    text = "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 3\n"
    result = assess(scrapes(text, text), HICACHE_ON)
    assert all(fact.value is None for fact in result.facts.values())
    assert {f.feature: f.status for f in result.features} == {"HiCache": "unknown", "CUDA graph": "unknown"}
    assert result.idle() == []
    assert "UNKNOWN" in result.features[0].line
    # No scrape at all (no /metrics): the same.
    assert assess([], HICACHE_ON).idle() == []


def test_vllm_prefix_cache_and_spec_decode_counters() -> None:
    def vllm(queries: float, hits: float, drafts: float, accepted: float) -> str:
        return (
            "# TYPE vllm:prefix_cache_queries counter\n"
            f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}\n'
            "# TYPE vllm:prefix_cache_hits counter\n"
            f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}\n'
            "# TYPE vllm:spec_decode_num_draft_tokens counter\n"
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {drafts}\n'
            "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}\n'
        )

    result = assess(scrapes(vllm(0, 0, 0, 0), vllm(1000, 600, 400, 100)), None)
    assert result.facts["prefix_cache_hit_rate"].value == 0.6
    assert result.facts["spec_accept_rate"].value == 0.25
    assert result.facts["evicted_tokens"].value is None
    # vLLM serves no /server_info: no feature is known to be on, so none is judged.
    assert result.features == []


def test_pd_transfers_and_their_failures() -> None:
    def pd(mb: float, failed: float) -> str:
        return ("# TYPE sglang:kv_transfer_total_mb gauge\n" f"sglang:kv_transfer_total_mb {mb}\n"
                "# TYPE sglang:num_transfer_failed_reqs_total counter\n" f"sglang:num_transfer_failed_reqs_total {failed}\n")

    info = {"disaggregation_mode": "decode"}
    moved = assess(scrapes(pd(0, 0), pd(12.5, 2), pd(3.0, 3)), info)
    assert moved.facts["pd_transfer_mb"].value == 12.5 and moved.facts["pd_transfer_failures"].value == 3
    assert moved.features[0].status == "exercised"
    assert assess(scrapes(pd(0, 0), pd(0, 0)), info).features[0].status == "not exercised"


def test_gate_is_inconclusive_naming_the_idle_feature_and_its_metric(tmp_path: Path) -> None:
    idle = assess(scrapes(sglang(100, 10, None, 0, 5), sglang(5000, 3000, None, 0, 90)), HICACHE_ON)
    result = evaluate(make_run(tmp_path / "idle", clean=200, exercised=idle), max_corruption_rate=0.05)
    assert result.exit_code == 125
    check = next(c for c in result.checks if c.name == "exercised")
    assert check.status == "inconclusive"
    assert check.line == ('exercised: INCONCLUSIVE: HiCache: on but NOT EXERCISED: sglang:cached_tokens_total'
                          '{cache_source="host"} did not rise (tokens loaded back from the host tier: 0)')
    # The rate itself passed: only the exercise makes it inconclusive.
    assert next(c for c in result.checks if c.name == "corruption-rate").status == "pass"
    # The report's banner says the same instead of CLEAN.
    render_report([tmp_path / "idle"], tmp_path / "idle.html")
    page = (tmp_path / "idle.html").read_text(encoding="utf-8")
    assert "INCONCLUSIVE: the load never exercised what it tests (HiCache: on but NOT EXERCISED: " in page
    assert "CLEAN:" not in page


def test_gate_fails_on_corruption_even_when_a_feature_was_idle(tmp_path: Path) -> None:
    idle = assess(scrapes(sglang(100, 10, None, 0, 5), sglang(5000, 3000, None, 0, 90)), HICACHE_ON)
    result = evaluate(make_run(tmp_path / "idle", clean=40, corrupt=20, exercised=idle), max_corruption_rate=0.05)
    assert result.exit_code == 1


def test_gate_passes_when_the_feature_acted_or_nothing_can_tell(tmp_path: Path) -> None:
    acted = assess(scrapes(sglang(100, 10, None, 0, 5), sglang(900, 300, 256, 512, 9)), HICACHE_ON)
    unknown = assess([], HICACHE_ON)
    for name, exercise in (("acted", acted), ("unknown", unknown)):
        result = evaluate(make_run(tmp_path / name, clean=200, exercised=exercise), max_corruption_rate=0.05)
        assert result.exit_code == 0, name


def test_capacity_from_sglang_server_info_and_vllm_cache_config() -> None:
    info = {"max_total_tokens": 700_000, "page_size": 256, "enable_hierarchical_cache": True, "hicache_ratio": 2.0}
    assert from_server_info(info) == Capacity(700_000, "/server_info max_total_tokens", 256, 1_400_000)
    assert from_server_info({**info, "enable_hierarchical_cache": False}).host_tokens is None
    assert from_server_info({"version": "x"}) is None and from_server_info(None) is None
    # The scheduler's own count wins over the --max-total-tokens cap (often unset).
    real = {"max_total_tokens": None, "internal_states": [{"max_total_num_tokens": 812_544}], "page_size": 256}
    assert from_server_info(real) == Capacity(812_544, "/server_info max_total_num_tokens", 256)
    text = ('# TYPE vllm:cache_config_info gauge\n'
            'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
            'engine="0",num_gpu_blocks="40000"} 1.0\n')
    assert from_metrics(text) == Capacity(640_000, "vllm:cache_config_info num_gpu_blocks x block_size", 16)
    assert from_metrics("garbage {") is None


def test_pressure_sizes_each_session_to_overflow_the_pool_and_warns_when_a_load_cannot() -> None:
    workload = load_workload(None).workload
    pool = Capacity(700_000, "test", 256, 1_400_000)
    unsized = plan(pool, workload, active=60, turns=12, factor=None)
    assert unsized.context_tokens == 0 and unsized.working_set < 700_000
    assert unsized.warning is not None and "cannot make the server evict" in unsized.warning
    sized = plan(pool, workload, active=60, turns=12, factor=2.0)
    assert sized.warning is None and 2 * 700_000 <= sized.working_set < 2 * 700_000 + 60
    assert any("60 sessions at once" in line for line in sized.lines)
    # A few sessions cannot hold two pools in documents of half a pool: capped, and said so.
    capped = plan(pool, workload, active=2, turns=12, factor=2.0)
    assert capped.context_tokens == 350_000 and any("capped" in line for line in capped.lines)
    assert parse_factor("auto") == 2.0 and parse_factor(None) is None and parse_factor("3") == 3.0
    for bad in ("0.5", "x", "inf", "nan"):
        with pytest.raises(UsageError, match="--pressure must be auto, off or a factor above 1"):
            parse_factor(bad)


def _run(base_url: str, out: Path, **options: object) -> None:
    execute_run(RunOptions(base_url=base_url, out=out, timeout=300, turn_timeout=120, **options),
                console=Console(quiet=True), live=False, report=False)


def test_a_big_pool_is_not_exercised_and_pressure_makes_it_load_back(sim_server: Callable[..., SimHandle],
                                                                     tmp_path: Path) -> None:
    # A device pool that these sessions fit in: nothing is evicted, HiCache never loads back.
    # On the virtual clock: whether the sized load evicts and loads back is the seed's, at any machine load.
    sim = sim_server("--enable-hierarchical-cache", "--clock", "virtual", "--max-total-tokens", "200000")
    _run(sim.base_url, tmp_path / "idle", sessions=8, turns=4)
    idle = json.loads((tmp_path / "idle" / "summary.json").read_text())
    assert idle["exercised"]["facts"]["host_load_back_tokens"]["value"] == 0
    assert idle["inconclusive"] and any("HiCache: on but NOT EXERCISED" in r for r in idle["inconclusive_reasons"])
    gate = evaluate(tmp_path / "idle", max_corruption_rate=0.5, min_completed=1)
    assert gate.exit_code == 125 and any(c.name == "exercised" and c.status == "inconclusive" for c in gate.checks)
    # The same server, the load sized to it: the sessions' own prefixes evict one another and come back.
    _run(sim.base_url, tmp_path / "sized", sessions=8, turns=4, pressure="auto", name="sized")
    sized = json.loads((tmp_path / "sized" / "summary.json").read_text())
    facts = {key: fact["value"] for key, fact in sized["exercised"]["facts"].items()}
    assert facts["evicted_tokens"] > 0 and facts["host_load_back_tokens"] > 0
    assert [f["status"] for f in sized["exercised"]["features"]] == ["exercised", "exercised"]
    # The report states it, and plots the turns by prompt size and cached share, and the metrics over time.
    render_report([tmp_path / "idle", tmp_path / "sized"], tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    # 8 sessions are too few anyway: that is the banner's headline, the idle feature one of its lines.
    assert "<p>Not exercised: HiCache: on but NOT EXERCISED: sglang:cached_tokens_total{cache_source=&#34;host&#34;}" in page
    assert page.count("What the load made the server do") == 2
    assert "<strong>exercised</strong>: HiCache: exercised: tokens loaded back from the host tier" in page
    assert "Corruption by prompt size and by cached-token share" in page and "Server metrics: sized" in page


def test_a_server_without_metrics_says_unknown(sim_server: Callable[..., SimHandle], tmp_path: Path) -> None:
    sim = sim_server("--enable-hierarchical-cache", "--time-scale", "0", "--no-enable-metrics")
    _run(sim.base_url, tmp_path / "run", sessions=4, turns=2)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert all(fact["value"] is None for fact in summary["exercised"]["facts"].values())
    assert {f["feature"]: f["status"] for f in summary["exercised"]["features"]} == {
        "HiCache": "unknown", "CUDA graph": "unknown"}
    assert not any("NOT EXERCISED" in reason for reason in summary["inconclusive_reasons"])


def test_exercise_conditions_parse_and_evaluate_on_the_scrapes() -> None:
    from repro.store.conditions import ConditionError, evaluate as holds, parse
    from repro.store.exercise import Scrapes

    scraped = Scrapes(scrapes(sglang(100, 10, None, 0, 5), sglang(900, 300, 256, 512, 9)))
    assert holds(parse("host_load_back_tokens > 0"), scraped).held
    outcome = holds(parse('delta(sglang:cached_tokens_total{cache_source="host"}) >= 300'), scraped)
    assert not outcome.held and outcome.value == 256
    assert outcome.line() == ('delta(sglang:cached_tokens_total{cache_source="host"}) >= 300 does not hold '
                              '(delta(sglang:cached_tokens_total{cache_source="host"}) = 256)')
    # A labelled series never incremented is 0; a metric name never exported is an error.
    assert holds(parse('delta(sglang:cached_tokens_total{cache_source="storage"}) == 0'), scraped).held
    assert holds(parse("peak(sglang:evicted_tokens_total) == 512"), scraped).held
    for text, message in (("delta(sglang:nope_total) > 0", "exports no metric 'sglang:nope_total'"),
                          ("pd_transfer_mb > 0", "exports no sglang:kv_transfer_total_mb")):
        with pytest.raises(ConditionError, match=re.escape(message)):
            holds(parse(text), scraped)
    for bad in ("host_load_back_tokens", "loadbacks > 0", "delta(x{a=1}) > 0", "host_load_back_tokens > zero"):
        with pytest.raises(ConditionError):
            parse(bad)
