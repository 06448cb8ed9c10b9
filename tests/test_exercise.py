"""Exercise evidence: what the load made the server do, read from metric scrapes, and the verdicts built on it.

The scrapes are Prometheus expositions as SGLang and vLLM write them, parsed by the scraper's own parser.
"""

from __future__ import annotations

import json
from pathlib import Path

from repro.run.gate import evaluate
from repro.run.metrics import parse_samples
from repro.store.exercise import Sample, assess
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
