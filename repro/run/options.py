"""`repro run`'s options: one validated model for the CLI, a `--config` YAML file and a matrix spec's `load:`.

The phase modules of a run (target, plan, drive, finish) read these options and nothing else of the
command line, so everything a run may be asked is defined once, here.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from dsml_checker.server_parsers import DEFAULT_PARSER, PARSERS
from repro.cluster.rayutil import Executor, is_amount
from repro.errors import UsageError, describe_validation_error, load_yaml, read_text
from repro.run.observe import ObserveMode, RawEndpoint
from repro.run.pressure import parse_factor
from repro.untrusted import NestingError, json_depth, parse_json
from repro.wire.client import MAX_TURN_BYTES
from repro.wire.transport import Endpoint
from repro.workload.trace import is_trace

STRING_OR_LIST = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
"""The schema of flags given as one shell-like string or as a list (the validator splits a string)."""
MAX_RAMP_UP_S = 86_400.0
"""A day: a longer ramp-up is a typo (1e12), and would wait without end for sessions never started."""
MAX_EXTRA_BODY_DEPTH = 64
DEFAULT_TURNS = 12
MAX_REPLAY_TURNS = 1_000_000
"""A trace replays every recorded turn unless --turns says fewer."""


class RunOptions(BaseModel):
    """One field per `repro run` option; the defaults are the CLI's."""

    # NaN and infinity are never useful here: `--ramp-up inf` would wait forever.
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    base_url: str | None = None
    """OpenAI base URL of the target (…/v1); none: the embedded simulator."""
    model: str | None = None
    """Model name; none: the first of /v1/models."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (sent as a bearer token, never written)."""
    sessions: int = Field(default=60, ge=1, le=100_000)
    """Number of sessions."""
    concurrency: int | None = Field(default=None, ge=1, le=100_000)
    """Sessions at once; none: all sessions at once."""
    ramp_up: float = Field(default=0.0, ge=0.0, le=MAX_RAMP_UP_S)
    """Spread the session starts over this many seconds."""
    turns: int | None = Field(default=None, ge=1, le=1_000)
    """Most turns per session; none: 12 for a workload, every recorded turn of a trace's conversations."""
    timeout: float = Field(default=180.0, gt=0.0)
    """Whole-session budget, seconds: a session still going then is a timeout."""
    turn_timeout: float = Field(default=120.0, gt=0.0)
    """One request's budget, seconds."""
    stall_timeout: float = Field(default=30.0, gt=0.0)
    """A stream silent this many seconds is wedged: the turn ends as a timeout."""
    max_turn_bytes: int = Field(default=MAX_TURN_BYTES, ge=1024)
    """Cap on one response's bytes: a longer one is cut there and the turn is an error."""
    max_bytes_in_flight: int | None = Field(default=None, ge=1024)
    """Answer bytes the client holds at once, all workers together; more and new turns wait (client queueing,
    not latency); none: an eighth of the machine's memory."""
    workload: Path | None = None
    """Workload YAML, or a trace (.jsonl) to replay; none: the packaged experiments/agentic_coding.yaml."""
    seed: int = 0
    """Seed of the session tasks."""
    name: str | None = None
    """Run name; none: the workload's name."""
    out: Path | None = None
    """Run directory; none: reports/<timestamp>-<name>/."""
    stream: bool = True
    """Stream responses (server-sent events)."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """JSON object merged into every request (e.g. `{"chat_template_kwargs": {"thinking": true}}`)."""
    sim_args: Annotated[list[str], WithJsonSchema(STRING_OR_LIST)] = Field(default_factory=list)
    """More flags for the embedded simulator (a string is split like a shell)."""
    max_corruption_rate: float | None = Field(default=None, ge=0.0, lt=1.0)
    """Gate the run at its end: exit 0 when the rate is shown below this, 1 above, 125 inconclusive."""
    observe: ObserveMode | None = None
    """Judge the parsed message, the raw generated text, or both; none: both where the target shows raw text."""
    raw_endpoint: RawEndpoint | None = None
    """Take raw text from this endpoint instead of chat logprobs; none: logprobs when they cover tool calls."""
    pressure: str | None = None
    """`auto` or a factor: give each session a long document of its own so that the sessions running at once
    hold this many device KV pools (auto: 2); none: the workload as it is."""
    client_parser: str = DEFAULT_PARSER
    """The server parser run client-side over a raw-text endpoint's text (repro.run.observe): for sglang-0.5.23,
    DeepSeek's own deepseek-recipe where it is installed, else the emulation; the manifest says which ran."""
    until_decided: bool = False
    """Run in waves of `concurrency` and stop once the gate's answer is known (repro.run.stopping); `sessions` is the cap."""
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    """Confidence of the gate and of the stopping rule."""
    baseline: Path | None = None
    """With `until_decided`: stop once an increase over this finished run, or its absence, is shown."""
    margin: float = Field(default=0.05, gt=0.0, lt=1.0)
    """Against a baseline: an increase shown to be under this passes."""
    replay: Literal["fast", "timing"] = "fast"
    """With a trace workload (.jsonl): send each recorded turn as soon as the last answer is in, or keep the
    recorded gaps between turns."""
    workers: int = Field(default=1, ge=1, le=256)
    """Workers the sessions are sharded across (repro.run.shards); 1: this process alone."""
    executor: Executor = "local"
    """What the workers are: local processes, or Ray actors on a cluster (repro.run.rayshards; needs `workers`)."""
    ray_address: str | None = None
    """With executor ray: the cluster's HOST:PORT; none: RAY_ADDRESS, else a Ray started here for the run."""
    worker_resources: list[dict[str, float]] | dict[str, float] | None = None
    """With executor ray: the Ray resources every worker asks for (a list: one entry per worker, in order);
    none: one CPU each."""

    @field_validator("client_parser")
    @classmethod
    def _known_parser(cls, value: str) -> str:
        if value not in PARSERS:
            raise ValueError(f"unknown parser {value!r}; expected one of {', '.join(PARSERS)}")
        return value

    @field_validator("pressure")
    @classmethod
    def _pressure(cls, value: str | None) -> str | None:
        try:
            parse_factor(value)
        except UsageError as err:
            raise ValueError(str(err).removeprefix("--pressure ")) from None
        return value

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        if any(char.isspace() or not char.isprintable() for char in value):
            raise ValueError("must not contain spaces or control characters (CR, LF, tab)")
        parts = urlsplit(value)
        if "@" in parts.netloc:
            # Refused, not sent: it would be written to manifest.json and the report, and it is in the
            # shell's history and `ps` already. A key belongs in the environment.
            raise ValueError(
                "must not carry a user name or password (user:password@host): "
                "put the key in an environment variable and pass --api-key-env"
            )
        if "?" in value or "#" in value:
            raise ValueError(
                "must not have a query string or fragment: /models and /chat/completions are appended to it"
            )
        Endpoint.parse(value)  # a ValueError names what else is wrong: no host, a bad port
        return value.rstrip("/")

    @field_validator("extra_body", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = parse_json(value)
            except NestingError:
                raise ValueError(f"nested deeper than {MAX_EXTRA_BODY_DEPTH} levels") from None
            except ValueError as err:
                raise ValueError(f"not valid JSON: {err}") from None
        if not isinstance(value, dict):
            raise ValueError("must be a JSON object")
        if json_depth(value) > MAX_EXTRA_BODY_DEPTH:
            raise ValueError(f"nested deeper than {MAX_EXTRA_BODY_DEPTH} levels")
        if "ignore_eos" in value:  # a forced run past the end of sentence would fake the model's own loops
            raise ValueError("ignore_eos is never sent: a loop must be the model's own (docs/control.md)")
        try:
            json.dumps(value, allow_nan=False)  # as every request body is sent: standard JSON only
        except ValueError:
            raise ValueError("NaN and Infinity are not JSON; no server can be expected to read them") from None
        except TypeError as err:
            raise ValueError(f"not JSON: {err}") from None
        return value

    @field_validator("worker_resources", mode="before")
    @classmethod
    def _resources(cls, value: Any) -> Any:
        # Imported here, not at start-up: only a Ray run has resources to check.

        if isinstance(value, str):
            try:
                value = parse_json(value)
            except ValueError as err:
                raise ValueError(f"not valid JSON: {err}") from None
        for entry in value if isinstance(value, list) else [value]:
            if not isinstance(entry, dict) or not entry:
                raise ValueError('expected a JSON object of Ray resources ({"CPU": 1, "loadgen": 1}) or a list of them')
            for name, amount in entry.items():
                if not is_amount(amount):
                    raise ValueError(f"resource {name!r}: expected a number of at least 0, got {amount!r}")
        return value

    @field_validator("sim_args", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return shlex.split(value) if isinstance(value, str) else value

    @field_validator("api_key_env")
    @classmethod
    def _variable_name(cls, value: str | None) -> str | None:
        if value is not None and not value.replace("_", "a").isalnum():
            raise ValueError("must be the name of an environment variable, not the key itself")
        return value

    @model_validator(mode="after")
    def _stopping_needs(self) -> "RunOptions":
        if "margin" in self.model_fields_set and self.baseline is None:
            raise ValueError("--margin needs --baseline (it is the increase over the baseline that passes)")
        if self.baseline is not None and not self.until_decided:
            raise ValueError("--baseline needs --until-decided (a finished run is compared by `repro gate --baseline`)")
        if self.until_decided:
            if self.max_corruption_rate is None and self.baseline is None:
                raise ValueError("--until-decided needs --max-corruption-rate or --baseline: the rule stops when "
                                 "the answer to one of them is decided")
            if self.concurrency is None or self.concurrency >= self.sessions:
                raise ValueError("--until-decided needs --concurrency below --sessions: a wave is one concurrency's "
                                 "worth of sessions, and the rule looks after each")
        if self.sharded and self.until_decided:
            raise ValueError("--workers runs the sessions in one wave; --until-decided looks between waves: use one")
        if self.sharded and is_trace(self.workload):
            raise ValueError("--workers shards generated sessions; a trace (.jsonl) is replayed in one process")
        if self.executor == "ray" and "workers" not in self.model_fields_set:
            raise ValueError("--executor ray needs --workers N: the number of Ray actors that share the sessions")
        if self.executor != "ray":
            for name in ("ray_address", "worker_resources"):
                if getattr(self, name) is not None:
                    raise ValueError(f"--{name.replace('_', '-')} needs --executor ray")
        if isinstance(self.worker_resources, list) and len(self.worker_resources) != self.workers:
            raise ValueError(f"--worker-resources: a list gives one entry per worker: {self.workers} expected, "
                             f"{len(self.worker_resources)} given")
        return self

    @property
    def sharded(self) -> bool:
        """The sessions are played by workers (processes or actors) and streamed back (repro.run.shards)."""
        return self.workers > 1 or self.executor == "ray"

    @classmethod
    def parse(cls, data: dict[str, Any], *, source: str = "options") -> "RunOptions":
        """Validate, turning the first problem into a UsageError that names the field."""
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise UsageError(describe_validation_error(err, source=source)) from None

    @classmethod
    def from_sources(cls, config: Path | None, overrides: dict[str, Any]) -> "RunOptions":
        """Options from a YAML file (`--config`) with the command line's values winning."""
        data: dict[str, Any] = {}
        if config is not None:
            text = read_text(Path(config), f"--config {config}")
            loaded = load_yaml(text, source=f"--config {config}")
            if loaded is not None and not isinstance(loaded, dict):
                raise UsageError(f"--config {config}: must be a mapping of option names to values")
            data = {str(key).replace("-", "_"): value for key, value in (loaded or {}).items()}
        data.update({key: value for key, value in overrides.items() if value is not None})
        return cls.parse(data, source=str(config) if config is not None else "options")
