"""A run's target: the embedded simulator or a URL, checked before anything is sent, and its model picked.

`/models` must answer with an OpenAI model list (else TargetError, exit 3); `/server_info` is read when
the server has one (SGLang does), for the manifest and for confirming a matrix cell's configuration.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx
from rich.console import Console

from repro.errors import TargetError, UsageError
from repro.run.display import say
from repro.run.metrics import server_root
from repro.run.options import RunOptions
from repro.sim.launch import EMBEDDED_SIM_ARGS, start_sim
from repro.untrusted import get_bounded, parse_json
from repro.wire.transport import tls_for

TARGET_CHECK_TIMEOUT_S = 10.0
TARGET_CHECK_BYTES = 16 * 1024 * 1024
"""Most bytes read of /models or /server_info: an answer that never ends is no answer."""


@dataclass(frozen=True)
class Target:
    """The server a run drives, as checked before the load."""

    base_url: str
    model: str
    embedded: bool
    sim_args: list[str]
    server_info: dict[str, Any] | None


def auth_headers(options: RunOptions) -> dict[str, str]:
    """The bearer token from `--api-key-env`'s variable, checked to fit a header; never shown."""
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
    with httpx.Client(timeout=TARGET_CHECK_TIMEOUT_S, trust_env=False, headers=headers, verify=tls_for(base_url)) as client:
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
def embedded_sim(options: RunOptions, run_dir: Path, console: Console) -> Iterator[str]:
    """The simulator in the seeds' faulty configuration (plus `--sim-args`), its log in the run directory."""
    args = [*EMBEDDED_SIM_ARGS, *options.sim_args]
    with start_sim(args, log_path=run_dir / "sim.log") as sim:
        extra = f"; {shlex.join(options.sim_args)}" if options.sim_args else ""
        say(console, f"No --base-url: started the embedded simulator at {sim.base_url} "
                     f"(HiCache on, bf16 index-K, no index-K gate{extra})")
        yield sim.base_url


def reach(options: RunOptions, headers: dict[str, str], run_dir: Path, stack: contextlib.ExitStack,
          console: Console) -> Target:
    """The target resolved: the embedded simulator started (stopped when `stack` closes), or the URL checked."""
    if options.base_url is None:
        base_url = stack.enter_context(embedded_sim(options, run_dir, console))
        return resolve_target(base_url, options.model, headers, embedded=True,
                              sim_args=[*EMBEDDED_SIM_ARGS, *options.sim_args])
    return resolve_target(options.base_url, options.model, headers, embedded=False, sim_args=[])
