"""A bisect probe consults the run's exercise evidence: a load that never made the target's HiCache load a
page back cannot call the commit good. Real simulators on the virtual clock, real `repro run` rounds."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from repro.bisect.probe import ProbeSettings, not_decided_by, run_probe, sim_plan

FLAGS = ["--enable-hierarchical-cache", "--index-k-dtype", "fp8", "--time-scale", "0", "--clock", "virtual"]
LOAD = {"turns": 4, "timeout": 300, "turn_timeout": 120}


def test_a_probe_whose_load_never_exercised_hicache_is_inconclusive_not_good(tmp_path: Path) -> None:
    settings = ProbeSettings(load=LOAD, round_sessions=6, max_rounds=1, mode="fixed", good_rate=0.02)
    plan = settings.plan(0.5, 2)
    # A device pool these sessions fit in: nothing is evicted, nothing comes back from the host tier.
    idle = run_probe(sim_plan([*FLAGS, "--max-total-tokens", "200000"], {}), plan, LOAD, tmp_path / "idle",
                     seed=0, console=Console(quiet=True))
    assert idle.verdict == "inconclusive" and idle.corrupt == 0
    assert idle.message is not None and idle.message.startswith("HiCache: on but NOT EXERCISED")
    # The same probe with the load sized to the pool: HiCache acts, and the fp8 index-K keeps it clean.
    sized = {**LOAD, "pressure": "auto"}
    acted = run_probe(sim_plan([*FLAGS, "--max-total-tokens", "200000"], {}), plan, sized, tmp_path / "sized",
                      seed=0, console=Console(quiet=True))
    assert acted.verdict == "good", acted.message


def test_only_corruption_decides_a_probe_that_left_a_feature_idle() -> None:
    assert not_decided_by("good", 0) and not_decided_by("undecided", 3) and not_decided_by("continue", 0)
    assert not not_decided_by("bad", 2) and not not_decided_by("continue", 1)
    assert not not_decided_by("inconclusive", 0)
