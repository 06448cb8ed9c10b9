"""Size the load to the server's KV cache, so that the device pool must evict and HiCache must load back.

The race this harness hunts needs three things in turn: cold prefills of long prefixes (kept warm while
they fit), eviction pressure (prefills that together exceed the device pool, pushing the older prefixes
to the host tier), and byte-identical replays of those prefixes, which must then come back from the
host tier. Agentic sessions do the third by themselves (each turn resends the conversation); the first
two need each session's own prefix to be long enough that the sessions running at once overflow the
pool. `plan` chooses that length (the workload's `context_tokens`) from the capacity the server states:
SGLang's `/server_info` (`max_total_tokens`, `page_size`, `hicache_ratio`), vLLM's
`vllm:cache_config_info` metric (`num_gpu_blocks` x `block_size`). Pure apart from `sized_workload`,
which reads a vLLM target's /metrics and prints.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import httpx

from repro.errors import UsageError
from repro.run.metrics import metrics_url
from repro.untrusted import get_bounded
from repro.wire.transport import tls_for
from repro.workload.trace import Trace

from repro.workload.context import CHARS_PER_TOKEN
from repro.workload.scenario import SandboxSizes, Workload

DEFAULT_FACTOR = 2.0
"""The working set of the sessions running at once, in device pools, that `--pressure auto` aims for."""
ANSWER_TOKENS = 150
"""About what one assistant turn (reasoning and a tool call) adds to the conversation."""
HEADROOM_TOKENS = 2048
"""Kept free of a single prompt under the server's context length, for the growth of its last turns."""


@dataclass(frozen=True)
class Capacity:
    """The server's KV cache as it states it."""

    device_tokens: int
    source: str
    page_size: int | None = None
    host_tokens: int | None = None
    """The HiCache host tier in tokens; None when HiCache is off or its size is not stated in tokens."""
    context_length: int | None = None


def _positive(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _pool(info: Mapping[str, Any]) -> tuple[float, str] | None:
    """The device pool: the scheduler's own count (`max_total_num_tokens`, at the top or in its first
    `internal_states`) before the `--max-total-tokens` argument, which is only a cap and often unset."""
    states = info.get("internal_states")
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], Mapping) else {}
    for where, key in ((info, "max_total_num_tokens"), (first, "max_total_num_tokens"), (info, "max_total_tokens")):
        value = _positive(where.get(key))
        if value is not None:
            return value, f"/server_info {key}"
    return None


def from_server_info(info: Mapping[str, Any] | None) -> Capacity | None:
    """SGLang: the device pool, `page_size`, and `hicache_ratio` when HiCache is on."""
    pool = _pool(info) if info else None
    if pool is None:
        return None
    assert info is not None
    total, source = pool
    ratio = _positive(info.get("hicache_ratio")) if info.get("enable_hierarchical_cache") is True else None
    # --hicache-size (GB) overrides the ratio; its size in tokens depends on the model's bytes per token.
    by_size = _positive(info.get("hicache_size")) is not None
    page = _positive(info.get("page_size"))
    context = _positive(info.get("context_length"))
    return Capacity(device_tokens=int(total), source=source,
                    page_size=int(page) if page else None,
                    host_tokens=int(total * ratio) if ratio and not by_size else None,
                    context_length=int(context) if context else None)


def from_metrics(text: str) -> Capacity | None:
    """vLLM: `vllm:cache_config_info{num_gpu_blocks=..., block_size=...}` (an info gauge whose labels are the config)."""
    # Imported here: only a vLLM target's /metrics is read for this; other runs need not load it.
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        return None
    for family in families:
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                blocks, size = sample.labels.get("num_gpu_blocks", ""), sample.labels.get("block_size", "")
                if blocks.isdigit() and size.isdigit() and int(blocks) > 0:
                    return Capacity(device_tokens=int(blocks) * int(size), source="vllm:cache_config_info "
                                    "num_gpu_blocks x block_size", page_size=int(size))
    return None


def growth_per_turn(sizes: SandboxSizes) -> int:
    """About the tokens one turn adds: the median tool result of the sandbox (a whole file is read now and
    then, a grep or a listing more often) and an answer."""
    results = (sizes.file_lines * (sizes.line_width + 1), sizes.grep_matches * (sizes.line_width + 1),
               sizes.list_entries * 30, sizes.test_output_lines * (sizes.line_width + 1))
    return math.ceil(statistics.median(results) / CHARS_PER_TOKEN) + ANSWER_TOKENS


@dataclass(frozen=True)
class PressurePlan:
    context_tokens: int
    """Each session's own document (0: the workload as it is)."""
    working_set: int
    """About the tokens the sessions running at once hold at their longest."""
    lines: list[str] = field(default_factory=list)
    """What was chosen and why, as printed."""
    warning: str | None = None
    """Set when the load cannot make the device pool evict."""


def session_tokens(workload: Workload, turns: int) -> int:
    """About the tokens a session holds at its last turn, before any document: its prompt and its growth."""
    opening = len(workload.system_prompt) + len(max(workload.tasks, key=len)) + 200 * len(workload.tools)
    return math.ceil(opening / CHARS_PER_TOKEN) + workload.context_tokens + turns * growth_per_turn(workload.sandbox)


def plan(capacity: Capacity, workload: Workload, *, active: int, turns: int, factor: float | None) -> PressurePlan:
    """The document length that makes `active` sessions of `turns` turns hold `factor` device pools
    (`factor` None: the workload as it is, only checked)."""
    pool = capacity.device_tokens
    base = session_tokens(workload, turns)
    stated = [f"device KV pool {pool:,} tokens ({capacity.source})"]
    if capacity.page_size:
        stated.append(f"page {capacity.page_size} tokens")
    if capacity.host_tokens:
        stated.append(f"host tier {capacity.host_tokens:,} tokens")
    lines = ["pressure: " + ", ".join(stated)]
    document = 0
    if factor is not None:
        wanted = math.ceil(factor * pool / active) - base
        limit = min(pool // 2, (capacity.context_length or pool) - base - HEADROOM_TOKENS)
        document = max(0, min(wanted, limit))
        if wanted <= 0:
            lines.append(f"pressure: {active} sessions at once, each about {base:,} tokens after {turns} turns, already "
                         f"hold about {active * base / pool:.1f}x the device pool: no document added")
        else:
            lines.append(
                f"pressure: {active} sessions at once, each about {base:,} tokens after {turns} turns; each opens "
                f"with its own {document:,}-token document so that together they hold about {factor:g}x the device "
                "pool: their prefixes evict one another, and every later turn resends its own prefix byte for byte, "
                "which must then come back from the host tier (or be computed again)")
        if document < wanted:
            lines.append(f"pressure: the document is capped at {document:,} tokens (half the pool, or the context "
                         f"length less the session's growth); {wanted:,} were wanted")
    working = active * (base + document)
    warning = None
    if working <= pool:
        warning = (f"this load cannot make the server evict: {active} sessions at once of about {base + document:,} "
                   f"tokens each hold about {working:,} tokens, under the device pool of {pool:,}; HiCache will "
                   "never load back (more --concurrency, longer sessions, or --pressure auto)")
    elif capacity.host_tokens and working > pool + capacity.host_tokens:
        lines.append(f"pressure: the working set ({working:,}) exceeds device and host tier together "
                     f"({pool + capacity.host_tokens:,}): some prefixes will be computed again rather than loaded back")
    return PressurePlan(context_tokens=document, working_set=working, lines=lines, warning=warning)


def parse_factor(value: str | None) -> float | None:
    """`--pressure`: off (None), auto (the default factor), or the factor itself (above 1)."""
    if value is None or value == "off":
        return None
    if value == "auto":
        return DEFAULT_FACTOR
    try:
        factor = float(value)
    except ValueError:
        factor = math.nan
    if not factor > 1.0 or math.isinf(factor):
        raise UsageError(f"--pressure must be auto, off or a factor above 1 (device pools), got {value!r}")
    return factor


def size_load(workload: Workload, *, server_info: Mapping[str, Any] | None, metrics: Callable[[], str | None],
              active: int, turns: int, factor: float | None) -> tuple[Workload, PressurePlan | None]:
    """The workload sized to the target (unchanged without a factor) and the plan; no plan when the target
    states no capacity (with a factor, that is an error: the load cannot be sized). `metrics` fetches the
    target's /metrics text, asked only of a server that serves no capacity in `/server_info`."""
    capacity = from_server_info(server_info)
    if capacity is None:
        text = metrics()
        capacity = from_metrics(text) if text else None
    if capacity is None:
        if factor is not None:
            raise UsageError("--pressure: the target states no KV capacity (no max_total_tokens in /server_info, no "
                             "vllm:cache_config_info in /metrics); size the load with the workload's context_tokens")
        return workload, None
    chosen = plan(capacity, workload, active=active, turns=turns, factor=factor)
    if factor is None:
        return workload, chosen
    return workload.model_copy(update={"context_tokens": workload.context_tokens + chosen.context_tokens}), chosen


METRICS_BYTES = 16 * 1024 * 1024
METRICS_TIMEOUT_S = 10.0


def sized_workload(scenario: Workload | Trace, *, pressure: str | None, server_info: Mapping[str, Any] | None,
                   base_url: str, headers: dict[str, str], active: int, turns: int,
                   say: Callable[[str], None]) -> Workload | Trace:
    """`repro run`'s workload sized by `--pressure`, with what was chosen printed, and a warning before the
    load when it cannot make the server evict."""
    factor = parse_factor(pressure)
    if isinstance(scenario, Trace):
        if factor is not None:
            raise UsageError("--pressure sizes a workload's sessions; a trace replays recorded conversations as they are")
        return scenario

    def metrics() -> str | None:
        with httpx.Client(trust_env=False, headers=headers, verify=tls_for(base_url)) as client:
            try:
                status, content = get_bounded(client, metrics_url(base_url), max_bytes=METRICS_BYTES,
                                              timeout_s=METRICS_TIMEOUT_S)
            except (httpx.HTTPError, ValueError):  # unreachable, or an answer that never ends: no capacity there
                return None
        return content.decode("utf-8", "replace") if status == 200 else None

    sized, chosen = size_load(scenario, server_info=server_info, metrics=metrics, active=active, turns=turns,
                              factor=factor)
    if chosen is not None:
        for line in chosen.lines if factor is not None else ():
            say(line)
        if chosen.warning is not None:
            say(f"warning: {chosen.warning}")
    return sized
