"""Did the load exercise what the server has on? Facts from the metric scrapes, and a status per feature.

Pure apart from `read_samples`. The facts are read from metric names that SGLang 0.5.x and vLLM 0.33
export (docs/exercise.md lists them); a fact no exported metric shows is unknown (`None`), never 0.

Counters are read as deltas between the first and the last scrape of the run. A labelled Prometheus
counter has no series until it is first incremented (SGLang's `cached_tokens_total{cache_source="host"}`
appears only once the host tier matched), so a series that shows up after the first scrape started at 0.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from repro.store.records import Exercise, ExerciseFact, ExerciseStatus, FeatureExercise


@dataclass(frozen=True)
class Sample:
    t: float
    name: str
    labels: Mapping[str, str]
    value: float


def read_samples(path: Path) -> list[Sample]:
    """metrics.csv's rows (elapsed_s, metric, labels, value); unreadable rows are skipped, a missing file is empty."""
    samples: list[Sample] = []
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as file:
            for row in csv.DictReader(file):
                try:
                    labels = json.loads(row.get("labels") or "{}")
                    samples.append(Sample(float(row["elapsed_s"]), str(row["metric"]),
                                          {str(k): str(v) for k, v in labels.items()}, float(row["value"])))
                except (KeyError, TypeError, ValueError, AttributeError):
                    continue
    except OSError:
        return []
    return samples


def _label_text(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""


def metric_text(name: str, labels: Mapping[str, str] | None = None) -> str:
    """`name{k="v"}`, as Prometheus writes a series."""
    return name + _label_text(labels or {})


class Scrapes:
    """The samples of one run, indexed by metric name and label set."""

    def __init__(self, samples: Iterable[Sample]) -> None:
        self.series: dict[str, dict[tuple[tuple[str, str], ...], list[tuple[float, float]]]] = defaultdict(dict)
        self.first_t: float | None = None
        for sample in samples:
            key = tuple(sorted(sample.labels.items()))
            self.series[sample.name].setdefault(key, []).append((sample.t, sample.value))
            self.first_t = sample.t if self.first_t is None else min(self.first_t, sample.t)
        for by_labels in self.series.values():
            for points in by_labels.values():
                points.sort()

    def has(self, name: str) -> bool:
        return name in self.series

    def _matching(self, name: str, labels: Mapping[str, str]) -> list[list[tuple[float, float]]]:
        wanted = set(labels.items())
        return [points for key, points in self.series.get(name, {}).items() if wanted <= set(key)]

    def delta(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """How much a counter rose over the run, summed over the series that carry `labels`; None if never exported.

        A series that appeared after the first scrape started at 0; a fall (a restarted server) counts from 0.
        """
        if not self.has(name):
            return None
        total = 0.0
        for points in self._matching(name, labels or {}):
            previous = 0.0 if points[0][0] > (self.first_t or 0.0) else points[0][1]
            for _, value in points:
                total += value - previous if value >= previous else value
                previous = value
        return total

    def peak(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """The largest value a gauge showed; None if never exported."""
        values = [value for points in self._matching(name, labels or {}) for _, value in points]
        return max(values) if values else None

    def label_values(self, name: str, label: str) -> set[str]:
        return {dict(key)[label] for key in self.series.get(name, {}) if label in dict(key)}


def _fact(value: float | None, metric: str) -> ExerciseFact:
    return ExerciseFact(value=value, metric=metric)


def _first_known(*candidates: tuple[float | None, str]) -> ExerciseFact:
    """The first candidate whose metric the server exports; unknown (naming every metric looked for) otherwise."""
    for value, metric in candidates:
        if value is not None:
            return _fact(value, metric)
    return ExerciseFact(value=None, metric=" or ".join(metric for _, metric in candidates))


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return top / bottom if top is not None and bottom else None


CACHED = "sglang:cached_tokens_total"
HOST = {"cache_source": "host"}


def _host_load_backs(s: Scrapes) -> ExerciseFact:
    # SGLang with the per-source breakdown: a server that reports any source and never "host" loaded nothing back.
    if s.label_values(CACHED, "cache_source"):
        return _fact(s.delta(CACHED, HOST), metric_text(CACHED, HOST))
    return _first_known(
        (s.delta("sglang:load_back_tokens_total"), "sglang:load_back_tokens_total"),
        (None, metric_text(CACHED, HOST)),
    )


def _pd_transfer_mb(s: Scrapes) -> ExerciseFact:
    return _first_known((s.peak("sglang:kv_transfer_total_mb"), "sglang:kv_transfer_total_mb (peak)"))


def _pd_failures(s: Scrapes) -> ExerciseFact:
    transfer, bootstrap = s.delta("sglang:num_transfer_failed_reqs_total"), s.delta("sglang:num_bootstrap_failed_reqs_total")
    if transfer is None and bootstrap is None:
        return ExerciseFact(metric="sglang:num_transfer_failed_reqs_total")
    return _fact((transfer or 0.0) + (bootstrap or 0.0),
                 "sglang:num_transfer_failed_reqs_total + sglang:num_bootstrap_failed_reqs_total")


def _spec_accept_rate(s: Scrapes) -> ExerciseFact:
    vllm = _ratio(s.delta("vllm:spec_decode_num_accepted_tokens_total"), s.delta("vllm:spec_decode_num_draft_tokens_total"))
    return _first_known(
        (s.peak("sglang:spec_accept_rate"), "sglang:spec_accept_rate (peak)"),
        (vllm, "vllm:spec_decode_num_accepted_tokens_total / vllm:spec_decode_num_draft_tokens_total"),
    )


FACTS: dict[str, Callable[[Scrapes], ExerciseFact]] = {
    "evicted_tokens": lambda s: _first_known((s.delta("sglang:evicted_tokens_total"), "sglang:evicted_tokens_total")),
    "host_load_back_tokens": _host_load_backs,
    "prefix_cache_hit_rate": lambda s: _first_known(
        (_ratio(s.delta(CACHED), s.delta("sglang:prompt_tokens_total")), f"{CACHED} / sglang:prompt_tokens_total"),
        (_ratio(s.delta("vllm:prefix_cache_hits_total"), s.delta("vllm:prefix_cache_queries_total")),
         "vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total"),
    ),
    "pd_transfer_mb": _pd_transfer_mb,
    "pd_transfer_failures": _pd_failures,
    "cuda_graph_passes": lambda s: _first_known((
        s.delta("sglang:cuda_graph_passes_total", {"mode": "decode_cuda_graph"}),
        metric_text("sglang:cuda_graph_passes_total", {"mode": "decode_cuda_graph"}),
    )),
    "spec_accept_rate": _spec_accept_rate,
}
"""Every fact, by the key summary.json's `exercised.facts` uses."""

FACT_WORDS: dict[str, str] = {
    "evicted_tokens": "tokens evicted from the device cache",
    "host_load_back_tokens": "tokens loaded back from the host tier",
    "prefix_cache_hit_rate": "prefix-cache hit rate",
    "pd_transfer_mb": "largest PD KV transfer (MB)",
    "pd_transfer_failures": "PD transfer failures",
    "cuda_graph_passes": "decode passes run as CUDA graphs",
    "spec_accept_rate": "speculative-decoding acceptance rate",
}


@dataclass(frozen=True)
class FeatureRule:
    """A feature `/server_info` can show on, and the fact that must be above 0 once it acted."""

    feature: str
    is_on: Callable[[Mapping[str, Any]], bool]
    fact: str


FEATURES: tuple[FeatureRule, ...] = (
    FeatureRule("HiCache", lambda info: info.get("enable_hierarchical_cache") is True, "host_load_back_tokens"),
    FeatureRule("PD disaggregation", lambda info: info.get("disaggregation_mode") in ("prefill", "decode"),
                "pd_transfer_mb"),
    FeatureRule("CUDA graph", lambda info: info.get("disable_cuda_graph") is False, "cuda_graph_passes"),
    FeatureRule("speculative decoding", lambda info: bool(info.get("speculative_algorithm")), "spec_accept_rate"),
)
"""The run-level checks. The overlap schedule has none: no metric shows it acting."""


def fmt_value(value: float | None) -> str:
    if value is None:
        return "unknown"
    return f"{value:.1%}" if 0 < value < 1 else f"{value:,.0f}" if value == int(value) else f"{value:,.2f}"


def judge(rule: FeatureRule, fact: ExerciseFact) -> FeatureExercise:
    status: ExerciseStatus
    metric = fact.metric or ""
    if fact.value is None:
        status = "unknown"
        line = f"{rule.feature}: on, exercise UNKNOWN: the server exports no {metric}"
    elif fact.value > 0:
        status = "exercised"
        line = f"{rule.feature}: exercised: {FACT_WORDS[rule.fact]} {fmt_value(fact.value)} ({metric})"
    else:
        status = "not exercised"
        line = f"{rule.feature}: on but NOT EXERCISED: {metric} did not rise ({FACT_WORDS[rule.fact]}: 0)"
    return FeatureExercise(feature=rule.feature, status=status, fact=rule.fact, metric=metric, line=line)


def assess(samples: Iterable[Sample], server_info: Mapping[str, Any] | None) -> Exercise:
    """The `exercised` block of a run from its metric samples and the `/server_info` it recorded."""
    scrapes = Scrapes(samples)
    facts = {key: read(scrapes) for key, read in FACTS.items()}
    info = server_info or {}
    features = [judge(rule, facts[rule.fact]) for rule in FEATURES if rule.is_on(info)]
    return Exercise(facts=facts, features=features)


def fact_lines(exercise: Exercise) -> list[str]:
    """`words: value` for every fact, unknown ones included (a reader must see what could not be told)."""
    return [f"{FACT_WORDS.get(key, key)}: {fmt_value(fact.value)}" for key, fact in exercise.facts.items()]


def idle_reasons(exercise: Exercise | None) -> list[str]:
    """One reason per feature that was on and never acted, naming the metric that shows it."""
    return [f.line for f in (exercise.idle() if exercise is not None else ())]

