"""Models split over llama.cpp's RPC workers (`uma run --rpc`, `uma rpc-worker`): the settings'
checks, the worker's refusal of a public address, and live on loopback: two workers serve the
greedy tokens of a local run, an unreachable one fails the start naming it, and a worker lost
mid-stream ends the requests with an error while the daemon stays up and says so."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time

import pytest

import uma
from uma import _core, testing
from uma.client import Client, ServerError
from uma.config import EngineConfig, check_endpoints
from uma.errors import InvalidRequestError

from .helpers import assert_same_greedy, free_port

pytestmark = pytest.mark.skipif(not _core.rpc_supported(),
                                reason="built without llama.cpp's RPC backend (UMA_RPC=OFF)")


@pytest.mark.parametrize(("value", "endpoints"), [
    ("127.0.0.1:50052", ("127.0.0.1:50052",)),
    ("a:1,gpu-box.lan:50052", ("a:1", "gpu-box.lan:50052")),
    (["10.0.0.2:7", " h:08 "], ("10.0.0.2:7", "h:8")),
])
def test_endpoints_are_host_and_port(value, endpoints):
    assert check_endpoints(value) == endpoints


@pytest.mark.parametrize(("value", "words"), [
    ("host", "not host:port"), ("h:0", "port in [1, 65535]"), ("h:65536", "port"),
    ("h:x", "port"), (":5", "no valid host"), ("[::1]:5", "IPv6"), ("a:1,a:1", "twice"),
    (5, "host:port endpoints"),
])
def test_bad_endpoints_are_named(value, words):
    with pytest.raises(InvalidRequestError, match=r"rpc.*" + words.replace("[", r"\[")
                       .replace("]", r"\]")):
        check_endpoints(value)


def test_tensor_split_is_checked():
    assert EngineConfig("m.gguf", tensor_split="1,1,2").tensor_split == (1.0, 1.0, 2.0)
    for bad in ("-1,1", "0,0", "a,b", [1.0] * 17):
        with pytest.raises(InvalidRequestError, match="tensor_split"):
            EngineConfig("m.gguf", tensor_split=bad)


@pytest.mark.parametrize("host", ["8.8.8.8", "0.0.0.0"])
def test_a_worker_refuses_a_public_address(host):
    proc = subprocess.run([sys.executable, "-m", "uma", "rpc-worker", "--host", host,
                           "--port", "1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4 and "unauthenticated" in proc.stderr and "--allow-public" \
        in proc.stderr


# --- live, on loopback ------------------------------------------------------------------------


def accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def worker():
    """`uma rpc-worker` on a free loopback port, once it accepts connections."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uma", "rpc-worker", "--port", str(port),
                             "--threads", "1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not accepts(port):  # another process: polled, there is no event to wait on
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the worker did not listen in time"
            time.sleep(0.05)
        yield proc, f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def test_two_workers_serve_the_greedy_tokens_of_a_local_run(tiny_path):
    prompt = "Once upon a time, in a land far away"
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=1) as local:
        alone = local.generate(prompt, max_tokens=24, ignore_eos=True, logprobs=True)
    with worker() as (_, one), worker() as (_, two), \
            testing.run_daemon(tiny_path, "--rpc", f"{one},{two}", "--tensor-split", "1,1",
                               "--parallel", "2") as d, Client(d.socket) as c:
        split = c.generate(prompt, max_tokens=24, ignore_eos=True, logprobs=True)
        assert c.health()["rpc"] == [one, two]
    assert_same_greedy(alone.token_ids, split.token_ids, alone.logprobs, split.logprobs)


def test_an_unreachable_worker_fails_the_start_naming_it(tiny_path):
    endpoint = f"127.0.0.1:{free_port()}"
    with pytest.raises(RuntimeError, match=f"cannot reach the RPC worker at {endpoint}"), \
            testing.run_daemon(tiny_path, "--rpc", endpoint):
        pass


def test_a_worker_lost_mid_stream_ends_requests_and_the_daemon_says_so(tiny_path):
    with worker() as (proc, endpoint), \
            testing.run_daemon(tiny_path, "--rpc", endpoint, "--ctx", "65536",
                               "--max-tokens", "60000") as d, Client(d.socket) as c:
        stream = c.submit("Hello", max_tokens=60000, ignore_eos=True)
        next(iter(stream))  # decoding on the worker
        proc.kill()
        with pytest.raises(ServerError, match="E_MODEL_001.*engine stopped"):
            stream.result()
        health = c.health()
        assert health["status"] == "failed" and "RPC worker" in health["error"]
        with pytest.raises(ServerError, match="E_MODEL_001"):
            c.generate("after", max_tokens=2)
        assert d.proc.poll() is None  # still up, saying what happened
        c.stop()
        # it exits as failed (for a service manager to restart it), not held by the thread
        assert d.proc.wait(60) == 1


def test_a_listening_worker_is_found_at_once_and_one_that_never_listens_given_up_on():
    from uma.engine import rpc_workers

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        assert rpc_workers.wait_until_listening(endpoint, wait_s=5.0)
    nobody = f"127.0.0.1:{free_port()}"
    assert not rpc_workers.wait_until_listening(nobody, wait_s=0.3)
