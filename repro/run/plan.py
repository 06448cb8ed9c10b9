"""A run's plan before the load: the session configuration, how turns are observed, and the manifest.

The observe plan is probed on the target (repro.run.rawprobe) before any session starts, and shared
by every session; the manifest records the options, the workload, the target and that plan.
"""

from __future__ import annotations

import platform
import sys
from datetime import datetime, timezone

import anyio
import httptools
import httpx

from repro import __version__
from repro.cluster.node import where
from repro.run import clock
from repro.run.observe import thinking_of
from repro.run.options import DEFAULT_TURNS, MAX_REPLAY_TURNS, RunOptions
from repro.run.rawprobe import PROBE_TIMEOUT_S, ProbeRequest, ProbeResult, probe
from repro.run.session import SessionConfig
from repro.run.target import Target
from repro.store.records import Manifest
from repro.wire.budget import default_limit
from repro.workload.scenario import LoadedScenario, Workload
from repro.workload.trace import Trace


def utc_now() -> str:
    """Now, as the manifest's start and end times are written."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def session_config(options: RunOptions, target: Target, workload: Workload | Trace, headers: dict[str, str]) -> SessionConfig:
    """What every session of the run sends, and its budgets."""
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
        # Each worker process holds its share of the run's budget.
        max_bytes_in_flight=(options.max_bytes_in_flight or default_limit()) // max(1, options.workers),
        extra_body=options.extra_body,
        headers=headers,
        clock_url=clock.clock_url(target.server_info, target.base_url),
    )


def observe_plan(options: RunOptions, config: SessionConfig, base_url: str, headers: dict[str, str]) -> ProbeResult:
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


def versions() -> dict[str, str]:
    """The versions a run's results depend on, for the manifest."""
    return {
        "repro": __version__,
        "python": platform.python_version(),
        "httpx": httpx.__version__,
        "httptools": httptools.__version__,
    }


def manifest(options: RunOptions, name: str, run_id: str, loaded: LoadedScenario, target: Target,
             observed: ProbeResult, *, control: str | None = None) -> Manifest:
    """The run's manifest as the load starts (the end time and the workers' places come later); `control`
    marks a control arm's own run, so a reader of that directory alone sees it."""
    return Manifest(
        name=name,
        run_id=run_id,
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
        versions=versions(),
        node=where(),
        started_at=utc_now(),
        control=control,
    )
