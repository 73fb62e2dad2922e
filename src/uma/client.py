"""Clients of the UMA daemon (`uma run`): `Client` blocks, `AsyncClient` runs on asyncio.

Both speak uma.wire.framing's frames over the daemon's Unix socket, and many requests share one
connection: every event names its request's id, so events are routed to that request's stream as
they arrive. The sync client has no reader thread: whichever call needs the next frame reads it
and queues what belongs to other requests. Streams hand out the same `TokenEvent`s and `Result`
as an in-process uma.Engine handle, so code can move between the two.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import os
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from uma.config import SamplingParams, default_socket_path
from uma.embeddings import Embeddings
from uma.errors import ClosedError, InvalidRequestError, UmaError
from uma.handle import Result, Timings, TokenEvent, TopLogprobs, Usage
from uma.priority import Priority
from uma.tools import ToolCall
from uma.wire.framing import FrameDecoder, FrameError, encode
from uma.wire.protocol import MAX_ID_CHARS, ProtocolError, parse_event

_READ_SIZE = 1 << 16
_DEFAULTS = SamplingParams()
_NAN = float("nan")


class ServerError(UmaError):
    """The daemon answered a request with an error event. Match on `code` (the E_* constants
    of uma.wire.protocol); `message` is for people."""

    def __init__(self, code: str, message: str, request_id: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id


class ConnectionLost(UmaError, ConnectionError):
    """No usable connection to the daemon: none at the path, closed by the daemon, or the daemon
    sent bytes that are not the protocol. `code` is the wire code when the daemon said why."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


def generate_request(request_id: str, prompt, params: SamplingParams | None = None, *,
                     priority: str | Priority | None = None, stream: bool = True,
                     tools: Sequence[dict] | None = None, tool_choice: object = None,
                     response_format: dict | None = None, grammar: str | None = None,
                     model: str | None = None, **options) -> dict:
    """The generate request map, as uma.wire.protocol.parse_request reads it.

    prompt: text, token ids (a sequence or numpy array of ints) or chat messages. options
    override fields of params and are checked here, as uma.Engine.submit checks them. Fields
    left at their defaults are not sent (the server's defaults are the same), except options
    named explicitly: max_tokens=256 is sent even though the server's cap may differ.
    priority None leaves the class to the connection's default (interactive unless the client
    configured another), so it is sent whenever it is given. tools, tool_choice: OpenAI's,
    with chat messages; response_format (OpenAI's) or grammar (GBNF): what the output must
    match (the daemon checks them). model: a model of the daemon's directory (None: the one
    it started with), loaded first where it is not.
    """
    msg: dict = {"type": "generate", "id": request_id, **_prompt_field(prompt)}
    if model is not None:
        msg["model"] = model
    try:
        params = dataclasses.replace(params or _DEFAULTS, **options)
    except TypeError as exc:  # an unknown option
        raise InvalidRequestError(str(exc)) from None
    for field in dataclasses.fields(SamplingParams):
        value = getattr(params, field.name)
        if field.name in options or value != getattr(_DEFAULTS, field.name):
            msg[field.name] = list(value) if field.name == "stop" else value
    if priority is not None:
        msg["priority"] = Priority.parse(priority).value
    if not stream:
        msg["stream"] = False
    if tools is not None:
        msg["tools"] = list(tools)
    if tool_choice is not None:
        msg["tool_choice"] = tool_choice
    if response_format is not None:
        msg["response_format"] = response_format
    if grammar is not None:
        msg["grammar"] = grammar
    return msg


def embed_request(request_id: str, inputs: str | Sequence, normalize: bool = True,
                  model: str | None = None) -> dict:
    """The embed request map: inputs as OpenAI's input forms (numpy arrays become lists)."""
    if isinstance(inputs, np.ndarray):
        inputs = inputs.tolist()
    elif not isinstance(inputs, str):
        inputs = [x.tolist() if isinstance(x, np.ndarray) else x for x in inputs]
    msg: dict = {"type": "embed", "id": request_id, "input": inputs}
    if not normalize:
        msg["normalize"] = False
    if model is not None:
        msg["model"] = model
    return msg


def load_request(request_id: str, model: str, keep_alive: float | None = None) -> dict:
    """The load request map. keep_alive: seconds the model stays loaded idle (negative: until
    unloaded; None: the daemon's setting)."""
    msg: dict = {"type": "load", "id": request_id, "model": model}
    if keep_alive is not None:
        msg["keep_alive"] = keep_alive
    return msg


def configure_request(priority: str | Priority) -> dict:
    """The configure map: the connection's default class for requests that name none."""
    return {"type": "configure", "priority": Priority.parse(priority).value}


def _prompt_field(prompt) -> dict:
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if prompt is None or isinstance(prompt, (bytes, bytearray)):
        raise InvalidRequestError("prompt must be text (str), token ids or chat messages")
    if isinstance(prompt, Sequence) and prompt and all(isinstance(m, dict) for m in prompt):
        return {"messages": [dict(m) for m in prompt]}  # the server checks role and content
    try:
        tokens = np.asarray(prompt)
    except (TypeError, ValueError):
        raise InvalidRequestError("prompt must be text, token ids or chat messages") from None
    if tokens.ndim != 1 or tokens.size == 0 or tokens.dtype.kind not in "iu":
        raise InvalidRequestError("token ids must be a non-empty flat sequence of integers")
    return {"tokens": tokens.tolist()}  # plain ints: msgpack cannot pack numpy scalars


class _Stream:
    """What one request has received so far. A metrics or health request is a stream too, one
    that ends with its answer instead of an eos."""

    def __init__(self, request_id: str) -> None:
        self.id = request_id  # the wire id: set_priority takes it
        self._texts: list[str] = []
        self._token_ids: list[int] = []
        self._logprobs: list[float] | None = None
        self._top: list[TopLogprobs] | None = None
        self._result: Result | None = None
        self._answer: dict | None = None
        self._error: UmaError | None = None
        self._progress: Callable[[float], object] | None = None  # a load's, where asked

    @property
    def done(self) -> bool:
        """Whether the request has ended (its result, or its error, is in)."""
        return self._result is not None or self._answer is not None or self._error is not None

    def _push(self, event: TokenEvent) -> None:
        raise NotImplementedError

    def _ended(self) -> None:
        """Wakes whoever waits for the end."""

    def _take(self, msg: dict) -> None:
        try:
            kind = msg["event"]
            if kind == "token":
                logprobs, top = msg.get("logprobs"), msg.get("top_logprobs")
                event = TokenEvent(msg["text"], tuple(msg["token_ids"]),
                                   None if logprobs is None else tuple(logprobs),
                                   None if top is None else _top_logprobs(top))
                self._texts.append(event.text)
                self._token_ids.extend(event.token_ids)
                if event.logprobs is not None:
                    if self._logprobs is None:
                        self._logprobs = []
                    self._logprobs.extend(event.logprobs)
                if event.top_logprobs is not None:
                    if self._top is None:
                        self._top = []
                    self._top.extend(event.top_logprobs)
                self._push(event)
            elif kind == "eos":
                self._result = self._build_result(msg)
            elif kind == "error":
                self._error = ServerError(msg["code"], msg["message"], self.id)
            elif kind == "progress":
                if self._progress is not None:
                    self._progress(float(msg["progress"]))
            else:
                self._answer = msg
        except (KeyError, TypeError, ValueError) as exc:
            raise ConnectionLost(f"the daemon sent a malformed {msg.get('event')} event for "
                                 f"request {self.id!r}: {exc!r}") from None
        if self.done:
            self._ended()

    def _build_result(self, eos: dict) -> Result:
        usage, timings = eos["usage"], eos["timings"]
        text = eos.get("text")  # only stream=false requests get the whole text at the end
        return Result(
            text="".join(self._texts) if text is None else text,
            token_ids=tuple(eos.get("token_ids") or self._token_ids),
            finish_reason=eos["reason"],
            usage=Usage(int(usage.get("prompt_tokens") or 0),
                        int(usage.get("completion_tokens") or 0),
                        int(usage.get("cached_tokens") or 0)),
            timings=Timings(
                admitted_ns=int(timings.get("admitted_ns") or 0),
                queue_ms=_number(timings, "queue_ms"), ttft_ms=_number(timings, "ttft_ms"),
                total_ms=_number(timings, "total_ms"),
                token_ms=tuple(timings.get("token_ms") or ())),
            logprobs=_first_of(eos.get("logprobs"), self._logprobs, tuple),
            top_logprobs=_first_of(eos.get("top_logprobs"), self._top, _top_logprobs),
            tool_calls=tuple(ToolCall(str(c["name"]), str(c["arguments"]), str(c["id"]))
                             for c in eos.get("tool_calls") or ()),
            content=eos.get("content"))

    def _fail(self, exc: UmaError) -> None:
        if not self.done:
            self._error = exc
            self._ended()

    def _outcome(self) -> Result:
        if self._error is not None:
            raise self._error
        assert self._result is not None  # callers wait for done first
        return self._result

    def _reply(self, kind: str) -> Any:
        if self._error is not None:
            raise self._error
        if self._answer is None or self._answer["event"] != kind:
            raise ConnectionLost(f"the daemon did not answer a {kind} request with a {kind} event")
        return self._answer[kind]

    def _embeddings(self) -> Embeddings:
        vectors = self._reply("embeddings")
        return Embeddings(np.asarray(vectors, dtype=np.float32),
                          int(self._answer["usage"]["prompt_tokens"]),  # type: ignore[index]
                          str(self._answer["pooling"]))  # type: ignore[index]


def _number(timings: dict, key: str) -> float:
    value = timings.get(key)
    return _NAN if value is None else float(value)


def _top_logprobs(steps: list) -> tuple[TopLogprobs, ...]:
    """[[[id, logprob], ...], ...] off the wire as TopLogprobs, one per token."""
    return tuple(tuple((int(t), float(lp)) for t, lp in step) for step in steps)


def _first_of(sent: list | None, streamed: list | None, convert):
    """What the eos event carries (a stream=false request's), else what the stream had."""
    if sent is not None:
        return convert(sent)
    return None if streamed is None else convert(streamed)


class DaemonNotRunning(ConnectionLost):
    """No daemon answers at the socket path (no file, or one a dead daemon left)."""


def _decode(decoder: FrameDecoder, data: bytes) -> list[dict]:
    try:
        return decoder.feed(data)
    except FrameError as exc:
        raise ConnectionLost(f"the daemon sent a malformed frame: {exc.message}",
                             exc.code) from None


def _no_daemon(path: str, exc: OSError) -> ConnectionLost:
    # Refused: a socket file left behind by a daemon that is gone.
    if isinstance(exc, (FileNotFoundError, ConnectionRefusedError)):
        return DaemonNotRunning(f"no UMA daemon at {path}: start one with `uma run`")
    return DaemonNotRunning(f"cannot connect to the UMA daemon at {path}: {exc}")


class _Demux:
    """What both clients share: request ids, the streams in flight, routing, failure."""

    def __init__(self, socket_path: str | os.PathLike | None) -> None:
        self.socket_path = default_socket_path() if socket_path is None else os.fspath(socket_path)
        self._ids = itertools.count(1)
        self._pending: dict[str, _Stream] = {}
        self._failure: UmaError | None = None  # once set, the connection is done for

    def _new_id(self, request_id: str | None) -> str:
        if request_id is None:
            request_id = f"c{next(self._ids)}"
            while request_id in self._pending:  # the caller chose this one earlier
                request_id = f"c{next(self._ids)}"
        elif type(request_id) is not str or not 0 < len(request_id) <= MAX_ID_CHARS:
            raise InvalidRequestError(
                f"request_id must be a string of 1 to {MAX_ID_CHARS} characters")
        elif request_id in self._pending:
            raise InvalidRequestError(f"request {request_id!r} is already in flight")
        return request_id

    def _route(self, msg: dict) -> None:
        try:
            parse_event(msg)
        except ProtocolError as exc:
            raise ConnectionLost(f"the daemon sent an invalid event: {exc.message}",
                                 exc.code) from None
        request_id = msg["id"]
        if request_id is None and msg["event"] == "error":
            raise ConnectionLost(f"the daemon ended the connection: {msg['code']}: "
                                 f"{msg['message']}", msg["code"])
        stream = self._pending.get(request_id)
        # No stream: late news of a request already over (the E_PROTO_004 answering a cancel
        # that crossed its eos). Nothing waits for it.
        if stream is not None:
            stream._take(msg)
            if stream.done:
                self._pending.pop(request_id, None)

    def _fail(self, exc: UmaError) -> None:
        if self._failure is None:
            self._failure = exc
        for stream in list(self._pending.values()):
            stream._fail(self._failure)
        self._pending.clear()


class ClientStream(_Stream):
    """One request on a `Client`: iterate it for `TokenEvent`s; `result()` waits for the end."""

    def __init__(self, client: Client, request_id: str) -> None:
        super().__init__(request_id)
        self._client = client
        self._events: collections.deque[TokenEvent] = collections.deque()

    def _push(self, event: TokenEvent) -> None:
        self._events.append(event)

    def __iter__(self) -> ClientStream:
        return self

    def __next__(self) -> TokenEvent:
        self._client._wait(lambda: bool(self._events) or self.done)
        if self._events:
            return self._events.popleft()
        if self._error is not None:
            raise self._error
        raise StopIteration

    def result(self) -> Result:
        """Waits for the request to end and returns its Result (events stay available to
        iterate). Raises ServerError, ConnectionLost, or TimeoutError (the client's timeout)."""
        self._client._wait(lambda: self.done)
        return self._outcome()

    def cancel(self) -> None:
        """Asks the daemon to stop the request; it ends with finish_reason 'cancelled' (unless
        it finished first)."""
        if not self.done:
            self._client._send({"type": "cancel", "id": self.id})


class Client(_Demux):
    """A blocking connection to the daemon. Threads may share it: sends are serialised, and one
    thread at a time reads, queueing the events of other threads' requests.

    timeout: seconds that connecting, sending or waiting for the next frame may take before
    TimeoutError (the connection stays usable after a read timeout); None waits forever.

    >>> with Client() as client:
    ...     print(client.generate("Once upon a time", max_tokens=32).text)
    """

    def __init__(self, socket_path: str | os.PathLike | None = None,
                 timeout: float | None = None) -> None:
        super().__init__(socket_path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(self.socket_path)
        except OSError as exc:
            self._sock.close()
            raise _no_daemon(self.socket_path, exc) from None
        self._decoder = FrameDecoder()
        self._send_lock = threading.Lock()  # a frame is one sendall; ids are taken under it
        self._cond = threading.Condition()  # guards the streams; notified after each read
        self._reading = False  # a thread is in recv (only one may be)
        self._closed = False

    @property
    def timeout(self) -> float | None:
        """The timeout given to the constructor; may be changed at any time."""
        return self._sock.gettimeout()

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        self._sock.settimeout(value)

    def submit(self, prompt, params: SamplingParams | None = None, *,
               priority: str | Priority | None = None, stream: bool = True,
               request_id: str | None = None, **options) -> ClientStream:
        """Sends a generate request and returns its stream at once.

        prompt: text, token ids or chat messages; options override fields of params.
        priority: 'interactive' or 'background'; None takes the connection's default
        (set_default_priority). stream=False: no token events, the whole text arrives with the
        end. request_id: the wire id (default "c1", "c2", ...). Raises InvalidRequestError for
        bad input.
        """
        with self._send_lock:
            rid = self._new_id(request_id)
            msg = generate_request(rid, prompt, params, priority=priority, stream=stream,
                                   **options)
            return self._start(ClientStream(self, rid), msg)

    def generate(self, prompt, params: SamplingParams | None = None, **kw) -> Result:
        """Runs one request to the end and returns its Result (kw as for submit)."""
        return self.submit(prompt, params, **kw).result()

    def chat(self, messages: Sequence[dict], params: SamplingParams | None = None,
             **kw) -> Result:
        """generate() for chat messages, rendered with the model's chat template."""
        return self.generate(_messages(messages), params, **kw)

    def metrics(self) -> dict:
        """The daemon's metrics snapshot."""
        return self._ask("metrics")

    def scorecard(self) -> dict:
        """The daemon's scorecard since it started (docs/design/metrics.md, "Scorecard")."""
        return self._ask("scorecard")

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False,
                 model: str | None = None) -> list[int]:
        """Text to token ids with the tokenizer of `model` (None: the daemon's first)."""
        return list(self._ask("tokenize", "tokens", text=text, add_special=add_special,
                              parse_special=parse_special, **_named(model)))

    def detokenize(self, tokens: Sequence[int], *, model: str | None = None) -> str:
        """Token ids to text with the tokenizer of `model` (None: the daemon's first)."""
        return str(self._ask("detokenize", "text", tokens=[int(t) for t in tokens],
                             **_named(model)))

    def embed(self, inputs: str | Sequence, *, normalize: bool = True,
              model: str | None = None) -> Embeddings:
        """Each input (a text or token ids; one or a list) pooled into one vector by
        `model` (None: the daemon's first; uma.embeddings)."""
        with self._send_lock:
            rid = self._new_id(None)
            waiter = self._start(ClientStream(self, rid),
                                 embed_request(rid, inputs, normalize, model))
        self._wait(lambda: waiter.done)
        return waiter._embeddings()

    def load(self, model: str, *, keep_alive: float | None = None,
             progress: Callable[[float], object] | None = None) -> dict:
        """Loads a model of the daemon's directory (at once where it is loaded) and returns it
        as ps() lists it, with load_ms. keep_alive: seconds it stays loaded idle (negative:
        until unloaded; None: the daemon's setting). progress(fraction): told as it loads.
        Raises ServerError: E_MODEL_001 (not found, or it would not load: the reason),
        E_BUSY_001 (no room: every loaded model has requests)."""
        with self._send_lock:
            rid = self._new_id(None)
            waiter = ClientStream(self, rid)
            waiter._progress = progress
            self._start(waiter, load_request(rid, model, keep_alive))
        self._wait(lambda: waiter.done)
        return dict(waiter._reply("loaded"))

    def unload(self, model: str) -> str:
        """Unloads a loaded model and returns its name; ServerError E_BUSY_001 while it has
        requests (they are never cut off), E_MODEL_001 where it is not loaded."""
        return str(self._ask("unload", "unloaded", model=model))

    def ps(self) -> list[dict]:
        """The loaded models, the most recently used first: name, path, size, memory_bytes,
        requests, idle_s, keep_alive_s, expires_in_s and whether it is the default."""
        return list(self._ask("ps", "models"))

    def health(self) -> dict:
        """Whether the daemon is up and what it serves."""
        return self._ask("health")

    def set_priority(self, request_id: str, priority: str | Priority) -> None:
        """Promotes or demotes a request in flight ('interactive' or 'background')."""
        self._send({"type": "priority", "id": request_id,
                    "priority": Priority.parse(priority).value})

    def set_default_priority(self, priority: str | Priority) -> None:
        """The class of this connection's later requests that name none (an app of background
        jobs says so once)."""
        self._send(configure_request(priority))

    def close(self) -> None:
        """Closes the connection; requests in flight raise ClosedError. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._failure is None:
            self._failure = ClosedError("the client was closed")
        self._shutdown()  # wakes a thread blocked in recv
        with self._cond:
            self._fail(self._failure)
            # Closing the descriptor under a thread still in recv could hit a reused number.
            self._cond.wait_for(lambda: not self._reading)
            self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- moving frames -------------------------------------------------------------------------

    def stop(self) -> dict:
        """Asks the daemon to stop gracefully, as SIGTERM does: in-flight requests get its grace
        period. Returns its health as it begins to drain; it exits once drained."""
        return self._ask("stop", "health")

    def _ask(self, kind: str, answer: str | None = None, **fields: Any) -> Any:
        with self._send_lock:
            rid = self._new_id(None)
            waiter = self._start(ClientStream(self, rid), {"type": kind, "id": rid, **fields})
        self._wait(lambda: waiter.done)
        return waiter._reply(answer or kind)

    def _start(self, stream: ClientStream, msg: dict) -> ClientStream:
        # Registered before sending: another thread may read the answer at once.
        self._pending[stream.id] = stream
        try:
            self._send_locked(msg)
        except BaseException:
            self._pending.pop(stream.id, None)
            raise
        return stream

    def _send(self, msg: dict) -> None:
        with self._send_lock:
            self._send_locked(msg)

    def _send_locked(self, msg: dict) -> None:
        if self._failure is not None:
            raise self._failure
        try:
            self._sock.sendall(encode(msg))
        except OSError as exc:
            # Part of a frame may have gone out (a timeout mid-send): nothing can follow it.
            self._failure = ConnectionLost(
                f"lost the connection to the daemon at {self.socket_path}: {exc}")
            self._shutdown()
            raise self._failure from None

    def _wait(self, ready: Callable[[], bool]) -> None:
        # One thread at a time reads; the others sleep on the condition and look again after
        # each batch it routes, which may have brought what they wait for.
        with self._cond:
            while not ready():
                if self._failure is not None:
                    self._fail(self._failure)  # every waiter is a stream: now done
                    if not ready():
                        raise self._failure
                    return
                if self._reading:
                    self._cond.wait()
                    continue
                self._reading = True
                try:
                    self._read()
                finally:
                    self._reading = False
                    self._cond.notify_all()

    def _read(self) -> None:
        """Reads and routes the next frames; called holding the condition, which it lets go
        while blocked in recv."""
        try:
            self._cond.release()
            try:
                data = self._sock.recv(_READ_SIZE)
            finally:
                self._cond.acquire()
            if not data:
                raise ConnectionLost(f"the daemon at {self.socket_path} closed the connection")
            for msg in _decode(self._decoder, data):
                self._route(msg)
        except TimeoutError:
            raise TimeoutError(f"no answer from the daemon within {self.timeout} s") from None
        except OSError as exc:  # ConnectionLost is one too
            lost = exc if isinstance(exc, ConnectionLost) else ConnectionLost(
                f"lost the connection to the daemon at {self.socket_path}: {exc}")
            self._fail(lost)
            self._shutdown()

    def _shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)


def _named(model: str | None) -> dict:
    return {} if model is None else {"model": model}


def _messages(messages: Sequence[dict]) -> list[dict]:
    if isinstance(messages, str) or not isinstance(messages, Sequence):
        raise InvalidRequestError("chat() takes a list of {'role', 'content'} messages")
    return list(messages)


_END = object()  # queued after a stream's last event


class AsyncClientStream(_Stream):
    """One request on an `AsyncClient`: `async for` its `TokenEvent`s; `await result()`."""

    def __init__(self, client: AsyncClient, request_id: str) -> None:
        super().__init__(request_id)
        self._client = client
        self._queue: asyncio.Queue = asyncio.Queue()
        self._finished = asyncio.Event()

    def _push(self, event: TokenEvent) -> None:
        self._queue.put_nowait(event)

    def _ended(self) -> None:
        self._queue.put_nowait(_END)
        self._finished.set()

    def __aiter__(self) -> AsyncClientStream:
        return self

    async def __anext__(self) -> TokenEvent:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)  # the end stays the end for a later __anext__
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        return item

    async def result(self) -> Result:
        """Waits for the request to end and returns its Result. Raises ServerError or
        ConnectionLost."""
        await self._finished.wait()
        return self._outcome()

    async def cancel(self) -> None:
        """Asks the daemon to stop the request; it ends with finish_reason 'cancelled'."""
        if not self.done:
            await self._client._send({"type": "cancel", "id": self.id})


class AsyncClient(_Demux):
    """An asyncio connection to the daemon: `await AsyncClient.connect()` or
    `async with AsyncClient() as client`. One reader task routes events to their streams; bound
    waits with asyncio.timeout or asyncio.wait_for."""

    def __init__(self, socket_path: str | os.PathLike | None = None) -> None:
        super().__init__(socket_path)
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        # Frames are written whole, but concurrent drain() calls are not safe on Python 3.10.
        self._send_lock = asyncio.Lock()
        self._closed = False

    @classmethod
    async def connect(cls, socket_path: str | os.PathLike | None = None) -> AsyncClient:
        """Connects to the daemon; raises ConnectionLost if none listens at the path."""
        client = cls(socket_path)
        await client._open()
        return client

    async def __aenter__(self) -> AsyncClient:
        if self._writer is None:
            await self._open()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def submit(self, prompt, params: SamplingParams | None = None, *,
                     priority: str | Priority | None = None, stream: bool = True,
                     request_id: str | None = None, **options) -> AsyncClientStream:
        """Sends a generate request and returns its stream (arguments as Client.submit)."""
        rid = self._new_id(request_id)
        msg = generate_request(rid, prompt, params, priority=priority, stream=stream, **options)
        return await self._start(AsyncClientStream(self, rid), msg)

    async def generate(self, prompt, params: SamplingParams | None = None, **kw) -> Result:
        """Runs one request to the end and returns its Result."""
        return await (await self.submit(prompt, params, **kw)).result()

    async def chat(self, messages: Sequence[dict], params: SamplingParams | None = None,
                   **kw) -> Result:
        """generate() for chat messages, rendered with the model's chat template."""
        return await self.generate(_messages(messages), params, **kw)

    async def tokenize(self, text: str, *, add_special: bool = True,
                       parse_special: bool = False, model: str | None = None) -> list[int]:
        """Client.tokenize, awaited."""
        return list(await self._ask("tokenize", "tokens", text=text, add_special=add_special,
                                    parse_special=parse_special, **_named(model)))

    async def detokenize(self, tokens: Sequence[int], *, model: str | None = None) -> str:
        """Client.detokenize, awaited."""
        return str(await self._ask("detokenize", "text", tokens=[int(t) for t in tokens],
                                   **_named(model)))

    async def embed(self, inputs: str | Sequence, *, normalize: bool = True,
                    model: str | None = None) -> Embeddings:
        """Client.embed, awaited."""
        rid = self._new_id(None)
        stream = await self._start(AsyncClientStream(self, rid),
                                   embed_request(rid, inputs, normalize, model))
        await stream._finished.wait()
        return stream._embeddings()

    async def load(self, model: str, *, keep_alive: float | None = None,
                   progress: Callable[[float], object] | None = None) -> dict:
        """Client.load, awaited."""
        rid = self._new_id(None)
        waiter = AsyncClientStream(self, rid)
        waiter._progress = progress
        await self._start(waiter, load_request(rid, model, keep_alive))
        await waiter._finished.wait()
        return dict(waiter._reply("loaded"))

    async def unload(self, model: str) -> str:
        """Client.unload, awaited."""
        return str(await self._ask("unload", "unloaded", model=model))

    async def ps(self) -> list[dict]:
        """Client.ps, awaited."""
        return list(await self._ask("ps", "models"))

    async def metrics(self) -> dict:
        """The daemon's metrics snapshot."""
        return await self._ask("metrics")

    async def scorecard(self) -> dict:
        """Client.scorecard, awaited."""
        return await self._ask("scorecard")

    async def health(self) -> dict:
        """Whether the daemon is up and what it serves."""
        return await self._ask("health")

    async def set_priority(self, request_id: str, priority: str | Priority) -> None:
        """Promotes or demotes a request in flight ('interactive' or 'background')."""
        await self._send({"type": "priority", "id": request_id,
                          "priority": Priority.parse(priority).value})

    async def set_default_priority(self, priority: str | Priority) -> None:
        """The class of this connection's later requests that name none."""
        await self._send(configure_request(priority))

    async def close(self) -> None:
        """Closes the connection; requests in flight raise ClosedError. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._fail(ClosedError("the client was closed"))
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()

    # --- moving frames -------------------------------------------------------------------------

    async def _open(self) -> None:
        try:
            reader, self._writer = await asyncio.open_unix_connection(self.socket_path)
        except OSError as exc:
            raise _no_daemon(self.socket_path, exc) from None
        self._reader_task = asyncio.create_task(self._read_loop(reader), name="uma-client-reader")

    async def _ask(self, kind: str, answer: str | None = None, **fields: Any) -> Any:
        rid = self._new_id(None)
        waiter = await self._start(AsyncClientStream(self, rid),
                                   {"type": kind, "id": rid, **fields})
        await waiter._finished.wait()
        return waiter._reply(answer or kind)

    async def _start(self, stream: AsyncClientStream, msg: dict) -> AsyncClientStream:
        self._pending[stream.id] = stream
        try:
            await self._send(msg)
        except BaseException:
            self._pending.pop(stream.id, None)
            raise
        return stream

    async def _send(self, msg: dict) -> None:
        if self._failure is not None:
            raise self._failure
        if self._writer is None:
            raise ClosedError("not connected: use `await AsyncClient.connect()` or `async with`")
        async with self._send_lock:
            try:
                self._writer.write(encode(msg))
                await self._writer.drain()
            except OSError as exc:
                self._fail(ConnectionLost(
                    f"lost the connection to the daemon at {self.socket_path}: {exc}"))
                raise self._failure from None

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        decoder = FrameDecoder()
        try:
            while True:
                data = await reader.read(_READ_SIZE)
                if not data:
                    raise ConnectionLost(
                        f"the daemon at {self.socket_path} closed the connection")
                for msg in _decode(decoder, data):
                    self._route(msg)
        except ConnectionLost as exc:
            self._fail(exc)
        except Exception as exc:  # OSError, or a bug: either way no stream may wait forever
            self._fail(ConnectionLost(
                f"lost the connection to the daemon at {self.socket_path}: {exc!r}"))
        finally:
            if self._writer is not None:
                self._writer.close()
