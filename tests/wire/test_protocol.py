"""Requests parse into frozen objects or fail with the right wire code, naming the field."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uma import errors
from uma.config import SamplingParams
from uma.priority import Priority
from uma.tools import ToolCall
from uma.wire import protocol as p
from uma.wire.framing import FrameDecoder, encode
from uma.wire.protocol import (
    CancelRequest,
    ConfigureRequest,
    GenerateRequest,
    HealthRequest,
    MetricsRequest,
    PriorityRequest,
    ProtocolError,
    RequestLimits,
    parse_event,
    parse_request,
)

LIMITS = RequestLimits(max_prompt_bytes=1000, max_prompt_tokens=100, max_tokens=512)


def parse(msg: dict, limits: RequestLimits = LIMITS, **kw):
    return parse_request(msg, limits, **kw)


def rejected(msg: dict, limits: RequestLimits = LIMITS) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_request(msg, limits)
    return info.value


def gen(**fields) -> dict:
    return {"type": "generate", "id": "r1", "prompt": "hi", **fields}


# --- each request type -----------------------------------------------------------------------


def test_generate_with_prompt_and_defaults():
    req = parse(gen())
    assert req == GenerateRequest(id="r1", params=SamplingParams(max_tokens=256),
                                  priority=Priority.INTERACTIVE, prompt="hi")
    assert req.stream is True
    assert req.engine_prompt == "hi"
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.id = "other"  # type: ignore[misc]


def test_short_prompts_are_submitted_on_the_io_thread_long_ones_by_a_worker():
    limits = RequestLimits(max_prompt_bytes=1 << 20)
    n = p.QUICK_PROMPT_CHARS
    assert parse(gen(prompt="x" * n), limits).quick_to_submit
    assert not parse(gen(prompt="x" * (n + 1)), limits).quick_to_submit
    half = [{"role": "user", "content": "y" * (n // 2)}] * 2
    assert parse(gen(prompt=None, messages=half), limits).quick_to_submit
    assert not parse(gen(prompt=None, messages=[*half, {"role": "user", "content": "z"}]),
                     limits).quick_to_submit
    assert parse(gen(prompt=None, tokens=[1, 2, 3])).quick_to_submit


def test_generate_with_every_option():
    req = parse(gen(
        max_tokens=32, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, repeat_penalty=1.1,
        frequency_penalty=0.5, presence_penalty=-0.5, penalty_last_n=128, seed=2**64 - 1,
        stop=["\n\n", "END"], stream=False, priority="background", logprobs=True,
        ignore_eos=True, speculation="ngram"))
    assert req.params == SamplingParams(
        temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1,
        frequency_penalty=0.5, presence_penalty=-0.5, penalty_last_n=128, seed=2**64 - 1,
        max_tokens=32, stop=("\n\n", "END"), ignore_eos=True, logprobs=True,
        speculation="ngram")
    assert req.stream is False
    assert req.priority is Priority.BACKGROUND


def test_an_unknown_speculation_is_refused_naming_the_field():
    with pytest.raises(p.ProtocolError, match="speculation must be one of off, ngram, draft, not"):
        parse(gen(speculation="medusa"))
    with pytest.raises(p.ProtocolError, match="speculation must be one of"):
        parse(gen(speculation=1))


def test_generate_with_messages():
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    req = parse({"type": "generate", "id": "c", "messages": messages})
    assert req.messages == tuple(messages)
    assert req.prompt is None and req.tokens is None
    assert req.engine_prompt == tuple(messages)


def test_generate_with_tokens():
    req = parse({"type": "generate", "id": "t", "tokens": [1, 15043, 0, 2**31 - 1]})
    assert req.tokens == (1, 15043, 0, 2**31 - 1)
    assert req.engine_prompt == req.tokens


def test_single_stop_string_becomes_a_tuple():
    assert parse(gen(stop="###")).params.stop == ("###",)


def test_nil_fields_count_as_absent():
    req = parse(gen(temperature=None, max_tokens=None, stop=None, stream=None, priority=None,
                    tokens=None, messages=None))
    assert req == parse(gen())


def test_priority_defaults_to_the_connection_default():
    assert parse(gen(), default_priority=Priority.BACKGROUND).priority is Priority.BACKGROUND
    assert parse(gen(), default_priority="background").priority is Priority.BACKGROUND
    assert parse(gen(priority="interactive"),
                 default_priority=Priority.BACKGROUND).priority is Priority.INTERACTIVE


def test_bad_default_priority_is_the_servers_error_not_the_clients():
    with pytest.raises(errors.InvalidRequestError):
        parse(gen(), default_priority="urgent")


def test_default_max_tokens_is_capped():
    assert parse(gen(), RequestLimits(max_tokens=100)).params.max_tokens == 100
    assert parse(gen(), RequestLimits(default_max_tokens=64)).params.max_tokens == 64


def test_cancel_priority_metrics_health():
    assert parse({"type": "cancel", "id": "r1"}) == CancelRequest("r1")
    assert parse({"type": "priority", "id": "r1", "priority": "background"}) == \
        PriorityRequest("r1", Priority.BACKGROUND)
    assert parse({"type": "metrics"}) == MetricsRequest()
    assert parse({"type": "metrics", "id": "m"}) == MetricsRequest("m")
    assert parse({"type": "scorecard"}) == p.ScorecardRequest()
    assert parse({"type": "scorecard", "id": "s"}) == p.ScorecardRequest("s")
    assert parse({"type": "health"}) == HealthRequest()
    assert parse({"type": "health", "id": "h"}) == HealthRequest("h")
    assert parse({"type": "configure", "priority": "background"}) == \
        ConfigureRequest(Priority.BACKGROUND)
    assert parse({"type": "configure", "app": "editor"}) == ConfigureRequest(app="editor")
    req = parse({"type": "generate", "id": "g", "prompt": "p", "app": "agent-7", "weight": 2})
    assert (req.app, req.weight) == ("agent-7", 2.0)


def test_generate_with_tools_and_a_conversation_around_a_call():
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    history = [{"role": "user", "content": "Oslo?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "20 degrees"}]
    req = parse({"type": "generate", "id": "g", "messages": history, "tools": [weather],
                 "tool_choice": "auto"})
    assert req.tools == (weather,) and req.tool_choice == "auto"
    assert req.messages[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert not req.quick_to_submit  # templating tools is left to a worker
    err = rejected({"type": "generate", "id": "g", "prompt": "p", "tools": [weather]})
    assert "go with messages" in err.message
    err = rejected({"type": "generate", "id": "g", "messages": history,
                    "tools": [{"type": "function"}]})
    assert err.code == p.E_PROTO_003 and "tools[0].function" in err.message
    err = rejected({"type": "generate", "id": "g", "messages": history, "tools": [weather],
                    "tool_choice": {"type": "function", "function": {"name": "other"}}})
    assert err.code == p.E_PROTO_003 and "not among the tools" in err.message


def test_generate_with_a_constraint():
    fmt = {"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}}
    req = parse({"type": "generate", "id": "g", "prompt": "p", "response_format": fmt})
    assert req.response_format == fmt and req.grammar is None and not req.quick_to_submit
    req = parse({"type": "generate", "id": "g", "prompt": "p", "grammar": 'root ::= "a"'})
    assert req.grammar == 'root ::= "a"'
    for bad, words in [({"response_format": {"type": "xml"}}, "response_format.type"),
                       ({"grammar": 5}, "non-empty GBNF"),
                       ({"grammar": "x" * 1001}, "grammar is 1001 bytes")]:
        err = rejected({"type": "generate", "id": "g", "prompt": "p", **bad})
        assert words in err.message, err.message


def test_tokenize_and_detokenize():
    req = parse({"type": "tokenize", "id": "t", "text": "hi", "parse_special": True})
    assert req == p.TokenizeRequest("t", "hi", add_special=True, parse_special=True)
    assert parse({"type": "detokenize", "id": "d", "tokens": [1, 2]}) == \
        p.DetokenizeRequest("d", (1, 2))
    for bad, words in [({"type": "tokenize", "id": "t"}, "text must be a string"),
                       ({"type": "tokenize", "id": "t", "text": "x", "add_special": 1},
                        "add_special must be a boolean"),
                       ({"type": "tokenize", "id": "t", "text": "x" * 1001}, "1001 bytes"),
                       ({"type": "detokenize", "id": "d", "tokens": [-1]}, "tokens[0]"),
                       ({"type": "tokenize", "text": "x"}, "missing field 'id'")]:
        assert words in rejected(bad).message
    assert p.tokens_event("t", [1]) == {"event": "tokens", "id": "t", "tokens": [1]}
    assert p.text_event("d", "x") == {"event": "text", "id": "d", "text": "x"}


def test_parses_what_came_over_the_wire():
    msg = gen(temperature=0.5, stop=["x"], tokens=None)
    [decoded] = FrameDecoder().feed(encode(msg))
    assert parse(decoded) == parse(msg)


# --- schema errors -------------------------------------------------------------------------


def test_unknown_field_is_named_with_a_suggestion():
    err = rejected(gen(max_token=5))
    assert err.code == p.E_PROTO_003
    assert "'max_token'" in err.message and "did you mean 'max_tokens'" in err.message
    assert err.request_id == "r1"


@pytest.mark.parametrize("msg", [
    {"type": "cancel", "id": "x", "prompt": "hi"},
    {"type": "metrics", "verbose": True},
    {"type": "health", "id": "h", "extra": 1},
    {"type": "priority", "id": "x", "priority": "background", "stream": True},
    {"type": "configure", "priority": "background", "id": "x"},
])
def test_unknown_fields_rejected_for_every_type(msg):
    err = rejected(msg)
    assert err.code == p.E_PROTO_003 and "unknown field" in err.message


@pytest.mark.parametrize("msg, words", [
    ({"id": "x"}, "missing field 'type'"),
    ({"type": "generat", "id": "x"}, "unknown request type 'generat'"),
    ({"type": 3, "id": "x"}, "unknown request type 3"),
    ({"type": ["generate"], "id": "x"}, "unknown request type a list"),
    ({"type": "cancel"}, "missing field 'id'"),
    ({"type": "priority", "id": "x"}, "missing field 'priority'"),
    ({"type": "priority", "id": "x", "priority": "urgent"}, "priority"),
    ({"type": "priority", "id": "x", "priority": 1}, "priority"),
    ({"type": "configure"}, "a configure request needs priority, app or both"),
    ({"type": "configure", "app": "has space"}, "app must be 1-64 characters"),
    ({"type": "generate", "id": "x", "prompt": "p", "app": 7}, "app must be a string"),
    ({"type": "generate", "id": "x", "prompt": "p", "weight": 0}, "weight must be in (0, 1000]"),
    ({"type": "configure", "priority": "urgent"}, "priority must be 'interactive' or"),
    ({"type": "generate", "id": "x"}, "exactly one of prompt, messages and tokens"),
    (gen(tokens=[1]), "got prompt and tokens"),
])
def test_schema_errors(msg, words):
    err = rejected(msg)
    assert err.code == p.E_PROTO_003
    assert words in err.message


@pytest.mark.parametrize("request_id", [5, True, 1.5, ["a"], b"bytes", "", "x" * 129])
def test_ids_are_strings_of_1_to_128_characters(request_id):
    err = rejected(gen(id=request_id))
    assert err.code == p.E_PROTO_003 and "id" in err.message
    assert err.request_id is None  # not a readable id, so not echoed
    err = rejected({"type": "metrics", "id": request_id})
    assert err.code == p.E_PROTO_003 and "id" in err.message


def test_longest_id_accepted():
    assert parse(gen(id="x" * 128)).id == "x" * 128


BAD_FIELDS = [
    # (field, value); each must be rejected with a message naming the field
    ("temperature", "hot"), ("temperature", True), ("temperature", math.nan),
    ("temperature", math.inf), ("temperature", -1.0), ("temperature", [1.0]),
    ("top_p", 0.0), ("top_p", "0.9"), ("min_p", 2.0), ("min_p", -0.1),
    ("top_k", 1.5), ("top_k", True), ("top_k", -1), ("top_k", 2**40),
    ("repeat_penalty", 0), ("frequency_penalty", 3.0), ("presence_penalty", "x"),
    ("penalty_last_n", 2**21), ("penalty_last_n", False),
    ("seed", -1), ("seed", 2**64), ("seed", 1.0),
    ("max_tokens", True), ("max_tokens", "5"), ("max_tokens", 0), ("max_tokens", -3),
    ("max_tokens", 5.0),
    ("stream", 1), ("stream", "true"), ("logprobs", 1), ("ignore_eos", "yes"),
    ("priority", "urgent"), ("priority", 1), ("priority", ["background"]),
    ("stop", 5), ("stop", [1]), ("stop", [""]), ("stop", ""), ("stop", {"a": 1}),
    ("stop", ["x"] * 17), ("stop", ["x" * 257]),
    # Finite as 64-bit floats, but past what the native sampler's 32-bit floats hold (1e308
    # once reached the sampler as inf and failed every request in flight).
    ("temperature", 1e308), ("temperature", 3.5e38), ("temperature", 2**64),
    ("temperature", 10**400), ("repeat_penalty", 1e308), ("repeat_penalty", 5e-324),
    ("repeat_penalty", -0.0), ("frequency_penalty", 1e308), ("presence_penalty", -1e308),
    ("min_p", 1e308), ("top_p", 1e308), ("top_p", -0.0), ("top_k", 2**63),
    ("penalty_last_n", 2**63), ("seed", 2**65),
]

EDGE_BUT_VALID = [
    ("temperature", -0.0), ("temperature", 5e-324), ("temperature", 1e-300),
    ("min_p", 5e-324), ("top_p", 5e-324), ("seed", 2**64 - 1), ("seed", 2**63),
    ("frequency_penalty", -2), ("top_k", 2**31 - 1),
]


@pytest.mark.parametrize("field, value", EDGE_BUT_VALID)
def test_edge_values_inside_the_ranges_are_accepted(field, value):
    assert getattr(parse(gen(**{field: value})).params, field) == value


@pytest.mark.parametrize("field, value", BAD_FIELDS)
def test_bad_values_are_schema_errors_naming_the_field(field, value):
    err = rejected(gen(**{field: value}))
    assert err.code == p.E_PROTO_003, err.message
    assert field in err.message
    assert err.request_id == "r1"


@pytest.mark.parametrize("field, value, name", [
    ("prompt", ["a"], "prompt"), ("prompt", b"hi", "prompt"), ("prompt", 7, "prompt"),
    ("messages", "hi", "messages"), ("messages", {"role": "user"}, "messages"),
    ("messages", ["hi"], "messages[0]"),
    ("messages", [{"role": "user"}], "messages[0].content"),
    ("messages", [{"content": "x"}], "messages[0].role"),
    ("messages", [{"role": "user", "content": 1}], "messages[0].content"),
    ("messages", [{"role": "user", "content": "x"}, {"role": 2, "content": "y"}],
     "messages[1].role"),
    ("messages", [{"role": "user", "content": "x", "color": "red"}], "'color' in messages[0]"),
    ("messages", [{"role": "assistant", "content": None}], "messages[0].content"),
    ("tokens", "abc", "tokens"), ("tokens", [1, "2"], "tokens[1]"), ("tokens", [True], "tokens[0]"),
    ("tokens", [1, 2.0], "tokens[1]"), ("tokens", [-1], "tokens[0]"),
    ("tokens", [5, 2**31], "tokens[1]"), ("tokens", [[1]], "tokens[0]"),
])
def test_bad_prompts_are_schema_errors_naming_the_field(field, value, name):
    err = rejected({"type": "generate", "id": "r1", field: value})
    assert err.code == p.E_PROTO_003, err.message
    assert name in err.message
    assert err.request_id == "r1"


def test_long_unknown_field_name_is_shortened():
    err = rejected(gen(**{"k" * 1000: 1}))
    assert len(err.message) < 200


# --- limits ------------------------------------------------------------------------------------


def test_prompt_bytes_are_utf8_bytes():
    assert parse(gen(prompt="é" * 500)).prompt  # 1000 bytes: at the limit
    err = rejected(gen(prompt="é" * 501))
    assert err.code == p.E_LIMIT_001 and "1002 bytes" in err.message
    assert err.request_id == "r1"


def test_message_bytes_add_up_roles_included():
    ok = [{"role": "user", "content": "x" * 496}] * 2  # 2 * (4 + 496) = 1000
    assert parse({"type": "generate", "id": "c", "messages": ok}).messages
    err = rejected({"type": "generate", "id": "c",
                    "messages": [{"role": "u" * 600, "content": "x" * 401}]})
    assert err.code == p.E_LIMIT_001 and "messages" in err.message


def test_token_count_limit():
    assert parse({"type": "generate", "id": "t", "tokens": [1] * 100}).tokens
    err = rejected({"type": "generate", "id": "t", "tokens": [1] * 101})
    assert err.code == p.E_LIMIT_001 and "tokens" in err.message


# Token ids reach a C int on every path: generate's tokens were checked, embed's and (over
# HTTP) detokenize's were not, and 2**31 answered E_RUNTIME_001 "Python integer 2147483648 out
# of bounds for int32", 2**64 "Python int too large to convert to C long".
@pytest.mark.parametrize("token", [2**31, 2**40, 2**63 - 1, 2**64 - 1, -1, -(2**63)])
@pytest.mark.parametrize(("msg", "field"), [
    ({"type": "generate", "id": "t", "tokens": [1, "T"]}, "tokens[1]"),
    ({"type": "detokenize", "id": "t", "tokens": [1, "T"]}, "tokens[1]"),
    ({"type": "embed", "id": "t", "input": [1, "T"]}, "input[1]"),
    ({"type": "embed", "id": "t", "input": [[1, "T"]]}, "input[0][1]"),
    ({"type": "embed", "id": "t", "input": ["text", [1, "T"]]}, "input[1][1]"),
])
def test_token_ids_out_of_a_c_int_are_schema_errors_on_every_path(msg, field, token):
    msg = {k: v if type(v) is not list else [
        [token if t == "T" else t for t in x] if type(x) is list else
        (token if x == "T" else x) for x in v] for k, v in msg.items()}
    err = rejected(msg)
    assert err.code == p.E_PROTO_003 and err.request_id == "t"
    assert err.message.startswith(f"{field} must be a token id, in [0, 2147483647], not ")
    assert len(err.message) < 100


def test_embed_inputs_are_checked_as_prompts_are():
    req = parse({"type": "embed", "id": "e", "input": ["a", [1, 2]], "normalize": False})
    assert req == p.EmbedRequest("e", ("a", [1, 2]), normalize=False)
    assert rejected({"type": "embed", "id": "e", "input": [1] * 101}).code == p.E_LIMIT_001
    err = rejected({"type": "embed", "id": "e", "input": ["a", "x" * 1001]})
    assert err.code == p.E_LIMIT_001 and err.message.startswith("input[1] is 1001 bytes")


# Python's names for types ("not NoneType", "not bytes") and whole echoes of what was sent
# (a 100 KB name) were in messages.
@pytest.mark.parametrize(("msg", "words"), [
    (gen(prompt=5), "prompt must be a string, not an integer"),
    (gen(prompt=b"hi"), "prompt must be a string, not binary data"),
    (gen(prompt=None, messages=[None]), "messages[0] must be a map, not null"),
    (gen(prompt=None, messages={"role": "user"}), "not a map"),
    (gen(stream=[]), "stream must be a boolean, not a list"),
    (gen(temperature="hot"), "temperature must be a number, not a string"),
    (gen(top_k=1.5), "top_k must be an integer, not a number"),
    (gen(app=False), "app must be a string, not a boolean"),
    ({"type": "detokenize", "id": "d", "tokens": {}}, "tokens must be a list of integers, "
                                                      "not a map"),
])
def test_messages_name_kinds_in_the_wires_words(msg, words):
    message = rejected(msg).message
    assert words in message
    assert not re.search(r"\bnot (NoneType|bytes|dict|list|str|int|float|bool)\b", message)


@pytest.mark.parametrize("msg", [
    {"type": "x" * 100_000, "id": "i"},
    gen(**{"y" * 100_000: 1}),
    gen(app="a" * 100_000),
    gen(priority="p" * 100_000),
    gen(prompt=None, tokens=[1] * 50 + [10**19]),
    gen(seed=2**64 + 5),
    gen(max_tokens=10**30),
    gen(temperature=10**30),
    gen(logit_bias={"9" * 5000: 1}),
    gen(prompt=None, messages=[{"role": "user", "content": "x"}], tools=[
        {"type": "function", "function": {"name": "n" * 100_000}}]),
])
def test_echoed_values_are_cut_short(msg):
    err = rejected(msg)
    assert err.code in (p.E_PROTO_003, p.E_LIMIT_002) and len(err.message) < 250, err.message


def test_unexpected_exceptions_reach_clients_as_internal_errors_in_our_words():
    bug = OverflowError("Python int too large to convert to C long")
    assert p.error_event_for("r", bug) == {
        "event": "error", "id": "r", "code": p.E_RUNTIME_001,
        "message": "internal error (the server's log has the details)"}
    ours = errors.InvalidTokenError("token id 99999 is outside the vocabulary [0, 32000)")
    assert p.error_event_for("r", ours)["message"] == str(ours)
    assert p.error_event_for(None, ours)["code"] == p.E_PROTO_003


def test_max_tokens_above_the_cap_is_an_error_not_clamped():
    assert parse(gen(max_tokens=512)).params.max_tokens == 512
    err = rejected(gen(max_tokens=513))
    assert err.code == p.E_LIMIT_002 and "max_tokens" in err.message and "512" in err.message
    assert err.request_id == "r1"


@pytest.mark.parametrize("field", ["max_prompt_bytes", "max_prompt_tokens", "max_tokens",
                                   "default_max_tokens"])
@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_request_limits_validate(field, value):
    with pytest.raises(ValueError, match=field):
        RequestLimits(**{field: value})


# --- robustness --------------------------------------------------------------------------------

wire_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=10) | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8,
)
field_names = st.sampled_from(sorted(p._FIELDS["generate"]) + ["role", "content", "x"])


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([*p._FIELDS, "bogus"]),
       st.dictionaries(field_names, wire_values, max_size=6))
def test_any_message_parses_or_raises_protocol_error(kind, fields):
    try:
        parse({**fields, "type": kind})
    except ProtocolError as exc:
        assert exc.code in (p.E_PROTO_003, p.E_LIMIT_001, p.E_LIMIT_002)


def test_non_map_request_is_a_payload_error():
    with pytest.raises(ProtocolError) as info:
        parse_request([1], LIMITS)  # type: ignore[arg-type]
    assert info.value.code == p.E_PROTO_001


# --- error codes -------------------------------------------------------------------------------


@pytest.mark.parametrize("exc, code", [
    (errors.InvalidRequestError("bad"), p.E_PROTO_003),
    (errors.InvalidTokenError("bad token"), p.E_PROTO_003),
    (errors.ContextOverflowError("long"), p.E_LIMIT_001),
    (errors.BatchFullError("full"), p.E_BUSY_001),
    (errors.EngineBusyError("busy"), p.E_BUSY_001),
    (errors.ClosedError("closed"), p.E_BUSY_001),
    (errors.ModelLoadError("load"), p.E_MODEL_001),
    (errors.ModelNotFoundError("missing"), p.E_MODEL_001),
    (errors.InvalidModelError("not gguf"), p.E_MODEL_001),
    (errors.DecodeError("decode", -3), p.E_RUNTIME_001),
    (errors.NoKVSlotError("kv", 1), p.E_RUNTIME_001),
    (errors.DecodeAbortedError("abort", 2), p.E_RUNTIME_001),
    (errors.InvalidBatchError("batch", -1), p.E_RUNTIME_001),
    (errors.LogitsInUseError("view"), p.E_RUNTIME_001),
    (errors.UmaError("?"), p.E_RUNTIME_001),
    (RuntimeError("bug"), p.E_RUNTIME_001),
    (ProtocolError(p.E_LIMIT_004, "too many"), p.E_LIMIT_004),
])
def test_error_code_for(exc, code):
    assert p.error_code_for(exc) == code


def test_codes_are_their_own_names():
    codes = {name: value for name, value in vars(p).items() if name.startswith("E_")}
    assert len(codes) == 13
    assert all(name == value for name, value in codes.items())


# --- events ------------------------------------------------------------------------------------

EVENTS = [
    p.token_event("r1", "Hel", [15043]),
    p.token_event("r1", "", (1, 2), logprobs=[-0.1, -2.5]),
    p.eos_event("r1", "length", {"prompt_tokens": 3, "completion_tokens": 8},
                {"ttft_ms": 12.5, "total_ms": 80.0}),
    p.eos_event("r1", "stop", {"prompt_tokens": 3, "completion_tokens": 2}, {}, text="Hi"),
    p.error_event("r1", p.E_LIMIT_002, "max_tokens is too high"),
    p.error_event(None, p.E_PROTO_002, "frame too large"),
    p.metrics_event(None, {"requests_submitted_total": 3, "ttft_ms": {"p50": 12.0}}),
    p.health_event("h", {"status": "ok", "model": "tiny.gguf"}),
    p.scorecard_event("s", {"model": "tiny.gguf", "p95_ms": None, "cap_held": True}),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e["event"])
def test_events_survive_the_wire_and_parse(event):
    [decoded] = FrameDecoder().feed(encode(event))
    assert parse_event(decoded) is decoded
    assert decoded["event"] in p.EVENTS


def test_event_shapes():
    assert p.token_event("a", "x", [1]) == {"event": "token", "id": "a", "text": "x",
                                             "token_ids": [1]}
    assert "logprobs" in p.token_event("a", "x", [1], [-1.0])
    assert "text" not in p.eos_event("a", "stop", {}, {})
    call = ToolCall("get_weather", '{"city": "Oslo"}', "call_1")
    eos = p.eos_event("a", "tool_calls", {}, {}, None, [call], "Checking.")
    assert eos["tool_calls"] == [{"id": "call_1", "name": "get_weather",
                                  "arguments": '{"city": "Oslo"}'}]
    assert eos["content"] == "Checking." and "tool_calls" not in p.eos_event("a", "stop", {}, {})
    assert p.eos_event("a", "stop", {}, {}, text="")["text"] == ""
    assert p.error_event(None, "E", "m") == {"event": "error", "id": None, "code": "E",
                                             "message": "m"}


@pytest.mark.parametrize("msg, words", [
    ({"id": "a"}, "missing field 'event'"),
    ({"event": "tokenz", "id": "a"}, "unknown event 'tokenz'"),
    ({"event": ["token"], "id": "a"}, "unknown event a list"),
    ({"event": "token", "id": "a", "text": "x"}, "'token_ids'"),
    ({"event": "error", "code": "E", "message": "m"}, "'id'"),
    ({"event": "eos", "id": "a", "reason": "stop", "usage": {}}, "'timings'"),
])
def test_parse_event_rejects(msg, words):
    with pytest.raises(ProtocolError) as info:
        parse_event(msg)
    assert info.value.code == p.E_PROTO_003
    assert words in info.value.message
    if isinstance(msg.get("id"), str):
        assert info.value.request_id == msg["id"]


def test_parse_event_rejects_non_maps():
    with pytest.raises(ProtocolError) as info:
        parse_event("token")  # type: ignore[arg-type]
    assert info.value.code == p.E_PROTO_001
