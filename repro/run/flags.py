"""The command-line flags of a run's load, defined once: `repro run` and `repro sweep` both declare
`LOAD_FLAGS`, so a sweep's levels can be tuned exactly as a run is (and `--config` reads the same YAML);
the bisect commands take the per-session ones through `LOAD_FLAGS.only`."""

from __future__ import annotations

from pathlib import Path

import typer

from repro.option_groups import OptionGroup

LOAD_FLAGS = OptionGroup(
    model=(str | None, typer.Option(None, "--model", help="Model name (default: the first of /v1/models).")),
    api_key_env=(str | None, typer.Option(None, "--api-key-env", help="Environment variable holding the API key.")),
    ramp_up=(float | None, typer.Option(None, "--ramp-up", help="Spread session starts over SECONDS (default: 0).")),
    turns=(int | None, typer.Option(
        None, "--turns", help="Maximum turns per session (default: 12; a trace: every recorded turn).")),
    timeout=(float | None, typer.Option(None, "--timeout", help="Whole-session budget, seconds (default: 180).")),
    turn_timeout=(float | None, typer.Option(
        None, "--turn-timeout", help="One request's budget, seconds (default: 120).")),
    stall_timeout=(float | None, typer.Option(
        None, "--stall-timeout", help="No bytes this long: wedged (default: 30).")),
    max_turn_bytes=(int | None, typer.Option(
        None, "--max-turn-bytes", help="Cut a response longer than this and call the turn an error (default: 64 MiB).")),
    max_bytes_in_flight=(int | None, typer.Option(
        None, "--max-bytes-in-flight", help="Answer bytes held at once; at the limit new turns wait, counted as "
        "client queueing (default: 1/8 of RAM).")),
    workload=(Path | None, typer.Option(
        None, "--workload", help="Workload YAML, or a trace of recorded conversations (.jsonl) to replay "
        "(default: experiments/agentic_coding.yaml).")),
    seed=(int | None, typer.Option(None, "--seed", help="Seed of the session tasks (default: 0).")),
    stream=(bool | None, typer.Option(None, "--stream/--no-stream", help="Stream responses (default: stream).")),
    extra_body=(str | None, typer.Option(None, "--extra-body", help="JSON object merged into every request.")),
    sim_args=(str | None, typer.Option(None, "--sim-args", help="More flags for the embedded simulator.")),
    observe=(str | None, typer.Option(
        None, "--observe", help="Judge raw|parsed|both: the model's raw text, the parsed message, or both "
        "(default: both where the target shows raw text).")),
    raw_endpoint=(str | None, typer.Option(
        None, "--raw-endpoint", help="Raw text from completions|generate instead of chat logprobs "
        "(default: logprobs when they cover tool calls).")),
    client_parser=(str | None, typer.Option(
        None, "--client-parser", help="Server parser run over a raw endpoint's text (default: sglang-0.5.23, "
        "DeepSeek's deepseek-recipe where installed, else emulated).")),
    replay=(str | None, typer.Option(
        None, "--replay", help="With a trace (.jsonl) workload: fast (default) or timing (keep the recorded gaps "
        "between turns).")),
    pressure=(str | None, typer.Option(
        None, "--pressure", help="auto (or a factor): size each session's own prefix so the sessions at once hold "
        "2 (or FACTOR) device KV pools: evictions and host-tier load-backs.")),
    config=(Path | None, typer.Option(None, "--config", help="YAML file of `repro run` options; the command line wins.")),
)
"""How each session is driven and judged; the values arrive as a dict, None where the flag was not given."""
