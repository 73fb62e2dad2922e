"""Generated requests, valid and invalid, over the socket and HTTP to a live `uma run` while a
victim stream decodes: every bad request is refused with a protocol error or a 4xx naming what
was wrong (never an internal error), every good one is served, and the victim's tokens are
exactly what it gets alone. Edge values (1e308, 3.5e38, -0.0, subnormals, 2^63, 2^64, NaN,
infinities) come as numbers and as strings."""

from __future__ import annotations

import json
import math
import socket

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from uma import testing
from uma.client import Client
from uma.config import SamplingParams
from uma.errors import InvalidRequestError
from uma.server.framing import FrameDecoder, encode

from ..helpers import assert_same_greedy

VICTIM = "Once upon a time, in a land far away, there lived a"
VICTIM_TOKENS = 3000  # also the daemon's cap on max_tokens: more is E_LIMIT_002
EXAMPLES = 120  # per door

EDGES = [1e308, -1e308, 3.5e38, 3.4028234e38, -0.0, 0.0, 5e-324, 1e-310, 1e-40, 2**63,
         2**64, 2**64 - 1, -(2**63), math.nan, math.inf, -math.inf, 10**400]
SAMPLER = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "frequency_penalty",
           "presence_penalty", "penalty_last_n", "seed")

values = st.one_of(
    st.sampled_from(EDGES),
    st.sampled_from(EDGES).map(repr),  # the same, as strings: "1e+308", "nan", "inf"
    st.floats(-3, 3), st.integers(-5, 100), st.booleans(), st.none(),
    st.just([1.0]), st.just({"a": 1}), st.text(max_size=4),
)
requests = st.fixed_dictionaries(
    {"prompt": st.sampled_from(["x", "Hello there", "🦙"])},
    optional={**{name: values for name in SAMPLER},
              "max_tokens": st.one_of(st.integers(-1, 8), st.just(VICTIM_TOKENS + 1), values)},
)


def expected_ok(fields: dict) -> bool:
    """What SamplingParams, the one check both doors share, makes of the fields."""
    options = {k: v for k, v in fields.items() if k != "prompt" and v is not None}
    max_tokens = options.pop("max_tokens", 1)
    if type(max_tokens) is int and max_tokens > VICTIM_TOKENS:
        return False
    try:
        SamplingParams(max_tokens=max_tokens, **options)
    except InvalidRequestError:
        return False
    return True


def msgpack_can_carry(fields: dict) -> bool:
    ints = [v for v in fields.values() if type(v) is int]
    return all(-(2**63) <= v < 2**64 for v in ints)


@pytest.fixture(scope="module")
def daemon(tiny_path):
    with testing.run_daemon(tiny_path, "--http", "127.0.0.1:0", "--ctx", "16384",
                            "--parallel", "4", "--max-tokens", str(VICTIM_TOKENS)) as d:
        yield d


class SocketDoor:
    """One connection; each request is sent as a frame and read to its end."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(path)
        self.decoder = FrameDecoder(1 << 24)
        self.n = 0

    def send(self, fields: dict) -> dict:
        """The request's last event: its eos or its error."""
        self.n += 1
        rid = f"f{self.n}"
        self.sock.sendall(encode({"type": "generate", "id": rid, "stream": False, **fields}))
        while True:
            for event in self.decoder.feed(self.sock.recv(65536)):
                assert event["id"] == rid, event  # nothing concerns the connection
                if event["event"] in ("eos", "error"):
                    return event


def test_generated_requests_never_touch_a_running_stream(daemon):
    with Client(daemon.socket) as client:
        solo = client.generate(VICTIM, max_tokens=VICTIM_TOKENS, ignore_eos=True,
                               logprobs=True)
        victim = client.submit(VICTIM, max_tokens=VICTIM_TOKENS, ignore_eos=True,
                               logprobs=True)
        next(iter(victim))  # decoding
        door = SocketDoor(daemon.socket)
        http = httpx.Client(base_url=daemon.http_url, timeout=60)
        overlapped = []

        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(fields=requests.filter(msgpack_can_carry))
        def over_the_socket(fields):
            event = door.send({**fields, "max_tokens": fields.get("max_tokens", 2)})
            if expected_ok({**fields, "max_tokens": fields.get("max_tokens", 2)}):
                assert event["event"] == "eos" and event["reason"] in ("stop", "length"), event
            else:
                assert event["event"] == "error", event
                assert event["code"] in ("E_PROTO_003", "E_LIMIT_002"), event
            overlapped.append(not victim.done)

        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(fields=requests)
        def over_http(fields):
            body = json.dumps({**fields, "max_tokens": fields.get("max_tokens", 2)})
            r = http.post("/v1/completions", content=body,
                          headers={"content-type": "application/json"})
            if expected_ok({**fields, "max_tokens": fields.get("max_tokens", 2)}):
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
            else:
                assert r.status_code == 400, r.text
                error = r.json()["error"]
                assert error["type"] == "invalid_request_error" and error["param"], error
            overlapped.append(not victim.done)

        over_the_socket()
        over_http()
        result = victim.result()
        http.close()
        door.sock.close()
        # The victim decoded beside most of the generated requests.
        assert sum(overlapped) >= len(overlapped) // 2, (sum(overlapped), len(overlapped))
        assert result.finish_reason == "length"
        assert_same_greedy(solo.token_ids, result.token_ids, solo.logprobs, result.logprobs)
        assert client.generate("still served", max_tokens=3).usage.completion_tokens == 3
        assert client.health()["status"] == "ok"
