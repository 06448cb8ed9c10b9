"""The simulator's HTTP face: SGLang's endpoints over starlette, streaming with SSE, served by uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import sys
import traceback
from dataclasses import asdict
from typing import Any, AsyncIterator, Callable, Iterator, Protocol, TypeVar

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from dsml_checker import check, check_raw
from dsml_checker.formats import stated_thinking
from repro.sim.config import SimConfig, server_info
from repro.sim.corrupt import damage
from repro.sim.engine import CHARS_PER_TOKEN, Engine, EngineRequest, Race, context_length, count_tokens, page_keys
from repro.sim.faults import FaultLog, FaultRecord, WedgeRecord, parser_effect
from repro.sim.lockstep import SESSION_HEADER
from repro.sim.loops import looping_answer, loops
from repro.sim.metrics import SimMetrics
from repro.sim.model import answer, assistant_turns, conversation_key, rng_for
from repro.sim.parser import ParsedOutput, parse_output
from repro.sim.pd import Wedge
from repro.sim.prompt_decode import PromptDecodeError, decode_prompt
from repro.sim.protocol import ChatRequest, ChatStream, Reply, error_body, now_s, render_prompt
from repro.sim.raw_api import (
    CompletionCursor,
    CompletionRequest,
    GenerateCursor,
    GenerateRequest,
    RawText,
    completion_body,
    generate_body,
)
from repro.sim.tokens import token_logprobs, tokenize
from repro.untrusted import scrub_json

READY_BANNER = "The server is fired up and ready to roll!"


def _error(message: str, status: int, *, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status=status, param=param), status_code=status)


def cut_to_limit(raw: str, limit: int | None) -> str:
    """The raw text as far as the token limit lets the model write it."""
    return raw[: limit * CHARS_PER_TOKEN] if limit is not None and count_tokens(raw) > limit else raw


_Body = TypeVar("_Body", bound=BaseModel)


async def _validated(request: Request, model: type[_Body]) -> _Body | JSONResponse:
    """The request body validated as `model`, or the error response SGLang would give."""
    try:
        # A lone surrogate (`"\\ud800"`) is valid JSON but no UTF-8 text: the tokenizer of a real server
        # replaces it, as the simulator does here, rather than failing the request.
        payload = scrub_json(json.loads(await request.body()))
    except ValueError:
        return _error("The request body is not valid JSON.", 400)
    if not isinstance(payload, dict):
        return _error("The request body must be a JSON object.", 400)
    try:
        return model.model_validate(payload)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        return _error(f"{param}: {first['msg']}" if param else first["msg"], 422, param=param)


class _StreamView(Protocol):
    def opening(self) -> list[dict[str, Any]]: ...

    def advance(self, tokens_done: int, tokens_total: int) -> Iterator[dict[str, Any]]: ...

    def closing(self) -> list[dict[str, Any]]: ...


class Simulator:
    """Shared state of one server: the engine, its metrics, the fault log, the PD wedges."""

    def __init__(self, config: SimConfig, is_corrupt: Callable[[ParsedOutput, str, dict[str, Any]], bool]) -> None:
        self.config = config
        self.engine = Engine(config)
        self.metrics = SimMetrics(self.engine, config.served_model_name)
        self.faults = FaultLog(config.fault_log)
        self.wedges: list[WedgeRecord] = []
        self.fault_texts: dict[str, str] = {}
        """The raw text each faulted request emitted (after damage and its token limit), by request id."""
        self.is_corrupt = is_corrupt
        self.ready_at = float("inf")

    def finish(self, raw: str, request: ChatRequest) -> tuple[ParsedOutput, str, int]:
        """Apply the token limit, then the configured parser: (output, finish_reason, completion tokens)."""
        text = cut_to_limit(raw, request.token_limit)
        truncated, raw = text != raw, text
        output, reason = parse_output(raw, tools=[t.model_dump(exclude_none=True) for t in request.tools],
                                      tool_choice=request.choice_value(), parser=self.config.tool_parser,
                                      truncated=truncated)
        return output, reason, count_tokens(raw)

    def generate(self, request: ChatRequest, request_id: str, prompt: str, session: str | None = None,
                 ) -> tuple[EngineRequest, asyncio.Future[Reply]]:
        """Submit a request to the engine; the future resolves to its reply once the prefill ran."""
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        tools = [t.model_dump(exclude_none=True) for t in request.tools]
        seed = self.config.seed if request.seed is None else hash((self.config.seed, request.seed))
        meant = answer(messages, tools, request.choice_value(), seed=seed, final_after_turns=self.config.final_after_turns)
        if loops(self.config, messages, seed):
            meant = looping_answer(request.token_limit, CHARS_PER_TOKEN)
        prompt_tokens = count_tokens(prompt)
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Reply] = loop.create_future()

        def on_prefilled(race: Race | None) -> int:
            raw = meant.raw
            if race is not None:
                raw = self._inject(race, raw, request, request_id, messages, seed)
            output, reason, tokens = self.finish(raw, request)
            emitted = cut_to_limit(raw, request.token_limit)
            if race is not None:
                self.fault_texts[request_id] = emitted
            logprobs = None
            if request.logprobs and self.config.logprobs_coverage != "none":
                logprobs = tuple(token_logprobs(emitted, top_logprobs=request.top_logprobs or 0,
                                                coverage=self.config.logprobs_coverage, has_calls=bool(output.calls)))
            # Usage counts the pseudo-tokens logprobs are served for, one per generated token as on a real
            # server (a client checks its logprobs against it); the engine's clock keeps its own count.
            reply.set_result(Reply(request_id, self.config.served_model_name, now_s(), output, reason,
                                   prompt_tokens, len(tokenize(emitted)), engine_request.cached_tokens, emitted, logprobs))
            return tokens

        def on_wedged(wedge: Wedge) -> None:
            self.wedges.append(WedgeRecord(
                request_id=request_id, conversation=conversation_key(messages), turn=assistant_turns(messages),
                state=wedge.state, slot=wedge.slot, sim_time_s=wedge.sim_time_s, cause=wedge.cause,
                by_request_id=wedge.by_request_id, in_flight=wedge.in_flight,
            ))

        engine_request = EngineRequest(request_id, prompt_tokens, page_keys(prompt, self.config.page_size), on_prefilled,
                                       on_wedged=on_wedged, session=session)
        self.engine.submit(engine_request)
        return engine_request, reply

    def _inject(self, race: Race, raw: str, request: ChatRequest, request_id: str,
                messages: list[dict[str, Any]], seed: int) -> str:
        conversation, turn = conversation_key(messages), assistant_turns(messages)
        tool = request.tools[0].function.name if request.tools else "search"
        tool_fields = request.model_dump(include={"tools", "tool_choice"})
        operator, damaged = damage(raw, rng_for(seed, conversation, turn, "damage"), tool=tool)
        meant, _, _ = self.finish(raw, request)
        got, reason, _ = self.finish(damaged, request)
        visible = self.is_corrupt(got, reason, tool_fields)
        raw_verdict = check_raw(cut_to_limit(damaged, request.token_limit), tools=tool_fields.get("tools"),
                                tool_choice=tool_fields.get("tool_choice"), finish_reason=reason,
                                thinking=stated_thinking(request.model_extra))
        self.faults.add(FaultRecord(
            request_id=request_id, conversation=conversation, turn=turn, operator=operator, layer=race.layer,
            read_time_s=round(race.read_time_s, 6), copy_done_s=round(race.copy_done_s, 6),
            load_back_tokens=race.load_back_tokens, link_share=race.link_share, index_k_dtype=self.config.index_k_dtype,
            tool_parser=self.config.tool_parser, raw_verdict=raw_verdict.label,
            raw_rules=sorted({f.rule for f in raw_verdict.findings}), parsed_verdict="corrupt" if visible else "clean",
            parser_effect=parser_effect(meant, got, visible=visible),
        ))
        return damaged


class LoadPlan(BaseModel):
    """`POST /sim/clock/plan`: the load a client is about to run on the virtual clock."""

    sessions: int = Field(ge=0)
    concurrency: int = Field(ge=1)


class SessionEnded(BaseModel):
    """`POST /sim/clock/ended`: a session that will send no more requests."""

    session: str = Field(min_length=1, max_length=64)


def _checker_says_corrupt(output: ParsedOutput, finish_reason: str, request: dict[str, Any]) -> bool:
    message = Reply("probe", "", 0, output, finish_reason, 0, 0, 0).message()
    verdict = check(message, finish_reason=finish_reason, tools=request.get("tools"), tool_choice=request.get("tool_choice"))
    return verdict.label == "corrupt"


def create_app(config: SimConfig) -> Starlette:
    """The ASGI app of one simulator; the engine runs while the app's lifespan lasts."""
    sim = Simulator(config, _checker_says_corrupt)
    max_prompt_tokens = context_length(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        task = loop.create_task(sim.engine.run())
        task.add_done_callback(_engine_stopped)
        sim.ready_at = loop.time() + config.warmup
        print(READY_BANNER, flush=True)
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            sim.faults.close()

    def _engine_stopped(task: asyncio.Task[None]) -> None:
        # A dead engine would leave every request hanging: say why in the log and turn /health red.
        if not task.cancelled() and task.exception() is not None:
            traceback.print_exception(task.exception(), file=sys.stderr)
            sim.ready_at = float("inf")

    async def health(request: Request) -> Response:
        ready = asyncio.get_running_loop().time() >= sim.ready_at
        return Response(status_code=200 if ready else 503)

    async def health_generate(request: Request) -> Response:
        probe = EngineRequest("health-" + secrets.token_hex(4), 1, [], lambda race: 1, fake_transfer=True)
        sim.engine.submit(probe)
        try:
            await asyncio.wait_for(probe.changed.wait(), timeout=20.0)
        except asyncio.TimeoutError:
            sim.engine.abort(probe)
            return Response(status_code=503)
        return Response(status_code=200)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": config.served_model_name, "object": "model", "created": 0, "owned_by": "sglang",
             "root": config.model_path, "max_model_len": max_prompt_tokens}]})

    async def info(request: Request) -> Response:
        return JSONResponse(server_info(config))

    async def loads(request: Request) -> Response:
        engine = sim.engine
        return JSONResponse({"loads": [{"dp_rank": 0, "num_reqs": engine.num_requests(),
                                        "num_waiting_reqs": len(engine.waiting), "num_tokens": engine.used_tokens()}]})

    async def flush_cache(request: Request) -> Response:
        if sim.engine.busy:
            return _error("Cache not flushed: requests are running or waiting.", 400)
        sim.engine.flush()
        return Response("Cache flushed.\n", status_code=200)

    async def metrics(request: Request) -> Response:
        if not sim.config.enable_metrics:  # SGLang serves /metrics only with --enable-metrics
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return Response(sim.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def faults(request: Request) -> Response:
        return JSONResponse({"faults": [asdict(r) for r in sim.faults.records]})

    async def fault_texts(request: Request) -> Response:
        return JSONResponse({"texts": sim.fault_texts})

    async def wedges(request: Request) -> Response:
        return JSONResponse({"wedges": [asdict(r) for r in sim.wedges]})

    async def chat(request: Request) -> Response:
        chat_request = await _validated(request, ChatRequest)
        if isinstance(chat_request, JSONResponse):
            return chat_request
        if chat_request.model not in (None, "default", config.served_model_name):
            return _error(f"The model {chat_request.model!r} does not exist.", 404, param="model")
        prompt = render_prompt(chat_request)
        prompt_tokens = count_tokens(prompt)
        if prompt_tokens > max_prompt_tokens:
            return _error(f"The prompt has {prompt_tokens} tokens; the context length is {max_prompt_tokens}.",
                          400, param="messages")
        request_id = "chatcmpl-" + secrets.token_hex(12)
        engine_request, pending = sim.generate(chat_request, request_id, prompt, request.headers.get(SESSION_HEADER))
        if chat_request.stream:
            include_usage = chat_request.include_usage
            return StreamingResponse(
                _stream(engine_request, pending, lambda r: ChatStream(r, include_usage=include_usage)),
                media_type="text/event-stream")
        failed = await _finished(engine_request)
        return failed or JSONResponse(pending.result().body())

    async def _finished(engine_request: EngineRequest) -> Response | None:
        """Wait for a non-streamed request; the error response when it did not finish."""
        try:
            while not engine_request.finished:
                engine_request.changed.clear()
                await engine_request.changed.wait()
        finally:
            sim.engine.abort(engine_request)
        if engine_request.error is not None:
            return _error(engine_request.error, 500)
        if engine_request.aborted:
            return _error("The request was aborted.", 503)
        _observe(engine_request)
        return None

    def _raw_submit(prompt: str, limit: int, seed: int | None, request_id: str, session: str | None,
                    ) -> tuple[EngineRequest, asyncio.Future[Reply]] | JSONResponse:
        """Start a raw-text request: the conversation read back from its prompt, answered as over chat."""
        try:
            decoded = decode_prompt(prompt)
            # The prompt states its thinking mode (it ends with <think> or </think>): the fault log judges by it.
            chat_request = ChatRequest.model_validate(
                {"messages": decoded.messages, "tools": decoded.tools, "max_tokens": limit, "seed": seed,
                 "chat_template_kwargs": {"thinking": decoded.thinking}})
        except (PromptDecodeError, ValidationError) as err:
            return _error(f"The prompt is not a DeepSeek-V4 conversation the simulator can read: {err}", 400)
        prompt_tokens = count_tokens(prompt)
        if prompt_tokens > max_prompt_tokens:
            return _error(f"The prompt has {prompt_tokens} tokens; the context length is {max_prompt_tokens}.", 400)
        return sim.generate(chat_request, request_id, prompt, session)

    async def generate(request: Request) -> Response:
        body = await _validated(request, GenerateRequest)
        if isinstance(body, JSONResponse):
            return body
        params = body.sampling_params
        started = _raw_submit(body.text, params.max_new_tokens, params.sampling_seed, body.rid or secrets.token_hex(16),
                              request.headers.get(SESSION_HEADER))
        if isinstance(started, JSONResponse):
            return started
        engine_request, pending = started
        keep_eos = not params.skip_special_tokens and params.no_stop_trim
        if body.stream:
            return StreamingResponse(
                _stream(engine_request, pending, lambda r: GenerateCursor(RawText(r, keep_eos=keep_eos))),
                media_type="text/event-stream")
        failed = await _finished(engine_request)
        return failed or JSONResponse(generate_body(RawText(pending.result(), keep_eos=keep_eos)))

    async def completions(request: Request) -> Response:
        body = await _validated(request, CompletionRequest)
        if isinstance(body, JSONResponse):
            return body
        if body.model not in (None, "default", config.served_model_name):
            return _error(f"The model {body.model!r} does not exist.", 404, param="model")
        started = _raw_submit(body.prompt, body.max_tokens, body.seed, "cmpl-" + secrets.token_hex(12),
                              request.headers.get(SESSION_HEADER))
        if isinstance(started, JSONResponse):
            return started
        engine_request, pending = started
        keep_eos = not body.skip_special_tokens and body.no_stop_trim
        if body.stream:
            include_usage = body.include_usage
            return StreamingResponse(
                _stream(engine_request, pending,
                        lambda r: CompletionCursor(RawText(r, keep_eos=keep_eos), include_usage=include_usage)),
                media_type="text/event-stream")
        failed = await _finished(engine_request)
        return failed or JSONResponse(completion_body(RawText(pending.result(), keep_eos=keep_eos)))

    def _observe(engine_request: EngineRequest) -> None:
        now = asyncio.get_running_loop().time()
        if engine_request.first_token_real is not None:
            sim.metrics.ttft.observe(engine_request.first_token_real - engine_request.arrival_real)
        sim.metrics.e2e.observe(now - engine_request.arrival_real)

    async def _stream(engine_request: EngineRequest, pending: asyncio.Future[Reply],
                      view_of: Callable[[Reply], _StreamView]) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        try:
            # Until the first token: in PD mode the reply exists once the prefill ran, but nothing may reach
            # the client before the decode side has the KV.
            while not (engine_request.tokens_done or engine_request.finished):
                engine_request.changed.clear()
                await engine_request.changed.wait()
            if engine_request.error is not None:
                # SGLang's streaming error event for a request the scheduler aborted, then the end of the stream.
                yield _sse(error_body(engine_request.error, status=500, kind="InternalServerError"))
                yield "data: [DONE]\n\n"
                return
            if engine_request.aborted:
                return
            view = view_of(pending.result())
            for chunk in view.opening():
                yield _sse(chunk)
            last = loop.time()
            while True:
                engine_request.changed.clear()
                for chunk in view.advance(engine_request.tokens_done, engine_request.output_tokens):
                    yield _sse(chunk)
                now = loop.time()
                sim.metrics.itl.observe(now - last)
                last = now
                if engine_request.finished:
                    break
                await engine_request.changed.wait()
            if engine_request.aborted:
                return
            for chunk in view.closing():
                yield _sse(chunk)
            yield "data: [DONE]\n\n"
            _observe(engine_request)
        finally:
            sim.engine.abort(engine_request)

    async def clock(request: Request) -> Response:
        lockstep = sim.engine.lockstep
        return JSONResponse({"clock": config.clock, **(lockstep.status() if lockstep is not None else {})})

    async def clock_plan(request: Request) -> Response:
        body = await _validated(request, LoadPlan)
        if isinstance(body, JSONResponse):
            return body
        if sim.engine.lockstep is None:
            return _error("The simulator runs on the real clock (--clock real): there is no load to declare.", 400)
        sim.engine.lockstep.plan(body.sessions, body.concurrency)
        sim.engine.poke()
        return JSONResponse(sim.engine.lockstep.status())

    async def clock_ended(request: Request) -> Response:
        body = await _validated(request, SessionEnded)
        if isinstance(body, JSONResponse):
            return body
        if sim.engine.lockstep is None:
            return _error("The simulator runs on the real clock (--clock real): there are no sessions to end.", 400)
        sim.engine.lockstep.end(body.session)
        sim.engine.poke()
        return JSONResponse(sim.engine.lockstep.status())

    async def not_found(request: Request, exc: HTTPException) -> Response:
        return _error(exc.detail, exc.status_code)

    routes = [
        Route("/health", health), Route("/health_generate", health_generate), Route("/v1/models", models),
        Route("/server_info", info), Route("/get_server_info", info), Route("/v1/loads", loads),
        Route("/get_load", loads), Route("/flush_cache", flush_cache, methods=["POST"]), Route("/metrics", metrics),
        Route("/debug/faults", faults), Route("/debug/wedges", wedges), Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/debug/fault-texts", fault_texts), Route("/generate", generate, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]), Route("/sim/clock", clock),
        Route("/sim/clock/plan", clock_plan, methods=["POST"]), Route("/sim/clock/ended", clock_ended, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: not_found})


def _sse(chunk: dict[str, Any]) -> str:
    return "data: " + json.dumps(chunk, ensure_ascii=False, separators=(",", ":")) + "\n\n"


def serve(config: SimConfig) -> None:
    """Run the simulator until SIGINT or SIGTERM."""
    # A long keep-alive: the client's pooled connections must not be closed under it between turns.
    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level="warning", access_log=False,
                timeout_keep_alive=120)
