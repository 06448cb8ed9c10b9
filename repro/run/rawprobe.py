"""Before the load: find how this target can show the text its model generates, and settle the run's ObservePlan.

One cheap chat request (the first session's opening, with `logprobs: true, top_logprobs: 0`, bounded
by a timeout) says whether the logprob token strings cover the tool-call tokens. When they do not
(or no logprobs come back), the raw-text endpoints are tried with a few tokens: OpenAI
`/v1/completions`, then SGLang's `/generate` (or only the one `--raw-endpoint` names). What happens
when nothing works depends on what was asked:
- `--observe raw`, or `both` given explicitly: a UsageError (exit 2), before any load;
- no `--observe` (the default `both`): the run degrades to `parsed`, and says so in the manifest.
`--observe parsed` sends nothing here: the run's requests are exactly the production ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dsml_checker.server_parsers import DEFAULT_PARSER
from repro.errors import UsageError
from repro.run.metrics import server_root
from repro.run.observe import (
    LOGPROB_FIELDS,
    ObserveMode,
    ObservePlan,
    RawEndpoint,
    text_request,
)
from repro.wire.client import make_client, send_turn
from repro.wire.rawtext import LogprobText, collector
from repro.wire.transport import Endpoint

PROBE_TIMEOUT_S = 60.0
"""At most this long per probe request (less when the turn timeout is shorter)."""
PROBE_TEXT_TOKENS = 16
"""Tokens asked of a raw-text endpoint: enough to see that it answers with text."""


@dataclass(frozen=True)
class ProbeRequest:
    """What the probe needs to know of the run: the target, the first turn's chat payload, the options."""

    base_url: str
    payload: dict[str, Any]
    """The first session's first chat request, as the run would send it."""
    stream: bool
    timeout: float
    headers: dict[str, str] = field(default_factory=dict)
    requested: ObserveMode | None = None
    """None: the default (`both` where the target supports it)."""
    raw_endpoint: RawEndpoint | None = None
    """None: logprobs when they cover tool calls, else the first raw-text endpoint that answers."""
    client_parser: str = DEFAULT_PARSER
    fmt: str = "v4"
    thinking: bool = True


@dataclass(frozen=True)
class ProbeResult:
    plan: ObservePlan
    findings: dict[str, str]
    """What each probe saw, by source: `logprobs`, `completions`, `generate`."""
    warnings: list[str]

    def manifest_entry(self, requested: ObserveMode | None) -> dict[str, Any]:
        return {
            "requested": requested or "both (default)",
            **self.plan.describe(),
            "probe": self.findings,
            "warnings": self.warnings,
        }


def raw_url(base_url: str, endpoint: RawEndpoint) -> str:
    """`…/v1/completions` beside the chat endpoint, or `/generate` at the server's root."""
    return f"{base_url}/completions" if endpoint == "completions" else f"{server_root(base_url)}/generate"


async def _probe_logprobs(request: ProbeRequest, client: Any) -> tuple[bool, str]:
    """Whether the chat endpoint's logprobs cover a tool-calling turn, and what was seen."""
    rawtext = LogprobText()
    result = await send_turn(
        client,
        Endpoint.parse(f"{request.base_url}/chat/completions"),
        {**request.payload, **LOGPROB_FIELDS},
        stream=request.stream,
        turn_timeout=request.timeout,
        stall_timeout=request.timeout,
        headers=request.headers or None,
        rawtext=rawtext,
    )
    if result.status != "ok":
        return False, f"{result.status}: {result.error}"
    raw = rawtext.result(result.message)
    if not raw.complete:
        return False, f"incomplete: {raw.gap}"
    if not (result.message or {}).get("tool_calls"):
        # Nothing to disprove coverage; each turn still checks its own (repro.wire.rawtext).
        return True, "logprobs on every token; tool-call coverage unverified (the probe's answer had no tool calls)"
    return True, "logprobs on every token, tool calls included"


async def _probe_text(request: ProbeRequest, client: Any, endpoint: RawEndpoint) -> tuple[bool, str]:
    """Whether the raw-text endpoint answers a rendered prompt with text."""
    payload = {**request.payload, "max_tokens": PROBE_TEXT_TOKENS}
    body = text_request(endpoint, payload, fmt=request.fmt, thinking=request.thinking)
    rawtext = collector(endpoint)
    result = await send_turn(
        client,
        Endpoint.parse(raw_url(request.base_url, endpoint)),
        body,
        stream=request.stream,
        turn_timeout=request.timeout,
        stall_timeout=request.timeout,
        headers=request.headers or None,
        rawtext=rawtext,
    )
    if result.status != "ok":
        return False, f"{result.status}: {result.error}"
    return True, f"answers with text ({len(rawtext.result(None).text)} characters for {PROBE_TEXT_TOKENS} tokens)"


async def probe(request: ProbeRequest) -> ProbeResult:
    """Settle the run's ObservePlan (module docstring); UsageError when raw text was demanded and none is to be had."""
    requested = request.requested
    if requested == "parsed":
        return ProbeResult(ObservePlan(), {}, [])
    mode: ObserveMode = requested or "both"
    findings: dict[str, str] = {}
    async with make_client(1, headers=request.headers or None) as client:
        if request.raw_endpoint is None:
            ok, findings["logprobs"] = await _probe_logprobs(request, client)
            if ok:
                return ProbeResult(
                    ObservePlan(mode, "logprobs", fmt=request.fmt, thinking=request.thinking), findings, []
                )
        for endpoint in (request.raw_endpoint,) if request.raw_endpoint else ("completions", "generate"):
            ok, findings[endpoint] = await _probe_text(request, client, endpoint)
            if ok:
                plan = ObservePlan(
                    mode,
                    endpoint,
                    raw_url=raw_url(request.base_url, endpoint),
                    client_parser=request.client_parser,
                    fmt=request.fmt,
                    thinking=request.thinking,
                )
                return ProbeResult(plan, findings, [])
    # Server error texts may span lines; the message is one.
    seen = " ".join("; ".join(f"{source}: {what}" for source, what in findings.items()).split())
    if requested is not None:
        raise UsageError(f"--observe {requested}: the target shows no raw text ({seen})")
    warning = f"observe: the target shows no raw text, so only parsed messages are judged ({seen})"
    return ProbeResult(ObservePlan(), findings, [warning])
