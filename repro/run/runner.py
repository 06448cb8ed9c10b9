"""`repro run` end to end: options, target (a URL or the embedded simulator), run directory, load, summary.

`RunOptions` is the validated option set (CLI, `--config` YAML, a matrix spec's `load:` section);
`execute_run` is the synchronous entry point the CLI and the matrix call. The statistics, gate and
report modules are imported where they are first used: scipy and matplotlib take seconds to import,
and a usage or target error should not wait for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import resource
import shlex
import sys
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Iterator, Literal
from urllib.parse import urlsplit

import anyio
import httptools
import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator, model_validator
from rich.console import Console

from dsml_checker.server_parsers import DEFAULT_PARSER, PARSERS
from repro import __version__
from repro.wire.client import MAX_TURN_BYTES, make_client
from repro.run.display import final_view, say, show_progress
from repro.errors import (
    EXIT_FAILED,
    EXIT_INCONCLUSIVE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    InternalError,
    ReproError,
    TargetError,
    UsageError,
    describe_validation_error,
    load_yaml,
    read_text,
    saving,
    stopping,
)
from repro.run.load import LoadProgress, run_load
from repro.matrix.spec import STRING_OR_LIST
from repro.run.metrics import MetricsScraper, metrics_url, server_root
from repro.run.pressure import parse_factor, sized_workload
from repro.cluster.node import where
from repro.run.observe import ObserveMode, RawEndpoint, thinking_of
from repro.run.rawprobe import PROBE_TIMEOUT_S, ProbeRequest, ProbeResult, probe
from repro.cluster.rayutil import Executor
from repro.store.records import Manifest, OutcomeCounts, SessionRecord, Summary, WorkerPlace
from repro.run.replay import ReplaySession
from repro.run.session import Session, SessionConfig
from repro.run.shards import run_sharded
from repro.sim.launch import start_sim
from repro.store.rundir import METRICS, REPORT, RunWriter, make_run_dir, new_run_dir, slug
from repro.workload.trace import Trace, is_trace
from repro.wire.transport import Endpoint, tls_context
from repro.untrusted import NestingError, get_bounded, json_depth, parse_json
from repro.workload.scenario import Workload, load_scenario

if TYPE_CHECKING:
    from repro.run.shards import Transport
    from repro.run.stopping import BaselineRule, Look, StoppingRule

EMBEDDED_SIM_ARGS = ("--enable-hierarchical-cache", "--index-k-dtype", "bf16", "--enable-metrics", "--enable-cache-report")
"""The seeds' faulty configuration: HiCache on, bf16 index-K, no index-K gate (the fix flag absent); metrics on."""
TARGET_CHECK_TIMEOUT_S = 10.0
TARGET_CHECK_BYTES = 16 * 1024 * 1024
"""Most bytes read of /models or /server_info: an answer that never ends is no answer."""
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
    """The server parser emulated client-side over a raw-text endpoint's text (repro.run.observe)."""
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
        from repro.cluster.rayutil import is_amount

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

    @field_validator("pressure")
    @classmethod
    def _pressure(cls, value: str | None) -> str | None:
        try:
            parse_factor(value)
        except UsageError as err:
            raise ValueError(str(err).removeprefix("--pressure ")) from None
        return value

    @model_validator(mode="after")
    def _stopping_needs(self) -> "RunOptions":
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


@dataclass(frozen=True)
class RunResult:
    path: Path
    summary: Summary
    exit_code: int


@dataclass(frozen=True)
class Target:
    base_url: str
    model: str
    embedded: bool
    sim_args: list[str]
    server_info: dict[str, Any] | None


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _headers(options: RunOptions) -> dict[str, str]:
    if options.api_key_env is None:
        return {}
    key = os.environ.get(options.api_key_env)
    if not key:
        raise UsageError(f"--api-key-env {options.api_key_env}: the environment variable is not set")
    bad = next((i for i, char in enumerate(key) if not "!" <= char <= "~"), None)
    if bad is not None:
        # Named by position and kind, never shown: the rest of the value is the secret.
        kind = repr(key[bad]) if key[bad] in "\r\n\t " else "a non-ASCII or control character"
        hint = " (a key file with Windows line endings?)" if key[bad] == "\r" else ""
        raise UsageError(
            f"--api-key-env {options.api_key_env}: the key has {kind} at position {bad + 1} of {len(key)}"
            f"{hint}; an HTTP header cannot carry it (the value is not shown)"
        )
    return {"Authorization": f"Bearer {key}"}


def _get(client: httpx.Client, url: str) -> tuple[int, bytes]:
    return get_bounded(client, url, max_bytes=TARGET_CHECK_BYTES, timeout_s=TARGET_CHECK_TIMEOUT_S)


def resolve_target(base_url: str, model: str | None, headers: dict[str, str], *, embedded: bool, sim_args: list[str]) -> Target:
    """Check that the target answers `/models`; pick the model; read `/server_info` when there is one."""
    with httpx.Client(timeout=TARGET_CHECK_TIMEOUT_S, trust_env=False, headers=headers, verify=tls_context()) as client:
        try:
            status, content = _get(client, f"{base_url}/models")
        except httpx.HTTPError as err:
            raise TargetError(f"target {base_url} is unreachable: {type(err).__name__}: {err}") from None
        except ValueError as err:
            raise TargetError(f"target {base_url}/models: {err}") from None
        if status != 200:
            raise TargetError(f"target {base_url}/models answered HTTP {status}")
        try:
            listed = [str(entry["id"]) for entry in parse_json(content).get("data", [])]
        except (ValueError, AttributeError, KeyError, TypeError):
            raise TargetError(f"target {base_url}/models did not return an OpenAI model list") from None
        if model is None:
            if not listed:
                raise TargetError(f"target {base_url} serves no model (/models is empty)")
            model = listed[0]
        server_info = None
        with contextlib.suppress(httpx.HTTPError, ValueError):
            status, content = _get(client, server_root(base_url) + "/server_info")
            info_json = parse_json(content) if status == 200 else None
            if isinstance(info_json, dict):
                server_info = info_json
    return Target(base_url=base_url, model=model, embedded=embedded, sim_args=sim_args, server_info=server_info)


@contextlib.contextmanager
def _embedded_sim(options: RunOptions, run_dir: Path, console: Console) -> Iterator[str]:
    args = [*EMBEDDED_SIM_ARGS, *options.sim_args]
    with start_sim(args, log_path=run_dir / "sim.log") as sim:
        extra = f"; {shlex.join(options.sim_args)}" if options.sim_args else ""
        say(console, f"No --base-url: started the embedded simulator at {sim.base_url} "
                     f"(HiCache on, bf16 index-K, no index-K gate{extra})")
        yield sim.base_url


def _observe(options: RunOptions, config: SessionConfig, base_url: str, headers: dict[str, str]) -> ProbeResult:
    """The run's observe plan, probed on the target before the load (repro.run.rawprobe)."""
    request = ProbeRequest(
        base_url=base_url,
        payload=config.payload(config.opening(0)),
        stream=options.stream,
        timeout=min(options.turn_timeout, PROBE_TIMEOUT_S),
        headers=headers,
        requested=options.observe,
        raw_endpoint=options.raw_endpoint,
        client_parser=options.client_parser,
        thinking=thinking_of(options.extra_body),
    )
    return anyio.run(probe, request)


def _run_dir(options: RunOptions, name: str) -> tuple[Path, bool]:
    """The run directory, made now (so a concurrent run cannot take it); True if this call created it."""
    if options.out is not None:
        return options.out, make_run_dir(options.out)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return new_run_dir(Path("reports"), f"{stamp}-{slug(name)}"), True


class _StartGuard:
    """Until `done`, an exception removes what the run made, so nothing blocks a rerun with the same --out.

    Entered first in the run's ExitStack, so it exits last: after the simulator stopped writing its log.
    Only what this run made is removed (rmdir, not rmtree): a directory that holds anything else stays.
    """

    def __init__(self, run_dir: Path, created: bool) -> None:
        self.run_dir = run_dir
        self.created = created
        self.writer: RunWriter | None = None
        self.done = False

    def __enter__(self) -> "_StartGuard":
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: object) -> None:
        if kind is None or self.done:
            return
        with contextlib.suppress(OSError):
            if self.writer is not None:  # else the directory may be another run's: touch none of its files
                self.writer.discard()
                (self.run_dir / "sim.log").unlink(missing_ok=True)  # its tail is in the error already
            if self.created:
                self.run_dir.rmdir()


def ensure_open_files(connections: int) -> None:
    """Raise the open-file limit to fit `connections` sockets (plus the run's files), or say why not."""
    wanted = connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            raise UsageError(f"--concurrency {connections} needs {wanted} open files; the hard limit is {hard} (ulimit -Hn)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


@dataclass
class _Halting:
    """What a first Ctrl-C does to a `--until-decided` run (the `stopping` callback around its load and
    its saving): halt the load while it runs (or as soon as it starts, when it came before); once a
    look has decided, or the last wave ended, nothing, so the saving completes and a decided run stays
    decided (a run that stopped because it knew the answer was not interrupted)."""

    halt: Callable[[], None] | None = None
    requested: bool = False
    """A Ctrl-C came before the load could take it."""
    over: bool = False

    def __call__(self) -> None:
        if self.over:
            return
        if self.halt is None:
            self.requested = True
        else:
            self.halt()


@dataclass
class _Driven:
    records: list[SessionRecord]
    interrupted: bool
    lag: list[float]
    duration: float
    worker_lag: list[list[float]]
    """Per worker process with `--workers`: its own loop-lag samples (all are in `lag` too)."""
    lost: dict[int, str] = dataclasses.field(default_factory=dict)
    """With `--workers`: the workers lost mid-run, and why."""
    looks: "list[Look] | None" = None
    """The stopping rule's looks, for a `--until-decided` run."""


def _waves(options: RunOptions) -> list[range]:
    """Session ids per wave: all at once, or `concurrency` at a time for `--until-decided`."""
    if not options.until_decided or options.concurrency is None:
        return [range(options.sessions)]
    step = options.concurrency
    return [range(start, min(start + step, options.sessions)) for start in range(0, options.sessions, step)]


async def _drive(
    options: RunOptions,
    config: SessionConfig,
    writer: RunWriter,
    console: Console,
    live: bool,
    base_url: str,
    rule: "StoppingRule | BaselineRule | None",
    halting: _Halting,
    transport: "Transport | None" = None,
    on_placed: Callable[[list[dict[str, str]]], None] | None = None,
) -> _Driven:
    concurrency = options.concurrency or options.sessions
    records: list[SessionRecord] = []
    progress = LoadProgress(planned=options.sessions)
    origin = progress.t0
    # Set when the disk fills up, or by a Ctrl-C between two waves (one during a wave stops run_load itself).
    halt = anyio.Event()
    looks: "list[Look]" = []

    def on_finish(record: SessionRecord) -> None:
        records.append(record)
        writer.append_session(record)
        if writer.full is not None:
            halt.set()

    def keep_raw(session_id: int, turn: int, data: bytes, *, suffix: str = "sse") -> str | None:
        path = writer.write_raw(session_id, turn, data, suffix=suffix)
        if writer.full is not None:
            halt.set()
        return path

    interrupted = False
    lag: list[float] = []
    worker_lag: list[list[float]] = []
    lost: dict[int, str] = {}
    duration = 0.0
    loop = asyncio.get_running_loop()
    async with (
        make_client(concurrency) as client,
        httpx.AsyncClient(trust_env=False, headers=config.headers, verify=tls_context()) as side_client,
        anyio.create_task_group() as group,
    ):
        scraper = MetricsScraper(side_client, metrics_url(base_url), writer.path / METRICS)
        if await scraper.scrape_once(origin):  # no metrics at the first scrape: none are looked for again
            group.start_soon(scraper.follow, origin)
        group.start_soon(show_progress, progress, console, live)

        kind = ReplaySession if isinstance(config.workload, Trace) else Session
        # Between waves (while the rule looks) a Ctrl-C halts the run as one during a wave does
        # (execute_run installs `halting` as the signals' callback).
        halting.halt = lambda: loop.call_soon_threadsafe(halt.set)
        if halting.requested:
            halt.set()
        decided = False
        try:
            for wave in _waves(options):
                await anyio.lowlevel.checkpoint()  # lets a Ctrl-C that came while the rule looked set `halt`
                if halt.is_set():
                    break

                before = len(records)

                def make_session(index: int, first: int = wave.start) -> Session:
                    return kind(first + index, config, client, keep_raw=keep_raw, origin=origin)

                if options.sharded:  # one wave: RunOptions refuses --workers with --until-decided
                    result = await run_sharded(
                        min(options.workers, concurrency, len(wave)), len(wave), concurrency, config, on_finish, keep_raw,
                        ramp_up=options.ramp_up, progress=progress, stop=halt, transport=transport, on_placed=on_placed,
                    )
                else:
                    result = await run_load(
                        len(wave), concurrency, make_session, on_finish, ramp_up=options.ramp_up, progress=progress,
                        stop=halt,
                    )
                lag += result.loop_lag_s
                worker_lag += result.worker_loop_lag_s
                lost.update(result.lost)
                duration += result.duration_s
                # A Ctrl-C after the wave's last session ended cut nothing short: the wave is looked at
                # (as the gate's replay of sessions.jsonl will), and the run stops after the look.
                ended = records[before:]
                whole = len(ended) == len(wave) and all(record.outcome != "interrupted" for record in ended)
                interrupted = result.interrupted
                if (interrupted and not whole) or rule is None:
                    break
                counts = OutcomeCounts.of(records)
                looks.append(rule.look(counts.corrupt, counts.completed, len(records)))
                progress.stopping = f"look {len(looks)}: {rule.describe(looks[-1])}"
                if looks[-1].decision is not None:
                    decided, interrupted = True, False
                    break
                if interrupted:
                    break
        finally:
            # The load is over: a Ctrl-C from here on only lets the saving finish.
            halting.over, halting.halt = True, None
        await anyio.lowlevel.checkpoint()
        # A Ctrl-C that came while the deciding look ran was too late to stop anything: the run is decided.
        interrupted = interrupted or (halt.is_set() and not decided)
        group.cancel_scope.cancel()
        if not interrupted:
            # The counters as the run ends, whatever the scrape interval left out (shielded: the group is cancelled).
            with anyio.CancelScope(shield=True):
                await scraper.scrape_once(origin)
    return _Driven(records, interrupted or bool(lost), lag, duration, worker_lag, lost, looks if rule is not None else None)


def _stopping_rule(options: RunOptions) -> "StoppingRule | BaselineRule | None":
    """The `--until-decided` rule: against the baseline when one is given, else against the limit."""
    if not options.until_decided:
        return None
    from repro.run.stopping import BaselineRule, StoppingRule, max_looks

    if options.baseline is None:
        assert options.max_corruption_rate is not None  # RunOptions._stopping_needs
        return StoppingRule(limit=options.max_corruption_rate, confidence=options.confidence)
    from repro.store.rundir import DamagedRun, load_run

    try:
        base = load_run(options.baseline)
    except (DamagedRun, UsageError) as err:
        raise UsageError(f"--baseline: {err}") from None
    if base.summary is None or base.summary.interrupted:
        raise UsageError(f"--baseline {options.baseline}: the run did not finish; compare against a finished run")
    counts = OutcomeCounts.of(base.sessions)
    return BaselineRule(
        baseline_corrupt=counts.corrupt, baseline_completed=counts.completed,
        max_looks=max_looks(options.sessions, options.concurrency or options.sessions), margin=options.margin,
        confidence=options.confidence, baseline=base.name,
    )


def _versions() -> dict[str, str]:
    return {
        "repro": __version__,
        "python": platform.python_version(),
        "httpx": httpx.__version__,
        "httptools": httptools.__version__,
    }


def execute_run(
    options: RunOptions, *, console: Console | None = None, live: bool = True, report: bool = True
) -> RunResult:
    """Run the whole job; TargetError (exit 3) when the target is unreachable or serves no model.

    `report=False` skips `report.html` (a caller that renders reports itself, such as the matrix).
    """
    console = console or Console()
    loaded = load_scenario(options.workload, replay=options.replay)
    headers = _headers(options)
    secrets = [value.removeprefix("Bearer ") for value in headers.values()]
    rule = _stopping_rule(options)  # before anything is made: a bad --baseline is a usage error
    if options.executor == "ray":
        from repro.cluster.rayutil import require_ray

        require_ray(options.ray_address)  # before the run directory is made
    name = options.name or loaded.name
    run_dir, created = _run_dir(options, name)  # made now: before a simulator starts or a target is asked anything
    ensure_open_files(options.concurrency or options.sessions)
    halting = _Halting()
    with contextlib.ExitStack() as signals:
        with contextlib.ExitStack() as stack:
            start = stack.enter_context(_StartGuard(run_dir, created))
            if options.base_url is None:
                # The directory exists before the simulator starts, so its log lands in it.
                writer = start.writer = RunWriter(run_dir, secrets=secrets)
                stack.callback(writer.close)
                base_url = stack.enter_context(_embedded_sim(options, run_dir, console))
                target = resolve_target(base_url, options.model, headers, embedded=True, sim_args=[*EMBEDDED_SIM_ARGS, *options.sim_args])
            else:
                base_url = options.base_url
                target = resolve_target(base_url, options.model, headers, embedded=False, sim_args=[])
                writer = start.writer = RunWriter(run_dir, secrets=secrets)
                stack.callback(writer.close)
            transport = _ray_transport(options, base_url, stack) if options.executor == "ray" else None
            scenario = sized_workload(
                loaded.scenario, pressure=options.pressure, server_info=target.server_info, base_url=target.base_url,
                headers=headers, active=min(options.concurrency or options.sessions, options.sessions),
                turns=options.turns or DEFAULT_TURNS, say=lambda line: say(console, line))
            config = _session_config(options, target, scenario, headers)
            observed = _observe(options, config, base_url, headers)
            config = dataclasses.replace(config, observe=observed.plan)
            for warning in observed.warnings:
                say(console, writer.scrub_text(warning))  # a probe's error may quote a server that echoed the key
            manifest = Manifest(
                name=name,
                run_id=run_dir.name,
                command=list(sys.argv),
                options=options.model_dump(mode="json"),
                workload=loaded.manifest_entry(),
                target={
                    "base_url": target.base_url,
                    "model": target.model,
                    "embedded": target.embedded,
                    **({"sim_args": target.sim_args} if target.embedded else {}),
                },
                server_info=target.server_info,
                observe=observed.manifest_entry(options.observe),
                versions=_versions(),
                node=where(),
                started_at=_utc_now(),
            )
            try:
                writer.write_manifest(manifest)
            except OSError as err:
                raise UsageError(f"--out {run_dir}: cannot write the manifest: {err.strerror or err}") from None
            start.done = True

            def on_placed(nodes: list[dict[str, str]]) -> None:
                nonlocal manifest
                manifest = manifest.model_copy(update={"workers": [WorkerPlace(index=i, node=n) for i, n in enumerate(nodes)]})
                with contextlib.suppress(OSError):  # written again at the end; a full disk is noticed there
                    writer.write_manifest(manifest)

            if rule is not None and threading.current_thread() is threading.main_thread():
                # From its first wave to the end of its saving, a `--until-decided` run takes a Ctrl-C itself.
                signals.enter_context(stopping(halting))
            with saving("the records of the sessions in flight, summary.json and report.html"):
                driven = anyio.run(_drive, options, config, writer, console, live, base_url, rule, halting, transport, on_placed)
        with saving("summary.json and report.html"):
            return _save(options, run_dir, writer, manifest, driven, rule, console, report)


def _ray_transport(options: RunOptions, base_url: str, stack: contextlib.ExitStack) -> "Transport":
    """Connect to Ray for the run (disconnected when `stack` closes) and check the cluster can reach the target."""
    from repro.run.rayshards import check_resources, check_target, ray_actors
    from repro.cluster.rayutil import DEFAULT_RESOURCES, connected

    ray = stack.enter_context(connected(options.ray_address))
    check_target(ray, base_url)
    resources = options.worker_resources or DEFAULT_RESOURCES
    asked = [resources] * options.workers if isinstance(resources, dict) else resources
    check_resources(ray, asked)
    return ray_actors(ray, asked)


def _save(
    options: RunOptions,
    run_dir: Path,
    writer: RunWriter,
    manifest: Manifest,
    driven: _Driven,
    rule: "StoppingRule | BaselineRule | None",
    console: Console,
    report: bool,
) -> RunResult:
    """After the load: summary.json, the manifest's end time, the gate, the final view and the report.

    When the disk filled up, the run was stopped: what could be saved is, and one line says what was not.
    """
    from repro.store.summary import summarize

    writer.sync()  # the lines of the load's last loop pass: a failed fsync counts in `lost` before it is read
    full = writer.full
    observe = manifest.observe or {}
    records, interrupted, lag, duration = driven.records, driven.interrupted, driven.lag, driven.duration
    if driven.lost:
        lost_workers = "; ".join(driven.lost.values())
        stop_reason = f"{len(driven.lost)} of {len(manifest.workers)} workers lost ({lost_workers})"
        manifest = manifest.model_copy(update={"workers": [
            place.model_copy(update={"lost": driven.lost.get(place.index)}) for place in manifest.workers
        ]})
    else:
        stop_reason = None
    from repro.store.exercise import assess, read_samples

    exercised = assess(read_samples(run_dir / METRICS), manifest.server_info)
    summary = summarize(
        records, loop_lag_s=lag, worker_loop_lag_s=driven.worker_lag, duration_s=duration, interrupted=interrupted,
        lost=writer.lost,
        stop_reason=f"the run stopped early: cannot write ({full.strerror or full})" if full is not None else stop_reason,
        observe=observe.get("mode"), raw_source=observe.get("raw_source"), exercised=exercised,
    )
    stopped = None
    if rule is not None and driven.looks is not None:
        from repro.run.stopping import stopping_record

        stopped = stopping_record(rule, driven.looks, wave=options.concurrency or options.sessions,
                                  cap=options.sessions, interrupted=interrupted or full is not None)
        summary = summary.model_copy(update={"stopping": stopped})
        say(console, f"stopping: {stopped.decision.upper()} after {stopped.sessions} of {stopped.cap} sessions: "
                     f"{stopped.reason}")
    try:
        writer.write_summary(summary)
        writer.write_manifest(manifest.model_copy(update={"ended_at": _utc_now()}))
        saved = "summary.json written"
    except OSError as err:
        saved = f"summary.json not written ({err.strerror or err})"
    if full is not None:
        console.print(final_view(summary, run_dir))
        kept = len(records) - writer.lost
        lost = f", {writer.lost} finished sessions not saved" if writer.lost else ""
        raise ReproError(
            f"run stopped: cannot write to {run_dir}: {full.strerror or full}; "
            f"{kept} sessions kept in sessions.jsonl{lost}; {saved}",
            exit_code=EXIT_INTERRUPTED,
        )
    exit_code = EXIT_INTERRUPTED if interrupted else EXIT_OK
    if options.max_corruption_rate is not None:
        summary, gate_code = _gate(run_dir, summary, options, writer, console)
        exit_code = exit_code if interrupted else gate_code
    elif stopped is not None and not interrupted:
        exit_code = {"pass": EXIT_OK, "fail": EXIT_FAILED}.get(stopped.decision, EXIT_INCONCLUSIVE)
    console.print(final_view(summary, run_dir))
    if report:
        with saving("report.html"):
            _report(run_dir, console)
    if driven.lost:
        # Not a verdict on the target: the run's own machinery failed (exit 255), with what was kept.
        raise InternalError(f"run incomplete: {stop_reason}; their sessions in flight are recorded as errors, "
                            f"the ones they had not started were not played; {saved}")
    return RunResult(path=run_dir, summary=summary, exit_code=exit_code)


def _session_config(options: RunOptions, target: Target, workload: Workload | Trace, headers: dict[str, str]) -> SessionConfig:
    return SessionConfig(
        url=f"{target.base_url}/chat/completions",
        model=target.model,
        workload=workload,
        seed=options.seed,
        stream=options.stream,
        turns=options.turns or (MAX_REPLAY_TURNS if isinstance(workload, Trace) else DEFAULT_TURNS),
        timeout=options.timeout,
        turn_timeout=options.turn_timeout,
        stall_timeout=options.stall_timeout,
        max_turn_bytes=options.max_turn_bytes,
        extra_body=options.extra_body,
        headers=headers,
    )


def _gate(run_dir: Path, summary: Summary, options: RunOptions, writer: RunWriter, console: Console) -> tuple[Summary, int]:
    """Judge the finished run (issue #5's gate) and keep its verdict in summary.json."""
    from repro.run.gate import evaluate

    assert options.max_corruption_rate is not None
    result = evaluate(run_dir, max_corruption_rate=options.max_corruption_rate, confidence=options.confidence,
                      baseline=options.baseline)
    summary = summary.model_copy(update={"gate": result.as_record()})
    writer.write_summary(summary)
    for line in result.lines():
        say(console, line)
    return summary, result.exit_code


def _report(run_dir: Path, console: Console) -> None:
    """report.html beside the records; a report that cannot be rendered does not undo the run."""
    from repro.report import render_report

    try:
        render_report([run_dir], run_dir / REPORT)
    except ReproError as err:
        say(console, f"report: not written: {err}")
        return
    say(console, f"Report: {run_dir / REPORT}")

