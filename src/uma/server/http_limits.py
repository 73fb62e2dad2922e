"""The HTTP gateway's connection limits, which uvicorn does not have.

uvicorn accepts every connection (its `limit_concurrency` answers 503 only once a request's
headers are in) and gives a connection as long as it likes to send its first request's headers
(its keep-alive timeout starts only after a response). 300 half-sent requests stayed open for
as long as their clients wanted. This protocol, uvicorn's own h11 one underneath, closes both
doors: a connection beyond the cap is answered 503 and closed before it is read, and one whose
next request's headers are not in within the header timeout is answered 408 and closed. The
body's own time limit is the app's (uma.server.http reads it under http_body_timeout_s).
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.h11_impl import H11Protocol


def _response(status: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response, closing the connection, with an OpenAI-shaped error body."""
    body = json.dumps({"error": {"message": message, "type": "server_error", "param": None,
                                 "code": code}}).encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a connection cap and a header timeout. Build it with
    functools.partial(LimitedH11Protocol, max_connections=..., header_timeout_s=...)."""

    def __init__(self, *args, max_connections: int, header_timeout_s: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._max_connections = max_connections
        self._header_timeout_s = header_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None
        self._partial = False  # bytes of the awaited request arrived, but not all its headers

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self._max_connections:
            transport.write(_response(
                "503 Service Unavailable",
                f"the server takes at most {self._max_connections} HTTP connections at once",
                "too_many_connections"))
            transport.close()
            return
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        self._partial = True
        super().data_received(data)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_headers()  # the next request's, on a kept-alive connection

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        super().connection_lost(exc)

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
