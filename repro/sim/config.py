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
    """Every flag of `repro sim serve`. Field names are SGLang's server-arg names where they exist."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(30000, ge=1, le=65535)
    model_path: str = "deepseek-ai/DeepSeek-V4"
    served_model_name: str = "deepseek-ai/DeepSeek-V4"
    tool_call_parser: str = "deepseekv4"
    tool_parser: Literal["sglang-0.5.23", "sglang-0.5.20", "vllm-0.33"] = "sglang-0.5.23"
    """Whose DeepSeek-V4 parser the server runs (dsml_checker.server_parsers.PARSERS): the real one where it is
    installed (sglang-0.5.23: deepseek-recipe), else its emulation; /server_info says which."""
    reasoning_parser: str = "deepseek-v4"
    kv_cache_dtype: str = "fp8_e4m3"
    page_size: int = Field(64, ge=1)
    max_running_requests: int = Field(64, ge=1)
    max_total_tokens: int = Field(64_000, ge=1024)
    """Device KV pool size in tokens: the prefix cache and the running requests share it."""
    chunked_prefill_size: int = Field(16_384, ge=256)
    enable_hierarchical_cache: bool = False
    hicache_ratio: float = Field(2.0, gt=0)
    hicache_write_policy: str = "write_through"
    hicache_io_backend: str = "kernel"
    hicache_mem_layout: str = "layer_first"
    disable_overlap_schedule: bool = False
    disable_cuda_graph: bool = False
    disaggregation_mode: Literal["null", "prefill", "decode"] = "null"
    """prefill or decode: the simulator stands for the whole PD pair (prefill, decode, router)."""
    disaggregation_waiting_timeout: float = Field(300.0, gt=0)
    """Simulated seconds a PD request may wait for its KV before it fails (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)."""
    enable_metrics: bool = True
    enable_cache_report: bool = True
    # The simulator's own flags.
    index_k_dtype: Literal["fp8", "bf16"] = "fp8"
    index_k_gate: bool = False
    """The fix: the index-K read waits for its layer's load-back like the main-KV read does."""
    time_scale: float = Field(0.2, ge=0)
    """Real seconds per simulated second (0 runs the clock as fast as the CPU allows); the real clock only."""
    clock: Literal["real", "virtual"] = "real"
    """real: the engine keeps pace with the wall clock, and when a client's turn lands depends on the machine.
    virtual: the engine steps once every session the client declared has its request in (repro.sim.lockstep):
    the same seed and flags give the same faults at any machine load."""
    lockstep_patience: float = Field(60.0, gt=0)
    """Virtual clock: real seconds the engine waits for a missing session before it steps without it."""
    seed: int = 0
    final_after_turns: int = Field(6, ge=1)
    """Answer with a final text once the conversation holds this many assistant turns."""
    disaggregation_metadata_slots: int = Field(45, ge=1)
    """PD: the decode side's metadata slots; more transfers in flight than slots can lose a completion notice."""
    logprobs_coverage: Literal["full", "no-tool-calls", "none"] = "full"
    """Which generated tokens get log-probabilities in chat: all (SGLang 0.5.23, vLLM 0.33), none inside the
    tool-call block, or none at all."""
    model_loop_rate: float = Field(0.0, ge=0, le=1)
    """The model's own loops (repro.sim.loops): the share of long prompts it answers with one span repeated
    until max_tokens, at any load and on any configuration."""
    model_loop_after_turns: int = Field(3, ge=0)
    """A prompt is long once the conversation holds this many assistant turns."""
    fault_log: Path | None = None
    warmup: float = Field(0.0, ge=0)
    """Real seconds during which /health answers 503, as a starting server does."""


_FLAG_HELP: dict[str, str] = {
    "max_total_tokens": "device KV pool size in tokens",
    "disaggregation_mode": "null, or prefill|decode: the simulator then stands for the whole PD pair behind a "
                           "router, and every request's KV transfer is simulated",
    "disaggregation_waiting_timeout": "PD: simulated seconds before a request stuck in its KV transfer fails",
    "disaggregation_metadata_slots": "PD: decode-side metadata slots; more transfers in flight than slots can "
                                     "lose a completion notice and wedge its request",
    "enable_hierarchical_cache": "HiCache: evicted prefix pages move to a host tier and are loaded back layer by layer",
    "index_k_dtype": "index-K storage: bf16 copies twice the bytes of fp8 per layer",
    "index_k_gate": "the fix: gate the index-K read on its layer's load-back",
    "time_scale": "real seconds per simulated second (real clock)",
    "clock": "real (paced by the wall clock) or virtual (steps once the client's declared sessions are in: "
             "the same seed gives the same faults at any machine load)",
    "lockstep_patience": "virtual clock: real seconds to wait for a missing session before stepping without it",
    "final_after_turns": "assistant turns before the model gives a final answer",
    "fault_log": "JSON-lines file recording every injected fault (ground truth)",
    "logprobs_coverage": "chat log-probabilities: full (as SGLang 0.5.23), no-tool-calls (withheld from the "
                         "tool-call block on), or none",
    "warmup": "seconds during which /health answers 503",
    "model_loop_rate": "share of long prompts the model itself answers with a loop (one span repeated up to "
                       "max_tokens, no tool call), decided by the conversation and turn: the same at any load",
    "model_loop_after_turns": "a prompt is long once the conversation holds this many assistant turns",
    "tool_parser": "the server-side parser: sglang-0.5.23 (deepseek-recipe itself where installed, else its "
                   "emulation), sglang-0.5.20 or vllm-0.33 (emulated)",
}


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"sim serve: {message}")


def _build_parser(prog: str) -> argparse.ArgumentParser:
    parser = _RaisingParser(prog=prog, description="Serve the embedded DeepSeek-V4 SGLang simulator.")
    for name, field in SimConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = _FLAG_HELP.get(name, "")
        if field.annotation is bool:
            # --no-FLAG too, so a caller can switch off a flag that a wrapper (repro run) passes first.
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=name, default=None, help=f"{help_text} (default: {field.default})".strip())
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
    namespace = _build_parser(prog).parse_args(list(argv))
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
