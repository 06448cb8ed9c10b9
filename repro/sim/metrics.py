"""Prometheus metrics under SGLang's `sglang:` names, read from the engine's state at scrape time."""

from __future__ import annotations

from typing import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from repro.sim.engine import Engine

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)


class _EngineCollector:
    """Gauges and counters that mirror the engine; nothing is double-bookkept here."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self.engine = engine
        self.labels = {"model_name": model_name}

    def _family(self, kind: type[GaugeMetricFamily | CounterMetricFamily], name: str, doc: str, value: float) -> Metric:
        family = kind(f"sglang:{name}", doc, labels=list(self.labels))
        family.add_metric(list(self.labels.values()), value)
        return family

    def _split_counter(self, name: str, doc: str, label: str, values: dict[str, float]) -> Metric:
        """A counter with one series per `label` value; as with SGLang's labelled counters, a series that
        was never incremented is absent (not 0)."""
        family = CounterMetricFamily(f"sglang:{name}", doc, labels=[*self.labels, label])
        for value_label, value in values.items():
            if value:
                family.add_metric([*self.labels.values(), value_label], value)
        return family

    def _gauge(self, name: str, doc: str, value: float) -> Metric:
        return self._family(GaugeMetricFamily, name, doc, value)

    def _counter(self, name: str, doc: str, value: float) -> Metric:
        return self._family(CounterMetricFamily, name, doc, value)

    def collect(self) -> Iterator[Metric]:
        engine, counters = self.engine, self.engine.counters
        used = engine.used_tokens()
        capacity = engine.config.max_total_tokens
        yield self._gauge("num_running_reqs", "Running requests.", len(engine.running))
        yield self._gauge("num_queue_reqs", "Requests waiting to be scheduled.", len(engine.waiting))
        yield self._gauge("num_used_tokens", "Device KV tokens in use.", used)
        yield self._gauge("token_usage", "Fraction of the device KV pool in use.", min(1.0, used / capacity))
        hit = counters.cached_tokens / counters.prompt_tokens if counters.prompt_tokens else 0.0
        yield self._gauge("cache_hit_rate", "Prefix cache hit rate over all prompt tokens.", hit)
        yield self._gauge("is_cuda_graph", "Whether decode runs CUDA graphs.", 0.0 if engine.config.disable_cuda_graph else 1.0)
        yield self._counter("prompt_tokens", "Prompt tokens.", counters.prompt_tokens)
        yield self._counter("generation_tokens", "Generated tokens.", counters.generation_tokens)
        # SGLang's breakdown by tier: "host" only once the host tier matched a prefix.
        yield self._split_counter("cached_tokens", "Prompt tokens served from the prefix cache, by tier.", "cache_source", {
            "device": counters.cached_tokens - counters.load_back_tokens, "host": counters.load_back_tokens})
        yield self._counter("num_requests", "Requests prefilled.", counters.requests)
        yield self._counter("num_aborted_requests", "Requests aborted by their client.", counters.aborted)
        yield self._counter("load_back_tokens", "Tokens loaded back from the host tier (HiCache).", counters.load_back_tokens)
        yield self._counter("evicted_tokens", "Tokens evicted from the device cache.",
                            engine.cache.evicted_pages * engine.config.page_size)
        graph = "decode_none" if engine.config.disable_cuda_graph else "decode_cuda_graph"
        yield self._split_counter("cuda_graph_passes", "Decode forward passes, by whether a CUDA graph ran them.",
                                  "mode", {graph: counters.decode_passes})
        if engine.pd is not None:
            yield self._gauge("num_decode_prealloc_queue_reqs", "PD: requests waiting for a decode-side slot.",
                              len(engine.pd.prealloc))
            yield self._gauge("num_decode_transfer_queue_reqs", "PD: requests waiting for their KV transfer.",
                              len(engine.pd.queue))
            yield self._counter("num_transfer_failed_reqs", "PD: requests whose KV transfer failed.",
                                counters.transfer_failed)
            yield self._gauge("kv_transfer_total_mb", "PD: megabytes of the latest KV transfer.", counters.last_transfer_mb)


class SimMetrics:
    """The registry behind `/metrics`: engine mirrors plus the latency histograms the server observes."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine, model_name))
        labels = ["model_name"]
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Time to first token.", labels,
                              registry=self.registry, buckets=_LATENCY_BUCKETS).labels(model_name)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Time between streamed chunks.", labels,
                             registry=self.registry, buckets=_LATENCY_BUCKETS).labels(model_name)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "End-to-end request latency.", labels,
                             registry=self.registry, buckets=_LATENCY_BUCKETS).labels(model_name)

    def render(self) -> bytes:
        return generate_latest(self.registry)
