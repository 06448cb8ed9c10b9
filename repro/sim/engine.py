"""The simulated GPU: a clock, continuous batching, a paged prefix cache with a host tier, and the race.

Time is simulated: every scheduler step advances `now` by its modelled cost and the loop then waits
`cost * time_scale` real seconds, so streams receive tokens at the engine's pace. A step is either a
prefill batch (admitted from the waiting queue) or a decode step of every running request.

On the virtual clock (`--clock virtual`) the loop does not wait real time: it steps as soon as every
session the client declared has its request in (repro.sim.lockstep), so the same seed and flags give the
same schedule, and the same faults, however loaded the machine is.

The race is mechanistic. When HiCache is on and a request reuses prefix pages that were evicted to the
host tier, its prefill loads them back layer by layer on a link shared by every load-back of the batch.
Per layer the copy moves the index-K bytes, then the main-KV bytes. The forward reads layers in order:
the indexer reads a layer's index-K first, then the attention reads its main KV, which waits for that
layer's copy. Without `--index-k-gate` the index-K read does not wait; if it comes before the layer's
index-K bytes have landed, the request read stale pages and its output is corrupt.

With `--disaggregation-mode prefill|decode` the engine stands for a whole PD pair: a request first
passes the decode side's prealloc and transfer queues (repro.sim.pd), its prefill's KV travels to the
decode side, and its first token is emitted only once the decode side has seen the transfer complete.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

from repro.sim.config import SimConfig
from repro.sim.lockstep import Lockstep, session_order
from repro.sim.pd import DecodeTransfers, Transfer, Wedge

CHARS_PER_TOKEN = 4
"""The simulator's tokenizer: a token is four characters of rendered prompt or completion."""
OUTPUT_ALLOWANCE = 512
"""Tokens reserved for a request's output when it is admitted."""


def context_length(config: SimConfig) -> int:
    """The longest prompt the device pool can hold with everything else evicted."""
    return config.max_total_tokens - 2 * OUTPUT_ALLOWANCE


@dataclass(frozen=True)
class Costs:
    """The cost model, in simulated seconds and bytes. Values are plausible for one 8-GPU node."""

    layers: int = 61
    prefill_base_s: float = 0.040
    prefill_per_token_s: float = 40e-6
    prefill_attention_s: float = 1e-8
    """Attention: each new token attends to its whole context, so a prefill also costs extend x context."""
    decode_base_s: float = 0.008
    decode_per_request_s: float = 0.0002
    no_cuda_graph_factor: float = 1.8
    """Kernel launches without a captured graph: the decode step's fixed part grows by this factor."""
    schedule_gap_s: float = 0.002
    """CPU scheduling time that the overlap scheduler hides and a non-overlapped step pays."""
    overlap_lead: float = 0.9
    non_overlap_lead: float = 1.0
    """When a prefill's first layer reads, in per-layer compute times after its load-back starts."""
    main_kv_bytes: int = 656
    """Per token and layer: MLA latent + rope, fp8."""
    index_k_bytes_fp8: int = 132
    """Per token and layer: the fused fp8 index-K with its scale; `--index-k-dtype bf16` doubles it."""
    link_bytes_per_s: float = 1.6e9
    """Effective host-to-device rate of page-scattered layer copies, far below the PCIe peak.

    The calibration knob: with the default workload it puts bf16 at 10-20% of 60 sessions and fp8 at
    none (benchmarks/calibrate_sim.py measures it).
    """
    link_ramp_tokens: int = 8192
    link_stream_bytes_per_s: float = 20e9
    """A load-back's first `link_ramp_tokens` move at `link_bytes_per_s`; the rest at this rate.

    A short load-back is a handful of scattered page copies, each paying its own latency; a long one
    keeps enough of them in flight to stream near the link's rate (PCIe 4 x16 carries about 25 GB/s in
    practice). Without the ramp a 150k-token prefix (what `--pressure auto` replays on a large pool) took
    40 times a 4k-token copy against a forward about 10 times longer, and every such replay lost the
    race (60 of 60 sessions corrupt). With it (5 times), the sized run corrupts at about the default
    run's rate (benchmarks/calibrate_sim.py); no load-back of the default workload (8k tokens at most)
    reaches the ramp, so its faults are unchanged.
    """
    tokens_per_step: int = 8
    """Tokens each running request gains per decode step: streams get chunks of several tokens."""
    kv_transfer_bytes_per_s: float = 20e9
    """PD: prefill-to-decode RDMA rate for a request's whole KV (every layer's main KV and index-K)."""
    pd_idle_poll_s: float = 0.02
    """PD: a decode scheduler step with nothing to run, only transfers to poll."""


def page_keys(text: str, page_size: int) -> list[str]:
    """Keys of the full pages of a rendered prompt; a key names its page and everything before it."""
    page_chars = page_size * CHARS_PER_TOKEN
    keys: list[str] = []
    digest = hashlib.blake2b(digest_size=12)
    for end in range(page_chars, len(text) + 1, page_chars):
        digest.update(text[end - page_chars:end].encode())
        keys.append(digest.copy().hexdigest())
    return keys


def count_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


@dataclass
class Race:
    """A read that overtook its layer's load-back."""

    layer: int
    read_time_s: float
    copy_done_s: float
    load_back_tokens: int
    link_share: int


@dataclass(eq=False)
class EngineRequest:
    """One generation: its prompt pages, and its progress as the engine reports it."""

    rid: str
    prompt_tokens: int
    pages: list[str]
    on_prefilled: Callable[[Race | None], int]
    """Called once the prefill ran, with the race it suffered if any; returns the output length in tokens."""
    output_tokens: int = 0
    tokens_done: int = 0
    cached_tokens: int = 0
    load_back_tokens: int = 0
    finished: bool = False
    aborted: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    held_pages: list[str] = field(default_factory=list)
    reserved_pages: int = 0
    arrival_real: float = 0.0
    first_token_real: float | None = None
    transfer: Transfer | None = None
    """PD: its KV transfer; None in null mode and for health probes (SGLang's fake bootstrap)."""
    fake_transfer: bool = False
    """PD: skip the transfer, as SGLang's /health_generate does with its fake bootstrap host."""
    on_wedged: Callable[[Wedge], None] | None = None
    """PD: called when its transfer's completion notice is lost."""
    error: str | None = None
    """Why the engine failed it (a PD transfer that timed out); None otherwise."""
    session: str | None = None
    """The client's session (its X-Repro-Session header), which the virtual clock waits for."""


class PrefixCache:
    """Device pages in LRU order, host pages in LRU order, and the pin counts of running requests."""

    def __init__(self, device_pages: int, host_pages: int) -> None:
        self.device_capacity = device_pages
        self.host_capacity = host_pages
        self.device: OrderedDict[str, None] = OrderedDict()
        self.host: OrderedDict[str, None] = OrderedDict()
        self.pins: dict[str, int] = {}
        self.evicted_pages = 0

    def match(self, pages: list[str]) -> tuple[list[str], list[str]]:
        """The reusable prefix split into device-resident and host-resident pages."""
        on_device: list[str] = []
        on_host: list[str] = []
        for key in pages:
            if key in self.device:
                on_device.append(key)
            elif key in self.host:
                on_host.append(key)
            else:
                break
        return on_device, on_host

    def pin(self, keys: list[str]) -> None:
        for key in keys:
            self.pins[key] = self.pins.get(key, 0) + 1

    def unpin(self, keys: list[str]) -> None:
        for key in keys:
            left = self.pins[key] - 1
            if left:
                self.pins[key] = left
            else:
                del self.pins[key]

    def evict(self, pages_needed: int, free_pages: Callable[[], int]) -> None:
        """Evict unpinned device pages, least recently used first, until `pages_needed` are free."""
        if free_pages() >= pages_needed:
            return
        for key in list(self.device):
            if key in self.pins:
                continue
            del self.device[key]
            self.evicted_pages += 1
            if self.host_capacity:
                self.host[key] = None
                while len(self.host) > self.host_capacity:
                    self.host.popitem(last=False)
            if free_pages() >= pages_needed:
                return

    def touch(self, keys: list[str]) -> None:
        """Insert or refresh pages as most recently used on the device (a load-back from the host as well)."""
        for key in keys:
            self.host.pop(key, None)
            self.device[key] = None
            self.device.move_to_end(key)

    def clear(self) -> None:
        self.device.clear()
        self.host.clear()


@dataclass
class Counters:
    """Monotonic totals the metrics endpoint reports."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    load_back_tokens: int = 0
    requests: int = 0
    aborted: int = 0
    decode_passes: int = 0
    transfer_failed: int = 0
    last_transfer_mb: float = 0.0
    """PD: the KV of the latest completed transfer, as SGLang's kv_transfer_total_mb gauge shows it."""


class Engine:
    """Continuous batching over a simulated clock. Single-threaded: call only from the event loop."""

    def __init__(self, config: SimConfig, costs: Costs = Costs()) -> None:
        self.config = config
        self.costs = costs
        device_pages = config.max_total_tokens // config.page_size
        host_pages = int(device_pages * config.hicache_ratio) if config.enable_hierarchical_cache else 0
        self.cache = PrefixCache(device_pages, host_pages)
        self.index_k_bytes = costs.index_k_bytes_fp8 * (2 if config.index_k_dtype == "bf16" else 1)
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.reserved_pages = 0
        self.now = 0.0
        self.counters = Counters()
        self.pd: DecodeTransfers | None = None
        if config.disaggregation_mode != "null":
            self.pd = DecodeTransfers(config.disaggregation_metadata_slots, config.disaggregation_waiting_timeout)
        self._wake = asyncio.Event()
        self.lockstep = Lockstep(config.lockstep_patience) if config.clock == "virtual" else None
        self.arrivals: list[EngineRequest] = []
        """Virtual clock: requests that arrived since the last step, admitted in session order at the next."""
        self.inflight: set[EngineRequest] = set()

    # --- public interface -------------------------------------------------------------------

    def submit(self, request: EngineRequest) -> None:
        request.arrival_real = asyncio.get_running_loop().time()
        self.inflight.add(request)
        if self.lockstep is not None:
            self.arrivals.append(request)
        else:
            self._enqueue(request)
        self._wake.set()

    def poke(self) -> None:
        """Look again whether a step can run (the virtual clock's load changed)."""
        self._wake.set()

    def _enqueue(self, request: EngineRequest) -> None:
        if self.pd is not None and not request.fake_transfer:
            self.pd.add(request)
        else:
            self.waiting.append(request)

    def abort(self, request: EngineRequest) -> None:
        """Drop a request whose client went away, freeing what it holds."""
        if request.finished:
            return
        request.aborted = True
        self.counters.aborted += 1
        self.inflight.discard(request)
        if self.pd is not None:
            self.pd.forget(request)
        if request in self.arrivals:
            self.arrivals.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        elif request in self.running:
            self.running.remove(request)
            self._release(request)
        elif request.transfer is not None and request.transfer.state == "Transferring":
            # Prefilled: the KV it reserved is held until the transfer is given up.
            self._release(request)
        request.finished = True
        request.changed.set()
        self._wake.set()

    @property
    def busy(self) -> bool:
        return bool(self.arrivals or self.waiting or self.running or (self.pd is not None and self.pd.pending))

    def num_requests(self) -> int:
        """Requests anywhere in the engine, each counted once (a PD request can wait in two queues)."""
        queues = [self.arrivals, self.waiting, self.running] + ([self.pd.prealloc, self.pd.queue] if self.pd is not None else [])
        return len({id(r) for queue in queues for r in queue})

    def used_tokens(self) -> int:
        return (len(self.cache.device) + self.reserved_pages) * self.config.page_size

    def flush(self) -> None:
        self.cache.clear()

    async def run(self) -> None:
        """The scheduler loop; runs until cancelled."""
        if self.lockstep is not None:
            await self._run_virtual(self.lockstep)
        loop = asyncio.get_running_loop()
        real0, sim0 = loop.time(), self.now
        while True:
            if not self.busy:
                self._wake.clear()
                await self._wake.wait()
                real0, sim0 = loop.time(), self.now
                continue
            self.now += self.step()
            behind = loop.time() - (real0 + (self.now - sim0) * self.config.time_scale)
            if behind > 0.2:
                # The CPU fell behind the clock: re-anchor rather than burst through the backlog.
                real0, sim0 = loop.time(), self.now
            await asyncio.sleep(max(0.0, -behind))

    async def _run_virtual(self, lockstep: Lockstep) -> None:
        """The loop on the virtual clock: a step as soon as the declared sessions are all in, no real waiting."""
        loop = asyncio.get_running_loop()
        give_up: float | None = None
        while True:
            if not self.busy:
                give_up = None
                self._wake.clear()
                await self._wake.wait()
                continue
            if not lockstep.ready(r.session for r in self.inflight):
                give_up = give_up or loop.time() + lockstep.patience_s
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), max(0.0, give_up - loop.time()))
                    continue
                except asyncio.TimeoutError:
                    lockstep.timeouts += 1
                    print(f"sim: virtual clock: stepped without every session after {lockstep.patience_s:g}s "
                          f"of waiting ({lockstep.status()}); this run's schedule is no longer reproducible",
                          file=sys.stderr, flush=True)
            give_up = None
            for request in sorted(self.arrivals, key=lambda r: session_order(r.session)):
                self._enqueue(request)
            self.arrivals.clear()
            self.now += self.step()
            # Lets the streams and the clients' next turns in before the next look.
            await asyncio.sleep(0)

    # --- scheduling ----------------------------------------------------------------------------

    def step(self) -> float:
        """Run one scheduler step and return its simulated cost."""
        if self.pd is not None:
            self._pd_step()
        batch = self._admit()
        if batch:
            return self._prefill(batch)
        if self.pd is not None and not self.running:
            return self.costs.pd_idle_poll_s
        return self._decode()

    def _pd_step(self) -> None:
        assert self.pd is not None
        capacity = self.config.max_running_requests - len(self.running) - len(self.pd.queue)
        claimed, transferred, failed = self.pd.step(self.now, capacity)
        # A claimed slot is the decode side's handshake: the prefill side may now schedule the request.
        self.waiting.extend(claimed)
        for request in transferred:
            self.counters.last_transfer_mb = self._kv_bytes(request) / 1e6
            self.running.append(request)
            self._emit(request, 1)
        for request in failed:
            self._fail(request, f"KV transfer of {request.rid} failed: no completion after "
                                f"{self.config.disaggregation_waiting_timeout:g}s (disaggregation waiting timeout)")

    def _fail(self, request: EngineRequest, reason: str) -> None:
        self.counters.transfer_failed += 1
        self.inflight.discard(request)
        if request in self.waiting:
            self.waiting.remove(request)
        else:
            self._release(request)
        request.error = reason
        request.finished = True
        request.changed.set()

    def _kv_bytes(self, request: EngineRequest) -> float:
        return request.prompt_tokens * self.costs.layers * (self.costs.main_kv_bytes + self.index_k_bytes)

    def _kv_transfer_s(self, request: EngineRequest) -> float:
        return self._kv_bytes(request) / self.costs.kv_transfer_bytes_per_s

    def _free_pages(self) -> int:
        return self.cache.device_capacity - len(self.cache.device) - self.reserved_pages

    def _admit(self) -> list[EngineRequest]:
        batch: list[EngineRequest] = []
        budget = self.config.chunked_prefill_size
        page = self.config.page_size
        while self.waiting and len(self.running) + len(batch) < self.config.max_running_requests:
            request = self.waiting[0]
            on_device, on_host = self.cache.match(request.pages)
            reused = len(on_device) + len(on_host)
            extend = request.prompt_tokens - reused * page
            if batch and extend > budget:
                break
            # Room for the pages it loads back, its uncached prompt and an output allowance.
            reserve = -(-(extend + OUTPUT_ALLOWANCE) // page)
            self.cache.pin(on_device)
            self.cache.evict(len(on_host) + reserve, self._free_pages)
            if self._free_pages() < len(on_host) + reserve:
                self.cache.unpin(on_device)
                break
            self.waiting.popleft()
            self.cache.touch(on_host)  # loaded back from the host tier
            self.cache.pin(on_host)
            request.held_pages = on_device + on_host
            request.reserved_pages = reserve
            self.reserved_pages += reserve
            request.cached_tokens = reused * page
            request.load_back_tokens = len(on_host) * page
            budget -= extend
            batch.append(request)
        return batch

    def _prefill(self, batch: list[EngineRequest]) -> float:
        costs = self.costs
        extends = [r.prompt_tokens - r.cached_tokens for r in batch]
        attention = sum(e * r.prompt_tokens for e, r in zip(extends, batch))
        forward = costs.prefill_base_s + costs.prefill_per_token_s * sum(extends) + costs.prefill_attention_s * attention
        per_layer = forward / costs.layers
        if self.config.disable_overlap_schedule:
            gap, lead = costs.schedule_gap_s, per_layer * costs.non_overlap_lead
        else:
            gap, lead = 0.0, per_layer * costs.overlap_lead
        loading = [r for r in batch if r.load_back_tokens]
        duration = forward + lead
        races: dict[int, Race] = {}
        for request in loading:
            end, race = self._forward_with_load_back(request.load_back_tokens, len(loading), per_layer, lead)
            duration = max(duration, end)
            if race is not None:
                races[id(request)] = race
        local: list[EngineRequest] = []
        for request in batch:
            self.counters.requests += 1
            self.counters.prompt_tokens += request.prompt_tokens
            self.counters.cached_tokens += request.cached_tokens
            self.counters.load_back_tokens += request.load_back_tokens
            request.output_tokens = max(1, request.on_prefilled(races.get(id(request))))
            if self.pd is not None and self.pd.holds(request):
                # PD: the first token travels with the KV; the decode side emits it once it sees the notice.
                self.pd.sent(request, self.now + duration + gap + self._kv_transfer_s(request))
            else:
                self.running.append(request)
                local.append(request)
        # The prefill's forward emits every request's first token.
        for request in local:
            self._emit(request, 1)
        return duration + gap

    def _forward_with_load_back(self, tokens: int, share: int, per_layer: float, lead: float) -> tuple[float, Race | None]:
        """Walk the layers of one request's forward against its layer-by-layer copy.

        Returns when the forward finished (relative to the batch start) and the first overtaking read.
        """
        costs = self.costs
        rate, stream = costs.link_bytes_per_s / share, costs.link_stream_bytes_per_s / share
        slow = min(tokens, costs.link_ramp_tokens)
        index_copy = slow * self.index_k_bytes / rate + (tokens - slow) * self.index_k_bytes / stream
        main_copy = slow * costs.main_kv_bytes / rate + (tokens - slow) * costs.main_kv_bytes / stream
        copy_start = 0.0
        read = lead
        race: Race | None = None
        for layer in range(self.costs.layers):
            index_done = copy_start + index_copy
            main_done = index_done + main_copy
            copy_start = main_done
            if self.config.index_k_gate:
                read = max(read, index_done)
            elif read < index_done and race is None:
                race = Race(layer=layer, read_time_s=self.now + read, copy_done_s=self.now + index_done,
                            load_back_tokens=tokens, link_share=share)
            read = max(read, main_done) + per_layer
        return read, race

    def _decode(self) -> float:
        costs = self.costs
        base = costs.decode_base_s * (costs.no_cuda_graph_factor if self.config.disable_cuda_graph else 1.0)
        self.counters.decode_passes += 1
        per_token = base + costs.decode_per_request_s * len(self.running)
        gap = costs.schedule_gap_s if self.config.disable_overlap_schedule else 0.0
        for request in list(self.running):
            self._emit(request, costs.tokens_per_step)
        return (per_token + gap) * costs.tokens_per_step

    def _emit(self, request: EngineRequest, tokens: int) -> None:
        gained = min(tokens, request.output_tokens - request.tokens_done)
        request.tokens_done += gained
        self.counters.generation_tokens += gained
        if request.first_token_real is None:
            request.first_token_real = asyncio.get_running_loop().time()
        if request.tokens_done >= request.output_tokens:
            self.running.remove(request)
            self._release(request)
            request.finished = True
            self.inflight.discard(request)
        request.changed.set()

    def _release(self, request: EngineRequest) -> None:
        # The prompt's pages were computed or loaded: they stay cached for the conversation's next turn.
        self.cache.unpin(request.held_pages)
        self.reserved_pages -= request.reserved_pages
        request.reserved_pages = 0
        self.cache.touch(request.pages)
        request.held_pages = []
