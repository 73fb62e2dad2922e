"""The OpenAI-compatible HTTP gateway: Starlette routes served by uvicorn on a thread of its own.

It submits to the same uma.Engine as the Unix-socket daemon, so both share one scheduler, its
priorities and its metrics; the engine is thread-safe, and this thread's event loop never
touches the daemon's poller. Request bodies become socket-protocol requests
(uma.server.openai_api), so both doors accept and refuse the same things.

    POST /v1/completions, POST /v1/chat/completions  (stream: server-sent events)
    POST /v1/embeddings
    POST /tokenize, /detokenize, /infill (llama-server's)
    POST /api/generate, /api/chat, /api/embed, /api/embeddings, /api/show; GET /api/tags,
         /api/ps, /api/version (Ollama's, uma.server.ollama_api; stream: NDJSON)
    GET  /v1/models, /v1/models/{id}, /health, /metrics (Prometheus text; with
         Accept: application/json the scorecard), /scorecard

    POST /load, /unload {"model": NAME}

Both dialects' model listings show the loaded models and the others of the model directory
(uma.server.models_api). A request names its model (none: the one `uma run` names); one of
the directory that is not loaded is loaded first and the request waits for it (uma.host:
keep-alive, least recently used out under max_loaded, never a model with requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hmac
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from types import EllipsisType

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from uma import catalog
from uma.app import app_name
from uma.config import ServerConfig, parse_http_address
from uma.embeddings import Embeddings
from uma.engine import Engine
from uma.errors import SHOWN_CHARS, InvalidRequestError, UmaError, shown
from uma.handle import RequestHandle, Result, TokenEvent
from uma.host import Loaded, ModelHost
from uma.model_dir import ModelFile, list_models
from uma.priority import Priority
from uma.server import models_api, ollama_api, prometheus
from uma.server.hosting import host_for
from uma.server.http_limits import limited_protocol
from uma.server.infill_api import InfillFormat, parse_infill
from uma.server.openai_api import (
    ApiError,
    ApiRequest,
    ChatFormat,
    CompletionFormat,
    body_of,
    embeddings_response,
    error_for,
    parse_chat,
    parse_completion,
    parse_detokenize,
    parse_embeddings,
    parse_tokenize,
    sse,
)
from uma.tools import ToolStream
from uma.wire import protocol as P
from uma.wire.protocol import RequestLimits

log = logging.getLogger("uma.http")

_DONE = b"data: [DONE]\n\n"
_ANSWERED = ("stop", "length", "tool_calls")  # finish reasons that are answers
# the paths an API key guards
_KEYED = ("/v1", "/api/", "/tokenize", "/detokenize", "/infill", "/priority", "/load",
          "/unload")
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_ALWAYS = ("/health", "/metrics")  # answered while the gateway drains


def create_app(engine: Engine, config: ServerConfig,
               metrics_source: Iterable[prometheus.Metric] | None = None,
               host: tuple[ModelHost, str] | None = None) -> Starlette:
    """The gateway's ASGI app over `engine`, with config's limits and API key. /metrics renders
    metrics_source (default: the engine's Registry) on every scrape. host: the daemon's model
    host and the name of `engine`'s model in it (uma.server.hosting.host_for), shared with
    the socket; None makes one of the gateway's own."""
    api = _Api(engine, config, metrics_source, host)
    routes = [
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", api.model, methods=["GET"]),
        Route("/v1/embeddings", api.embeddings, methods=["POST"]),
        Route("/infill", api.infill, methods=["POST"]),
        Route("/tokenize", api.tokenize, methods=["POST"]),
        Route("/detokenize", api.detokenize, methods=["POST"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/metrics", api.metrics, methods=["GET"]),
        Route("/scorecard", api.scorecard, methods=["GET"]),
        Route("/priority", api.priority, methods=["POST"]),
        Route("/load", api.load, methods=["POST"]),
        Route("/unload", api.unload, methods=["POST"]),
        Route("/api/generate", api.ollama_generate, methods=["POST"]),
        Route("/api/chat", api.ollama_chat, methods=["POST"]),
        Route("/api/embed", api.ollama_embed, methods=["POST"]),
        Route("/api/embeddings", api.ollama_embeddings, methods=["POST"]),
        Route("/api/tags", api.ollama_tags, methods=["GET"]),
        Route("/api/ps", api.ollama_ps, methods=["GET"]),
        Route("/api/show", api.ollama_show, methods=["POST"]),
        Route("/api/version", api.ollama_version, methods=["GET"]),
    ]
    middleware = [Middleware(Draining, api=api)]
    if config.api_key:
        middleware.append(Middleware(BearerAuth, key=config.api_key))
    app = Starlette(routes=routes, middleware=middleware, exception_handlers={
        ApiError: _api_error, HTTPException: _http_error, Exception: _internal_error})
    app.state.api = api
    return app


class _Model:
    """A loaded model as the routes use it: its engine, the names it answers to, what the
    listings say of it and the limits of its requests."""

    def __init__(self, engine: Engine, config: ServerConfig, entry: Loaded) -> None:
        name = entry.name
        self.engine = engine
        self.name = name  # its name in the model directory (uma.model_dir)
        self.limits = RequestLimits(
            max_prompt_bytes=config.max_prompt_bytes, max_prompt_tokens=engine.n_ctx_seq,
            max_tokens=config.max_tokens,
            default_max_tokens=min(config.default_max_tokens, config.max_tokens))
        stem = Path(engine.config.model).stem
        self.model_id = name  # what the OpenAI answers and listings call it
        self.created = int(os.path.getmtime(engine.config.model))
        self.served = ollama_api.Served(stem, (*catalog.names_of(engine.config.model), name))
        # its quantisation as the directory's listing reads it from the file (uma.model_dir)
        self.facts = _model_facts(engine, self.served, self.created,
                                  entry.file.quantization or "")
        self.piece = engine.model.token_to_piece

    def named(self, body: object) -> object:
        """The body with its `model` (any name this model answers to) as the parsers check it:
        its id."""
        if type(body) is dict and type(body.get("model")) is str:
            return {**body, "model": self.model_id}
        return body

    def answers_to(self, model: str) -> bool:
        """Whether a request's `model` names this one: its directory name, catalogue names
        or file's name, with or without Ollama's tag `:latest`."""
        return self.served.serves(model)


class _Api:
    """The routes' shared state: the models, the limits and the gateway's own counters."""

    def __init__(self, engine: Engine, config: ServerConfig,
                 metrics_source: Iterable[prometheus.Metric] | None,
                 host: tuple[ModelHost, str] | None = None) -> None:
        self.config = config
        self.max_body = config.http_max_body_bytes
        self.body_timeout_s = config.http_body_timeout_s
        self.models_dir = config.models_dir  # None: the model cache (uma.model_dir)
        self.first_path = engine.config.model  # the model `uma run` names: the default
        # the daemon's host, shared with the socket; a gateway on its own makes its own
        self.own_host = host is None
        self.host, self.first = host_for(engine, config) if host is None else host
        self.first_engine = engine  # the caller's: it closes it
        first_entry = self.host.find(self.first)
        assert first_entry is not None  # host_for added it
        self._models: dict[str, _Model] = {self.first: _Model(engine, config, first_entry)}
        self.metrics_source = engine.metrics if metrics_source is None else metrics_source
        self.stopping = False  # set when the gateway drains: new requests get 503 (Draining)
        self.live = _Live()  # requests being answered, for cancel_all and the drain
        reg = engine.metrics
        self.requests = reg.counter("http_requests_total", "HTTP completion and chat requests")
        self.errors = reg.counter("http_errors_total", "of those, answered with an error")
        self.disconnects = reg.counter(
            "http_client_disconnects_total", "HTTP requests cancelled because the client left")

    # --- models --------------------------------------------------------------------------------

    def _view(self, entry: Loaded) -> _Model:
        model = self._models.get(entry.name)
        if model is None or model.engine is not entry.engine:
            model = self._models[entry.name] = _Model(entry.engine, self.config, entry)
        return model

    async def _held(self, body: object, *, tag: str = "",
                    keep_alive: float | None | EllipsisType = ...) -> tuple[_Model, Loaded]:
        """The model a request's body names (none: the first), loaded first where it is not
        (the request waits), held until release(): between now and its submission keep-alive
        and room-making leave it alone. A model found nowhere: 404 naming those there are."""
        name = body.get("model") if type(body) is dict else None
        if type(name) is not str or not name:  # no model, or one the parser refuses
            name = self.first
        entry = self.host.hold(name, keep_alive_s=keep_alive)
        if entry is not None:
            return self._view(entry), entry
        listing = await asyncio.to_thread(list_models, self.models_dir, (self.first_path,))
        found = models_api.find(listing, self.host.canonical(name))
        if found is None or not found.usable:
            raise models_api.not_served(name, [e.name for e in self.host.loaded()], listing,
                                        tag=tag)
        try:
            entry = await asyncio.to_thread(self.host.load, found.name, hold=True,
                                            keep_alive_s=keep_alive)
        except Exception as exc:  # noqa: BLE001 - each one has its HTTP answer
            raise error_for(exc) from exc
        return self._view(entry), entry

    @contextlib.asynccontextmanager
    async def _using(self, body: object, *, tag: str = "",
                     keep_alive: float | None | EllipsisType = ...) -> AsyncIterator[_Model]:
        model, entry = await self._held(body, tag=tag, keep_alive=keep_alive)
        try:
            yield model
        finally:
            self.host.release(entry)

    # --- generation --------------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, lambda model: parse_completion, CompletionFormat)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, lambda model: parse_chat, ChatFormat)

    async def infill(self, request: Request) -> Response:
        """llama-server's /infill (uma.server.infill_api): tokenising the prefix, suffix and
        extra context happens off the event loop."""
        return await self._generate(request, lambda model: functools.partial(
            parse_infill, tokens_of=model.engine.infill_tokens), InfillFormat, off_loop=True)

    async def _generate(self, request: Request,
                        parse_for: Callable[[_Model], Callable[..., ApiRequest]],
                        format_cls: type[CompletionFormat | ChatFormat | InfillFormat],
                        off_loop: bool = False) -> Response:
        async with self._counted():
            body = await _read_json(request, self.max_body, self.body_timeout_s)
            async with self._using(body) as model:
                api_req, handle = await self._submit(request, model, parse_for(model), body,
                                                     off_loop=off_loop)
        fmt = format_cls(model.model_id, model.piece)
        if isinstance(fmt, CompletionFormat):
            fmt.return_tokens = api_req.return_tokens
        rid = getattr(fmt, "id", None)  # llama-server's /infill answers carry none
        if api_req.stream:
            return _EventStream(self, handle, self._events(handle, fmt, api_req, model), rid)
        result = await self._result(handle, request, rid)
        if result is None:
            # Nobody will read this: nginx's "client closed request", for the access log.
            return Response(status_code=499)
        return JSONResponse(fmt.full(result))

    @contextlib.asynccontextmanager
    async def _counted(self) -> AsyncIterator[None]:
        """A generation request counted, and its error answers too; refused while the
        gateway drains."""
        self.requests.inc()
        try:
            if self.stopping:
                raise ApiError(503, "the server is shutting down", type="server_error",
                               code="shutting_down")
            yield
        except ApiError:
            self.errors.inc()
            raise

    async def _submit(self, request: Request, model: _Model, parse: Callable[..., ApiRequest],
                      body: object, off_loop: bool = False
                      ) -> tuple[ApiRequest, RequestHandle]:
        """The body parsed and submitted to the model's engine, as the app it comes from."""
        parse = functools.partial(
            parse, model.named(body), model_id=model.model_id, limits=model.limits,
            default_priority=_header_priority(request))
        api_req = await asyncio.to_thread(parse) if off_loop else parse()
        gen = api_req.generate
        app = _header_app(request) or api_req.user or await _peer_app(request) \
            or _connection_app(request)
        try:
            submit = functools.partial(
                model.engine.submit, gen.engine_prompt, gen.params, priority=gen.priority,
                app=app, tools=gen.tools, tool_choice=gen.tool_choice,
                response_format=gen.response_format, grammar=gen.grammar)
            handle = submit() if gen.quick_to_submit else await asyncio.to_thread(submit)
        except Exception as exc:  # noqa: BLE001 - each one has its HTTP answer
            raise error_for(exc) from exc
        self.live.own(handle, model.engine)
        return api_req, handle

    async def _result(self, handle: RequestHandle, request: Request, rid: str | None
                      ) -> Result | None:
        """A request answered whole: its result, None if the client left first; an error
        for one that neither stopped nor hit its length."""
        self.live.add(handle, rid)
        try:
            result = await self._wait(handle, request)
        finally:
            self.live.discard(handle)
        if result is not None and result.finish_reason not in _ANSWERED:
            self.errors.inc()
            raise _ended_badly(result)
        return result

    # --- Ollama's dialect (uma.server.ollama_api) ------------------------------------------

    async def ollama_generate(self, request: Request) -> Response:
        return await self._ollama(request, ollama_api.parse_generate)

    async def ollama_chat(self, request: Request) -> Response:
        return await self._ollama(request, ollama_api.parse_chat)

    async def _ollama(self, request: Request,
                      parse: Callable[[object, ollama_api.Served], ollama_api.OllamaRequest]
                      ) -> Response:
        async with self._counted():
            body = await _read_json(request, self.max_body, self.body_timeout_s)
            keep = ollama_api.keep_alive_s(body)
            async with self._using(body, tag=":latest", keep_alive=keep) as model:
                ollama = parse(body, model.served)
                if not ollama.empty:
                    api_req, handle = await self._submit(
                        request, model, parse_chat if ollama.chat else parse_completion,
                        ollama.openai)
        answer = ollama_api.Answer(ollama, model.served)
        if ollama.empty:  # load, or unload with keep_alive 0 (idle: at once; else when idle)
            if keep == 0:
                with contextlib.suppress(UmaError):
                    await asyncio.to_thread(self.host.unload, model.name)
            return JSONResponse(answer.loaded("unload" if keep == 0 else "load"))
        if ollama.stream:
            return _EventStream(self, handle,
                                self._ollama_lines(handle, answer, api_req, model), None,
                                media_type="application/x-ndjson")
        result = await self._result(handle, request, None)
        if result is None:
            return Response(status_code=499)
        text = result.content if result.tool_calls and result.content is not None \
            else result.text
        return JSONResponse(answer.final(result, text))

    @staticmethod
    def _tool_stream(api_req: ApiRequest, model: _Model) -> ToolStream | None:
        """With tools, text that may be a call waits for the end (uma.tools.ToolStream)."""
        gen = api_req.generate
        return ToolStream(model.engine.tool_format) \
            if gen.tools and gen.tool_choice != "none" else None

    async def _ollama_lines(self, handle: RequestHandle, answer: ollama_api.Answer,
                            api_req: ApiRequest, model: _Model) -> AsyncIterator[bytes]:
        """NDJSON: a line per piece of text, tool calls in a line of their own, the figures
        last; an error ends the stream with Ollama's error line."""
        calls = self._tool_stream(api_req, model)
        while events := await handle.take():  # all queued in one write, as _events does
            lines = []
            for event in events:
                text = calls.feed(event.text) if calls is not None else event.text
                if text:
                    lines.append(ollama_api.line(answer.chunk(text)))
            if lines:
                yield b"".join(lines)
        result = await handle.aresult()
        if result.finish_reason not in _ANSWERED:
            self.errors.inc()
            yield ollama_api.line(ollama_api.error_body(_ended_badly(result)))
            return
        if calls is not None:
            rest = calls.finish(result.content if result.tool_calls else None)
            if rest:
                yield ollama_api.line(answer.chunk(rest))
            if result.tool_calls:
                yield ollama_api.line(answer.calls(result.tool_calls))
        yield ollama_api.line(answer.final(result))

    async def ollama_tags(self, request: Request) -> Response:
        loaded, others = await self._listing()
        return JSONResponse(ollama_api.tags([m.facts for m in loaded], others))

    async def ollama_ps(self, request: Request) -> Response:
        """The loaded models, the most recently used first, each with when its keep-alive
        ends."""
        now, wall = time.monotonic(), time.time()
        running = []
        for entry in self.host.loaded():
            alive = entry.keep_alive_s
            expires = None if alive is None else wall + (entry.used_at + alive - now)
            running.append(self._view(entry).facts.running(expires))
        return JSONResponse({"models": running})

    async def ollama_show(self, request: Request) -> Response:
        body = await _read_json(request, self.max_body, self.body_timeout_s)
        async with self._using(body, tag=":latest") as model:
            ollama_api.parse_show(body, model.served)
            return JSONResponse(model.facts.shown())

    async def ollama_version(self, request: Request) -> Response:
        return JSONResponse({"version": ollama_api.VERSION})

    async def ollama_embed(self, request: Request) -> Response:
        return await self._ollama_embed(request, legacy=False)

    async def ollama_embeddings(self, request: Request) -> Response:
        return await self._ollama_embed(request, legacy=True)

    async def _ollama_embed(self, request: Request, legacy: bool) -> Response:
        body = await _read_json(request, self.max_body, self.body_timeout_s)
        keep = ollama_api.keep_alive_s(body)
        async with self._using(body, tag=":latest", keep_alive=keep) as model:
            inputs, legacy = ollama_api.parse_embed(body, model.served, legacy)
            start = time.perf_counter_ns()
            future = await self._embedding(model, inputs)
        result = await self._embedded(future)
        if legacy:
            return JSONResponse({"embedding": result.vectors[0].tolist()})
        return JSONResponse({"model": model.served.name,
                             "embeddings": result.vectors.tolist(),
                             "total_duration": time.perf_counter_ns() - start,
                             "load_duration": 0, "prompt_eval_count": result.prompt_tokens})

    # --- loading and unloading ---------------------------------------------------------------

    async def load(self, request: Request) -> Response:
        """POST /load {"model": NAME}: loads a model of the directory (at once where it is
        loaded); 404 naming the models there are, 503 where every loaded model has requests
        and no more may be loaded."""
        body = await _read_json(request, self.max_body, self.body_timeout_s)
        _model_field(body)
        start = time.perf_counter()
        async with self._using(body) as model:
            return JSONResponse({"model": model.name, "loaded": True,
                                 "load_ms": round((time.perf_counter() - start) * 1e3, 1)})

    async def unload(self, request: Request) -> Response:
        """POST /unload {"model": NAME}: unloads a loaded model; 409 while it has requests
        (they are never cut off), 404 where it is not loaded."""
        body = await _read_json(request, self.max_body, self.body_timeout_s)
        name = self.host.canonical(_model_field(body))
        try:
            await asyncio.to_thread(self.host.unload, name)
        except Exception as exc:  # noqa: BLE001 - each one has its HTTP answer
            raise error_for(exc) from exc
        self._models.pop(name, None)
        return JSONResponse({"model": name, "loaded": False})

    def cancel_all(self) -> None:
        """Ends every request in flight (at the end of the shutdown grace period); each
        client gets a 'shutting down' error."""
        for handle in list(self.live):
            handle.cancel()

    async def _events(self, handle: RequestHandle,
                      fmt: CompletionFormat | ChatFormat | InfillFormat,
                      api_req: ApiRequest, model: _Model) -> AsyncIterator[bytes]:
        if isinstance(fmt, ChatFormat):
            yield sse(fmt.opening())
        logprobs = api_req.generate.params.logprobs
        calls = self._tool_stream(api_req, model)
        # Every event queued since the last write goes out in one write: a stream the gateway
        # fell behind on catches up in one step instead of one write per token.
        while events := await handle.take():
            chunk = []
            for event in events:
                if calls is not None:
                    event = dataclasses.replace(event, text=calls.feed(event.text))
                # An event with no text holds a token back (half a character, a possible stop
                # string); it is shown only when its log-probability was asked for.
                if event.text or (logprobs and event.token_ids):
                    chunk.append(fmt.delta_sse(event))
            if chunk:
                yield b"".join(chunk)
        result = await handle.aresult()
        if result.finish_reason not in _ANSWERED:
            # The status line is sent; OpenAI clients raise on a chunk that carries an error.
            # [DONE] still ends it, so that a client reading to it sees the stream end whole,
            # the reason just before (a stream cut by shutdown once ended without it).
            self.errors.inc()
            yield sse(_ended_badly(result).body())
            if fmt.done_marker:
                yield _DONE
            return
        if calls is not None and isinstance(fmt, ChatFormat):
            rest = calls.finish(result.content if result.tool_calls else None)
            if rest:
                yield sse(fmt.delta(TokenEvent(rest, ())))
            if result.tool_calls:
                yield sse(fmt.tool_calls(result))
        yield sse(fmt.closing(result))
        if api_req.include_usage and not isinstance(fmt, InfillFormat):
            yield sse(fmt.usage_chunk(result))
        if fmt.done_marker:
            yield _DONE

    async def _wait(self, handle: RequestHandle, request: Request) -> Result | None:
        """The result, or None if the client left first (the request is then cancelled)."""
        done = asyncio.ensure_future(handle.aresult())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            left = not done.done()
            if left:  # a task cancelled reads as cancelled only once the loop has run it
                done.cancel()
                handle.cancel()
                self.disconnects.inc()
        return None if left else done.result()

    # --- the rest ------------------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        """The loaded models, then the others available (usable files only)."""
        loaded, others = await self._listing()
        return JSONResponse({"object": "list", "data": [
            *(self._openai_entry(m) for m in loaded),
            *(models_api.openai_listed(m) for m in others if m.usable)]})

    async def model(self, request: Request) -> Response:
        model_id = request.path_params["model_id"]
        loaded, others = await self._listing()
        for m in loaded:
            if m.answers_to(model_id):
                return JSONResponse(self._openai_entry(m))
        found = models_api.find(others, model_id)
        if found is not None and found.usable:
            return JSONResponse(models_api.openai_listed(found))
        raise models_api.not_served(model_id, [m.name for m in loaded], others)

    @staticmethod
    def _openai_entry(m: _Model) -> dict:
        f = m.facts
        return models_api.openai_model(
            m.name, m.created, True, architecture=f.architecture,
            quantization=f.quantization, n_ctx_train=f.n_ctx_train, n_params=f.n_params,
            size=f.size_bytes)

    async def _listing(self) -> tuple[list[_Model], tuple[ModelFile, ...]]:
        """The loaded models (the most recently used first) and the others available. Read
        off the event loop: a file's header is read the first time it is seen (and again
        once it changes)."""
        listing = await asyncio.to_thread(list_models, self.models_dir, (self.first_path,))
        entries = self.host.loaded()
        paths = {e.file.path for e in entries}
        return [self._view(e) for e in entries], tuple(m for m in listing if m.path not in paths)

    async def embeddings(self, request: Request) -> Response:
        """OpenAI's /v1/embeddings: each input pooled into one unit-length vector."""
        body = await _read_json(request, self.max_body, self.body_timeout_s)
        async with self._using(body) as model:
            parsed = parse_embeddings(model.named(body), model_id=model.model_id,
                                      limits=model.limits, dimensions=model.engine.model.n_embd)
            future = await self._embedding(model, parsed.inputs)
        result = await self._embedded(future)
        return JSONResponse(embeddings_response(result, model.model_id, parsed.base64))

    @staticmethod
    async def _embedding(model: _Model, inputs: list[str | list[int]]) -> Future[Embeddings]:
        """The inputs submitted to the model's engine for embeddings; errors as their HTTP
        answers."""
        try:
            return await asyncio.to_thread(model.engine.submit_embeddings, inputs)
        except Exception as exc:  # noqa: BLE001 - each one has its HTTP answer
            raise error_for(exc) from exc

    @staticmethod
    async def _embedded(future: Future[Embeddings]) -> Embeddings:
        """The embeddings, errors as their HTTP answers."""
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:  # the client left: a job not yet started is dropped
            future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - each one has its HTTP answer
            raise error_for(exc) from exc

    async def tokenize(self, request: Request) -> Response:
        """llama-server's /tokenize: {"content", "add_special"?, "parse_special"?,
        "with_pieces"?, "model"?} -> {"tokens": [id, ...]} (with_pieces: [{"id", "piece"},
        ...]), with the named model's tokenizer (none: the first model's)."""
        raw = await _read_json(request, self.max_body, self.body_timeout_s)
        async with self._using(raw) as model:
            body = parse_tokenize(raw, model.limits)
            try:
                tokens = await asyncio.to_thread(
                    model.engine.tokenize, body.text, add_special=body.add_special,
                    parse_special=body.parse_special)
            except Exception as exc:  # noqa: BLE001 - each one has its HTTP answer
                raise error_for(exc) from exc
            if body.with_pieces:
                return JSONResponse({"tokens": [{"id": t, "piece": model.piece(t).decode(
                    "utf-8", "replace")} for t in tokens]})
        return JSONResponse({"tokens": tokens})

    async def detokenize(self, request: Request) -> Response:
        """llama-server's /detokenize: {"tokens": [id, ...], "model"?} -> {"content": text}."""
        raw = await _read_json(request, self.max_body, self.body_timeout_s)
        async with self._using(raw) as model:
            tokens = parse_detokenize(raw, model.limits)
            try:
                return JSONResponse({"content": model.engine.detokenize(tokens)})
            except Exception as exc:  # noqa: BLE001 - each one has its HTTP answer
                raise error_for(exc) from exc

    def _first_engine(self) -> Engine | None:
        """The first model's engine where it is loaded, else the most recently used one."""
        entry = self.host.find(self.first)
        loaded = self.host.loaded()
        if entry is None and loaded:
            entry = loaded[0]
        return entry.engine if entry is not None else None  # type: ignore[return-value]

    async def health(self, request: Request) -> Response:
        """200 "ok" while it serves; 503 "draining" while it shuts down and 503 "failed" once
        an engine has failed (a lost RPC worker): a load balancer's check (which routes on the
        status code) takes the daemon out of rotation for either."""
        for entry in self.host.loaded():
            failure = entry.engine.failure  # type: ignore[attr-defined]
            if failure is not None:
                return JSONResponse({"status": "failed", "model": entry.name,
                                     "error": failure}, status_code=503)
        if self.stopping:
            return JSONResponse({"status": "draining", "model": self.first},
                                status_code=503, headers={"retry-after": "1"})
        return JSONResponse({"status": "ok", "model": self.first,
                             "loaded": [e.name for e in self.host.loaded()]})

    async def priority(self, request: Request) -> Response:
        """POST /priority {"id": ..., "priority": "interactive" | "background"}: promotes or
        demotes a request in flight, named by the id its response carries (the design notes'
        endpoint, as the socket's priority message). Unknown or finished: 404."""
        body = await _read_json(request, self.max_body, self.body_timeout_s)
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object with id and priority")
        rid, value = body.get("id"), body.get("priority")
        if not isinstance(rid, str) or not rid:
            raise ApiError(400, f"id must be a response's id (a string), not {shown(rid)}",
                           param="id")
        try:
            if not isinstance(value, str):
                raise InvalidRequestError("not a string")
            priority = Priority.parse(value)
        except InvalidRequestError:
            raise ApiError(400, f"priority must be 'interactive' or 'background', not "
                                f"{shown(value)}", param="priority") from None
        handle = self.live.get(rid)
        if handle is None or handle.done:
            raise ApiError(404, f"no request {shown(rid)} is in flight", param="id",
                           code="not_found")
        engine = self.live.owner(handle)
        if engine is not None:
            engine.set_priority(handle, priority)
        return JSONResponse({"id": rid, "priority": priority.value})

    async def metrics(self, request: Request) -> Response:
        # The design notes' `GET /metrics (scorecard JSON)`, for a client that asks for JSON;
        # Prometheus scrapers ask for text (OpenMetrics or 0.0.4), and so get it.
        if "application/json" in request.headers.get("accept", ""):
            return await self.scorecard(request)
        return Response(prometheus.render(self.metrics_source),
                        media_type=prometheus.CONTENT_TYPE)

    async def scorecard(self, request: Request) -> Response:
        """The scorecard since the first model's engine started (docs/design/metrics.md,
        "Scorecard")."""
        engine = self._first_engine()
        if engine is None:
            raise ApiError(503, "no model is loaded", type="server_error", code="no_model")
        return JSONResponse(engine.scorecard())


class _EventStream(StreamingResponse):
    """A server-sent event stream that cancels its request however the response ends: a client
    that disconnects, or a server that stops, frees the request's KV at the next tick."""

    def __init__(self, api: _Api, handle: RequestHandle, chunks: AsyncIterator[bytes],
                 rid: str | None, media_type: str = "text/event-stream") -> None:
        super().__init__(chunks, media_type=media_type, headers=_SSE_HEADERS)
        self._api = api
        self._handle = handle
        self._rid = rid

    async def __call__(self, scope, receive, send) -> None:
        self._api.live.add(self._handle, self._rid)
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._api.live.discard(self._handle)
            if not self._handle.done:
                self._handle.cancel()
                self._api.disconnects.inc()
            # The body generator may be suspended at a yield if the client left mid-send.
            with contextlib.suppress(Exception):
                await self.body_iterator.aclose()


class _Live:
    """The requests being answered, by their responses' ids: what cancel_all ends, the drain
    waits for and POST /priority finds."""

    def __init__(self) -> None:
        self._handles: dict[RequestHandle, str | None] = {}
        self._by_id: dict[str, RequestHandle] = {}
        self._owners: dict[RequestHandle, Engine] = {}  # the engine each was submitted to
        self._none = asyncio.Event()  # set while there are none
        self._none.set()

    def add(self, handle: RequestHandle, rid: str | None) -> None:
        """rid: the id its response carries (None: one that carries none, as /infill's)."""
        self._handles[handle] = rid
        if rid is not None:
            self._by_id[rid] = handle
        self._none.clear()

    def own(self, handle: RequestHandle, engine: Engine) -> None:
        self._owners[handle] = engine

    def owner(self, handle: RequestHandle) -> Engine | None:
        return self._owners.get(handle)

    def discard(self, handle: RequestHandle) -> None:
        self._owners.pop(handle, None)
        rid = self._handles.pop(handle, None)
        if rid is not None:
            self._by_id.pop(rid, None)
        if not self._handles:
            self._none.set()

    def get(self, rid: str) -> RequestHandle | None:
        return self._by_id.get(rid)

    def __iter__(self):
        return iter(self._handles)

    def __len__(self) -> int:
        return len(self._handles)

    async def wait_none(self, timeout_s: float) -> bool:
        """True once none is left; False if some still are after timeout_s."""
        try:
            await asyncio.wait_for(self._none.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True


class Draining:
    """ASGI middleware: while the gateway drains, a new request is answered 503 with
    Retry-After and its connection closed, but for /health ("draining") and /metrics. The
    port stays open until the requests in flight are done, so that a client or a balancer
    gets that answer rather than "connection refused"."""

    def __init__(self, app, api: _Api) -> None:
        self.app = app
        self._api = api

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and self._api.stopping and scope["path"] not in _ALWAYS:
            error = ApiError(503, "the server is shutting down", type="server_error",
                             code="shutting_down")
            response = JSONResponse(error.body(), 503, {"retry-after": "1",
                                                        "connection": "close"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class BearerAuth:
    """ASGI middleware: every /v1 path needs `Authorization: Bearer <key>`. The key is compared
    in constant time, so response times do not reveal how much of a guess was right."""

    def __init__(self, app, key: str) -> None:
        self.app = app
        self._key = key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(_KEYED):
            problem = self._check(dict(scope["headers"]).get(b"authorization"))
            if problem:
                error = ApiError(401, problem, code="invalid_api_key")
                response = JSONResponse(error.body(), 401, {"www-authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _check(self, header: bytes | None) -> str | None:
        if header is None:
            return "missing API key: send the header 'Authorization: Bearer <key>'"
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self._key):
            return "invalid API key"
        return None


class HttpGateway:
    """Serves create_app(engine, config) on config.http with uvicorn, on its own thread and
    event loop. start() returns once it accepts connections; stop_soon() begins the drain
    (new requests get 503, requests in flight get config.grace_s, then are cancelled); stop()
    waits for it, closes the port and joins the thread."""

    def __init__(self, engine: Engine, config: ServerConfig,
                 metrics_source: Iterable[prometheus.Metric] | None = None,
                 sock: socket.socket | None = None,
                 host: tuple[ModelHost, str] | None = None) -> None:
        """sock: the listening socket from bind_http(config.http), bound before the model
        loaded; None binds it in start(). host: as create_app's."""
        if config.http is None:
            raise InvalidRequestError("the config has no http address")
        self.host, self.port = parse_http_address(config.http)
        self._sock = sock
        if sock is not None:
            self.port = sock.getsockname()[1]
        self.app = create_app(engine, config, metrics_source, host)
        self._grace = config.grace_s
        self._max_connections = config.http_max_connections
        self._header_timeout_s = config.http_header_timeout_s
        self._made_room = engine.metrics.counter(
            "http_connections_closed_for_room_total",
            "idle HTTP connections closed to make room for a new one")
        self._refused = engine.metrics.counter(
            "http_connections_refused_total",
            "HTTP connections answered 503 at the connection limits (too_many_connections)")
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._drained = threading.Event()  # set once the requests in flight are done
        self._drain: asyncio.Task | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        """Binds unless bound already (OSError if the port is taken) and starts serving."""
        # Bound here, not on the thread, so a taken port fails the caller and port 0 is known.
        sock = self._sock or bind_http(f"[{self.host}]:{self.port}" if ":" in self.host
                                       else f"{self.host}:{self.port}")
        self._sock = None
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, lifespan="off", log_config=None, log_level="warning", access_log=False,
            http=functools.partial(limited_protocol(), max_connections=self._max_connections,
                                   header_timeout_s=self._header_timeout_s,
                                   made_room=self._made_room, refused=self._refused),
            # uvicorn's own shutdown begins once the drain is done (stop); what it still
            # waits for then (a stream whose client stopped reading) it cuts after this long.
            server_header=False, timeout_graceful_shutdown=self._grace + 2.0)
        self._server = _Server(config)
        self._thread = threading.Thread(target=self._run, args=(sock,), name="uma-http",
                                        daemon=True)
        self._thread.start()
        if not self._server.ready.wait(timeout):
            raise TimeoutError(f"the HTTP gateway did not start in {timeout} s")
        if self._failure is not None:
            raise UmaError(f"the HTTP gateway failed to start: {self._failure!r}")
        api = self.app.state.api
        if api.own_host:  # a shared host is its owner's to run
            api.host.start_expiry()

    def _run(self, sock: socket.socket) -> None:
        try:
            self._server.run(sockets=[sock])
        except BaseException as exc:  # noqa: BLE001 - reported to start() or logged
            self._failure = exc
            log.exception("the HTTP gateway stopped with an error")
        finally:
            self._server.ready.set()
            sock.close()

    def stop_soon(self) -> None:
        """Begins draining: the port stays open, new requests get 503 with Retry-After
        (/health says "draining"), requests in flight get the grace period and are then
        cancelled, their streams ending with the reason and [DONE]. Returns at once; safe from
        signal handlers and other threads. stop() closes the port once they are done."""
        api = self.app.state.api
        if api.stopping:
            return
        api.stopping = True
        loop = self._server.loop if self._server is not None else None
        if loop is None:  # not serving: nothing to drain
            self._drained.set()
            return
        try:
            loop.call_soon_threadsafe(self._begin_drain)
        except RuntimeError:  # its loop has already closed
            self._drained.set()

    def _begin_drain(self) -> None:
        self._drain = asyncio.ensure_future(self._wait_drained())

    async def _wait_drained(self) -> None:
        api = self.app.state.api
        if not await api.live.wait_none(self._grace):
            api.cancel_all()
            # Each cancelled request's last chunk (its reason, [DONE]) needs a moment to go out.
            await api.live.wait_none(2.0)
        self._drained.set()

    def stop(self, timeout: float | None = None) -> None:
        """Drains (stop_soon), then closes the port and joins the gateway's thread.
        Idempotent."""
        self.stop_soon()
        if self._thread is None:
            return
        deadline = time.monotonic() + (self._grace + 5.0 if timeout is None else timeout)
        if self._thread.is_alive():
            self._drained.wait(max(0.0, deadline - time.monotonic()))
        if self._server is not None:
            self._server.should_exit = True  # uvicorn polls it every 0.1 s
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            raise TimeoutError("the HTTP gateway did not stop in time")
        api = self.app.state.api
        if api.own_host:  # the models it loaded; the caller's engine is the caller's
            api.host.close(keep=api.first_engine)


class _Server(uvicorn.Server):
    """uvicorn's server with a ready event: set once it listens (or once it failed)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.loop = asyncio.get_running_loop()
        # A streamed response runs in an anyio task group, and the first one loads anyio's
        # asyncio backend, tens of milliseconds on a small CPU that the first request's first
        # token would wait for. Loaded here, start-up pays it.
        async with anyio.create_task_group():
            pass
        self.ready.set()


def bind_http(address: str) -> socket.socket:
    """A listening TCP socket on 'host:port' (OSError if the port is taken)."""
    host, port = parse_http_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


# --- helpers ---------------------------------------------------------------------------------


async def _read_json(request: Request, limit: int, timeout_s: float) -> object:
    """The body as JSON. Bodies over `limit` are refused before more than `limit` bytes are
    held, whether or not they declare their length; one not in whole within timeout_s is
    answered 408."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks = []
    size = 0

    async def read() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit)
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), timeout_s)
    except ClientDisconnect:
        raise ApiError(400, "the client went away while sending the body") from None
    except asyncio.TimeoutError:
        raise ApiError(408, f"the body did not arrive whole within {timeout_s:g} s ({size} "
                            f"bytes came)", code="request_timeout") from None
    return body_of(b"".join(chunks))


def _too_large(size: int, limit: int) -> ApiError:
    return ApiError(413, f"the body is {size} bytes or more; this server takes at most {limit}",
                    code="request_too_large")


def _header_app(request: Request) -> str | None:
    """X-App: the app a request comes from, for fair share (before the body's user)."""
    value = request.headers.get("x-app")
    if value is None:
        return None
    try:
        return app_name(value.strip(), "X-App")
    except InvalidRequestError as exc:
        raise ApiError(400, str(exc), param="X-App") from None


async def _peer_app(request: Request) -> str | None:
    """An app that names itself nowhere is its process, where the connection comes from this
    machine and the OS tells which (uma.server.peers; the gateway's connections carry it)."""
    peer = request.scope.get("uma.peer")
    return await peer.app() if peer is not None else None


def _connection_app(request: Request) -> str:
    """An app named nowhere whose process is not known (a client elsewhere; not Linux) is
    its connection."""
    client = request.client
    return f"http:{client.port}" if client is not None else "http"


def _header_priority(request: Request) -> Priority:
    value = request.headers.get("x-uma-priority")
    if value is None:
        return Priority.INTERACTIVE
    try:
        return Priority.parse(value.strip().lower())
    except InvalidRequestError:
        raise ApiError(400, f"X-UMA-Priority must be 'interactive' or 'background', not "
                            f"{shown(value)}", param="X-UMA-Priority") from None


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _model_facts(engine: Engine, served: ollama_api.Served, created: int, quantization: str
                 ) -> ollama_api.ModelFacts:
    """What Ollama's lists say of the loaded model (it does not change while served)."""
    model = engine.model
    return ollama_api.ModelFacts(
        served=served, size_bytes=os.path.getsize(engine.config.model),
        modified_at=ollama_api.rfc3339(created),
        architecture=model.architecture, n_params=model.n_params,
        quantization=quantization,
        n_ctx_train=model.n_ctx_train, n_embd=model.n_embd,
        context=engine.n_ctx_seq, chat_template=model.chat_template)


def _ended_badly(result: Result) -> ApiError:
    """The answer to a request that neither stopped nor hit its length: an engine error, or a
    cancellation that only a stopping server makes (a client that left gets no answer)."""
    if result.finish_reason == "cancelled":
        return ApiError(503, "the request was cancelled: the server is shutting down",
                        type="server_error", code="shutting_down")
    return error_for(result.error or UmaError("the request failed"))


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    if exc.status == 500 and exc.__cause__ is not None:  # error_for told the client little
        log.error("internal error serving %s", request.url.path, exc_info=exc.__cause__)
    busy = exc.status == 429 or exc.code == "shutting_down"  # worth trying again (elsewhere)
    headers = {"retry-after": "1"} if busy else None
    body = ollama_api.error_body(exc) if _ollama_path(request) else exc.body()
    return JSONResponse(body, exc.status, headers)


def _ollama_path(request: Request) -> bool:
    """Ollama's endpoints answer errors in Ollama's shape ({"error": message})."""
    return request.url.path.startswith("/api/")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found" if exc.status_code == 404 else None
    path = request.url.path  # up to h11's 16 KiB of request line: not echoed whole
    path = path if len(path) <= SHOWN_CHARS else f"{path[:SHOWN_CHARS - 3]}..."
    error = ApiError(exc.status_code, f"{request.method} {path}: {exc.detail}", code=kind)
    body = ollama_api.error_body(error) if _ollama_path(request) else error.body()
    return JSONResponse(body, exc.status_code, exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    # Starlette logs the traceback after this answer is sent; the client learns only that it
    # was the server's fault (Python's words name nothing it could fix).
    error = ApiError(500, P.error_message(exc), type="server_error")
    return JSONResponse(ollama_api.error_body(error) if _ollama_path(request) else error.body(),
                        500)


def _model_field(body: object) -> str:
    """The `model` of a /load or /unload body: a name of the model directory."""
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, str) or not model:
        raise ApiError(400, f"the body must be a JSON object naming a model, as "
                            f'{{"model": "NAME"}}, not {shown(body)}', param="model")
    return model
