"""The HTTP gateway's connection limits, which uvicorn does not have.

uvicorn accepts every connection (its `limit_concurrency` answers 503 only once a request's
headers are in) and gives a connection as long as it likes to send its first request's headers
(its keep-alive timeout starts only after a response). 300 half-sent requests stayed open for
as long as their clients wanted. These protocols, uvicorn's own underneath (httptools where it
is installed, else h11), close both doors: connections are admitted by the connection policy
(uma.server.connections: a share per peer address, an idle connection closed to make room, a
reserve for /health and /metrics), and one whose next request's headers are not in within the
header timeout is answered 408 and closed. The body's own time limit is the app's
(uma.server.http reads it under http_body_timeout_s). Being the one object a connection has,
it also carries who is at the other end (uma.server.peers) to the app, for the app of requests
that name none.

httptools (a C parser, and a response path that writes a body chunk in one call) is preferred
where it is installed: a streamed token costs the gateway's thread a fraction of what h11's
pure-Python state machine costs, and that thread shares the interpreter with the engine's.
"""

from __future__ import annotations

import asyncio
import json
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools not installed: h11 alone
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

from uma.metrics import Counter
from uma.server.connections import Caps, Held, admit
from uma.server.peers import TcpPeer

SPARE_PATHS = ("/health", "/metrics")  # what a connection in the reserve may ask for


def _body(message: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "server_error", "param": None,
                                 "code": code}}).encode()


def _response(status: str, message: str, code: str, retry: bool = False) -> bytes:
    """A whole HTTP/1.1 response, closing the connection, with an OpenAI-shaped error body."""
    body = _body(message, code)
    retry_after = "retry-after: 1\r\n" if retry else ""
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n{retry_after}connection: close\r\n\r\n"
            ).encode() + body


def limited_protocol(parser: str = "auto") -> type:
    """The protocol class to build connections with: parser 'httptools' (where installed),
    'h11', or 'auto' (httptools if installed, else h11)."""
    if parser not in ("auto", "httptools", "h11"):
        raise ValueError(f"parser must be auto, httptools or h11, not {parser!r}")
    if parser == "h11" or (parser == "auto" and LimitedHttpToolsProtocol is None):
        return LimitedH11Protocol
    if LimitedHttpToolsProtocol is None:
        raise ValueError("httptools is not installed")
    return LimitedHttpToolsProtocol


class _Limited:
    """A uvicorn protocol with the connection policy and a header timeout (mixed into uvicorn's
    own protocol classes below). Build it with functools.partial(cls, max_connections=...,
    header_timeout_s=..., made_room=Counter, refused=Counter)."""

    # what the protocol class beside it in a concrete class provides
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    connections: set
    client: tuple | None
    server: tuple | None
    cycle: object
    app: object

    def __init__(self, *args, max_connections: int, header_timeout_s: float,
                 made_room: Counter | None = None, refused: Counter | None = None,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._caps = Caps.of(max_connections)
        self._header_timeout_s = header_timeout_s
        self._made_room = made_room
        self._refused = refused
        self._header_timer: asyncio.TimerHandle | None = None
        self._partial = False  # bytes of the awaited request arrived, but not all its headers
        self._idle_since = time.monotonic()  # since its last response, or since it connected
        self._spare = ""  # in the reserve (/health, /metrics only): which cap was full

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        held = self._held()  # before super() adds this one to the connections
        super().connection_made(transport)
        admission = admit(held, self._peer(), self._caps)
        if admission.close is not None:
            admission.close._make_room(self._limits())
        if admission.verdict == "refuse":
            _count(self._refused)
            transport.write(_response(
                "503 Service Unavailable", f"{self._full(admission.full)}, and the connections "
                f"kept for /health and /metrics are all busy", "too_many_connections",
                retry=True))
            transport.close()
            return
        if admission.verdict == "reserve":
            self._spare = admission.full
            self.app = _SpareOnly(self.app, f"{self._full(admission.full)}: this connection, "
                                            f"beyond the limit, is served /health and /metrics "
                                            f"only", self._refused)
        else:
            self.app = _WithPeer(self.app, TcpPeer(self.client, self.server))
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        self._partial = True
        super().data_received(data)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._idle_since = time.monotonic()
        self._await_headers()  # the next request's, on a kept-alive connection

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        super().connection_lost(exc)

    # --- the connection policy -----------------------------------------------------------------

    def _peer(self) -> str | None:
        return self.client[0] if self.client else None

    def _held(self) -> dict[_Limited, Held]:
        """The open connections as the connection policy sees them: a connection is idle
        between requests (its next request's headers not in yet), busy from then until its
        response is sent."""
        return {p: Held(p._peer(), None if p._busy() else p._idle_since, bool(p._spare))
                for p in self.connections
                if isinstance(p, _Limited) and p.transport is not None
                and not p.transport.is_closing()}

    def _busy(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete  # type: ignore[attr-defined]

    def _make_room(self, limits: str) -> None:
        """Closes this idle connection for a newcomer: with a 503 if part of a request came."""
        _count(self._made_room)
        if self._partial:
            self.transport.write(_response(
                "503 Service Unavailable", f"closed to make room for a new connection: this "
                f"one's request had not arrived, and {limits}", "too_many_connections",
                retry=True))
        self.transport.close()

    def _limits(self) -> str:
        return (f"the server takes at most {self._caps.total} HTTP connections at once, "
                f"{self._caps.per_peer} from one address")

    def _full(self, cap: str) -> str:
        if cap == "peer":
            return (f"this address holds {self._caps.per_peer} HTTP connections, the most the "
                    f"server takes from one address")
        return (f"the server takes at most {self._caps.total} HTTP connections at once and "
                f"none is idle")

    # --- the header timeout --------------------------------------------------------------------

    def _await_headers(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._partial = False
        if not self.transport.is_closing():
            self._header_timer = self.loop.call_later(
                self._header_timeout_s, self._headers_late, self.cycle)

    def _headers_late(self, cycle: object) -> None:
        # `cycle` is replaced when a request's headers are in: if it is still the one seen
        # when the timer was set, no request began since.
        if self.cycle is cycle and not self.transport.is_closing():
            if self._partial:
                self.transport.write(_response(
                    "408 Request Timeout",
                    f"no complete request headers within {self._header_timeout_s:g} s",
                    "request_timeout"))
            self.transport.close()


class LimitedH11Protocol(_Limited, H11Protocol):
    """uvicorn's h11 protocol, limited."""


if HttpToolsProtocol is not None:
    class LimitedHttpToolsProtocol(_Limited, HttpToolsProtocol):
        """uvicorn's httptools protocol, limited."""
else:
    LimitedHttpToolsProtocol = None  # type: ignore[assignment,misc]


class _WithPeer:
    """The app of a regular connection: each request's scope carries the connection's client
    process as scope["uma.peer"] (a uma.server.peers.TcpPeer, looked up once)."""

    def __init__(self, app, peer: TcpPeer) -> None:
        self.app = app
        self._peer = peer

    async def __call__(self, scope, receive, send) -> None:
        scope["uma.peer"] = self._peer
        await self.app(scope, receive, send)


class _SpareOnly:
    """The app of a connection in the reserve beyond the cap: GET /health and /metrics go to
    the app, anything else is answered 503 and the connection closed."""

    def __init__(self, app, message: str, refused: Counter | None) -> None:
        self.app = app
        self._body = _body(message, "too_many_connections")
        self._refused = refused

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or (scope["method"] in ("GET", "HEAD")
                                       and scope["path"] in SPARE_PATHS):
            await self.app(scope, receive, send)
            return
        _count(self._refused)
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self._body)).encode()),
            (b"retry-after", b"1"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": self._body})


def _count(counter: Counter | None) -> None:
    if counter is not None:
        counter.inc()
