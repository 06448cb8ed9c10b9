"""The side channels of two runs, read from their records and compared (repro.stats.sidechannels).

Per run: the `finish_reason` of every turn that got a response, each session's mean completion tokens
per turn, and speculative-decoding acceptance from metrics.csv where the server exports it (vLLM's
accepted and draft token counters, else SGLang's acceptance-rate gauge as sampled).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from repro.stats.sidechannels import ChannelTest, acceptance_counts_shift, flag, mix_shift, rank_shift
from repro.store.exercise import Scrapes, read_samples
from repro.store.records import SessionRecord

VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_DRAFTED = "vllm:spec_decode_num_draft_tokens_total"
SGLANG_ACCEPT = "sglang:spec_accept_rate"


@dataclass(frozen=True)
class Channels:
    """What one run showed on each side channel."""

    finish_reasons: dict[str, int]
    lengths: list[float]
    """Per session with token counts: mean completion tokens per turn."""
    accepted: int | None = None
    drafted: int | None = None
    accept_samples: list[float] | None = None


def finish_mix(sessions: Sequence[SessionRecord]) -> dict[str, int]:
    """Turns per finish_reason, over the turns that got a response ("none" when the server sent none)."""
    return dict(Counter(turn.finish_reason or "none" for s in sessions for turn in s.turns if turn.status == "ok"))


def session_lengths(sessions: Sequence[SessionRecord]) -> list[float]:
    """Each session's mean completion tokens per turn (sessions whose server reported no counts are left out)."""
    lengths = []
    for session in sessions:
        counts = [t.completion_tokens for t in session.turns if t.status == "ok" and t.completion_tokens is not None]
        if counts:
            lengths.append(sum(counts) / len(counts))
    return lengths


def channels_of(sessions: Sequence[SessionRecord], run_dir: Path | None) -> Channels:
    """A run's side channels; acceptance only where its metrics.csv holds the metrics."""
    accepted = drafted = None
    samples = None
    if run_dir is not None:
        scrapes = Scrapes(read_samples(Path(run_dir) / "metrics.csv"))
        up, down = scrapes.delta(VLLM_ACCEPTED), scrapes.delta(VLLM_DRAFTED)
        if up is not None and down is not None:
            accepted, drafted = int(up), int(down)
        elif scrapes.has(SGLANG_ACCEPT):
            samples = [value for points in scrapes.series[SGLANG_ACCEPT].values() for _, value in points]
    return Channels(finish_mix(sessions), session_lengths(sessions), accepted, drafted, samples)


def compare_channels(one: Channels, two: Channels, *, alpha: float = 0.05) -> list[ChannelTest]:
    """Every side channel of run one against run two, Holm-adjusted over those tested."""
    return flag(channel_tests(one, two), alpha=alpha)


def channel_tests(one: Channels, two: Channels) -> list[ChannelTest]:
    """Every side channel of run one against run two, unadjusted (a matrix adjusts over all its comparisons).

    Acceptance is compared only when both runs carry the same kind of metric; a run without it gives none.
    """
    tests = [mix_shift(one.finish_reasons, two.finish_reasons),
             rank_shift(one.lengths, two.lengths, channel="output length", unit="tokens/turn per session")]
    if one.drafted is not None and two.drafted is not None:
        tests.append(acceptance_counts_shift(one.accepted or 0, one.drafted, two.accepted or 0, two.drafted))
    elif one.accept_samples and two.accept_samples:
        tests.append(rank_shift(one.accept_samples, two.accept_samples, channel="speculative acceptance",
                                unit="acceptance rate per scrape"))
    return tests
