"""The simulator's flags: SGLang's spelling where SGLang has the flag, the simulator's own otherwise.

`parse_flags` turns a command line into a validated `SimConfig`; `server_info` reports it under
SGLang's `/server_info` key names so the harness can confirm a configuration took effect.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Literal, NoReturn, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dsml_checker.server_parsers import implementation
from repro.errors import UsageError, describe_validation_error

SIM_VERSION = "0.5.0-sim"


class SimConfig(BaseModel):
    """Every flag of `repro sim serve`. Field names are SGLang's server-arg names where they exist; each
    field's docstring is its flag's help."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(30000, ge=1, le=65535)
    """Port to listen on."""
    model_path: str = "deepseek-ai/DeepSeek-V4"
    """Model path reported in /server_info (no weights are read)."""
    served_model_name: str = "deepseek-ai/DeepSeek-V4"
    """Model name /v1/models lists and answers under."""
    tool_call_parser: str = "deepseekv4"
    """SGLang's tool-call parser name, reported in /server_info (the parser run is --tool-parser's)."""
    tool_parser: Literal["sglang-0.5.23", "sglang-0.5.20", "vllm-0.33"] = "sglang-0.5.23"
    """The server-side parser: sglang-0.5.23 (deepseek-recipe itself where installed, else its emulation),
    sglang-0.5.20 or vllm-0.33 (emulated); /server_info says which ran."""
    reasoning_parser: str = "deepseek-v4"
    """SGLang's reasoning parser name, reported in /server_info (reasoning is always split out)."""
    kv_cache_dtype: str = "fp8_e4m3"
    """KV cache dtype, reported in /server_info."""
    page_size: int = Field(64, ge=1)
    """Tokens per KV page: the unit of prefix caching and of HiCache's load-backs."""
    max_running_requests: int = Field(64, ge=1)
    """Requests decoded at once; more wait in the queue."""
    max_total_tokens: int = Field(64_000, ge=1024)
    """Device KV pool size in tokens: the prefix cache and the running requests share it."""
    chunked_prefill_size: int = Field(16_384, ge=256)
    """Most prompt tokens prefilled in one forward pass."""
    enable_hierarchical_cache: bool = False
    """HiCache: evicted prefix pages move to a host tier and are loaded back layer by layer."""
    hicache_ratio: float = Field(2.0, gt=0)
    """HiCache host tier size, as a multiple of the device pool."""
    hicache_write_policy: str = "write_through"
    """HiCache write policy, reported in /server_info."""
    hicache_io_backend: str = "kernel"
    """HiCache transfer backend, reported in /server_info."""
    hicache_mem_layout: str = "layer_first"
    """HiCache host memory layout, reported in /server_info."""
    disable_overlap_schedule: bool = False
    """Schedule without overlap: a gap between passes, and the layer-wise load-back leads the forward pass by
    more (the race's timing changes)."""
    disable_cuda_graph: bool = False
    """Decode without CUDA graphs: slower decode steps (and /metrics reports it)."""
    disaggregation_mode: Literal["null", "prefill", "decode"] = "null"
    """null, or prefill|decode: the simulator then stands for the whole PD pair behind a router, and every
    request's KV transfer is simulated."""
    disaggregation_waiting_timeout: float = Field(300.0, gt=0)
    """PD: simulated seconds a request may wait for its KV transfer before it fails
    (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)."""
    enable_metrics: bool = True
    """Serve Prometheus metrics on /metrics."""
    enable_cache_report: bool = True
    """Reported in /server_info (the simulator always reports cached prompt tokens in each answer's usage)."""
    # The simulator's own flags.
    index_k_dtype: Literal["fp8", "bf16"] = "fp8"
    """Index-K storage: bf16 copies twice the bytes of fp8 per layer, which widens the HiCache race."""
    index_k_gate: bool = False
    """The fix: the index-K read waits for its layer's load-back like the main-KV read does."""
    time_scale: float = Field(0.2, ge=0)
    """Real seconds per simulated second (0 runs the clock as fast as the CPU allows); the real clock only."""
    clock: Literal["real", "virtual"] = "real"
    """real: paced by the wall clock, so when a client's turn lands depends on the machine. virtual: the
    engine steps once every session the client declared has its request in: the same seed and flags give
    the same faults at any machine load."""
    lockstep_patience: float = Field(60.0, gt=0)
    """Virtual clock: real seconds the engine waits for a missing session before it steps without it."""
    seed: int = 0
    """Seeds every random choice of the simulated model and engine."""
    final_after_turns: int = Field(6, ge=1)
    """Answer with a final text once the conversation holds this many assistant turns."""
    disaggregation_metadata_slots: int = Field(45, ge=1)
    """PD: the decode side's metadata slots; more transfers in flight than slots can lose a completion
    notice and wedge its request."""
    logprobs_coverage: Literal["full", "no-tool-calls", "none"] = "full"
    """Which generated tokens get log-probabilities in chat: all (SGLang 0.5.23, vLLM 0.33), none inside the
    tool-call block, or none at all."""
    model_loop_rate: float = Field(0.0, ge=0, le=1)
    """The model's own loops (repro.sim.loops): the share of long prompts it answers with one span repeated
    until max_tokens, at any load and on any configuration."""
    model_loop_after_turns: int = Field(3, ge=0)
    """A prompt is long once the conversation holds this many assistant turns."""
    fault_log: Path | None = None
    """JSON-lines file recording every injected fault (the ground truth tests compare verdicts with)."""
    warmup: float = Field(0.0, ge=0)
    """Real seconds during which /health answers 503, as a starting server does."""


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"sim serve: {message}")


def sim_parser(prog: str = "repro sim serve") -> argparse.ArgumentParser:
    """The argument parser of `repro sim serve`: one flag per SimConfig field, its docstring the help."""
    parser = _RaisingParser(prog=prog, description="Serve the embedded DeepSeek-V4 SGLang simulator.")
    for name, field in SimConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = " ".join((field.description or "").split())
        if field.annotation is bool:
            # --no-FLAG too, so a caller can switch off a flag that a wrapper (repro run) passes first.
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=name, default=None, help=f"{help_text} (default: {field.default})")
    # Accepted for command-line compatibility with SGLang launch lines; they change nothing here.
    for ignored in ("--trust-remote-code", "--enable-deepseek-v4-fp4-indexer"):
        parser.add_argument(ignored, action="store_true", help=argparse.SUPPRESS)
    for ignored in ("--tp", "--tp-size", "--attention-backend", "--cuda-graph-max-bs", "--mem-fraction-static",
                    "--disaggregation-transfer-backend", "--disaggregation-bootstrap-port",
                    "--disaggregation-ib-device", "--hicache-size", "--hicache-storage-backend", "--base-gpu-id"):
        parser.add_argument(ignored, help=argparse.SUPPRESS)
    return parser


def parse_flags(argv: Sequence[str], *, prog: str = "repro sim serve") -> SimConfig:
    """A validated configuration from command-line flags; UsageError naming the bad flag otherwise."""
    namespace = sim_parser(prog).parse_args(list(argv))
    given = {name: value for name, value in vars(namespace).items() if name in SimConfig.model_fields and value is not None}
    try:
        return SimConfig(**given)
    except ValidationError as err:
        raise UsageError(describe_validation_error(err, source=prog)) from None


def server_info(config: SimConfig) -> dict[str, Any]:
    """The `/server_info` body: every flag under SGLang's key name, the version, and the simulator marker."""
    info: dict[str, Any] = config.model_dump(mode="json")
    info.update(version=SIM_VERSION, simulator=True, tool_parser_implementation=implementation(config.tool_parser))
    if config.disaggregation_mode != "null":
        info["pd_topology"] = "simulated: one process stands for the prefill server, the decode server and the router"
    return info
