"""The daemon: the models of one model host served over a Unix socket to every local app.

One thread polls every socket (selectors: epoll on Linux, kqueue on macOS) and never blocks on
a client: reads are parsed by the pure framer, writes go through a per-connection buffer sent as
the socket takes it. Engine events arrive on the engine's output thread, which only queues the
request's handle and wakes the poller through an eventfd (a pipe where there is none); the
poller turns them into frames. Tokenising a prompt can take a while, so submissions run on a
small thread pool (tokenisation releases the GIL) instead of the poller.

A request names its model (none: the one `uma run` started with). A model not loaded is
loaded on a loader thread (uma.host: one load at a time, callers of the same model share it)
while the poller serves everyone else; the request then goes on as if it had been loaded.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import logging
import os
import selectors
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import uma
from uma import _core
from uma.config import ServerConfig
from uma.engine import Engine
from uma.errors import UmaError
from uma.handle import RequestHandle, Result
from uma.host import Loaded, ModelHost
from uma.metrics import Registry
from uma.priority import Priority
from uma.server.connections import Caps, Held, admit
from uma.server.hosting import host_for
from uma.server.peers import peer_process, socket_app
from uma.wire import protocol as P
from uma.wire.framing import FrameDecoder, FrameError, encode

log = logging.getLogger("uma.daemon")

_READ_CHUNK = 1 << 16
# What a connection in the reserve beyond max_connections may ask (uma.server.connections):
# `uma status`, `uma stop` and a monitor's metrics, none of which starts work.
_SPARE_REQUESTS = (P.HealthRequest, P.MetricsRequest, P.StopRequest, P.ConfigureRequest,
                   P.ModelsRequest)
_PROGRESS_EVERY_S = 0.2  # a load's progress events at most this often


class SocketInUseError(UmaError):
    """Another daemon is serving on the socket path, or the path is not a socket."""


class SocketPathError(UmaError):
    """The socket cannot be created where it was asked for."""


class _Entry:
    """One request of a connection."""

    __slots__ = ("handle", "stream", "cancelled", "priority", "engine")

    def __init__(self, stream: bool) -> None:
        self.handle: RequestHandle | None = None  # None until its submission completes
        self.engine: Engine | None = None  # its model's, once known
        self.stream = stream
        self.cancelled = False  # a cancel arrived before the submission completed
        self.priority: Priority | None = None  # a priority change that arrived before it


class _Connection:
    __slots__ = ("sock", "decoder", "out", "requests", "last_active", "closing", "peer_gone",
                 "default_priority", "app", "reserved", "paused", "frame_started", "peer",
                 "spare", "pending", "asked")

    def __init__(self, sock: socket.socket, max_frame: int, app: str,
                 peer: int | None = None) -> None:
        self.sock = sock
        self.peer = peer  # the connecting process's id, where the OS tells it
        # In the reserve beyond max_connections (health, metrics and stop only): which cap
        # was full, "peer" or "total"; "" for a regular connection.
        self.spare = ""
        # requests other than generate not yet answered (embeddings jobs, those waiting for a
        # model to load): not in `requests`, but the connection is not idle either
        self.pending = 0
        self.asked = time.monotonic()  # when it last sent a request, or one of its ended
        self.decoder = FrameDecoder(max_frame)
        self.out = bytearray()
        self.requests: dict[str, _Entry] = {}
        self.last_active = time.monotonic()
        self.closing = False  # close once the output buffer is sent
        self.peer_gone = False
        self.default_priority = Priority.INTERACTIVE  # for requests that name none (configure)
        self.app = app  # for requests that name none: its process's or what configure said
        self.reserved = 0  # bytes of the input budget held for the frame in progress
        self.paused = False  # not read until the input budget has room for its frame
        self.frame_started = 0.0  # when the frame in progress began (or was resumed)


class _Stats:
    """The daemon's own metrics, in the engine's registry (so /metrics and `uma metrics`
    show the same names)."""

    def __init__(self, reg: Registry, daemon: Daemon) -> None:
        self.accepted = reg.counter("connections_accepted_total", "socket connections accepted")
        self.dropped_slow = reg.counter("connections_dropped_slow_total",
                                        "socket clients dropped for reading too slowly")
        self.made_room = reg.counter(
            "connections_closed_for_room_total",
            "idle socket connections closed to make room for a new one (E_IDLE_001)")
        self.refused = reg.counter(
            "connections_refused_total",
            "socket connections refused at the connection limits (E_LIMIT_003)")
        self.protocol_errors = reg.counter("protocol_errors_total",
                                           "socket frames and requests refused as malformed")
        reg.gauge("connections", "open socket connections", lambda: len(daemon._conns))
        reg.gauge("requests_in_flight", "socket requests not yet answered in full",
                  daemon._in_flight)
        reg.gauge("input_bytes_reserved", "input budget held by frames still arriving",
                  lambda: daemon._input_reserved)
        reg.gauge("connections_paused", "socket connections waiting for the input budget",
                  lambda: sum(c.paused for c in daemon._conns.values()))


class Daemon:
    """Serves `engine`, and the models of its directory, on `config.socket` until stop() (or
    a signal that calls it)."""

    def __init__(self, engine: Engine, config: ServerConfig,
                 listener: socket.socket | None = None,
                 host: tuple[ModelHost, str] | None = None) -> None:
        """listener: the socket from bind_socket(config.socket), bound before the model
        loaded; None binds it in bind(). host: the daemon's model host and the name of
        `engine`'s model in it (uma.server.hosting.host_for), shared with the HTTP gateway;
        None makes one of the daemon's own, closed with it."""
        self.engine = engine  # the first model's: its registry holds the daemon's metrics
        self.config = config
        self._own_host = host is None
        self.host, self.first = host_for(engine, config) if host is None else host
        self.limits = P.RequestLimits(
            max_prompt_bytes=config.max_prompt_bytes,
            # where other models may load, each engine checks a prompt against its context
            max_prompt_tokens=engine.n_ctx_seq if config.max_loaded == 1
            else P.RequestLimits.max_prompt_tokens,
            max_tokens=config.max_tokens,
            default_max_tokens=min(config.default_max_tokens, config.max_tokens))
        self._caps = Caps.of(config.max_connections)
        self._sel = selectors.DefaultSelector()
        self._conns: dict[int, _Connection] = {}
        self._ready: collections.deque = collections.deque()  # (conn, request id, handle)
        # (conn, request id, future) of embed requests once answered, for the poll loop
        self._answers: collections.deque = collections.deque()
        # what the loader threads hand back to the poll loop: callables run there, in order
        self._later: collections.deque[Callable[[], None]] = collections.deque()
        self._input_reserved = 0  # Σ of the connections' reservations (max_input_bytes)
        self._paused: collections.deque[_Connection] = collections.deque()  # waiting, in order
        self._wake_pending = False
        self._wake_r, self._wake_w = _make_waker()
        self._stopping = False
        # Called by stop() (the HTTP gateway's stop_soon, in `uma run`): `uma stop` drains
        # both doors at once, as a signal does.
        self.on_stop: Callable[[], None] | None = None
        self._listener = listener
        self._registered = False
        self._submitter = ThreadPoolExecutor(2, thread_name_prefix="uma-submit")
        # Waiting for a model to load holds a thread for the load's length: its own pool, so
        # submissions to loaded models never queue behind one.
        self._loader = ThreadPoolExecutor(4, thread_name_prefix="uma-load")
        self._started = time.monotonic()
        self.stats = _Stats(engine.metrics, self)

    # --- lifecycle ---------------------------------------------------------------------------

    def bind(self) -> None:
        """Creates the socket now (bind_socket), unless it was given."""
        if self._listener is None:
            self._listener = bind_socket(self.config.socket)
        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._registered = True

    def stop(self) -> None:
        """Begins a graceful shutdown. Safe from signal handlers and other threads."""
        self._stopping = True
        if self.on_stop is not None:
            self.on_stop()
        self._wake()

    def serve_forever(self) -> None:
        if not self._registered:
            self.bind()
        # The compute thread needs the GIL back after every decode; with the poll loop, the
        # output thread and the HTTP gateway runnable, Python's default 5 ms switch interval
        # added up to that much to a decode tick of a few milliseconds.
        sys.setswitchinterval(0.001)
        if self._own_host:
            self.host.start_expiry()
        deadline = None
        try:
            while True:
                if self._stopping and deadline is None:
                    deadline = self._begin_shutdown()
                if deadline is not None:
                    if not self._in_flight() and not self._unsent():
                        break
                    if time.monotonic() >= deadline:
                        if not self._cancel_all():
                            break  # cancelled already, and the grace for that is over too
                        deadline = time.monotonic() + 2.0
                for key, mask in self._sel.select(self._timeout(deadline)):
                    self._on_event(key, mask)
                self._run_later()
                self._publish_ready()
                self._publish_answers()
                self._expire_idle()
        finally:
            self._shutdown()

    # --- the poll loop -----------------------------------------------------------------------

    def _timeout(self, deadline: float | None) -> float | None:
        """Sleep until the next thing with a time on it; with nothing, indefinitely (an idle
        daemon makes no system calls at all)."""
        now = time.monotonic()
        times = [deadline] if deadline is not None else []
        idle = self.config.idle_timeout_s
        times += [c.last_active + idle for c in self._conns.values()
                  if not c.requests and not c.pending]
        frame = self.config.frame_timeout_s
        times += [c.frame_started + frame for c in self._conns.values() if self._in_frame(c)]
        return max(0.0, min(times) - now) if times else None

    @staticmethod
    def _in_frame(conn: _Connection) -> bool:
        """True while the connection is being read in the middle of a frame."""
        return conn.decoder.buffered > 0 and not conn.paused and not conn.closing

    def _on_event(self, key: selectors.SelectorKey, mask: int) -> None:
        if key.data == "accept":
            self._accept()
        elif key.data == "wake":
            _drain_waker(self._wake_r)
            self._wake_pending = False
        else:
            conn = key.data
            try:
                if mask & selectors.EVENT_READ:
                    self._read(conn)
                if mask & selectors.EVENT_WRITE and conn.sock.fileno() >= 0:
                    self._flush(conn)
            except Exception:  # noqa: BLE001 - a fault of this connection's alone
                self._contain(conn)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: keep serving the clients we have
                log.warning("accept failed: %s", exc)
                return
            sock.setblocking(False)
            self.stats.accepted.inc()
            peer = peer_process(sock)
            admission = admit(self._held(), peer, self._caps)
            if admission.close is not None:
                self.stats.made_room.inc()
                self._fail(self._conns[admission.close], P.E_IDLE_001,
                           f"closed to make room for a new connection: this one had no request "
                           f"in flight, and {self._limits()}")
            # Requests that name no app are their process's (uma.server.peers), else this
            # connection's: one process's many connections are one app to fair share.
            app = socket_app(peer) or f"conn{int(self.stats.accepted.value)}"
            conn = _Connection(sock, self.config.max_frame_bytes, app=app, peer=peer)
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)
            if admission.verdict == "reserve":
                conn.spare = admission.full
            elif admission.verdict == "refuse":
                self.stats.refused.inc()
                self._fail(conn, P.E_LIMIT_003, f"{self._full(admission.full)}, and the "
                                                f"connections kept for health, metrics and "
                                                f"stop are all busy")

    def _held(self) -> dict[int, Held]:
        """The open connections as the connection policy sees them (uma.server.connections)."""
        return {fd: Held(c.peer, self._idle_since(c), bool(c.spare))
                for fd, c in self._conns.items() if not c.closing}

    @staticmethod
    def _idle_since(conn: _Connection) -> float | None:
        """None with a request in flight; else since its last request, or since the frame it
        is sending began: a large prompt arriving is not closed before a client that has long
        been silent, and one that trickles a frame for ever is."""
        if conn.requests or conn.pending:
            return None
        return max(conn.asked, conn.frame_started) if conn.decoder.buffered else conn.asked

    def _limits(self) -> str:
        return (f"the daemon serves at most {self._caps.total} connections, "
                f"{self._caps.per_peer} to one process")

    def _full(self, cap: str) -> str:
        if cap == "peer":
            return (f"this process holds {self._caps.per_peer} connections, the most the "
                    f"daemon serves one process")
        return f"the daemon serves at most {self._caps.total} connections and none is idle"

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(_READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            conn.peer_gone = True
            if conn.decoder.buffered and not conn.closing:
                # The client closed its side mid-frame: say so, in case it still reads.
                self.stats.protocol_errors.inc()
                self._fail(conn, P.E_PROTO_002, f"the connection closed {conn.decoder.buffered}"
                                                f" bytes into a frame of {conn.decoder.pending}")
            else:
                self._close(conn)
            return
        now = conn.last_active = time.monotonic()
        if conn.closing:
            return  # a connection on its way out ignores further input
        between_frames = conn.decoder.buffered == 0
        try:
            messages = conn.decoder.feed(data)
        except FrameError as exc:
            self.stats.protocol_errors.inc()
            for msg in exc.messages:
                self._dispatch(conn, msg)
            self._fail(conn, exc.code, str(exc))
            return
        if conn.decoder.buffered and (between_frames or messages):
            conn.frame_started = now  # a new frame began
        self._reserve(conn)
        for msg in messages:
            self._dispatch(conn, msg)

    # --- the input budget --------------------------------------------------------------------
    # Each connection holds at most one frame in progress (max_frame_bytes), but 64 of them at
    # 16 MiB took the daemon from 178 MB to 690 MB. So a frame's length is reserved from one
    # budget (max_input_bytes) as soon as its prefix arrives, before its body; a connection
    # whose frame does not fit is not read until earlier frames are done, in arrival order.
    # A paused connection holds at most the one read that showed its length.

    def _reserve(self, conn: _Connection) -> None:
        need = conn.decoder.pending
        if need > conn.reserved and \
                self._input_reserved - conn.reserved + need > self.config.max_input_bytes:
            freed = conn.reserved > 0
            self._hold(conn, 0)
            conn.paused = True
            self._paused.append(conn)
            self._update_interest(conn)
            if freed:  # its last frame's share: those queued before it may fit now
                self._resume_paused()
            return
        freed = need < conn.reserved
        self._hold(conn, need)
        if freed:
            self._resume_paused()

    def _hold(self, conn: _Connection, n_bytes: int) -> None:
        self._input_reserved += n_bytes - conn.reserved
        conn.reserved = n_bytes

    def _resume_paused(self) -> None:
        """Reads paused connections again, first paused first, while their frames fit."""
        while self._paused:
            conn = self._paused[0]
            if conn.sock.fileno() < 0 or conn.closing:
                self._paused.popleft()
                continue
            need = conn.decoder.pending
            if self._input_reserved + need > self.config.max_input_bytes:
                return
            self._paused.popleft()
            self._hold(conn, need)
            conn.paused = False
            conn.frame_started = time.monotonic()  # its time runs from now
            self._update_interest(conn)

    def _dispatch(self, conn: _Connection, msg: dict) -> None:
        conn.asked = time.monotonic()
        try:
            req = P.parse_request(msg, self.limits, conn.default_priority)
        except P.ProtocolError as exc:
            self.stats.protocol_errors.inc()
            self._send(conn, P.error_event(exc.request_id, exc.code, str(exc)))
            return
        if conn.spare and not isinstance(req, _SPARE_REQUESTS):
            self.stats.refused.inc()
            self._fail(conn, P.E_LIMIT_003, f"{self._full(conn.spare)}: this connection, "
                                            f"beyond the limit, may ask only for health, "
                                            f"metrics or stop")
            return
        if isinstance(req, P.GenerateRequest):
            self._generate(conn, req)
        elif isinstance(req, P.CancelRequest):
            entry = self._entry(conn, req.id)
            if entry is not None:
                entry.cancelled = True
                if entry.handle is not None:
                    entry.handle.cancel()
        elif isinstance(req, P.PriorityRequest):
            entry = self._entry(conn, req.id)
            if entry is not None:
                if entry.handle is None:  # still being tokenised: applied when it is queued
                    entry.priority = req.priority
                elif entry.engine is not None:
                    entry.engine.set_priority(entry.handle, req.priority)
        elif isinstance(req, P.ConfigureRequest):
            conn.default_priority = req.priority or conn.default_priority
            conn.app = req.app or conn.app
        elif isinstance(req, P.MetricsRequest):
            self._send(conn, P.metrics_event(req.id, self.metrics()))
        elif isinstance(req, P.ScorecardRequest):
            self._send(conn, P.scorecard_event(req.id, self.engine.scorecard()))
        elif isinstance(req, P.HealthRequest):
            self._send(conn, P.health_event(req.id, self.health()))
        elif isinstance(req, P.TokenizeRequest):
            self._with_model(conn, req.id, req.model, lambda model: self._answer(
                conn, req.id, lambda: P.tokens_event(req.id, model.tokenize(
                    req.text, add_special=req.add_special, parse_special=req.parse_special))))
        elif isinstance(req, P.EmbedRequest):
            # tokenising takes a while: on the submit pool
            self._with_model(conn, req.id, req.model, lambda model: self._submitter.submit(
                self._embed, conn, req, model), answers=True)
        elif isinstance(req, P.DetokenizeRequest):
            self._with_model(conn, req.id, req.model, lambda model: self._answer(
                conn, req.id, lambda: P.text_event(req.id, model.detokenize(req.tokens))))
        elif isinstance(req, P.LoadRequest):
            conn.pending += 1
            self._loader.submit(self._load, conn, req)
        elif isinstance(req, P.UnloadRequest):
            conn.pending += 1
            self._loader.submit(self._unload, conn, req)
        elif isinstance(req, P.ModelsRequest):
            self._send(conn, P.models_event(req.id, self._models()))
        elif isinstance(req, P.StopRequest):
            log.info("stop requested over the socket")
            self.stop()
            self._send(conn, P.health_event(req.id, self.health()))

    def _answer(self, conn: _Connection, request_id: str, answer: Callable[[], dict]) -> None:
        """Sends answer() or, where it raises, the error event it maps to."""
        try:
            event = answer()
        except Exception as exc:  # noqa: BLE001 - this request's alone
            if not isinstance(exc, UmaError):
                log.exception("answering request %r failed", request_id)
            event = P.error_event_for(request_id, exc)
        self._send(conn, event)

    # --- models --------------------------------------------------------------------------------

    def _with_model(self, conn: _Connection, request_id: str, name: str | None,
                    serve: Callable[[Engine], object], *, answers: bool = False,
                    failed: Callable[[BaseException], None] | None = None) -> None:
        """Runs serve(engine) on the poll loop with the engine of model `name` (None: the
        first), at once where it is loaded, else once a loader thread has loaded it. The model
        is held until serve returns or, where it returns a future (work handed to the submit
        pool), until that is done: by then what it submitted keeps the model busy. A model
        that will not load: failed(exc), by default an error event. answers: serve's answer
        comes back through _answers (conn.pending stays counted until then)."""
        entry = self.host.hold(name or self.first)
        if entry is not None:
            self._serve_held(conn, entry, serve, answers)
            return
        conn.pending += 1
        self._loader.submit(self._load_for, conn, request_id, name or self.first, serve,
                            answers, failed)

    def _serve_held(self, conn: _Connection, entry: Loaded,
                    serve: Callable[[Engine], object], answers: bool) -> None:
        handed = None
        try:
            if conn.sock.fileno() >= 0:  # its client may have left while it loaded
                if answers:
                    conn.pending += 1
                handed = serve(entry.engine)  # type: ignore[arg-type]
        finally:
            if isinstance(handed, Future):
                handed.add_done_callback(lambda _: self.host.release(entry))
            else:
                self.host.release(entry)

    def _load_for(self, conn: _Connection, request_id: str, name: str,
                  serve: Callable[[Engine], object], answers: bool,
                  failed: Callable[[BaseException], None] | None) -> None:
        """On a loader thread: the model loaded and held, then served on the poll loop."""
        try:
            entry = self.host.load(name, hold=True)
        except Exception as exc:  # noqa: BLE001 - this request's answer
            def tell(exc: BaseException = exc) -> None:
                conn.pending -= 1
                if failed is not None:
                    failed(exc)
                else:
                    self._send(conn, P.error_event_for(request_id, exc))
            self._soon(tell)
            return

        def go() -> None:
            conn.pending -= 1
            self._serve_held(conn, entry, serve, answers)
        self._soon(go)

    def _load(self, conn: _Connection, req: P.LoadRequest) -> None:
        """On a loader thread: a load request, its progress sent as it goes."""
        began = time.monotonic()
        shown = [0.0]

        def progress(fraction: float) -> bool:
            now = time.monotonic()
            if now - shown[0] >= _PROGRESS_EVERY_S:
                shown[0] = now
                self._soon(lambda: self._send(conn, P.progress_event(req.id,
                                                                      round(fraction, 3))))
            return not self._stopping  # a daemon stopping cancels the load
        try:
            entry = self.host.load(req.model, keep_alive_s=req.keep_alive_s, progress=progress)
            event = P.loaded_event(req.id, {
                **entry.describe(time.monotonic()),
                "load_ms": round((time.monotonic() - began) * 1e3, 1)})
        except Exception as exc:  # noqa: BLE001 - this request's answer
            event = P.error_event_for(req.id, exc)
        self._soon(lambda: self._reply(conn, event))

    def _unload(self, conn: _Connection, req: P.UnloadRequest) -> None:
        """On a loader thread (closing an engine joins its threads)."""
        try:
            self.host.unload(req.model)
            event = P.unloaded_event(req.id, self.host.canonical(req.model))
        except Exception as exc:  # noqa: BLE001 - this request's answer
            event = P.error_event_for(req.id, exc)
        self._soon(lambda: self._reply(conn, event))

    def _reply(self, conn: _Connection, event: dict) -> None:
        conn.pending -= 1
        conn.asked = time.monotonic()
        self._send(conn, event)

    def _models(self) -> list[dict]:
        return [{**m, "default": m["name"] == self.first} for m in self.host.describe()]

    def _soon(self, call: Callable[[], None]) -> None:
        """From another thread: call() on the poll loop."""
        self._later.append(call)
        self._wake()

    def _run_later(self) -> None:
        while self._later:
            call = self._later.popleft()
            try:
                call()
            except Exception:  # noqa: BLE001 - one request's fault, the loop goes on
                log.exception("answering a request after its model loaded failed")

    def _embed(self, conn: _Connection, req: P.EmbedRequest, engine: Engine) -> None:
        """On the submit pool: queue the inputs; the answer goes back through _answers."""
        future: Future = Future()
        try:
            future = engine.submit_embeddings(list(req.inputs), normalize=req.normalize)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error event
            future.set_exception(exc)

        def answered(done: Future) -> None:  # on the engine's compute thread (or here)
            self._answers.append((conn, req.id, done))
            self._wake()

        future.add_done_callback(answered)

    def _publish_answers(self) -> None:
        while self._answers:
            conn, request_id, future = self._answers.popleft()
            if conn.sock.fileno() < 0:
                continue  # its client is gone
            conn.pending -= 1
            conn.asked = time.monotonic()
            if future.cancelled():
                continue
            exc = future.exception()
            self._send(conn, P.embeddings_event(request_id, future.result()) if exc is None
                       else P.error_event_for(request_id, exc))

    def _entry(self, conn: _Connection, request_id: str) -> _Entry | None:
        entry = conn.requests.get(request_id)
        if entry is None:
            self._send(conn, P.error_event(request_id, P.E_PROTO_004,
                                           f"no request {request_id!r} in flight here"))
        return entry

    def _generate(self, conn: _Connection, req: P.GenerateRequest) -> None:
        if self._stopping:
            self._send(conn, P.error_event(req.id, P.E_BUSY_001, "the daemon is shutting down"))
            return
        if req.id in conn.requests:
            self._send(conn, P.error_event(req.id, P.E_PROTO_004,
                                           f"request id {req.id!r} is already in flight"))
            return
        if len(conn.requests) >= self.config.max_inflight:
            self._send(conn, P.error_event(
                req.id, P.E_LIMIT_004,
                f"at most {self.config.max_inflight} requests in flight per connection"))
            return
        entry = conn.requests[req.id] = _Entry(req.stream)

        def submit(engine: Engine) -> Future | None:
            entry.engine = engine
            if req.quick_to_submit:
                self._submit(conn, req, engine)
                return None
            return self._submitter.submit(self._submit, conn, req, engine)

        self._with_model(conn, req.id, req.model, submit,
                         failed=lambda exc: self._ready.append((conn, req.id, exc)))

    def _submit(self, conn: _Connection, req: P.GenerateRequest, engine: Engine) -> None:
        """On the submit pool (or here, for a short prompt): tokenise and queue; the result
        goes back through _ready."""
        try:
            handle = engine.submit(req.engine_prompt, req.params, priority=req.priority,
                                   app=req.app or conn.app, weight=req.weight,
                                   tools=req.tools, tool_choice=req.tool_choice,
                                   response_format=req.response_format, grammar=req.grammar)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error event
            self._ready.append((conn, req.id, exc))
            self._wake()
            return
        self._ready.append((conn, req.id, handle))
        handle.listen(lambda h: self._notify(conn, req.id, h))

    def _notify(self, conn: _Connection, request_id: str, handle: RequestHandle) -> None:
        """On the engine's output thread: queue, wake the poller, return."""
        self._ready.append((conn, request_id, handle))
        self._wake()

    def _publish_ready(self) -> None:
        touched = set()
        while self._ready:
            conn, request_id, item = self._ready.popleft()
            try:
                if self._publish(conn, request_id, item):
                    touched.add(conn)
            except Exception:  # noqa: BLE001 - a fault of this connection's alone
                self._contain(conn)
        for conn in touched:
            self._flush(conn)

    def _publish(self, conn: _Connection, request_id: str,
                 item: RequestHandle | Exception) -> bool:
        """Queues what a request has to say: its submission's failure, or its new events and
        its result. True if anything was queued."""
        entry = conn.requests.get(request_id)
        if entry is None or conn.sock.fileno() < 0:
            if isinstance(item, RequestHandle) and not item.done:
                item.cancel()  # its client is gone
            return False
        if isinstance(item, Exception):
            del conn.requests[request_id]
            conn.asked = time.monotonic()
            code = P.error_code_for(item)
            if code == P.E_RUNTIME_001 and not isinstance(item, UmaError):
                log.exception("submit failed", exc_info=item)
            self._queue(conn, P.error_event_for(request_id, item))
            return True
        if entry.handle is None:
            entry.handle = item
            if entry.cancelled:
                item.cancel()
            elif entry.priority is not None and entry.engine is not None:
                entry.engine.set_priority(item, entry.priority)
        events, result = item.drain()
        if entry.stream:
            for ev in events:
                self._queue(conn, P.token_event(request_id, ev.text, ev.token_ids,
                                                ev.logprobs, ev.top_logprobs))
        # Queueing can drop a slow reader, which closes the connection and forgets its
        # requests: this one's result then has nobody to go to. (It did once, and the
        # KeyError ended the poll loop for every client.)
        if result is not None and conn.requests.pop(request_id, None) is not None:
            conn.last_active = conn.asked = time.monotonic()
            self._queue(conn, self._eos(request_id, result, entry.stream))
        return True

    def _contain(self, conn: _Connection) -> None:
        """A fault in serving one connection (a bug) closes that connection, its requests
        cancelled, and the daemon serves the others."""
        log.exception("serving connection %s failed; closing it", conn.app)
        with contextlib.suppress(Exception):
            self._close(conn)

    @staticmethod
    def _eos(request_id: str, r: Result, stream: bool) -> dict:
        if r.finish_reason == "error" and r.error is not None:
            return P.error_event_for(request_id, r.error)
        usage = {"prompt_tokens": r.usage.prompt_tokens,
                 "completion_tokens": r.usage.completion_tokens,
                 "cached_tokens": r.usage.cached_tokens}
        t = r.timings
        timings = {"queue_ms": t.queue_ms, "ttft_ms": t.ttft_ms, "total_ms": t.total_ms}
        if stream:
            return P.eos_event(request_id, r.finish_reason, usage, timings, None,
                               r.tool_calls, r.content)
        return P.eos_event(request_id, r.finish_reason, usage, timings, r.text, r.tool_calls,
                           r.content, r.token_ids, r.logprobs, r.top_logprobs)

    # --- output ------------------------------------------------------------------------------

    def _send(self, conn: _Connection, event: dict) -> None:
        self._queue(conn, event)
        self._flush(conn)

    def _queue(self, conn: _Connection, event: dict) -> None:
        if conn.sock.fileno() < 0:
            return
        conn.out += encode(event)
        if len(conn.out) > self.config.max_outbuf_bytes and not conn.closing:
            # The client reads too slowly: drop it rather than buffer without bound. The reason
            # replaces the backlog, in case it still reads that much.
            self.stats.dropped_slow.inc()
            mib = len(conn.out) / (1 << 20)
            conn.out = bytearray()
            self._fail(conn, P.E_IO_001, f"dropped: the client fell {mib:.1f} MiB behind")

    def _flush(self, conn: _Connection) -> None:
        if conn.sock.fileno() < 0:
            return
        while conn.out:
            try:
                n = conn.sock.send(conn.out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                conn.peer_gone = True
                self._close(conn)
                return
            del conn.out[:n]
        if conn.closing and not conn.out:
            self._close(conn)
            return
        self._update_interest(conn)

    def _update_interest(self, conn: _Connection) -> None:
        # A connection on its way out, or paused for the input budget, is not read.
        events = (0 if conn.closing or conn.paused else selectors.EVENT_READ) | (
            selectors.EVENT_WRITE if conn.out else 0)
        key = self._sel.get_map().get(conn.sock.fileno())
        if key is None:
            if events:
                self._sel.register(conn.sock, events, conn)
        elif not events:
            self._sel.unregister(conn.sock)
        elif key.events != events:
            self._sel.modify(conn.sock, events, conn)

    def _fail(self, conn: _Connection, code: str, message: str) -> None:
        """Tells the client why, then closes the connection once that is sent. Its input is
        dropped at once, and its share of the input budget with it."""
        conn.closing = True
        conn.decoder = FrameDecoder(conn.decoder.max_frame)
        self._hold(conn, 0)
        self._resume_paused()
        self._send(conn, P.error_event(None, code, message))

    def _close(self, conn: _Connection) -> None:
        """Closes at once; the connection's requests are cancelled, freeing their KV."""
        if conn.sock.fileno() < 0:
            return
        for entry in conn.requests.values():
            entry.cancelled = True
            if entry.handle is not None:
                entry.handle.cancel()
        conn.requests.clear()
        self._conns.pop(conn.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()
        self._hold(conn, 0)
        self._resume_paused()

    def _expire_idle(self) -> None:
        now = time.monotonic()
        limit = now - self.config.idle_timeout_s
        for conn in [c for c in self._conns.values()
                     if not c.requests and not c.pending and not c.closing
                     and c.last_active < limit]:
            self._fail(conn, P.E_IDLE_001,
                       f"closed after {self.config.idle_timeout_s:g} s without a request")
        frame = self.config.frame_timeout_s
        for conn in [c for c in self._conns.values()
                     if self._in_frame(c) and c.frame_started + frame < now]:
            self._fail(conn, P.E_IDLE_001, f"closed: a frame was still incomplete "
                                           f"{frame:g} s after it began")

    # --- status --------------------------------------------------------------------------------

    def metrics(self) -> dict:
        """The registry's snapshot, the daemon's own metrics in it (docs/design/metrics.md)."""
        return self.engine.snapshot()

    def health(self) -> dict:
        """Whether it serves, and what `uma status` shows: the first model's slots, queue,
        load and memory (else the most recently used model's), the loaded models, and the
        daemon's own figures."""
        loaded = self.host.loaded()
        shown = self.host.find(self.first) or (loaded[0] if loaded else None)
        failures = [(e.name, e.engine.failure) for e in loaded
                    if e.engine.failure is not None]  # type: ignore[attr-defined]
        rpc = self.engine.config.rpc
        return {
            **(shown.engine.status() if shown is not None else {"model": None}),
            "status": "failed" if failures else "draining" if self._stopping else "ok",
            **({"error": failures[0][1]} if failures else {}),
            "loaded": [e.name for e in loaded],
            **({"rpc": list(rpc)} if rpc else {}),
            "uptime_s": round(time.monotonic() - self._started, 3),
            "connections": len(self._conns), "requests_in_flight": self._in_flight(),
            "backends": list(_core.backends()), "pid": os.getpid(),
            "socket": self.config.socket, "version": uma.__version__,
        }

    def _in_flight(self) -> int:
        return sum(len(c.requests) for c in self._conns.values())

    def _unsent(self) -> bool:
        return any(c.out for c in self._conns.values())

    # --- shutdown ------------------------------------------------------------------------------

    def _begin_shutdown(self) -> float:
        """Stops accepting and removes the socket file; in-flight requests get the grace
        period to finish."""
        log.info("shutting down: %d requests in flight", self._in_flight())
        if self._listener is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(self._listener)
            self._listener.close()
            self._listener = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.config.socket)
        return time.monotonic() + self.config.grace_s

    def _cancel_all(self) -> bool:
        """Cancels what is still running; False if there was nothing left to cancel."""
        handles = [e.handle for c in self._conns.values() for e in c.requests.values()
                   if e.handle is not None and not e.handle.done and not e.cancelled]
        for conn in self._conns.values():
            for entry in conn.requests.values():
                entry.cancelled = True
        for handle in handles:
            handle.cancel()
        return bool(handles)

    def _shutdown(self) -> None:
        for conn in list(self._conns.values()):
            with contextlib.suppress(OSError):
                conn.sock.settimeout(1.0)  # blocking, for at most a second
                conn.sock.sendall(conn.out)
            self._close(conn)
        if self._listener is not None:
            self._listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.config.socket)
        self._submitter.shutdown(wait=True, cancel_futures=True)
        self._loader.shutdown(wait=True, cancel_futures=True)  # a load in flight is cancelled
        if self._own_host:
            self.host.close(keep=self.engine)  # the models it loaded; the first is the caller's
        self._sel.close()
        for fd in {self._wake_r, self._wake_w}:
            os.close(fd)

    def _wake(self) -> None:
        # One wake-up per poll round is enough; skipping the others saves a system call a token.
        if self._wake_pending:
            return
        self._wake_pending = True
        with contextlib.suppress(OSError):
            if self._wake_r == self._wake_w:
                os.eventfd_write(self._wake_w, 1)
            else:
                os.write(self._wake_w, b"\0")


def bind_socket(path: str) -> socket.socket:
    """The daemon's listening socket at path, mode 0600, non-blocking. A stale file from a dead
    daemon is replaced; a live daemon's socket, or a path that is not a socket, is left alone
    with an error. A missing parent directory is created (0700) only where it is the user's
    own: under their home, their runtime directory or the temporary directory. Every failure
    is a SocketInUseError or SocketPathError with a sentence, never an OS error's number.

    Daemons starting at once on one path take turns here (a lock on the directory): between
    one's check of the path and its socket listening, another took the file for stale and
    removed it, and two served on one path, or one failed with a bare "[Errno 2]"."""
    directory = os.path.dirname(os.path.abspath(path))
    _make_socket_dir(directory)
    try:
        with _directory_lock(directory, path):
            return _bind_socket(path)
    except OSError as exc:
        raise SocketPathError(f"cannot create the socket {path}: {_reason(exc)}") from None


def _bind_socket(path: str) -> socket.socket:
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise SocketInUseError(f"{path} exists and is not a socket; not touching it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # nobody listens: left over by a daemon that died
        else:
            raise SocketInUseError(f"another UMA daemon is serving on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket file is born 0600: no window where others may connect
    try:
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:  # a process that does not take the lock
            raise SocketInUseError(f"another process is listening on {path}") from None
        raise
    finally:
        os.umask(old)
    sock.setblocking(False)
    return sock


@contextlib.contextmanager
def _directory_lock(directory: str, path: str, timeout_s: float = 10.0) -> Iterator[None]:
    """Holds an exclusive flock on the socket's directory: every `uma run` binding a socket
    there waits its turn, for the few system calls that takes. Where the directory cannot be
    opened or locked (a filesystem without locks), it goes on without."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                # Held for microseconds by a daemon binding; this long, by one stopped there.
                if time.monotonic() > deadline:
                    raise SocketInUseError(
                        f"another UMA daemon has been starting on {path} for {timeout_s:g} s "
                        f"(it holds a lock on {directory}); is one stopped?") from None
                time.sleep(0.01)
            except OSError:
                break  # no locks on this filesystem
        yield
    finally:
        os.close(fd)  # releases the lock


def _make_socket_dir(directory: str) -> None:
    if os.path.isdir(directory):
        return
    own = [os.path.expanduser("~"), os.environ.get("XDG_RUNTIME_DIR"), tempfile.gettempdir()]
    if not any(root and _inside(directory, root) for root in own):
        raise SocketPathError(
            f"the socket's directory {directory} does not exist; create it, or choose a socket "
            f"path in an existing directory (it is created only under your home, your runtime "
            f"directory or {tempfile.gettempdir()})")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)  # another start may have made it
    except OSError as exc:
        raise SocketPathError(f"cannot create the socket's directory {directory}: "
                              f"{_reason(exc)}") from None


def _reason(exc: OSError) -> str:
    """An OS error as words: "Permission denied", not "[Errno 13] Permission denied: '/x'"."""
    return exc.strerror or str(exc)


def _inside(path: str, root: str) -> bool:
    root = os.path.realpath(root)
    return os.path.commonpath([os.path.realpath(path), root]) == root and \
        os.path.realpath(path) != root


def _make_waker() -> tuple[int, int]:
    """(read fd, write fd) of an eventfd (Linux), or of a pipe elsewhere; both non-blocking."""
    if hasattr(os, "eventfd"):
        fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        return fd, fd
    r, w = os.pipe()
    for fd in (r, w):
        os.set_blocking(fd, False)
    return r, w


def _drain_waker(fd: int) -> None:
    # An eventfd read returns its 8-byte counter and resets it; a pipe is read until empty.
    with contextlib.suppress(BlockingIOError, InterruptedError):
        while len(os.read(fd, 4096)) == 4096:
            pass

