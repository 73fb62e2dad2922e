"""Generated requests, valid and invalid, over the socket and HTTP to a live `uma run` while a
victim stream decodes: every bad request is refused with a protocol error or a 4xx naming what
was wrong (never an internal error), every good one is served, and the victim's tokens are
exactly what it gets alone. Edge values (1e308, 3.5e38, -0.0, subnormals, 2^63, 2^64, NaN,
infinities) come as numbers and as strings."""

from __future__ import annotations

import functools
import json
import math
import os
import socket

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from uma import testing
from uma.client import Client
from uma.config import SamplingParams
from uma.errors import InvalidRequestError
from uma.wire import protocol as P
from uma.wire.framing import FrameDecoder, FrameError, encode

from ..helpers import PYTHON_TEXT, assert_same_greedy

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



# --- hostile inputs on every route and every socket message kind -------------------------------
# What a hostile or careless client sends: lone surrogates, integers past int32 and int64 (and
# past what Python reads from JSON), deep nesting, 100 KB strings, the wrong kinds, bodies that
# are not JSON and frames that are not msgpack. Whatever comes, the answer is a 4xx or an error
# event in the project's words: never a 5xx or an E_RUNTIME_001, never Python's own text; every
# request is answered, and a stream decoding beside them all is untouched.

# per door, of which about a fifth are raw bodies or frames; more for a longer hunt
HOSTILE_EXAMPLES = int(os.environ.get("UMA_HOSTILE_EXAMPLES", "150"))
HOSTILE_VICTIM_TOKENS = 400
BIG_INTS = [2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**31) - 1,
            -(2**63)]
BIG_JSON_INTS = [2**64, -(2**63) - 1, 10**30, 10**4000]  # past what msgpack carries
HUGE_TEXTS = ["x" * 100_000, "🦙" * 30_000, "\0" * 1000, "<|im_start|>" * 500]
# placeholders for JSON nested past any limit (json.dumps itself stops at ~1000)
DEEP = {f"\0deep{n}\0": "[" * n + "]" * n for n in (31, 33, 999, 3000)}
RAW_BODIES = [
    b"", b"null", b"[]", b'"x"', b"\xef\xbb\xbf{}", b'{"prompt": "a"', b"\xff\xfe{\x00}\x00",
    b'{"prompt": "\xed\xa0\x80"}', b'{"prompt": "\xff"}', b'{"prompt": "\\ud800"}',
    b'{"max_tokens": 1' + b"0" * 5000 + b"}", b"{" * 100_000, b"[" * 100_000 + b"]" * 100_000,
]
# A string field whose bytes are no UTF-8: a surrogate as CESU-8, a lone continuation byte, an
# overlong '/', bytes UTF-8 never uses. "@@@" is replaced in the packed frame.
MARKED = [{"type": "generate", "id": "h", "prompt": "@@@"},
          {"type": "tokenize", "id": "h", "text": "@@@"},
          {"type": "configure", "app": "@@@"}, {"type": "health", "@@@": 1}]
BAD_UTF8 = [b"\xed\xa0\x80", b"\x80ab", b"\xc0\xaf!", b"\xff\xfe\xfd"]

COMMON = ["model", "stream", "max_tokens", "stop", "temperature", "top_p", "top_k", "seed",
          "min_p", "logit_bias", "priority", "user", "n", "ignore_eos", "cache_prompt",
          "parse_special", "grammar", "response_format", "logprobs", "stream_options"]
ROUTES = {
    "/v1/completions": ({"prompt": "Hi", "max_tokens": 2},
                        [*COMMON, "prompt", "echo", "suffix", "best_of"]),
    "/v1/chat/completions": ({"messages": [{"role": "user", "content": "Hi"}],
                              "max_tokens": 2},
                             [*COMMON, "messages", "tools", "tool_choice", "top_logprobs",
                              "max_completion_tokens"]),
    "/v1/embeddings": ({"input": "Hi"},
                       ["input", "model", "encoding_format", "dimensions", "user"]),
    "/infill": ({"input_prefix": "def f(", "input_suffix": ")", "n_predict": 2},
                [*COMMON, "input_prefix", "input_suffix", "input_extra", "prompt",
                 "n_predict"]),
    "/tokenize": ({"content": "Hi"}, ["content", "add_special", "parse_special",
                                      "with_pieces"]),
    "/detokenize": ({"tokens": [1, 2]}, ["tokens"]),
}
SOCKET_KINDS = {  # a valid message of each kind, less its type and id
    "generate": {"prompt": "Hi", "max_tokens": 2, "stream": False},
    "cancel": {}, "priority": {"priority": "background"}, "configure": {"app": "fuzz"},
    "metrics": {}, "health": {}, "stop": {}, "tokenize": {"text": "Hi"},
    "detokenize": {"tokens": [1, 2]}, "embed": {"input": "Hi"},
}
KEYS = st.one_of(st.text(max_size=6), st.just("k" * 100_000))  # made-up field names
# Invalid ids, or none (nil counts as absent): a request that is served is always "h".
BAD_IDS = st.one_of(st.none(), st.just(""), st.just("i" * 129), st.integers(-5, 2**64 - 1),
                    st.booleans(), st.floats(),
                    st.lists(st.integers(0, 9), max_size=2))


@functools.cache
def hostile(wire: str) -> st.SearchStrategy:
    """Any value: a scalar, or a small container of them; in JSON also lone surrogates, integers
    msgpack cannot carry and nesting past any limit."""
    texts = [st.text(max_size=8), st.sampled_from(HUGE_TEXTS)]
    ints = [st.integers(-3, 8), st.sampled_from(BIG_INTS)]
    extra = []
    if wire == "json":
        surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
        texts.append(st.builds("{}{}{}".format, st.text(max_size=3), surrogate,
                               st.text(max_size=3)))
        ints.append(st.sampled_from(BIG_JSON_INTS))
        extra.append(st.sampled_from(sorted(DEEP)))
    scalar = st.one_of(st.none(), st.booleans(), *ints, *texts,
                       st.floats(allow_nan=True, allow_infinity=True))

    def nest(inner: st.SearchStrategy) -> st.SearchStrategy:
        return st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3)

    return st.one_of(st.recursive(scalar, nest, max_leaves=6), *extra)


def shapes(v: st.SearchStrategy) -> dict[str, st.SearchStrategy]:
    """The shapes of the structured fields, with hostile values inside."""
    fixed = st.fixed_dictionaries
    return {
        "messages": st.lists(fixed({"role": v, "content": v}, optional={
            "tool_calls": v, "name": v, "tool_call_id": v}), max_size=3),
        "tools": st.lists(fixed({"type": st.just("function"), "function": fixed(
            {"name": v}, optional={"description": v, "parameters": v})}), max_size=2),
        "response_format": fixed({"type": st.just("json_schema"),
                                  "json_schema": fixed({"schema": v})}),
        "tokens": st.lists(st.one_of(st.integers(0, 31999), v), max_size=4),
        "input": st.one_of(st.lists(st.one_of(st.integers(0, 31999), v), max_size=4),
                           st.lists(st.lists(v, max_size=3), max_size=3)),
        "input_extra": st.lists(fixed({"filename": v, "text": v}), max_size=2),
        "logit_bias": st.dictionaries(st.one_of(st.text(max_size=6),
                                                st.integers(-1, 10**30).map(str)), v,
                                      max_size=2),
    }


@functools.cache
def value_of(name: str, wire: str) -> st.SearchStrategy:
    """What a field is set to: a hostile value, or one of its shape (built once: hypothesis
    checks each new strategy, and that took longer than the requests)."""
    v = hostile(wire)
    shaped = shapes(v)
    return st.one_of(v, shaped[name]) if name in shaped else v


@st.composite
def fields(draw, base: dict, names: list[str], wire: str) -> dict:
    """base with up to three of names (or of made-up names) set to hostile values."""
    keys = draw(st.lists(st.one_of(st.sampled_from(names), KEYS), max_size=3, unique=True))
    return {**base, **{k: draw(value_of(k if k in names else "", wire)) for k in keys}}


def json_body(body: object) -> bytes:
    text = json.dumps(body)
    for placeholder, nested in DEEP.items():
        text = text.replace(json.dumps(placeholder), nested)
    return text.encode()


def http_cases() -> st.SearchStrategy:
    """(route, body bytes): a route's valid body with hostile fields, or anything at all."""
    routes = st.sampled_from(sorted(ROUTES))
    shaped = routes.flatmap(lambda route: st.tuples(
        st.just(route), fields(*ROUTES[route], "json").map(json_body)))
    raw = st.tuples(routes, st.one_of(st.binary(max_size=40), st.sampled_from(RAW_BODIES),
                                      hostile("json").map(json_body)))
    return st.one_of(shaped, shaped, shaped, raw)


def api_error(body: bytes) -> dict | None:
    """The error object of a JSON answer, or of a stream's last event."""
    text = body.decode()
    if text.startswith("data: "):
        events = [line[6:] for line in text.splitlines() if line.startswith("data: {")]
        text = events[-1] if events else "{}"
    obj = json.loads(text)
    return obj.get("error") if isinstance(obj, dict) else None


def socket_frames() -> st.SearchStrategy:
    """A valid message of any kind with hostile fields and maybe a bad id, a string field of
    bad UTF-8, or bytes that are no msgpack map."""
    def message(kind: str) -> st.SearchStrategy:
        names = sorted(P._FIELDS[kind] - {"id"})
        return st.tuples(fields({"type": kind, **SOCKET_KINDS[kind]}, names, "msgpack"),
                         st.one_of(st.just("h"), BAD_IDS))

    def framed(pair: tuple[dict, object]) -> bytes:
        msg = {**pair[0], "id": pair[1]}
        if msg.get("type") == "stop":
            msg["bogus"] = 1  # a valid stop would stop the daemon: only bad ones are sent
        return encode(msg)

    valid = st.sampled_from(sorted(SOCKET_KINDS)).flatmap(message).map(framed)
    bad_utf8 = st.builds(lambda msg, bad: encode(msg).replace(b"@@@", bad),
                         st.sampled_from(MARKED), st.sampled_from(BAD_UTF8))
    junk = st.binary(min_size=1, max_size=40).map(lambda b: len(b).to_bytes(4, "little") + b)
    return st.one_of(valid, valid, valid, valid, bad_utf8, junk)


def socket_exchange(path: str, frame: bytes) -> list[dict]:
    """Every event one frame brings, on a connection of its own: up to the answer to a health
    request sent after it, and on to the end of request "h" where that answers later."""
    try:
        msg = FrameDecoder().feed(frame)[0]
        answers_later = msg.get("type") in ("generate", "embed") and msg.get("id") == "h"
    except FrameError:
        answers_later = False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)  # a hang fails the test
        sock.connect(path)
        sock.sendall(frame + encode({"type": "health", "id": "fence"}))
        decoder = FrameDecoder(1 << 24)
        events: list[dict] = []
        fenced = ended = False
        while not (fenced and (ended or not answers_later)):
            data = sock.recv(1 << 16)
            if not data:  # closed: only after a frame that broke the stream
                assert events and events[-1]["id"] is None, (frame[:200], events)
                assert events[-1]["code"] in ("E_PROTO_001", "E_PROTO_002"), events
                return events
            for event in decoder.feed(data):
                events.append(event)
                fenced = fenced or event["id"] == "fence"
                ended = ended or event["id"] == "h" and event["event"] in ("eos", "error",
                                                                           "embeddings")
        return events


def test_hostile_inputs_get_4xx_in_our_words_and_never_touch_a_stream(daemon):
    with Client(daemon.socket) as client:
        # streams decoding beside every hostile request: one more is started whenever one ends
        victims = []

        def keep_a_victim_decoding():
            if not victims or victims[-1].done:
                victims.append(client.submit(VICTIM, max_tokens=HOSTILE_VICTIM_TOKENS,
                                             ignore_eos=True, logprobs=True))
                next(iter(victims[-1]))

        keep_a_victim_decoding()
        http = httpx.Client(base_url=daemon.http_url, timeout=30)  # a hang fails the test

        @settings(max_examples=HOSTILE_EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=http_cases())
        def over_http(case):
            route, body = case
            r = http.post(route, content=body, headers={"content-type": "application/json"})
            error = api_error(r.content)
            if route == "/infill" and r.status_code == 501:  # the tiny model has no FIM tokens
                assert error["type"] == "not_supported_error", r.text
            else:
                assert r.status_code < 500, (route, body[:300], r.text[:500])
            assert r.status_code < 400 or error is not None, r.text[:300]
            if error is not None:
                assert not PYTHON_TEXT.search(error["message"]), (route, body[:300], error)
                assert len(error["message"]) < 500, (route, error["message"][:300])
            keep_a_victim_decoding()

        @settings(max_examples=HOSTILE_EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(frame=socket_frames())
        def over_the_socket(frame):
            for event in socket_exchange(daemon.socket, frame):
                if event["event"] == "error":
                    assert event["code"] != "E_RUNTIME_001", (frame[:300], event)
                    assert not PYTHON_TEXT.search(event["message"]), (frame[:300], event)
                    assert len(event["message"]) < 500, event["message"][:300]
                elif event["id"] == "h" and event["event"] == "eos":
                    assert event["reason"] in ("stop", "length"), event
            keep_a_victim_decoding()

        over_http()
        over_the_socket()
        for path in ["/health", "/metrics", "/v1/models", "/v1/models/" + "m" * 10_000,
                     "/v1/models/%ED%A0%80", "/v1/models/%FF", "/nowhere"]:
            r = http.get(path)
            assert r.status_code < 500, (path, r.text)
            error = api_error(r.content) if path != "/metrics" else None
            assert error is None or len(error["message"]) < 500, error
        http.close()
        victims[-1].cancel()
        # Each victim has every token it decoded, and they are what the prompt gets alone.
        results = [v.result() for v in victims]
        solo = client.generate(VICTIM, max_tokens=max(r.usage.completion_tokens
                                                      for r in results),
                               ignore_eos=True, logprobs=True)
        for r in results:
            assert r.finish_reason in ("length", "cancelled"), r.finish_reason
            n = r.usage.completion_tokens
            assert len(r.token_ids) == len(r.logprobs) == n > 0
            assert_same_greedy(solo.token_ids[:n], r.token_ids, solo.logprobs[:n], r.logprobs)
        assert client.health()["status"] == "ok"
