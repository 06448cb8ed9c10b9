"""The HiCache / index-K race, end to end: `repro run`'s sessions against real simulators over HTTP.

The fault log is the ground truth. The raw verdict (`check_raw` on the damaged text) catches every
logged fault, so the turns the harness flags are exactly the logged faults; the parsed verdict alone catches
what the server's parser lets through, exactly the faults the log calls visible. The flag effects are asserted on counts, never on timing.

Counts are bounded only on the virtual clock (`--clock virtual`), where the same seed gives the same faults
at any machine load; the real-clock tests assert only what holds whatever the schedule (a gate or HiCache
off never corrupts, a lone session never loads back).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from repro.run.options import RunOptions
from repro.run.runner import execute_run
from repro.sim.faults import PARSER_EFFECTS, read_fault_log
from repro.store.records import SessionRecord

FAULTY = ("--enable-hierarchical-cache", "--index-k-dtype", "bf16")
FAST = ("--time-scale", "0.1")
"""Half the default real time per simulated second (real clock): a faster test."""
VIRTUAL = ("--clock", "virtual")
"""The deterministic clock: every count bound below is on it."""


def _run(base_url: str, out: Path, sessions: int) -> list[SessionRecord]:
    options = RunOptions(base_url=base_url, sessions=sessions, out=out, timeout=600, turn_timeout=300)
    execute_run(options, console=Console(quiet=True), live=False)
    with open(out / "sessions.jsonl", encoding="utf-8") as fh:
        return [SessionRecord.model_validate_json(line) for line in fh]


def _counter(url: str, name: str) -> float:
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text)}
    return next(s.value for s in families[name].samples if s.name.endswith("_total"))


def _flagged(records: list[SessionRecord], verdict: str = "verdict") -> set[str]:
    return {t.request_id for r in records for t in r.turns if getattr(t, verdict) == "corrupt" and t.request_id}


def test_bf16_hicache_at_60_sessions_corrupts_and_fault_log_matches_verdicts(sim_server, tmp_path: Path) -> None:
    log = tmp_path / "faults.jsonl"
    sim = sim_server(*FAULTY, *VIRTUAL, "--fault-log", str(log))
    records = _run(sim.base_url, tmp_path / "run", 60)
    faults = read_fault_log(log)
    assert {r.outcome for r in records} <= {"clean", "corrupt"}
    # Every injected fault is corrupt in the raw text, and the harness (observing both by default) flags each
    # one and nothing else; its verdict on the parsed message alone flags exactly the faults the parser let through.
    assert faults and all(f.raw_verdict == "corrupt" for f in faults)
    assert all(f.parser_effect in PARSER_EFFECTS and f.tool_parser == "sglang-0.5.23" for f in faults)
    visible = [f for f in faults if f.parser_effect == "visible"]
    assert {f.request_id for f in faults} == _flagged(records) == _flagged(records, "raw_verdict")
    assert {f.request_id for f in visible} == _flagged(records, "parsed_verdict")
    assert all(f.parsed_verdict == ("corrupt" if f.parser_effect == "visible" else "clean") for f in faults)
    assert not any(t.verdict == "suspect" for r in records for t in r.turns)
    # The fault log rounds times to the microsecond: a read that beat its copy by less shows as a tie.
    assert all(f.read_time_s <= f.copy_done_s and 0 <= f.layer for f in faults)
    assert all(f.load_back_tokens > 0 for f in faults)
    corrupt_sessions = sum(r.outcome == "corrupt" for r in records)
    # The calibration aims at 10-20% of 60 sessions; on the virtual clock the count is fixed by the seed.
    assert 6 <= corrupt_sessions <= 12
    # Faults group by conversation: the task's session identity.
    assert len({f.conversation for f in faults}) == corrupt_sessions
    assert httpx.get(f"{sim.url}/debug/faults", timeout=10).json()["faults"] == [json.loads(line) for line in log.read_text().splitlines()]
    # Every step had its sessions in: the schedule is the seed's, not the machine's.
    assert httpx.get(f"{sim.url}/sim/clock", timeout=10).json()["timeouts"] == 0
    assert _counter(sim.url, "sglang:load_back_tokens") > 0


def test_a_load_sized_to_a_large_pool_corrupts_at_about_the_usual_rate(sim_server, tmp_path: Path) -> None:
    # A pool the default workload never fills; --pressure auto gives each session a prefix of about 160k
    # tokens, which must come back from the host tier. Long load-backs stream faster than short ones, so
    # these replays race about as often as the default run's short ones, not every time.
    log = tmp_path / "faults.jsonl"
    sim = sim_server(*FAULTY, *VIRTUAL, "--time-scale", "0", "--max-total-tokens", "2500000", "--fault-log", str(log))
    options = RunOptions(base_url=sim.base_url, sessions=30, out=tmp_path / "run", timeout=600, turn_timeout=300,
                         pressure="auto")
    execute_run(options, console=Console(quiet=True), live=False, report=False)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["exercised"]["facts"]["host_load_back_tokens"]["value"] > 1_000_000
    faults = read_fault_log(log)
    assert faults and min(f.load_back_tokens for f in faults) > 100_000
    # The default run's 10-20%: 5 of 30 at this seed on the virtual clock.
    assert 2 <= summary["counts"]["corrupt"] <= 8


def test_fp8_index_k_at_60_sessions_essentially_never_corrupts(sim_server, tmp_path: Path) -> None:
    sim = sim_server("--enable-hierarchical-cache", "--index-k-dtype", "fp8", *VIRTUAL)
    records = _run(sim.base_url, tmp_path / "run", 60)
    # Half the index-K bytes halve the copy window: only the far tail of load-back size could still race.
    assert sum(r.outcome == "corrupt" for r in records) <= 1
    assert {r.outcome for r in records} <= {"clean", "corrupt"}
    # The load-backs happened: the absence of corruption is the dtype's doing, not a lack of load.
    assert _counter(sim.url, "sglang:load_back_tokens") > 0


def test_fp8_races_under_pressure_on_a_small_pool_only_where_load_backs_share_the_link(sim_server, tmp_path: Path) -> None:
    # --pressure auto on the default 64,000-token pool: every turn of all 8 sessions loads its whole ~8,500-token
    # prefix back, several in one batch behind a few hundred new tokens. Two such copies queued on the link move
    # as many index-K bytes at fp8 as one does at bf16, and outlast the forward's lead: fp8's margin is the
    # factor of two in bytes, not a guarantee (docs/sim.md). A load-back alone never races at fp8.
    corrupt, faults = {}, {}
    for dtype in ("fp8", "bf16"):
        log = tmp_path / f"{dtype}-faults.jsonl"
        sim = sim_server("--enable-hierarchical-cache", "--index-k-dtype", dtype, *VIRTUAL, "--fault-log", str(log))
        options = RunOptions(base_url=sim.base_url, sessions=8, out=tmp_path / dtype, timeout=600, turn_timeout=300,
                             pressure="auto")
        execute_run(options, console=Console(quiet=True), live=False, report=False)
        corrupt[dtype] = json.loads((tmp_path / dtype / "summary.json").read_text())["counts"]["corrupt"]
        faults[dtype] = read_fault_log(log)
        assert httpx.get(f"{sim.url}/sim/clock", timeout=10).json()["timeouts"] == 0
    assert faults["fp8"] and all(f.link_share >= 2 and f.index_k_dtype == "fp8" for f in faults["fp8"])
    assert any(f.link_share == 1 for f in faults["bf16"])
    # 4 and 8 of 8 at this seed on the virtual clock.
    assert 1 <= corrupt["fp8"] < corrupt["bf16"]


def test_index_k_gate_at_60_sessions_never_corrupts(sim_server, tmp_path: Path) -> None:
    sim = sim_server(*FAULTY, "--index-k-gate", *FAST)
    records = _run(sim.base_url, tmp_path / "run", 60)
    assert [r.outcome for r in records] == ["clean"] * 60
    assert httpx.get(f"{sim.url}/debug/faults", timeout=10).json()["faults"] == []
    assert _counter(sim.url, "sglang:load_back_tokens") > 0


def test_hicache_off_has_no_load_back_and_recomputes_more(sim_server, tmp_path: Path) -> None:
    sim = sim_server("--index-k-dtype", "bf16", *FAST)
    records = _run(sim.base_url, tmp_path / "run", 60)
    assert all(r.outcome == "clean" for r in records)
    assert _counter(sim.url, "sglang:load_back_tokens") == 0
    assert _counter(sim.url, "sglang:evicted_tokens") > 0
    hit_off = _counter(sim.url, "sglang:cached_tokens") / _counter(sim.url, "sglang:prompt_tokens")
    # With HiCache the same evictions land in host memory and come back as cache hits.
    assert hit_off < 0.6


def test_one_session_alone_never_loads_back(sim_server, tmp_path: Path) -> None:
    sim = sim_server(*FAULTY)
    records = _run(sim.base_url, tmp_path / "run", 1)
    assert records[0].outcome == "clean" and len(records[0].turns) >= 3
    assert _counter(sim.url, "sglang:load_back_tokens") == 0
    assert httpx.get(f"{sim.url}/debug/faults", timeout=10).json()["faults"] == []
