"""The HTTP gateway's limits: a connection cap, header and body timeouts, a body size limit,
each configurable (uma.server.http_limits and uma.server.http)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from uma import Engine
from uma.config import ServerConfig
from uma.server.http import HttpGateway

CAP = 4


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


def connect(gateway) -> socket.socket:
    return socket.create_connection((gateway.host, gateway.port), timeout=30)


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


def test_connections_beyond_the_cap_are_answered_503_and_closed(engine):
    gateway = serve(engine, http_max_connections=CAP)
    held = [connect(gateway) for _ in range(CAP)]
    try:
        with connect(gateway) as extra:
            status, body = read_response(extra)
        assert status == 503 and body["error"]["code"] == "too_many_connections"
        assert f"at most {CAP}" in body["error"]["message"]
    finally:
        for s in held:
            s.close()
    # The server sees the closes in its own time: until then a new connection is still over.
    deadline = time.monotonic() + 30
    with httpx.Client(base_url=gateway.url, timeout=30) as c:
        while (r := c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
               ).status_code == 503:
            assert time.monotonic() < deadline, "the cap was not freed"
    assert r.status_code == 200
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
