"""How a run observes a turn: the message the server's parser returned, the text the model generated, or both.

`ObservePlan` is decided once per run (repro.run.rawprobe) and shared by every session:
- `parsed`: the production request, unchanged; one verdict, on the parsed message.
- `both` / `raw` with source `logprobs`: the chat request gains `logprobs: true, top_logprobs: 0`
  and the generated text is rebuilt from the token strings (repro.wire.rawtext).
- `both` / `raw` with source `completions` or `generate` (a server whose chat logprobs do not cover
  the tool-call tokens): the conversation is rendered client-side by DeepSeek's encoder and sent to
  the raw-text endpoint; the tool calls are parsed client-side as a real server's parser does
  (`dsml_checker.server_parsers.parse_as`: DeepSeek's own parser for sglang-0.5.23 where it is
  installed, else an emulation), and the session goes on with those. A text the parser raises on
  becomes the turn's `parser-error` finding, as the server would have failed the request.

`judge` gives each turn its verdicts (`dsml_checker.verdicts.judge_turn`): on the parsed message (what
an agent saw, so the same as in `parsed` mode), on the raw text (what the model emitted), on what the
parse lost of the raw text (parser damage no agent sees), and the combined one the run counts (`raw`
mode: the raw verdict; `both`: the worst of the three). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from dsml_checker import Verdict, check, check_raw, encode_messages
from dsml_checker.findings import make_finding
from dsml_checker.formats import stated_thinking
from dsml_checker.server_parsers import DEFAULT_PARSER, NativeParserError, implementation, parse_as
from dsml_checker.verdicts import judge_turn
from repro.store.records import FindingRecord, TurnVerdict
from repro.untrusted import parse_json
from repro.wire.rawtext import RawCollector, RawSource, RawText, collector

ObserveMode = Literal["raw", "parsed", "both"]
RawEndpoint = Literal["completions", "generate"]

LOGPROB_FIELDS: dict[str, Any] = {"logprobs": True, "top_logprobs": 0}
"""What raw mode adds to a chat request: every generated token's string, no alternatives."""

KEEP_SPECIAL: dict[str, Any] = {"skip_special_tokens": False, "no_stop_trim": True}
"""SGLang's switches that keep `</think>` and the end of sentence in a raw-text endpoint's output."""


@dataclass(frozen=True)
class ObservePlan:
    """What every turn of a run asks for and how it is judged."""

    mode: ObserveMode = "parsed"
    source: RawSource | None = None
    """Where the raw text comes from; None in `parsed` mode."""
    raw_url: str | None = None
    """The raw-text endpoint (`…/v1/completions` or `…/generate`) when `source` is one of them."""
    client_parser: str | None = None
    """The emulated server parser that turns a raw-text endpoint's text into tool calls."""
    fmt: str = "v4"
    thinking: bool = True
    """The prompt ends with `<think>`: the generated text starts with reasoning (DeepSeek's thinking mode)."""
    thinking_stated: bool | None = None
    """The thinking mode the requests state (`chat_template_kwargs`); None: the server's default decides, and the
    raw verdict does not assume one (only a stated thinking mode makes a missing `</think>` a finding)."""

    @property
    def text_endpoint(self) -> bool:
        """The turn is sent to a raw-text endpoint instead of chat completions."""
        return self.source in ("completions", "generate")

    def describe(self) -> dict[str, Any]:
        """The manifest's account of the plan: which mode ran, with which raw source, judged on what."""
        parsed_on, request = "the server's parsed message", "the production chat request, unchanged"
        if self.source == "logprobs":
            request = "the production chat request with logprobs: true, top_logprobs: 0"
        elif self.text_endpoint:
            parser = self.client_parser or DEFAULT_PARSER
            parsed_on = f"the {parser} parser ({implementation(parser)}) run client-side over the {self.source} text"
            request = f"{self.source} request with the prompt rendered client-side (DeepSeek encoder, {self.fmt})"
        return {
            "mode": self.mode,
            "raw_source": self.source,
            "raw_url": self.raw_url,
            "client_parser": self.client_parser if self.text_endpoint else None,
            "client_parser_implementation": implementation(self.client_parser or DEFAULT_PARSER)
            if self.text_endpoint else None,
            "fmt": self.fmt,
            "parsed_verdict_on": parsed_on,
            "request": request,
        }


def thinking_of(extra_body: dict[str, Any]) -> bool:
    """Whether requests ask for thinking mode: DeepSeek's default unless `chat_template_kwargs` turns it off."""
    stated = stated_thinking(extra_body)
    return True if stated is None else stated


class RenderError(ValueError):
    """The conversation cannot be rendered as a prompt: a damaged tool call in its history, say."""


def _check_renderable(messages: list[dict[str, Any]]) -> None:
    """The encoder writes each past call's arguments as parameters: they must be a JSON object."""
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            arguments = function.get("arguments")
            try:
                value = parse_json(arguments) if isinstance(arguments, str) else arguments
            except ValueError:
                value = None
            if not isinstance(value, dict):
                raise RenderError(
                    f"cannot render the conversation for the raw-text endpoint: the arguments of an earlier "
                    f"{str(function.get('name'))[:80]!r} call are not a JSON object"
                )


RENDERED = frozenset({"messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs"})
"""Chat fields the client-side rendering consumes (the prompt holds them); a raw-text request carries the rest."""


def text_request(source: RawSource, payload: dict[str, Any], *, fmt: str, thinking: bool) -> dict[str, Any]:
    """A chat payload as a raw-text request: the conversation rendered to a prompt, the same sampling.

    The prompt has no BOS: both servers tokenize a text prompt with the tokenizer's special tokens and
    would add it twice. Special tokens are kept in the output, so the end of sentence can be judged.
    Every field but those in `RENDERED` is carried over (`max_tokens` is `max_new_tokens` for /generate).
    RenderError when the history cannot be rendered (a server's chat endpoint would refuse it too).
    """
    _check_renderable(payload["messages"])
    try:
        prompt = encode_messages(
            payload["messages"], tools=payload.get("tools"), fmt=fmt, thinking=thinking, add_default_bos_token=False
        )
    except ValueError as err:
        raise RenderError(f"cannot render the conversation for the raw-text endpoint: {err}") from None
    # Everything else the chat request carries goes along: the scenario's sampling and the user's
    # `--extra-body` (a structured-output constraint, say), which the raw-text lane must not lose.
    rest = {key: value for key, value in payload.items() if key not in RENDERED and value is not None}
    if source == "generate":
        # SGLang's /generate takes every sampling field, constraints included, in `sampling_params`.
        if "max_tokens" in rest:
            rest["max_new_tokens"] = rest.pop("max_tokens")
        rest.pop("model", None)
        return {"text": prompt, "sampling_params": {**rest, **KEEP_SPECIAL}}
    return {**rest, "prompt": prompt, **KEEP_SPECIAL}


def turn_request(plan: ObservePlan, payload: dict[str, Any]) -> tuple[dict[str, Any], RawCollector | None]:
    """The body to send for one turn and the collector that rebuilds its raw text (None in parsed mode)."""
    if plan.source is None:
        return payload, None
    if plan.text_endpoint:
        return text_request(plan.source, payload, fmt=plan.fmt, thinking=plan.thinking), collector(plan.source)
    return {**payload, **LOGPROB_FIELDS}, collector("logprobs")


def parse_text(
    plan: ObservePlan, text: str, finish_reason: str | None, *, tools: Any, tool_choice: Any, turn: int
) -> tuple[dict[str, Any], str | None, str | None]:
    """A raw-text endpoint's text as the message and finish reason the server would have returned, and the
    parser's error when it raised on the text (then an empty message: the server would have answered none)."""
    try:
        parsed = parse_as(
            plan.client_parser or DEFAULT_PARSER,
            text,
            tools=tools,
            tool_choice=tool_choice,
            fmt=plan.fmt,
            finish_reason=finish_reason if finish_reason in ("stop", "length") else None,
            thinking=plan.thinking,
        )
    except NativeParserError as err:
        return {"role": "assistant", "content": "", "reasoning_content": None, "tool_calls": None}, finish_reason, str(err)
    message = parsed.message()
    for position, call in enumerate(message["tool_calls"] or []):
        call["id"] = f"call_{turn}_{position}"
    return message, parsed.finish_reason, None


@dataclass(frozen=True)
class Judgement:
    """A turn's verdicts: the combined one the run counts, on the parsed message, and on the raw text."""

    verdict: TurnVerdict
    parsed: Verdict
    raw: Verdict | None
    """None in parsed mode, or when the raw text was not whole."""
    lost: Verdict | None = None
    """What the parse lost of the raw text; None when there was no whole raw text to compare with."""


def judge(
    plan: ObservePlan,
    message: dict[str, Any],
    *,
    finish_reason: str | None,
    tools: Any,
    tool_choice: Any,
    rawtext: RawText | None,
    parser_error: str | None = None,
) -> Judgement:
    """Both verdicts of a turn and how they combine under the plan's mode (module docstring). A client-side
    parser's error is a hard `parser-error` finding on the parsed verdict (the server would have failed)."""
    if parser_error is not None:
        failed = Verdict.of((make_finding("parser-error", "parser", parser_error, 0, len(parser_error)),))
        raw = None
        if rawtext is not None and rawtext.complete:
            raw = check_raw(rawtext.text, tools=tools, tool_choice=tool_choice, finish_reason=finish_reason,
                            fmt=plan.fmt, thinking=plan.thinking_stated)
        return Judgement(raw.label if plan.mode == "raw" and raw is not None else "corrupt", failed, raw)
    if rawtext is None or not rawtext.complete:
        parsed = check(message, finish_reason=finish_reason, tools=tools, tool_choice=tool_choice)
        return Judgement(parsed.label, parsed, None)
    verdicts = judge_turn(
        message, rawtext.text, finish_reason=finish_reason, tools=tools, tool_choice=tool_choice, fmt=plan.fmt,
        thinking=plan.thinking_stated,
    )
    label = verdicts.raw.label if plan.mode == "raw" else verdicts.label
    return Judgement(label, verdicts.parsed, verdicts.raw, verdicts.lost)


def finding_records(verdict: Verdict) -> list[FindingRecord]:
    return [FindingRecord.model_validate(finding.to_dict()) for finding in verdict.findings]
