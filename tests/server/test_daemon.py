"""`uma run` in a subprocess on a tiny synthetic model, driven through real sockets."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time

import httpx
import msgpack
import numpy as np
import pytest

import uma
from uma import testing
from uma.client import AsyncClient, Client, ConnectionLost, ServerError
from uma.wire.framing import FrameDecoder, encode

from ..helpers import assert_same_greedy

ENDLESS = 60000
ENDLESS_ARGS = ("--ctx", "65536", "--max-tokens", str(ENDLESS))
PROMPTS = [
    "Hello", "The quick brown fox", "a b c", "Once upon a time, there was a",
    "1 2 3 4 5", "def main():", "🦙 llamas", "middling length prompt here",
]


@pytest.fixture(scope="module")
def daemon(tiny_path):
    # A large context and cap, so "endless" requests outlive anything a test does meanwhile.
    with testing.run_daemon(tiny_path, *ENDLESS_ARGS, "--parallel", "8",
                            "--idle-timeout", "60") as d:
        yield d
        # A daemon that stopped serving fails every later test here with "no daemon"; its
        # own log says why. (Once, on lavapipe, one closed its socket and lived on, and that
        # log was lost: docs/lab/2026-11-25-vulkan-lavapipe-suite.md.)
        if d.proc.poll() is not None or not os.path.exists(d.socket):
            raise AssertionError("the module's daemon stopped serving; its log:\n"
                                 + "".join(d.stderr)[-4000:])


def wait_for(predicate, timeout=30.0, interval=0.01):
    """Polls a condition of another process (no event to wait on), failing after timeout."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(interval)


def test_socket_is_private(daemon):
    mode = os.stat(daemon.socket).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600


def test_sixteen_clients_get_what_they_get_alone(daemon):
    opts = {"max_tokens": 12, "ignore_eos": True, "logprobs": True}
    with Client(daemon.socket) as c:
        alone = {p: c.generate(p, **opts) for p in PROMPTS}
    results = {}

    def one(i):
        with Client(daemon.socket) as c:
            results[i] = c.generate(PROMPTS[i % 8], **opts)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i in range(16):
        a, r = alone[PROMPTS[i % 8]], results[i]
        assert r.finish_reason == "length"
        assert_same_greedy(a.token_ids, r.token_ids, a.logprobs, r.logprobs)


def test_structured_output_and_a_required_call_over_the_socket(daemon):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}}}}}
    with Client(daemon.socket) as c:
        r = c.generate("JSON:", max_tokens=50, response_format={
            "type": "json_schema", "json_schema": {"schema": schema}})
        assert 0 <= json.loads(r.text)["n"] <= 9
        r = c.chat([{"role": "user", "content": "Weather?"}], max_tokens=100,
                   tools=[weather], tool_choice="required")
        assert r.finish_reason == "tool_calls" and r.tool_calls[0].name == "get_weather"
        assert json.loads(r.tool_calls[0].arguments).get("city") in (None, "Oslo", "Rome")
        with pytest.raises(ServerError, match="Unimplemented keys"):
            c.generate("x", max_tokens=2, response_format={"type": "json_schema", "json_schema": {
                "schema": {"dependentSchemas": {"a": {}}}}})


def test_top_logprobs_over_the_socket_streamed_or_not(daemon):
    opts = {"max_tokens": 6, "ignore_eos": True, "top_logprobs": 3}
    with Client(daemon.socket) as c:
        streamed = c.generate("Hello", **opts)
        whole = c.generate("Hello", stream=False, **opts)
    assert whole.token_ids == streamed.token_ids and len(whole.token_ids) == 6
    assert whole.logprobs == pytest.approx(streamed.logprobs)
    assert whole.top_logprobs == streamed.top_logprobs
    assert all(len(step) == 3 and step[0][0] == t
               for step, t in zip(whole.top_logprobs, whole.token_ids, strict=True))


def test_embeddings_over_the_socket(daemon):
    with Client(daemon.socket) as c:
        result = c.embed(["Hello world", [1, 15043]])
        raw = c.embed("Hello world", normalize=False)
        with pytest.raises(ServerError, match=r"E_PROTO_003: input\[0\] must be"):
            c.embed([{"text": "no"}])
        # token ids past a C int were E_RUNTIME_001 "Python integer ... out of bounds for int32"
        for tokens, where in [([2**40], r"input\[0\]"), ([[1, 2**64 - 1]], r"input\[0\]\[1\]")]:
            with pytest.raises(ServerError, match=rf"E_PROTO_003: {where} must be a token id"):
                c.embed(tokens)
        assert c.tokenize("still here")  # the connection outlives a bad request
    assert result.vectors.shape[0] == 2 and result.pooling == "mean"
    np.testing.assert_allclose(np.linalg.norm(result.vectors, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(raw.vectors[0] / np.linalg.norm(raw.vectors[0]),
                               result.vectors[0], atol=1e-5)

    async def embed_async():
        async with AsyncClient(daemon.socket) as c:
            return await c.embed("Hello world")

    np.testing.assert_allclose(asyncio.run(embed_async()).vectors, result.vectors[:1],
                               atol=1e-6)


def test_tokenize_and_detokenize_over_the_socket(daemon, model):
    with Client(daemon.socket) as c:
        tokens = c.tokenize("Hello world")
        assert tokens == model.tokenize("Hello world").tolist()
        assert c.detokenize(tokens[1:]).strip() == "Hello world"
        assert c.tokenize("<s>", add_special=False, parse_special=True) == [model.bos]
        with pytest.raises(ServerError, match="token"):
            c.detokenize([10**6])
        assert c.tokenize("still here")  # the connection outlives a bad request


def test_streaming_and_several_requests_per_connection(daemon):
    with Client(daemon.socket) as c:
        s1 = c.submit("first", max_tokens=8, ignore_eos=True)
        s2 = c.submit("second", max_tokens=8, ignore_eos=True, stream=False)
        events = list(s1)
        r1, r2 = s1.result(), s2.result()
    assert "".join(e.text for e in events) == r1.text
    assert len(r1.token_ids) == 8 and r2.usage.completion_tokens == 8 and r2.text


def test_killed_client_frees_its_kv_and_others_go_on(daemon, tiny_path):
    code = (
        "import sys; from uma.client import Client\n"
        "c = Client(sys.argv[1])\n"
        f"s = c.submit('never ending story', max_tokens={ENDLESS}, ignore_eos=True)\n"
        "next(iter(s)); print('streaming', flush=True); sys.stdin.read()\n"
    )
    with Client(daemon.socket) as watcher:
        before = watcher.metrics()
        other = watcher.submit("meanwhile", max_tokens=200, ignore_eos=True)
        victim = subprocess.Popen([sys.executable, "-c", code, daemon.socket],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert victim.stdout.readline().strip() == "streaming"
        victim.kill()
        victim.wait()
        wait_for(lambda: watcher.metrics()["requests_cancelled_total"]
                 > before["requests_cancelled_total"])
        result = other.result()
        assert result.finish_reason == "length" and result.usage.completion_tokens == 200
        wait_for(lambda: watcher.metrics()["kv_cells_used"] == 0)


def test_bad_requests_get_error_events_and_the_connection_survives(daemon):
    with Client(daemon.socket) as c:
        with pytest.raises(ServerError) as err:
            c.generate("x", max_tokens=ENDLESS + 1)
        assert err.value.code == "E_LIMIT_002"
        with pytest.raises(ServerError) as err:
            c.generate("word " * 70000)
        assert err.value.code == "E_LIMIT_001"
        assert c.generate("still fine", max_tokens=3).usage.completion_tokens == 3
        assert c.health()["status"] == "ok"


def class_counts(client: Client) -> tuple[int, int]:
    """(first tokens, inter-token gaps) the daemon has counted for background requests."""
    m = client.metrics()
    return m["ttft_ms_background"]["count"], m["inter_token_ms_background"]["count"]


def test_a_connection_default_class_applies_to_requests_that_name_none(daemon):
    with Client(daemon.socket) as apps, Client(daemon.socket) as watcher:
        before = class_counts(watcher)
        apps.set_default_priority("background")
        apps.generate("nightly job", max_tokens=4, ignore_eos=True)
        assert class_counts(watcher) == (before[0] + 1, before[1] + 3)
        apps.generate("but this one is urgent", max_tokens=4, ignore_eos=True,
                      priority="interactive")
        assert class_counts(watcher) == (before[0] + 1, before[1] + 3)
    with Client(daemon.socket) as fresh:  # the default belongs to the connection
        fresh.generate("a new app", max_tokens=4, ignore_eos=True)
        assert class_counts(fresh) == (before[0] + 1, before[1] + 3)


def test_a_priority_change_sent_with_its_request_is_not_lost(daemon):
    """Both frames arrive in one read, before the request has been tokenised and queued: the
    change is kept and applied once it is."""
    with Client(daemon.socket) as watcher:
        before = class_counts(watcher)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(daemon.socket)
            s.sendall(encode({"type": "generate", "id": "r", "prompt": "demote me",
                              "max_tokens": 64, "ignore_eos": True})
                      + encode({"type": "priority", "id": "r", "priority": "background"}))
            decoder, events = FrameDecoder(), []
            while not events or events[-1]["event"] == "token":
                events += decoder.feed(s.recv(65536))
        assert events[-1]["event"] == "eos" and events[-1]["reason"] == "length"
        assert class_counts(watcher)[1] > before[1]


def raw_exchange(path: str, payload: bytes, timeout: float = 10.0) -> list[dict]:
    """Sends raw bytes and reads events until the daemon closes the connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon closed first: it answered before the rest arrived
        decoder, events = FrameDecoder(1 << 24), []
        while chunk := s.recv(65536):
            events += decoder.feed(chunk)
        return events


def frame(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


def malformed_frames(rng: random.Random):
    """Frames a fuzzer would send: random bytes, lies about lengths, wrong types."""
    junk = [
        lambda: rng.randbytes(rng.randint(1, 64)),
        lambda: struct.pack("<I", 0xFFFFFFFF) + b"x",
        lambda: struct.pack("<I", 0),
        lambda: frame(rng.randbytes(rng.randint(1, 32))),
        lambda: frame(msgpack.packb([1, 2, 3])),
        lambda: frame(msgpack.packb({"type": "generate", "id": "x", "prompt": 5})),
        lambda: frame(msgpack.packb({"type": "generate", "id": "x", "prompt": "a",
                                     "max_tokens": 2**64 - 1})),
        lambda: frame(msgpack.packb({"type": "nope", "id": "x"})),
        lambda: frame(msgpack.packb({"type": "generate", "id": "y",
                                     "prompt": b"\xff\xfe".decode("latin1"),
                                     "temperature": float("nan")})),
        lambda: frame(b"\xa3\xff\xfe\xfd"),  # invalid UTF-8 in a str
        lambda: frame(msgpack.packb({"type": "cancel", "id": "missing"})),
        lambda: frame(msgpack.packb({"type": "generate", "id": "z", "tokens": [-1]})),
    ]
    while True:
        yield rng.choice(junk)()


def test_fuzzed_frames_never_hurt_a_well_behaved_client(daemon):
    rng = random.Random(1234)
    gen = malformed_frames(rng)
    with Client(daemon.socket) as good:
        steady = good.submit("steady stream", max_tokens=400, ignore_eos=True)
        closed_with_reason = 0
        for _ in range(300):  # about 3000 frames
            payload = b"".join(next(gen) for _ in range(rng.randint(1, 20)))
            events = raw_exchange(daemon.socket, payload)
            assert all(e["event"] == "error" for e in events)
            closed_with_reason += any(e["id"] is None for e in events)
        assert closed_with_reason > 0
        result = steady.result()
        assert result.finish_reason == "length" and result.usage.completion_tokens == 400
        assert good.health()["status"] == "ok"


def test_a_second_daemon_refuses_the_socket(daemon, tiny_path):
    proc = subprocess.run([sys.executable, "-m", "uma", "run", str(tiny_path),
                           "--socket", daemon.socket], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "another UMA daemon" in proc.stderr
    with Client(daemon.socket) as c:
        assert c.health()["status"] == "ok"


def test_a_stale_socket_file_is_replaced(tiny_path, tmp_path):
    path = testing.short_socket_path()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # the file stays, nobody listens: what a crashed daemon leaves
    with testing.run_daemon(tiny_path, socket=path) as d, Client(d.socket) as c:
        assert c.generate("hi", max_tokens=2).usage.completion_tokens == 2


def test_sigterm_ends_streams_with_a_reason_and_removes_the_socket(tiny_path):
    with testing.run_daemon(tiny_path, *ENDLESS_ARGS, "--grace", "0.5") as d:
        c = Client(d.socket)
        stream = c.submit("endless", max_tokens=ENDLESS, ignore_eos=True)
        next(iter(stream))
        os.kill(d.pid, signal.SIGTERM)
        result = stream.result()
        assert result.finish_reason == "cancelled"
        assert d.proc.wait(30) == 0
        assert not os.path.exists(d.socket)
        c.close()


def test_no_connection_no_daemon(tmp_path):
    with pytest.raises(ConnectionLost, match="uma run"):
        Client(str(tmp_path / "nobody.sock"))


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_an_idle_daemon_uses_no_cpu(daemon):
    with Client(daemon.socket) as c:
        c.generate("wake up", max_tokens=2)
        start = cpu_seconds(daemon.pid)
        time.sleep(2.0)  # the measurement window itself, not a synchronisation
        used = cpu_seconds(daemon.pid) - start
    assert used < 0.05, f"idle daemon used {used:.3f} s of CPU in 2 s"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_eight_clients_share_one_copy_of_the_weights(daemon, tiny_path):
    with Client(daemon.socket) as c:
        c.generate("one client", max_tokens=16, ignore_eos=True)
    one = rss_bytes(daemon.pid)
    clients = [Client(daemon.socket) for _ in range(8)]
    streams = [c.submit(f"client {i}", max_tokens=16, ignore_eos=True)
               for i, c in enumerate(clients)]
    assert all(s.result().usage.completion_tokens == 16 for s in streams)
    eight = rss_bytes(daemon.pid)
    for c in clients:
        c.close()
    # Less than one more copy of the weights for eight clients: each with its own would add
    # eight. (Not a quarter of one, as before: a device driver's own memory for batch shapes
    # first seen here is no copy, and lavapipe's came to 9-11 MiB against a 33 MiB model.)
    weights = os.path.getsize(tiny_path)
    assert eight - one < weights, f"RSS grew {(eight - one) >> 20} MiB for 8 clients"


def test_slow_readers_are_dropped(tiny_path):
    env = {"UMA_MAX_OUTBUF_BYTES": "65536"}
    with testing.run_daemon(tiny_path, *ENDLESS_ARGS, env=env) as d, Client(d.socket) as good:
        # A client that asks for a long stream and never reads is dropped, with a reason.
        slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        slow.connect(d.socket)
        slow.sendall(encode({"type": "generate", "id": "s", "prompt": "flood",
                             "max_tokens": ENDLESS, "ignore_eos": True}))
        wait_for(lambda: good.metrics()["connections_dropped_slow_total"] == 1, timeout=60)
        slow.close()
        assert good.generate("still served", max_tokens=3).usage.completion_tokens == 3


# --- fair use of the connections (uma.server.connections) --------------------------------------

ASK = """
import json, sys, time
from uma.client import Client
start = time.monotonic()
with Client(sys.argv[1]) as c:
    answer = getattr(c, sys.argv[2])()
print(json.dumps({"answer": answer, "seconds": time.monotonic() - start}))
"""

HOLD = """
import sys
from uma.client import Client
clients = [Client(sys.argv[1]) for _ in range(int(sys.argv[2]))]
streams = [c.submit("endless", max_tokens=int(sys.argv[3]), ignore_eos=True) for c in clients]
for s in streams:
    next(iter(s))
print("holding", flush=True)
sys.stdin.read()
"""


def from_another_process(path: str, what: str = "health") -> tuple[dict, float]:
    """Asks the daemon for its health, metrics or to stop from a process of its own, as `uma
    status` and `uma stop` do: (the answer, seconds from connecting to the answer)."""
    proc = subprocess.run([sys.executable, "-c", ASK, path, what], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    return out["answer"], out["seconds"]


def until_closed(sock: socket.socket) -> list[dict]:
    """The events a connection gets until the daemon closes it."""
    sock.settimeout(30)
    return read_events(sock, FrameDecoder(), lambda events: False)


def test_one_process_holding_200_connections_leaves_room_for_everyone_else(tiny_path):
    share = 48  # three quarters of max_connections' 64
    with testing.run_daemon(tiny_path) as d:
        held = []
        for _ in range(200):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(d.socket)
            held.append(s)
        # Each connection past its share closed this process's longest idle one, with a
        # reason; the rest of the daemon's connections stayed free for other processes.
        health, seconds = from_another_process(d.socket)
        assert seconds < 1.0
        assert health["connections"] == share + 1
        for s in held[:-share]:
            events = until_closed(s)
            assert [(e["id"], e["code"]) for e in events] == [(None, "E_IDLE_001")]
            assert "closed to make room for a new connection" in events[0]["message"]
            s.close()
        for i, s in enumerate(held[-share:]):  # the newest are served
            s.sendall(encode({"type": "health", "id": f"h{i}"}))
            events = read_events(s, FrameDecoder(), lambda events: events)
            assert [(e["event"], e["id"]) for e in events] == [("health", f"h{i}")]
            s.close()
        metrics, _ = from_another_process(d.socket, "metrics")
        assert metrics["connections_closed_for_room_total"] == 200 - share


def test_with_every_connection_busy_status_and_stop_still_get_in(tiny_path):
    # Four connections, three a process: a holder process takes three with a stream each,
    # this one the fourth. Nothing is idle, so newcomers get the reserve beyond the cap.
    env = {"UMA_MAX_CONNECTIONS": "4"}
    with testing.run_daemon(tiny_path, *ENDLESS_ARGS, "--grace", "2", "--http", "127.0.0.1:0",
                            env=env) as d:
        holder = subprocess.Popen([sys.executable, "-c", HOLD, d.socket, "3", str(ENDLESS)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline() == "holding\n"
            mine = Client(d.socket)
            stream = mine.submit("endless", max_tokens=ENDLESS, ignore_eos=True)
            next(iter(stream))
            with Client(d.socket) as spare:  # in the reserve: health and metrics, no work
                assert spare.health()["connections"] == 5
                with pytest.raises(ConnectionLost, match="E_LIMIT_003") as refused:
                    spare.generate("no room for this", max_tokens=2)
            assert "none is idle: this connection, beyond the limit, may ask only for " \
                   "health, metrics or stop" in str(refused.value)
            health, seconds = from_another_process(d.socket)
            assert seconds < 1.0 and health["status"] == "ok"
            assert health["requests_in_flight"] == 4
            answer, seconds = from_another_process(d.socket, "stop")
            assert seconds < 1.0 and answer["status"] == "draining"
            # `uma stop` drains the HTTP door too, as a signal does
            assert httpx.get(f"{d.http_url}/health", timeout=30).json()["status"] == "draining"
            assert stream.result().finish_reason == "cancelled"
            assert d.proc.wait(30) == 0
            mine.close()
        finally:
            holder.stdin.close()
            holder.wait(30)


def bind_in_turn(paths: list[str], start, end, results) -> None:
    """One of several processes binding the same paths at the same moment, path by path."""
    from uma.server.daemon import bind_socket

    for path in paths:
        start.wait(30)
        try:
            sock = bind_socket(path)
            results.put((path, "bound"))
        except Exception as exc:  # noqa: BLE001 - what the user would be told
            sock = None
            results.put((path, f"{type(exc).__name__}: {exc}"))
        end.wait(30)
        if sock is not None:
            sock.close()


def test_racing_starts_each_end_with_a_sentence():
    # Eight `uma run`s on one path with a stale socket file: each once took the file for
    # stale while another was between binding and listening, and removed it. Two then served
    # on one path, or one printed "uma: [Errno 2] No such file or directory".
    import multiprocessing

    paths = [testing.short_socket_path() for _ in range(40)]
    for path in paths:
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(path)
        stale.close()
    ctx = multiprocessing.get_context("spawn")
    start, end, results = ctx.Barrier(8), ctx.Barrier(8), ctx.Queue()
    workers = [ctx.Process(target=bind_in_turn, args=(paths, start, end, results))
               for _ in range(8)]
    for w in workers:
        w.start()
    told = collections.defaultdict(list)
    for _ in range(8 * len(paths)):
        path, outcome = results.get(timeout=60)
        told[path].append(outcome.replace(path, "PATH"))
    for w in workers:
        w.join(30)
    for path in paths:
        assert sorted(told[path]) == ["SocketInUseError: another UMA daemon is serving on "
                                      "PATH"] * 7 + ["bound"]


def test_idle_connections_are_closed_with_a_reason(tiny_path):
    with testing.run_daemon(tiny_path, "--idle-timeout", "0.5") as d:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
            idle.settimeout(30)
            idle.connect(d.socket)
            decoder, got = FrameDecoder(1 << 20), []
            while chunk := idle.recv(4096):
                got += decoder.feed(chunk)
        assert [e["code"] for e in got] == ["E_IDLE_001"]
        with Client(d.socket) as fresh:
            assert fresh.generate("still served", max_tokens=3).usage.completion_tokens == 3


def test_a_frame_cut_short_by_the_client_closing_gets_an_error_event(daemon):
    whole = encode({"type": "generate", "id": "t", "prompt": "never finished"})
    events = raw_exchange(daemon.socket, whole[:-3])  # then the client shuts its write side
    assert [(e["id"], e["code"]) for e in events] == [(None, "E_PROTO_002")]
    assert f"{len(whole) - 3} bytes into a frame of {len(whole)}" in events[0]["message"]


def read_events(sock: socket.socket, decoder: FrameDecoder, until) -> list[dict]:
    events = []
    while not until(events):
        chunk = sock.recv(65536)
        if not chunk:
            break
        events += decoder.feed(chunk)
    return events


LIMITS = {"UMA_MAX_PROMPT_BYTES": "4096", "UMA_MAX_FRAME_BYTES": str(1 << 20),
          "UMA_MAX_INPUT_BYTES": str(3 << 19)}  # room for one largest frame, not two


def test_frames_wait_for_room_in_the_input_budget_and_each_must_arrive_in_time(tiny_path):
    env = {**LIMITS, "UMA_FRAME_TIMEOUT": "2"}
    with testing.run_daemon(tiny_path, env=env) as d, Client(d.socket) as watcher:
        big = encode({"type": "generate", "id": "big", "prompt": "x" * ((1 << 20) - 64)})
        first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        second = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        for s in (first, second):
            s.settimeout(30)
            s.connect(d.socket)
        first.sendall(big[:1000])  # a largest frame in progress holds most of the budget
        wait_for(lambda: watcher.metrics()["input_bytes_reserved"] == len(big))
        second.sendall(big[:1000])  # another does not fit: not read until there is room
        wait_for(lambda: watcher.metrics()["connections_paused"] == 1)
        first.sendall(big[1000:])
        events = read_events(first, FrameDecoder(), lambda ev: ev)
        assert [e["code"] for e in events] == ["E_LIMIT_001"]  # whole, then judged
        wait_for(lambda: watcher.metrics()["connections_paused"] == 0)
        # The second was resumed; it never sends the rest, so its time runs out.
        events = read_events(second, FrameDecoder(), lambda ev: ev)
        assert [(e["id"], e["code"]) for e in events] == [(None, "E_IDLE_001")]
        assert "still incomplete 2 s after it began" in events[0]["message"]
        wait_for(lambda: watcher.metrics()["input_bytes_reserved"] == 0)
        first.close()
        second.close()
        assert watcher.generate("still served", max_tokens=3).usage.completion_tokens == 3


def peak_rss_since_reset(pid: int):
    """Resets the process's peak RSS (VmHWM) and returns a function reading the new peak."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")

    def peak() -> int:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM")
    return peak


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_every_connection_sending_its_largest_frame_stays_within_the_memory_bound(tiny_path):
    # docs/guide/socket-protocol.md, "Limits": input buffers stay under max_input_bytes plus one
    # 64 KiB read per connection, plus the one frame being decoded. Without the budget, 32 such
    # frames in flight hold 32 MiB and more.
    n = 32
    frame_bytes, budget = 1 << 20, 3 << 19
    # n + 1 connections of this process's: within its share, three quarters of the limit
    env = {**LIMITS, "UMA_MAX_CONNECTIONS": str(2 * n)}
    with testing.run_daemon(tiny_path, env=env) as d, Client(d.socket) as watcher:
        assert watcher.generate("warm up", max_tokens=2).usage.completion_tokens == 2
        base = rss_bytes(d.pid)
        peak = peak_rss_since_reset(d.pid)
        big = encode({"type": "generate", "id": "big", "prompt": "x" * (frame_bytes - 64)})
        answers: list[list[dict]] = []

        def flood() -> None:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(60)
                s.connect(d.socket)
                s.sendall(big)
                answers.append(read_events(s, FrameDecoder(), lambda ev: ev))

        threads = [threading.Thread(target=flood) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(answers) == n and all([e["code"] for e in a] == ["E_LIMIT_001"]
                                         for a in answers)
        grew = peak() - base
        bound = budget + n * (64 << 10) + 3 * frame_bytes  # the frame decoded: bytes + str
        assert grew < bound + (8 << 20), f"peak RSS grew {grew >> 20} MiB"
        assert watcher.metrics()["input_bytes_reserved"] == 0


def test_a_slow_reader_dropped_as_its_request_ends_leaves_the_daemon_serving(tmp_path):
    # One publishing round queued a request's last tokens, which dropped its reader (past
    # max_outbuf_bytes: the connection closes and forgets its requests), then the result that
    # came with them found no entry: the KeyError ended the poll loop for every client.
    # In process, on the fake core, one round driven by hand.
    from uma.config import ServerConfig
    from uma.server import daemon as daemon_module

    with uma.Engine("fake.gguf", core=testing.fake_core, n_ctx=1024, n_seq_max=2) as engine:
        d = daemon_module.Daemon(engine, ServerConfig(socket=str(tmp_path / "s"),
                                                      max_outbuf_bytes=64))
        ours, theirs = socket.socketpair()
        try:
            conn = daemon_module._Connection(ours, 1 << 20, app="slow")
            d._conns[ours.fileno()] = conn
            handle = engine.submit("hello", max_tokens=8, ignore_eos=True)
            assert handle.result(30).finish_reason == "length"  # its events still queued
            conn.requests["r"] = daemon_module._Entry(stream=True)
            d._ready.append((conn, "r", handle))
            d._publish_ready()
            assert ours.fileno() == -1 and not d._conns
            events = FrameDecoder(1 << 20).feed(theirs.recv(1 << 16))
            assert [e["code"] for e in events] == ["E_IO_001"]
        finally:
            theirs.close()
            d._shutdown()


def test_a_fault_in_serving_one_connection_closes_it_alone(tmp_path):
    # Defence in depth: whatever a bug raises while one connection's output is queued
    # closes that connection (its requests cancelled), and the others are served.
    from uma.config import ServerConfig
    from uma.server import daemon as daemon_module

    class Broken:
        done = False

        def cancel(self):
            pass

        def drain(self):
            raise RuntimeError("a bug")

    with uma.Engine("fake.gguf", core=testing.fake_core, n_ctx=1024, n_seq_max=2) as engine:
        d = daemon_module.Daemon(engine, ServerConfig(socket=str(tmp_path / "s")))
        pairs = [socket.socketpair() for _ in range(2)]
        try:
            conns = [daemon_module._Connection(ours, 1 << 20, app=f"app{i}")
                     for i, (ours, _) in enumerate(pairs)]
            for conn in conns:
                d._conns[conn.sock.fileno()] = conn
                conn.requests["r"] = daemon_module._Entry(stream=False)
            handle = engine.submit("hello", max_tokens=4, ignore_eos=True)
            assert handle.result(30).finish_reason == "length"
            d._ready.extend([(conns[0], "r", Broken()), (conns[1], "r", handle)])
            d._publish_ready()
            assert conns[0].sock.fileno() == -1 and list(d._conns.values()) == [conns[1]]
            events = FrameDecoder(1 << 20).feed(pairs[1][1].recv(1 << 16))
            assert [(e["event"], e["reason"]) for e in events] == [("eos", "length")]
        finally:
            for _, theirs in pairs:
                theirs.close()
            d._shutdown()
