"""uma.client against a fake daemon that speaks the real protocol (framing + protocol modules).

The fake answers a generate request by streaming the prompt's words back, one token event per
word, round-robin over the requests in flight, then an eos. Words in angle brackets steer it:
<hold> waits for a cancel, <error> answers with an error event, <close> drops the connection,
<garbage> sends bytes that are not a frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest

from uma.client import (
    AsyncClient,
    Client,
    ConnectionLost,
    ServerError,
    default_socket_path,
    generate_request,
)
from uma.config import SamplingParams
from uma.errors import ClosedError, InvalidRequestError
from uma.priority import Priority
from uma.wire import protocol as p
from uma.wire.framing import FrameDecoder, encode

WAIT_S = 5.0  # bound on every wait; a test that hits it has failed


class _Gen:
    """One generate request the fake is answering."""

    def __init__(self, req: p.GenerateRequest) -> None:
        self.req = req
        if req.prompt is not None:
            self.words = req.prompt.split()
        elif req.messages is not None:
            self.words = req.messages[-1]["content"].split()
        else:
            self.words = [str(t) for t in req.tokens]
        self.n_prompt = len(self.words)
        self.sent: list[str] = []
        self.held = False

    def eos(self, reason: str) -> dict:
        usage = {"prompt_tokens": self.n_prompt, "completion_tokens": len(self.sent)}
        timings = {"queue_ms": 0.5, "ttft_ms": 1.5, "total_ms": 4.0}
        text = None if self.req.stream else " ".join(self.sent)
        return p.eos_event(self.req.id, reason, usage, timings, text=text)


class FakeDaemon:
    """Listens on a Unix socket and serves each connection on its own thread.

    start_after: generate requests to collect before answering any, so that the events of
    several requests interleave deterministically.
    """

    def __init__(self, path: str, start_after: int = 1) -> None:
        self.path = path
        self.start_after = start_after
        self.raw: list[dict] = []  # every request map received
        self.requests: list[p.Request] = []  # those parse_request accepted
        self.sent_ids: list[str] = []  # request id of every token event, in sending order
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen()
        self._listener.settimeout(WAIT_S)
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def close(self) -> None:
        # On Linux, shutdown() wakes a thread blocked in accept(); close() alone does not.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for thread in self._threads:
            thread.join(WAIT_S)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed, or nobody came
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            self._Connection(self, conn).run()

    class _Connection:
        def __init__(self, daemon: FakeDaemon, conn: socket.socket) -> None:
            self.daemon, self.conn = daemon, conn
            self.decoder = FrameDecoder()
            self.gens: dict[str, _Gen] = {}
            self.started = False

        def run(self) -> None:
            while True:
                runnable = self.started and any(not g.held for g in self.gens.values())
                ready, _, _ = select.select([self.conn], [], [], 0 if runnable else WAIT_S)
                if ready:
                    data = self.conn.recv(1 << 16)
                    if not data:
                        return
                    for msg in self.decoder.feed(data):
                        self.handle(msg)
                elif not runnable:
                    return  # idle for WAIT_S: the test is over (or failed)
                if self.started and not self.step():
                    return

        def send(self, event: dict) -> None:
            self.conn.sendall(encode(event))

        def handle(self, msg: dict) -> None:
            self.daemon.raw.append(msg)
            try:
                req = p.parse_request(msg, p.RequestLimits())
            except p.ProtocolError as exc:
                self.send(p.error_event(exc.request_id, exc.code, exc.message))
                return
            self.daemon.requests.append(req)
            if isinstance(req, p.GenerateRequest):
                self.gens[req.id] = _Gen(req)
                self.started |= len(self.daemon.requests) >= self.daemon.start_after
            elif isinstance(req, p.CancelRequest):
                gen = self.gens.pop(req.id, None)
                if gen is None:
                    self.send(p.error_event(req.id, p.E_PROTO_004, "unknown request id"))
                else:
                    self.send(gen.eos("cancelled"))
            elif isinstance(req, p.MetricsRequest):
                self.send(p.metrics_event(req.id, {"requests": len(self.daemon.requests)}))
            elif isinstance(req, p.HealthRequest):
                self.send(p.health_event(req.id, {"status": "ok", "model": "fake.gguf"}))

        def step(self) -> bool:
            """One word of every running request; False once the connection is to end."""
            for gen in list(self.gens.values()):
                if gen.held:
                    continue
                if not gen.words:
                    self.send(gen.eos("stop"))
                    del self.gens[gen.req.id]
                    continue
                word = gen.words.pop(0)
                if word == "<hold>":
                    gen.held = True
                elif word == "<error>":
                    self.send(p.error_event(gen.req.id, p.E_MODEL_001, "the model fell over"))
                    del self.gens[gen.req.id]
                elif word == "<close>":
                    return False
                elif word == "<garbage>":
                    self.conn.sendall(b"\xff\xff\xff\xffnot a frame")
                    return False
                else:
                    if gen.req.stream:
                        text = f" {word}" if gen.sent else word
                        self.send(p.token_event(gen.req.id, text, [len(gen.sent) + 100]))
                        self.daemon.sent_ids.append(gen.req.id)
                    gen.sent.append(word)
            return True


@pytest.fixture
def sock_path(tmp_path):
    path = tmp_path / "uma.sock"
    if len(os.fsencode(path)) < 100:  # AF_UNIX paths hold about 107 bytes
        yield str(path)
        return
    short = tempfile.mkdtemp(dir="/tmp", prefix="uma-test-")
    yield os.path.join(short, "uma.sock")
    shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def daemon(sock_path):
    fake = FakeDaemon(sock_path)
    yield fake
    fake.close()


@pytest.fixture
def client(daemon):
    with Client(daemon.path, timeout=WAIT_S) as c:
        yield c


def run_async(coro):
    return asyncio.run(asyncio.wait_for(coro, WAIT_S))


# --- default_socket_path -----------------------------------------------------------------------


def test_default_socket_path_prefers_uma_socket(monkeypatch):
    monkeypatch.setenv("UMA_SOCKET", "/somewhere/u.sock")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    assert default_socket_path() == "/somewhere/u.sock"


def test_default_socket_path_uses_xdg_runtime_dir(monkeypatch):
    monkeypatch.delenv("UMA_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    assert default_socket_path() == "/run/user/7/uma.sock"


def test_default_socket_path_falls_back_to_tmp(monkeypatch):
    monkeypatch.delenv("UMA_SOCKET", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert default_socket_path() == f"/tmp/uma-{os.getuid()}.sock"


def test_client_connects_to_default_path(daemon, monkeypatch):
    monkeypatch.setenv("UMA_SOCKET", daemon.path)
    with Client(timeout=WAIT_S) as c:
        assert c.socket_path == daemon.path
        assert c.health()["status"] == "ok"


# --- request maps ------------------------------------------------------------------------------


def test_request_map_leaves_defaults_out():
    assert generate_request("c1", "hi") == {"type": "generate", "id": "c1", "prompt": "hi"}


def test_request_map_carries_params_and_options():
    params = SamplingParams(temperature=0.7, top_k=40, stop=("\n",), logprobs=True)
    msg = generate_request("r", "hi", params, priority="background", stream=False,
                           top_k=5, max_tokens=256, seed=3)
    assert msg == {"type": "generate", "id": "r", "prompt": "hi", "temperature": 0.7,
                   "top_k": 5, "seed": 3, "max_tokens": 256, "stop": ["\n"],
                   "logprobs": True, "priority": "background", "stream": False}
    req = p.parse_request(msg, p.RequestLimits())
    assert req.params == SamplingParams(temperature=0.7, top_k=5, seed=3, stop=("\n",),
                                        logprobs=True)
    assert req.priority is Priority.BACKGROUND and req.stream is False


@pytest.mark.parametrize("prompt, field, wire", [
    ([1, 2, 3], "tokens", [1, 2, 3]),
    (np.array([5, 6], dtype=np.int32), "tokens", [5, 6]),
    ([{"role": "user", "content": "hi"}], "messages", [{"role": "user", "content": "hi"}]),
])
def test_request_map_prompt_kinds(prompt, field, wire):
    msg = generate_request("r", prompt)
    assert msg[field] == wire and type(msg[field][0]) is type(wire[0])
    p.parse_request(msg, p.RequestLimits())


@pytest.mark.parametrize("prompt", [b"bytes", [], [1.5, 2.0], [[1, 2]], None])
def test_request_map_rejects_bad_prompts(prompt):
    with pytest.raises(InvalidRequestError):
        generate_request("r", prompt)


def test_request_map_rejects_unknown_option():
    with pytest.raises(InvalidRequestError, match="temp"):
        generate_request("r", "hi", temp=0.5)


def test_server_sees_the_fields_sent(client, daemon):
    client.generate("a b", temperature=0.5, stop=["x", "y"], priority="background",
                    max_tokens=9)
    client.generate(np.arange(3, dtype=np.int64))
    client.chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "c d"}])
    first, tokens, chat = daemon.requests
    assert first.prompt == "a b" and first.params.temperature == 0.5
    assert first.params.stop == ("x", "y") and first.params.max_tokens == 9
    assert first.priority is Priority.BACKGROUND
    assert tokens.tokens == (0, 1, 2)
    assert chat.messages[0] == {"role": "system", "content": "be brief"}
    assert [m["id"] for m in daemon.raw] == ["c1", "c2", "c3"]


# --- streams and results -----------------------------------------------------------------------


def test_streaming(client):
    stream = client.submit("the quick fox")
    events = list(stream)
    assert [e.text for e in events] == ["the", " quick", " fox"]
    assert [e.token_ids for e in events] == [(100,), (101,), (102,)]
    result = stream.result()
    assert result.text == "the quick fox"
    assert result.token_ids == (100, 101, 102)
    assert result.finish_reason == "stop"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (3, 3)
    assert (result.timings.queue_ms, result.timings.ttft_ms, result.timings.total_ms) == (
        0.5, 1.5, 4.0)
    assert result.timings.admitted_ns == 0 and result.timings.token_ms == ()


def test_non_streaming(client):
    stream = client.submit("one two", stream=False)
    assert list(stream) == []
    result = stream.result()
    assert result.text == "one two" and result.token_ids == ()
    assert result.usage.completion_tokens == 2


def test_result_before_iterating_keeps_the_events(client):
    stream = client.submit("x y")
    assert stream.result().text == "x y"
    assert [e.text for e in stream] == ["x", " y"]


def test_interleaved_requests_are_demultiplexed(sock_path):
    fake = FakeDaemon(sock_path, start_after=2)
    try:
        with Client(sock_path, timeout=WAIT_S) as c:
            a = c.submit("a1 a2 a3")
            b = c.submit("b1 b2", request_id="mine")
            # Reading b first makes the client queue a's events on the way.
            assert [e.text for e in b] == ["b1", " b2"]
            assert [e.text for e in a] == ["a1", " a2", " a3"]
            assert a.result().text == "a1 a2 a3" and b.result().text == "b1 b2"
        assert fake.sent_ids[:4] == ["c1", "mine", "c1", "mine"]
    finally:
        fake.close()


def test_threads_share_a_client(client):
    # A thread waits on a held request (and so is usually the one reading) while this thread
    # waits for another request's end: the reader must hand that on, not sit on it.
    held, other = client.submit("a1 <hold>"), client.submit("b1 <hold>")
    got_first = threading.Event()
    seen: list = []

    def consume() -> None:
        seen.append(next(held).text)
        got_first.set()
        seen.extend(e.text for e in held)
        seen.append(held.result().finish_reason)

    thread = threading.Thread(target=consume)
    thread.start()
    assert got_first.wait(WAIT_S)
    assert next(other).text == "b1"
    other.cancel()
    assert other.result().finish_reason == "cancelled"
    held.cancel()
    thread.join(WAIT_S)
    assert not thread.is_alive() and seen == ["a1", "cancelled"]


def test_duplicate_request_id_is_refused(client, daemon):
    client.submit("<hold>", request_id="x")
    with pytest.raises(InvalidRequestError, match="in flight"):
        client.submit("again", request_id="x")


def test_cancel(client, daemon):
    stream = client.submit("one two <hold> three")
    assert next(stream).text == "one"
    assert next(stream).text == " two"
    stream.cancel()
    assert list(stream) == []
    result = stream.result()
    assert result.finish_reason == "cancelled" and result.text == "one two"
    assert isinstance(daemon.requests[-1], p.CancelRequest)
    stream.cancel()  # over: sends nothing
    assert client.health()["status"] == "ok"
    assert not any(isinstance(r, p.CancelRequest) for r in daemon.requests[2:])


def test_set_priority(client, daemon):
    stream = client.submit("<hold>")
    client.set_priority(stream.id, "background")
    assert client.health()  # the frames arrive in order: the priority one is in
    assert daemon.requests[1] == p.PriorityRequest(stream.id, Priority.BACKGROUND)
    stream.cancel()
    assert stream.result().finish_reason == "cancelled"


def test_default_priority_is_the_connections(client, daemon):
    client.set_default_priority("background")
    first = client.submit("a b")
    second = client.submit("c d", priority="interactive")
    assert first.result().text == "a b" and second.result().text == "c d"
    assert daemon.raw[0] == {"type": "configure", "priority": "background"}
    assert "priority" not in daemon.raw[1]  # the daemon applies the connection's default
    assert daemon.raw[2]["priority"] == "interactive"  # named, so sent


def test_server_error_event(client):
    stream = client.submit("one <error>")
    assert next(stream).text == "one"
    with pytest.raises(ServerError) as info:
        next(stream)
    assert info.value.code == p.E_MODEL_001 and info.value.request_id == stream.id
    with pytest.raises(ServerError):
        stream.result()


def test_request_rejected_by_parse_request(client):
    with pytest.raises(ServerError) as info:
        client.generate("hi", max_tokens=100_000)
    assert info.value.code == p.E_LIMIT_002 and "max_tokens" in info.value.message
    assert client.generate("still fine").text == "still fine"


def test_metrics_and_health(client):
    assert client.health() == {"status": "ok", "model": "fake.gguf"}
    assert client.metrics() == {"requests": 2}


def test_read_timeout_leaves_the_connection_usable(daemon):
    with Client(daemon.path, timeout=0.05) as c:
        stream = c.submit("<hold>")
        with pytest.raises(TimeoutError):
            stream.result()
        c.timeout = WAIT_S
        stream.cancel()
        assert stream.result().finish_reason == "cancelled"


# --- connection failures -----------------------------------------------------------------------


def test_no_daemon(sock_path):
    with pytest.raises(ConnectionLost, match=f"no UMA daemon at {sock_path}.*uma run"):
        Client(sock_path)


def test_stale_socket_file(sock_path):
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(sock_path)
    stale.close()  # the file stays, nobody listens
    with pytest.raises(ConnectionLost, match="no UMA daemon"):
        Client(sock_path)


def test_close_mid_stream(client):
    other = client.submit("<hold>")
    stream = client.submit("one <close>")
    assert next(stream).text == "one"
    with pytest.raises(ConnectionLost, match="closed the connection"):
        next(stream)
    with pytest.raises(ConnectionLost):
        other.result()
    with pytest.raises(ConnectionLost):
        client.submit("after")


def test_garbage_from_the_server(client):
    stream = client.submit("<garbage>")
    with pytest.raises(ConnectionLost, match="malformed frame") as info:
        stream.result()
    assert info.value.code == p.E_PROTO_002


def test_close_is_idempotent_and_final(daemon):
    c = Client(daemon.path, timeout=WAIT_S)
    stream = c.submit("<hold>")
    c.close()
    c.close()
    with pytest.raises(ClosedError):
        stream.result()
    with pytest.raises(ClosedError):
        c.health()


def test_errors_are_in_the_tree():
    assert issubclass(ConnectionLost, ConnectionError)
    lost = ConnectionLost("gone", "E_IO_001")
    assert str(lost) == "gone" and lost.code == "E_IO_001"


# --- AsyncClient -------------------------------------------------------------------------------


def test_async_streaming_and_results(daemon):
    async def main():
        async with AsyncClient(daemon.path) as c:
            stream = await c.submit("hello there")
            assert [e.text async for e in stream] == ["hello", " there"]
            assert (await stream.result()).text == "hello there"
            result = await c.generate("quiet please", stream=False)
            assert result.text == "quiet please" and result.finish_reason == "stop"
            assert (await c.chat([{"role": "user", "content": "a b"}])).text == "a b"
            assert await c.health() == {"status": "ok", "model": "fake.gguf"}
            assert await c.metrics() == {"requests": 5}

    run_async(main())


def test_async_interleaved(sock_path):
    fake = FakeDaemon(sock_path, start_after=2)

    async def collect(stream):
        return [e.text async for e in stream], (await stream.result()).text

    async def main():
        c = await AsyncClient.connect(sock_path)
        try:
            a = await c.submit("a1 a2 a3")
            b = await c.submit("b1 b2")
            return await asyncio.gather(collect(b), collect(a))
        finally:
            await c.close()

    try:
        got_b, got_a = run_async(main())
        assert got_a == (["a1", " a2", " a3"], "a1 a2 a3")
        assert got_b == (["b1", " b2"], "b1 b2")
        assert fake.sent_ids[:4] == ["c1", "c2", "c1", "c2"]
    finally:
        fake.close()


def test_async_cancel_and_priority(daemon):
    async def main():
        async with AsyncClient(daemon.path) as c:
            stream = await c.submit("one <hold> two")
            assert (await stream.__anext__()).text == "one"
            await c.set_priority(stream.id, "background")
            await stream.cancel()
            assert [e async for e in stream] == []
            result = await stream.result()
            assert result.finish_reason == "cancelled" and result.text == "one"

    run_async(main())
    assert [type(r) for r in daemon.requests] == [
        p.GenerateRequest, p.PriorityRequest, p.CancelRequest]


def test_async_server_error(daemon):
    async def main():
        async with AsyncClient(daemon.path) as c:
            stream = await c.submit("<error>")
            with pytest.raises(ServerError) as info:
                await stream.result()
            assert info.value.code == p.E_MODEL_001
            with pytest.raises(ServerError):
                async for _ in stream:
                    pass

    run_async(main())


def test_async_connection_lost(daemon):
    async def main():
        async with AsyncClient(daemon.path) as c:
            held = await c.submit("<hold>")
            stream = await c.submit("one <close>")
            assert (await stream.__anext__()).text == "one"
            with pytest.raises(ConnectionLost, match="closed the connection"):
                await stream.__anext__()
            with pytest.raises(ConnectionLost):
                await held.result()
            with pytest.raises(ConnectionLost):
                await c.health()

    run_async(main())


def test_async_no_daemon(sock_path):
    with pytest.raises(ConnectionLost, match="no UMA daemon"):
        run_async(AsyncClient.connect(sock_path))


def test_async_close_fails_pending(daemon):
    async def main():
        c = await AsyncClient.connect(Path(daemon.path))
        stream = await c.submit("<hold>")
        await c.close()
        await c.close()
        with pytest.raises(ClosedError):
            await stream.result()

    run_async(main())
