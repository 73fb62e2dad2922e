"""The HTTP gateway's limits: a connection cap, header and body timeouts, a body size limit,
each configurable (uma.server.http_limits and uma.server.http); each test runs on both of
uvicorn's parsers the gateway may be built on (httptools where installed, h11)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from uma import Engine
from uma.config import ServerConfig
from uma.server import http_limits
from uma.server.http import HttpGateway

CAP = 4


@pytest.fixture(scope="module", autouse=True, params=["httptools", "h11"])
def parser(request):
    """The parser every gateway of this module is built on."""
    chosen = http_limits.limited_protocol(request.param)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("uma.server.http.limited_protocol", lambda: chosen)
        yield request.param


def test_auto_prefers_httptools_and_names_are_checked():
    assert http_limits.limited_protocol() is http_limits.LimitedHttpToolsProtocol
    assert http_limits.limited_protocol("h11") is http_limits.LimitedH11Protocol
    with pytest.raises(ValueError, match="parser must be"):
        http_limits.limited_protocol("fast")


@pytest.fixture(scope="module")
def engine(tiny_path):
    with Engine(tiny_path, n_ctx=4096, n_seq_max=2, n_threads=1) as e:
        yield e


def serve(engine, **limits):
    config = ServerConfig(socket="/tmp/unused.sock", http="127.0.0.1:0", **limits)
    gw = HttpGateway(engine, config)
    gw.start()
    return gw


@pytest.fixture(scope="module")
def gateway(engine):
    gw = serve(engine, http_header_timeout_s=0.5, http_body_timeout_s=0.5,
               http_max_body_bytes=4096)
    yield gw
    gw.stop()


def connect(gateway, source: str = "127.0.0.1") -> socket.socket:
    """A connection from `source`, a loopback address (127.0.0.0/8 is all this machine's):
    another source address is another client to the gateway's connection policy."""
    return socket.create_connection((gateway.host, gateway.port), timeout=30,
                                    source_address=(source, 0))


def read_response(s: socket.socket) -> tuple[int | None, dict | None]:
    """(status, JSON body) of what the server sends before it closes; (None, None) if it
    closes without a word."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    if not data:
        return None, None
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body) if body else None


def assert_serves(gateway):
    with httpx.Client(base_url=gateway.url, timeout=30) as c:
        r = c.post("/v1/completions", json={"prompt": "still there?", "max_tokens": 2})
        assert r.status_code == 200


HALF_SENT = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"  # headers never finished


def body_pending(gateway, source: str = "127.0.0.1") -> socket.socket:
    """A connection whose request is being served: its headers are in, and the app is reading
    a body that does not come (the 100 Continue says the app has begun)."""
    s = connect(gateway, source)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
              b"\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 100 ")
    s.sendall(b'{"prompt": ')
    return s


def still_open(s: socket.socket) -> bool:
    """True if the server has neither closed the connection nor answered on it."""
    s.setblocking(False)
    try:
        s.recv(1)  # b"": closed; bytes: an answer. Either way not held open.
        return False
    except BlockingIOError:
        return True
    finally:
        s.settimeout(30)


def client(gateway, source: str = "127.0.0.1") -> httpx.Client:
    return httpx.Client(base_url=gateway.url, timeout=30,
                        transport=httpx.HTTPTransport(local_address=source))


def test_a_slow_header_flood_makes_room_and_health_answers_at_once(engine):
    # 64 connections sending a byte a second once got the whole API, /health included, a 503
    # for as long as they kept coming. Waiting for their headers, they are idle: each
    # newcomer closes the one that has waited longest.
    gateway = serve(engine, http_max_connections=CAP, http_header_timeout_s=30)
    try:
        slow = []
        for _ in range(20):
            s = connect(gateway)
            s.sendall(HALF_SENT)
            slow.append(s)
        with client(gateway) as c:
            start = time.monotonic()
            assert c.get("/health").json()["status"] == "ok"
            assert time.monotonic() - start < 1.0
            r = c.post("/v1/completions", json={"prompt": "served", "max_tokens": 2})
            assert r.status_code == 200
        share = CAP * 3 // 4  # of one address: the flood's and this client's
        for s in slow[:-(share - 1)]:
            try:
                status, body = read_response(s)
            except ConnectionResetError:  # closed before its bytes were read: no word, a reset
                status = None
            assert status is None or (status, body["error"]["code"]) == (
                503, "too_many_connections")
            if status is not None:
                assert "closed to make room for a new connection" in body["error"]["message"]
        assert all(still_open(s) for s in slow[-(share - 1):])
        assert engine.snapshot()["http_connections_closed_for_room_total"] >= len(slow) - 2
    finally:
        for s in slow:
            s.close()
        gateway.stop()


def test_busy_connections_leave_health_and_metrics_a_reserve(engine):
    gateway = serve(engine, http_max_connections=CAP, http_body_timeout_s=30)
    held = []
    try:
        # One address at its share (three of four), all busy: a fourth connection of its
        # own goes to the reserve, where only /health and /metrics are served.
        held += [body_pending(gateway) for _ in range(3)]
        with client(gateway) as c:
            r = c.post("/v1/completions", json={"prompt": "no room", "max_tokens": 2})
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "too_many_connections"
            assert "this address holds 3 HTTP connections" in r.json()["error"]["message"]
        with client(gateway) as c:
            assert c.get("/health").json()["status"] == "ok"
            assert c.get("/metrics").status_code == 200
        # Another address still has room, and when it too is busy, the reserve again.
        with client(gateway, "127.0.0.2") as c:
            r = c.post("/v1/completions", json={"prompt": "room", "max_tokens": 2})
            assert r.status_code == 200
        held.append(body_pending(gateway, "127.0.0.2"))
        with client(gateway, "127.0.0.3") as c:
            r = c.post("/v1/completions", json={"prompt": "no room", "max_tokens": 2})
            assert r.status_code == 503 and "none is idle" in r.json()["error"]["message"]
        with client(gateway, "127.0.0.3") as c:
            start = time.monotonic()
            assert c.get("/health").status_code == 200
            assert time.monotonic() - start < 1.0
        assert all(still_open(s) for s in held)  # busy ones are never closed for room
    finally:
        for s in held:
            s.close()
        gateway.stop()


def test_headers_that_do_not_arrive_in_time_get_408(gateway):
    with connect(gateway) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-")
        status, body = read_response(s)
    assert status == 408 and body["error"]["code"] == "request_timeout"
    assert "headers within 0.5 s" in body["error"]["message"]


def test_a_connection_that_sends_nothing_is_closed_without_a_word(gateway):
    with connect(gateway) as s:
        assert read_response(s) == (None, None)


def test_a_body_that_does_not_arrive_in_time_gets_408(gateway):
    with connect(gateway) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
        status, body = read_response(s)
    assert status == 408 and body["error"]["code"] == "request_timeout"
    assert "did not arrive whole within 0.5 s" in body["error"]["message"]
    assert_serves(gateway)


def test_the_body_limit_is_the_configured_one(gateway):
    with httpx.Client(base_url=gateway.url, timeout=30) as c:
        r = c.post("/v1/completions", json={"prompt": "x" * 4096})
        assert r.status_code == 413 and "at most 4096" in r.json()["error"]["message"]


def test_defaults_follow_the_prompt_limit():
    config = ServerConfig(socket="/tmp/unused.sock", max_prompt_bytes=1000)
    assert config.http_max_body_bytes == config.max_frame_bytes == 2 * 1000 + (64 << 10)
