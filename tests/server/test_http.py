"""The OpenAI-compatible HTTP gateway, in-process on a tiny synthetic model, driven by the official
`openai` package, httpx and curl; and beside the socket in a `uma run --http` subprocess."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import httpx
import jsonschema
import numpy as np
import openai
import pytest

from uma import Engine, testing
from uma import tools as uma_tools
from uma.client import Client
from uma.config import ServerConfig
from uma.errors import InvalidRequestError
from uma.server import settings
from uma.server.http import HttpGateway
from uma.tools import ToolCall

from ..helpers import PYTHON_TEXT, assert_same_greedy

KEY = "test-key-123"
ENDLESS = 60000  # max_tokens of requests that are meant to be cut short
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12}}}}}
PROMPT = "Once upon a time"
CHAT = [{"role": "user", "content": "Say something"}]


# One compute thread: on a busy machine, ggml's threads wait for each other at every barrier
# and a tiny model's decode slows a hundredfold; the tests measure behaviour, not speed.
THREADS = 1


@pytest.fixture(scope="module")
def engine(tiny_path):
    # ChatML: a template that takes tool calls and results in a conversation (the tiny
    # model's own, Llama 2's, allows only alternating user and assistant turns)
    with Engine(tiny_path, n_ctx=65536, n_seq_max=4, n_threads=THREADS,
                chat_template="chatml") as e:
        yield e


@pytest.fixture(scope="module")
def gateway(engine):
    config = ServerConfig(socket="/tmp/unused.sock", http="127.0.0.1:0", api_key=KEY,
                          max_tokens=ENDLESS, max_prompt_bytes=1 << 16)
    gw = HttpGateway(engine, config)
    gw.start()
    yield gw
    gw.stop()


@pytest.fixture
def http(gateway):
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=30) as c:
        yield c


@pytest.fixture
def oai(gateway):
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0,
                       timeout=30) as c:
        yield c


@pytest.fixture
def model_id(tiny_path):
    return tiny_path.stem


def capture_handles(monkeypatch, engine) -> list:
    """Records the handles of the requests the gateway submits."""
    handles = []
    submit = engine.submit

    def recording_submit(*args, **kwargs):
        handles.append(submit(*args, **kwargs))
        return handles[-1]

    monkeypatch.setattr(engine, "submit", recording_submit)
    return handles


# --- the official client -------------------------------------------------------------------


def test_openai_client_completes_both_endpoints(engine, oai, model_id):
    expected = engine.generate(PROMPT, max_tokens=8, ignore_eos=True)
    r = oai.completions.create(model=model_id, prompt=PROMPT, max_tokens=8,
                               extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.model == model_id
    assert r.choices[0].text == expected.text and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        expected.usage.prompt_tokens, 8, expected.usage.prompt_tokens + 8)

    expected = engine.chat(CHAT, max_tokens=8, ignore_eos=True)
    r = oai.chat.completions.create(model=model_id, messages=CHAT, max_tokens=8,
                                    extra_body={"ignore_eos": True})
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == expected.text
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8


def test_openai_client_streams_both_endpoints_with_usage(engine, oai, model_id):
    expected = engine.generate(PROMPT, max_tokens=10, ignore_eos=True)
    chunks = list(oai.completions.create(
        model=model_id, prompt=PROMPT, max_tokens=10, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert len(chunks) > 3  # token by token, not one lump
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10

    expected = engine.chat(CHAT, max_tokens=10, ignore_eos=True)
    chunks = list(oai.chat.completions.create(
        model=model_id, messages=CHAT, max_tokens=10, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    assert chunks[-1].usage.prompt_tokens == expected.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == 10


def test_without_include_usage_a_stream_has_no_usage_chunk(oai, model_id):
    chunks = list(oai.completions.create(model=model_id, prompt=PROMPT, max_tokens=4,
                                         stream=True, extra_body={"ignore_eos": True}))
    assert all(c.choices and c.usage is None for c in chunks)


def test_logprobs_are_those_of_the_sampled_tokens(engine, oai, model, model_id):
    expected = engine.generate(PROMPT, max_tokens=6, ignore_eos=True, logprobs=True)
    r = oai.completions.create(model=model_id, prompt=PROMPT, max_tokens=6, logprobs=0,
                               extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    pieces = [model.token_to_piece(t).decode("utf-8", "replace") for t in expected.token_ids]
    assert lp.tokens == pieces and lp.top_logprobs is None
    assert lp.token_logprobs == pytest.approx(expected.logprobs, abs=1e-5)
    assert lp.text_offset[0] == 0 and lp.text_offset[-1] == len("".join(pieces[:-1]))

    expected = engine.chat(CHAT, max_tokens=6, ignore_eos=True, logprobs=True)
    r = oai.chat.completions.create(model=model_id, messages=CHAT, max_tokens=6, logprobs=True,
                                    extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx(expected.logprobs, abs=1e-5)
    assert [bytes(c.bytes) for c in content] == [model.token_to_piece(t)
                                                for t in expected.token_ids]


def test_return_tokens_gives_the_token_ids_of_the_answer(engine, oai, http, model_id):
    expected = list(engine.generate(PROMPT, max_tokens=6, ignore_eos=True).token_ids)
    body = {"ignore_eos": True, "return_tokens": True}
    r = oai.completions.create(model=model_id, prompt=PROMPT, max_tokens=6, extra_body=body)
    assert r.choices[0].model_extra["tokens"] == expected
    chunks = list(oai.completions.create(model=model_id, prompt=PROMPT, max_tokens=6,
                                         stream=True, extra_body=body))
    assert [t for c in chunks for t in c.choices[0].model_extra["tokens"]] == expected
    plain = oai.completions.create(model=model_id, prompt=PROMPT, max_tokens=2,
                                   extra_body={"ignore_eos": True})
    assert "tokens" not in (plain.choices[0].model_extra or {})
    bad = http.post("/v1/completions", json={"prompt": PROMPT, "return_tokens": "yes"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "return_tokens"


def test_top_logprobs_through_the_openai_client(engine, oai, model, model_id):
    expected = engine.chat(CHAT, max_tokens=5, ignore_eos=True, top_logprobs=4)
    r = oai.chat.completions.create(model=model_id, messages=CHAT, max_tokens=5, logprobs=True,
                                    top_logprobs=4, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    for entry, token, top in zip(content, expected.token_ids, expected.top_logprobs,
                                 strict=True):
        assert [bytes(t.bytes) for t in entry.top_logprobs] == [
            model.token_to_piece(t) for t, _ in top]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx([x for _, x in top],
                                                                        abs=1e-5)
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)  # greedy
        assert bytes(entry.bytes) == model.token_to_piece(token)

    chunks = list(oai.chat.completions.create(
        model=model_id, messages=CHAT, max_tokens=5, logprobs=True, top_logprobs=4,
        stream=True, extra_body={"ignore_eos": True}))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [t.logprob for e in streamed for t in e.top_logprobs] == pytest.approx(
        [t.logprob for e in content for t in e.top_logprobs], abs=1e-5)
    assert len(streamed) == 5

    r = oai.completions.create(model=model_id, prompt=PROMPT, max_tokens=4, logprobs=3,
                               extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.top_logprobs) == 4
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 1 <= len(top) <= 3 and top[token] == pytest.approx(value, abs=1e-5)


@pytest.mark.parametrize(("endpoint", "body", "words"), [
    ("chat", {"top_logprobs": 3}, "needs logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "in [0, 20]"),
    ("chat", {"logprobs": True, "top_logprobs": "3"}, "must be an integer"),
    ("completions", {"logprobs": 21}, "in [0, 20]"),
])
def test_bad_top_logprobs_are_named(http, endpoint, body, words):
    base = {"messages": CHAT} if endpoint == "chat" else {"prompt": PROMPT}
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    r = http.post(path, json={**base, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert words in error["message"] and error["param"] in ("top_logprobs", "logprobs")


def test_penalties_and_common_extra_fields_pass_through(engine, http, model_id):
    opts = {"max_tokens": 12, "ignore_eos": True, "frequency_penalty": 1.5,
            "presence_penalty": 1.0, "temperature": 0.8, "top_p": 0.9, "seed": 7}
    expected = engine.generate(PROMPT, **opts)
    r = http.post("/v1/completions", json={
        "model": model_id, "prompt": PROMPT, **opts, "user": "someone", "n": 1,
        "logit_bias": {}, "metadata": {"app": "x"}, "store": False, "best_of": 1})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == expected.text


# What editor assistants and chat front ends send for a chat turn
# (docs/guide/connect-your-tools.md): streamed, with usage asked for, stop lists, content parts,
# empty tool lists and their own extra fields.
TOOL_BODIES = {
    "continue": {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                              {"role": "user", "content": "Explain this code"}],
                 "max_tokens": 64, "temperature": 0.5, "stream": True,
                 "stop": ["<|im_end|>", "\n\n\n"]},
    "zed": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 1.0,
            "tools": [], "max_completion_tokens": 32},
    "aider": {"messages": [{"role": "system", "content": "Act as an expert developer."},
                           {"role": "user", "content": "Fix the bug"}],
              "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
              "max_tokens": 32},
    "open-webui": {"messages": [{"role": "user", "content": "Hello"},
                                {"role": "assistant", "content": "Hi! How can I help?"},
                                {"role": "user", "content": "Tell me a story"}],
                   "stream": True, "max_tokens": 32, "metadata": {"chat_id": "c1"}},
}


@pytest.mark.parametrize("tool", TOOL_BODIES)
def test_what_the_tools_send_is_served(http, model_id, tool):
    with http.stream("POST", "/v1/chat/completions",
                     json={"model": model_id, **TOOL_BODIES[tool]}) as r:
        assert r.status_code == 200, r.read()
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all("error" not in c for c in chunks)
    assert any(c["choices"] and c["choices"][0]["finish_reason"] for c in chunks)


def test_stop_strings_end_the_text(engine, http):
    full = engine.generate(PROMPT, max_tokens=12, ignore_eos=True).text
    stop = full[len(full) // 2:][:3]
    r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12,
                                           "ignore_eos": True, "stop": [stop]})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["text"] == full[:full.index(stop)]


# --- curl --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def curl():
    path = shutil.which("curl")
    if path is None:
        pytest.skip("curl is not installed")
    return path


def curl_args(curl, gateway, body: dict) -> list[str]:
    return [curl, "-N", "-sS", "--max-time", "30", "-H", f"Authorization: Bearer {KEY}",
            "-H", "Content-Type: application/json", "-d", json.dumps(body),
            f"{gateway.url}/v1/completions"]


def test_curl_streams(engine, gateway, curl):
    expected = engine.generate(PROMPT, max_tokens=8, ignore_eos=True)
    out = subprocess.run(curl_args(curl, gateway, {
        "prompt": PROMPT, "max_tokens": 8, "ignore_eos": True, "stream": True}),
        capture_output=True, text=True, timeout=60, check=True).stdout
    events = [line for line in out.split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected.text


def test_curl_n_shows_tokens_while_the_request_runs(engine, gateway, curl, monkeypatch):
    handles = capture_handles(monkeypatch, engine)
    proc = subprocess.Popen(curl_args(curl, gateway, {
        "prompt": PROMPT, "max_tokens": ENDLESS, "ignore_eos": True, "stream": True}),
        stdout=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()  # curl's --max-time bounds this read
        assert first.startswith("data: {")
        assert not handles[0].done  # the first token arrived long before the last
    finally:
        proc.terminate()
        proc.wait(30)
    assert handles[0].result(timeout=30).finish_reason == "cancelled"


# --- bad requests ------------------------------------------------------------------------------

BAD = [
    # (body or raw bytes, status, param, code, words in the message)
    (b'{"prompt": "x",', 400, None, None, "not valid JSON"),
    (b"\xff\xfe{}", 400, None, None, "not valid UTF-8"),
    ([1, 2], 400, None, None, "JSON object"),
    ({"max_tokens": 4}, 400, "prompt", None, "prompt is required"),
    ({"prompt": 5}, 400, "prompt", None, "prompt must be"),
    ({"prompt": ["a", "b"]}, 400, "prompt", None, "one prompt per request"),
    ({"prompt": "x", "max_tokens": "5"}, 400, "max_tokens", None, "integer"),
    ({"prompt": "x", "max_tokens": -1}, 400, "max_tokens", None, ">= 1"),
    ({"prompt": "x", "max_tokens": ENDLESS + 1}, 400, "max_tokens", None, "at most"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "model", "model_not_found", "'gpt-4' not found"),
    ({"prompt": "x", "n": 2}, 400, "n", None, "n must be 1"),
    ({"prompt": "x", "temperature": -1}, 400, "temperature", None, "temperature"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature", None, "number"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p", None, "top_p"),
    ({"prompt": "x", "seed": -3}, 400, "seed", None, "seed"),
    ({"prompt": "x", "stop": 3}, 400, "stop", None, "stop"),
    ({"prompt": "x", "stream": "yes"}, 400, "stream", None, "boolean"),
    ({"prompt": "x", "logprobs": True}, 400, "logprobs", None, "integer"),
    ({"prompt": "x", "logit_bias": {"five": 1}}, 400, "logit_bias", None, "no token id"),
    ({"prompt": "x", "logit_bias": {"5": 200}}, 400, "logit_bias[5]", None, "must be in"),
    ({"prompt": "x", "echo": True}, 400, "echo", None, "not supported"),
    ({"prompt": "x", "priority": "urgent"}, 400, "priority", None, "interactive"),
    ({"prompt": "x" * 70000}, 400, "prompt", "context_length_exceeded", "bytes"),
]


@pytest.mark.parametrize(("body", "status", "param", "code", "words"), BAD)
def test_bad_completions_get_openai_errors(http, body, status, param, code, words):
    if isinstance(body, bytes):
        r = http.post("/v1/completions", content=body)
    else:
        r = http.post("/v1/completions", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and words in error["message"]
    assert (error["param"], error["code"]) == (param, code)
    assert_still_serving(http)


BAD_CHAT = [
    ({}, "messages", "messages is required"),
    ({"messages": "hi"}, "messages", "messages must be a list"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "content must be a string"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content", "only text"),
    ({"messages": CHAT, "tools": [{"type": "function"}]}, "tools", "tools[0].function"),
    ({"messages": CHAT, "tools": [WEATHER], "tool_choice": "always"}, "tool_choice",
     "tool_choice must be"),
    ({"messages": CHAT, "response_format": {"type": "xml"}}, "response_format",
     "response_format.type must be"),
    ({"messages": CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "schema": {"type": "object", "dependentSchemas": {"a": {}}}}}}, None,
     "Unimplemented keys: [\"dependentSchemas\"]"),
    ({"messages": CHAT, "grammar": "root ::= foo"}, None, "Rule 'foo' not found"),
    ({"messages": CHAT, "logprobs": 1}, "logprobs", "boolean"),
    ({"messages": CHAT, "stream_options": {"include_usage": 1}},
     "stream_options.include_usage", "boolean"),
]


@pytest.mark.parametrize(("body", "param", "words"), BAD_CHAT)
def test_bad_chats_get_openai_errors(http, body, param, words):
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"]
    assert_still_serving(http)


def test_a_tools_request_is_answered_and_a_call_round_trips(oai, model_id):
    # random weights write no call: the answer is text, finish_reason 'stop' or 'length'
    r = oai.chat.completions.create(model=model_id, messages=CHAT, tools=[WEATHER],
                                    max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length") and not r.choices[0].message.tool_calls
    # the assistant's call and the tool's result go back in the next turn
    history = [*CHAT, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "20 degrees"}]
    r = oai.chat.completions.create(model=model_id, messages=history, tools=[WEATHER],
                                    max_tokens=2)
    assert r.choices[0].message.content is not None and r.usage.completion_tokens == 2


@pytest.fixture
def calls_found(monkeypatch):
    """The output stage finds one call in any answer: the API's shape of a call, whatever
    a random model writes (the formats' parsing: tests/test_tools.py)."""
    call = ToolCall("get_weather", '{"city": "Oslo"}', "call_abc")
    monkeypatch.setattr(uma_tools, "parse", lambda text, fmt: ("", [call]))
    return call


def test_a_call_is_answered_as_openai_tool_calls(oai, model_id, calls_found):
    r = oai.chat.completions.create(model=model_id, messages=CHAT, tools=[WEATHER],
                                    max_tokens=2, extra_body={"ignore_eos": True})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert (call.id, call.type, call.function.name, json.loads(call.function.arguments)) == (
        "call_abc", "function", "get_weather", {"city": "Oslo"})


def test_a_streamed_call_arrives_as_tool_call_deltas(oai, model_id, calls_found):
    stream = oai.chat.completions.create(model=model_id, messages=CHAT, tools=[WEATHER],
                                         max_tokens=2, stream=True,
                                         extra_body={"ignore_eos": True})
    chunks = list(stream)
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices[0].delta.tool_calls]
    assert [(d[0].index, d[0].id, d[0].function.name) for d in deltas] == [
        (0, "call_abc", "get_weather")]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_structured_output_through_the_openai_client(oai, model_id):
    schema = {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1,
                                                             "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "trip", "schema": schema,
                                                  "strict": True}}
    r = oai.chat.completions.create(model=model_id, messages=CHAT, response_format=fmt,
                                    max_tokens=200, temperature=1.0)
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    stream = oai.chat.completions.create(model=model_id, messages=CHAT, response_format=fmt,
                                         max_tokens=200, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), schema)
    # a GBNF grammar, as llama-server takes it, on completions
    r = oai.completions.create(model=model_id, prompt=PROMPT, max_tokens=10,
                               extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert r.choices[0].text in ("yes", "no")


def test_a_required_tool_call_is_answered_as_a_call(oai, model_id):
    r = oai.chat.completions.create(model=model_id, messages=CHAT, tools=[WEATHER],
                                    tool_choice="required", max_tokens=100)
    [call] = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments), dict)


def test_the_async_openai_client_gets_each_feature(gateway, model_id):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    history = [*CHAT, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "20 degrees"}]

    async def ask():
        async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=KEY,
                                      max_retries=0, timeout=30) as client:
            chat = client.chat.completions.create
            return await asyncio.gather(
                chat(model=model_id, messages=CHAT, tools=[WEATHER], tool_choice="required",
                     max_tokens=100),
                chat(model=model_id, messages=history, tools=[WEATHER], max_tokens=2),
                chat(model=model_id, messages=CHAT, response_format=fmt, max_tokens=50,
                     temperature=1.0),
                client.completions.create(model=model_id, prompt=PROMPT, max_tokens=3,
                                          logit_bias={"29871": 100}),
                read(chat(model=model_id, messages=CHAT, max_tokens=4, logprobs=True,
                          top_logprobs=2, stream=True, extra_body={"ignore_eos": True})))

    async def read(stream):
        tops = []
        async for chunk in await stream:
            if chunk.choices and chunk.choices[0].logprobs:
                tops.extend([t.logprob for t in e.top_logprobs]
                            for e in chunk.choices[0].logprobs.content)
        return tops

    called, answered, structured, biased, tops = asyncio.run(asyncio.wait_for(ask(), 60))
    assert called.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert answered.usage.completion_tokens == 2
    jsonschema.validate(json.loads(structured.choices[0].message.content), schema)
    assert biased.usage.completion_tokens == 3
    # beside the other requests, batched: the values themselves may differ in the last digits
    assert len(tops) == 4 and all(len(t) == 2 and t[0] >= t[1] for t in tops)


def test_embeddings_through_the_openai_client(engine, oai, model_id):
    texts = ["Hello world", "🦙 llamas"]
    expected = engine.embed(texts).vectors
    r = oai.embeddings.create(model=model_id, input=texts)
    assert [d.index for d in r.data] == [0, 1] and r.model == model_id
    got = np.array([d.embedding for d in r.data], np.float32)
    assert got.shape == (2, engine.model.n_embd)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(
        len(engine.tokenize(t)) for t in texts)
    # the client asks for base64 by default when it decodes vectors itself (numpy present)
    one = oai.embeddings.create(model=model_id, input=texts[0], encoding_format="base64")
    raw = base64.b64decode(one.data[0].embedding)
    # alone rather than in a batch of two: a GPU's kernels may sum in another order (lavapipe:
    # 2e-4 apart), where another input's vector is ~0.1 away
    np.testing.assert_allclose(np.frombuffer(raw, "<f4"), expected[0], atol=1e-3)
    tokens = oai.embeddings.create(model=model_id, input=[engine.tokenize(texts[1])])
    np.testing.assert_allclose(tokens.data[0].embedding, expected[1], atol=1e-3)


@pytest.mark.parametrize(("body", "param", "words"), [
    ({}, "input", "input is required"),
    ({"input": []}, "input", "non-empty list"),
    ({"input": ["ok", 3]}, "input", "input[1] must be"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", "'float' or 'base64'"),
    ({"input": "x", "dimensions": 3}, "dimensions", "the model's own"),
    ({"input": "word " * 3000}, "input", "embedding_ctx"),
])
def test_bad_embeddings_requests_are_named(http, body, param, words):
    r = http.post("/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"]
    assert_still_serving(http)


def test_tokenize_and_detokenize_as_llama_server_has_them(engine, gateway, http):
    r = http.post("/tokenize", json={"content": "Hello world"})
    tokens = r.json()["tokens"]
    assert tokens == engine.tokenize("Hello world")
    assert http.post("/tokenize", json={"content": "Hello", "add_special": False}
                     ).json()["tokens"] == engine.tokenize("Hello", add_special=False)
    pieces = http.post("/tokenize", json={"content": "Hello", "with_pieces": True}).json()
    assert [p["id"] for p in pieces["tokens"]] == engine.tokenize("Hello")
    r = http.post("/detokenize", json={"tokens": tokens[1:]})
    assert r.json()["content"].strip() == "Hello world"
    for path, body, words in [("/tokenize", {}, "content is required"),
                              ("/tokenize", {"content": 5}, "content must be a string"),
                              ("/detokenize", {"tokens": ["a"]}, "must be an integer"),
                              ("/detokenize", {"tokens": [10**6]}, "10")]:
        r = http.post(path, json=body)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    # the key guards them as it guards /v1
    assert httpx.post(f"{gateway.url}/tokenize", json={"content": "x"}).status_code == 401


def test_logit_bias_as_openai_sends_it(engine, oai, model_id):
    plain = engine.generate(PROMPT, max_tokens=3, ignore_eos=True)
    banned = plain.token_ids[0]
    r = oai.completions.create(model=model_id, prompt=PROMPT, max_tokens=3,
                               logit_bias={str(banned): -100}, extra_body={"ignore_eos": True})
    biased = engine.generate(PROMPT, max_tokens=3, ignore_eos=True, logit_bias={banned: -100})
    assert biased.token_ids[0] != banned and r.choices[0].text == biased.text != plain.text


def test_chat_content_parts_are_joined(engine, http):
    parts = [{"type": "text", "text": "Say"}, {"type": "text", "text": "something"}]
    expected = engine.chat([{"role": "user", "content": "Say\nsomething"}], max_tokens=5,
                           ignore_eos=True)
    r = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": parts, "name": "ann"}], "max_tokens": 5,
        "ignore_eos": True})
    assert r.json()["choices"][0]["message"]["content"] == expected.text


def test_huge_bodies_are_refused_before_they_are_read(gateway, http):
    limit = 2 * (1 << 16) + (64 << 10)
    r = http.post("/v1/completions", content=b" " * (limit + 1))
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunked():  # no Content-Length: the limit still holds while reading
        for _ in range(64):
            yield b" " * (64 << 10)

    r = http.post("/v1/completions", content=chunked())
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert_still_serving(http)


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"},
    {"Authorization": f"Bearer {KEY}x"}, {"Authorization": "Bearer"},
])
def test_every_v1_route_needs_the_key(gateway, http, headers):
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=30) as c:
        for method, path in [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                             ("GET", "/v1/models"), ("GET", "/v1/nothing-here")]:
            r = c.request(method, path, json={"prompt": "x"})
            assert r.status_code == 401, (path, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert r.headers["www-authenticate"] == "Bearer"
        assert c.get("/health").status_code == 200  # health and metrics stay open
    assert_still_serving(http)


def test_unknown_routes_and_methods(http):
    r = http.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = http.get("/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


# What a probe as a hostile client found: a lone surrogate in any text field was a 500 quoting
# Python ("'utf-8' codec can't encode character '\\ud800' ... surrogates not allowed"), token ids
# past int32 on /detokenize and /v1/embeddings too ("Python integer 2147483648 out of bounds for
# int32", "Python int too large to convert to C long"), and 400s spoke Python ("Exceeds the
# limit (4300 digits) ... sys.set_int_max_str_digits()", "maximum recursion depth exceeded
# while decoding a JSON array", "not NoneType") or echoed a 100 KB model name whole.
CHAT_WITH = '{"messages": [{"role": "user", "content": "x"}], '
HOSTILE = [
    ("/v1/completions", '{"prompt": "abc\\ud800", "max_tokens": 2}', "prompt",
     "prompt is not valid Unicode: it holds half of a UTF-16 surrogate pair (U+D800)"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a\\ud800"}]}',
     "messages[0].content", "not valid Unicode"),
    ("/v1/chat/completions", '{"messages": [{"role": "\\udfff", "content": "a"}]}',
     "messages[0].role", "not valid Unicode"),
    ("/v1/chat/completions", CHAT_WITH + '"tools": [{"type": "function", "function": '
     '{"name": "f", "description": "d\\ud800"}}]}', "tools[0].function.description",
     "not valid Unicode"),
    ("/v1/embeddings", '{"input": "a\\ud800"}', "input", "not valid Unicode"),
    ("/tokenize", '{"content": "a\\ud800"}', "content", "not valid Unicode"),
    ("/infill", '{"input_prefix": "\\ud800", "input_suffix": ""}', "input_prefix",
     "not valid Unicode"),
    ("/detokenize", '{"tokens": [2147483648]}', "tokens[0]",
     "tokens[0] must be a token id, in [0, 2147483647], not 2147483648"),
    ("/detokenize", '{"tokens": [1, 18446744073709551616]}', "tokens[1]",
     "not an integer of 65 bits"),
    ("/v1/embeddings", '{"input": [2147483648]}', "input", "input[0] must be a token id"),
    ("/v1/embeddings", '{"input": ["a", [1, 18446744073709551616]]}', "input",
     "input[1][1] must be a token id"),
    ("/v1/completions", '{"prompt": "a", "max_tokens": 1' + "0" * 5000 + "}", None,
     "the body holds a number with too many digits"),
    ("/v1/completions", "[" * 10_000 + "]" * 10_000, None, "nested more than 32 deep"),
    ("/v1/chat/completions", '{"messages": [null]}', "messages[0]",
     "messages[0] must be a map, not null"),
]


@pytest.mark.parametrize(("path", "body", "param", "words"), HOSTILE,
                         ids=[f"{path} {words[:30]}" for path, _, _, words in HOSTILE])
def test_what_a_hostile_client_sends_is_a_400_in_our_words(http, path, body, param, words):
    r = http.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert not PYTHON_TEXT.search(error["message"]) and len(error["message"]) < 200, error
    assert_still_serving(http)


def test_a_server_fault_is_a_500_that_quotes_no_python(engine, http, monkeypatch):
    def fault(*args, **kwargs):
        raise OverflowError("Python int too large to convert to C long")

    monkeypatch.setattr(engine, "detokenize", fault)
    r = http.post("/detokenize", json={"tokens": [1]})
    assert r.status_code == 500
    assert r.json()["error"] == {"message": "internal error (the server's log has the details)",
                                 "type": "server_error", "param": None, "code": None}


def assert_still_serving(http):
    r = http.post("/v1/completions", json={"prompt": "still there?", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


# --- capacity and shutdown ---------------------------------------------------------------------


def test_a_full_queue_is_429_and_a_closed_engine_503(tiny_path):
    busy = Engine(tiny_path, n_ctx=65536, n_seq_max=1, max_queue=1, n_threads=THREADS)
    gw = HttpGateway(busy, ServerConfig(socket="/tmp/unused.sock", http="127.0.0.1:0",
                                        max_tokens=ENDLESS))
    gw.start()
    try:
        runner = busy.submit("a", max_tokens=ENDLESS, ignore_eos=True)
        asyncio.run(asyncio.wait_for(runner.__anext__(), 30))  # it holds the only sequence
        waiting = busy.submit("b", max_tokens=2)  # and this one fills the queue
        r = httpx.post(f"{gw.url}/v1/completions", json={"prompt": "c"}, timeout=30)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "server_busy"
        runner.cancel()
        assert waiting.result(timeout=30).finish_reason == "length"
        busy.close()
        r = httpx.post(f"{gw.url}/v1/completions", json={"prompt": "c"}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
    finally:
        gw.stop()
        busy.close()


def test_a_draining_gateway_says_so_and_ends_its_streams_with_a_reason_and_done(tiny_path):
    with Engine(tiny_path, n_ctx=65536, n_seq_max=2, n_threads=THREADS) as eng:
        gw = HttpGateway(eng, ServerConfig(socket="/tmp/unused.sock", http="127.0.0.1:0",
                                           max_tokens=ENDLESS, grace_s=0.2))
        gw.start()
        body = {"prompt": PROMPT, "max_tokens": ENDLESS, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{gw.url}/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")
            gw.stop_soon()
            # Draining, the port stays open: new requests are told so, not refused.
            with httpx.Client(base_url=gw.url, timeout=30) as c:
                late = c.post("/v1/completions", json={"prompt": "late", "max_tokens": 2})
                assert late.status_code == 503 and late.headers["retry-after"] == "1"
                assert late.json()["error"]["code"] == "shutting_down"
                assert c.get("/v1/models").status_code == 503
                health = c.get("/health")
                assert health.status_code == 503 and health.json()["status"] == "draining"
                assert c.get("/metrics").status_code == 200
            # Stopped from another thread while this one keeps reading, as a server would be.
            stopper = threading.Thread(target=gw.stop)
            stopper.start()
            rest = [line for line in lines if line]
        stopper.join(30)
        assert not stopper.is_alive()
        # Past the grace period the stream is cut: its last chunk says why, then [DONE].
        assert json.loads(rest[-2].removeprefix("data: "))["error"]["code"] == "shutting_down"
        assert rest[-1] == "data: [DONE]"
        assert eng.snapshot()["kv_cells_used"] == 0
        with pytest.raises(httpx.ConnectError):  # drained and stopped: the port is closed
            httpx.get(f"{gw.url}/health", timeout=30)


# --- disconnects -------------------------------------------------------------------------------


def test_client_disconnect_mid_stream_frees_kv(engine, http, monkeypatch):
    handles = capture_handles(monkeypatch, engine)
    cancelled = engine.snapshot()["requests_cancelled_total"]
    body = {"prompt": PROMPT, "max_tokens": ENDLESS, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: {")
        assert engine.snapshot()["kv_cells_used"] > 0
    # Leaving the block closed the connection mid-stream.
    assert handles[0].result(timeout=30).finish_reason == "cancelled"
    snap = engine.snapshot()
    assert snap["kv_cells_used"] == 0
    assert snap["requests_cancelled_total"] == cancelled + 1
    assert snap["http_client_disconnects_total"] >= 1


def test_client_disconnect_while_waiting_for_a_whole_answer(engine, gateway, monkeypatch):
    handles = capture_handles(monkeypatch, engine)
    body = {"prompt": PROMPT, "max_tokens": ENDLESS, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gateway.url}/v1/completions", json=body, timeout=1.0,
                   headers={"Authorization": f"Bearer {KEY}"})
    assert handles[0].result(timeout=30).finish_reason == "cancelled"
    assert engine.snapshot()["kv_cells_used"] == 0


# --- models, health, metrics, priority ---------------------------------------------------------


def test_models_and_health(http, oai, model_id):
    # the loaded model first, then the model directory's (tests/server/test_models_http.py)
    loaded, *others = oai.models.list().data
    assert loaded.id == model_id and loaded.loaded and not any(m.loaded for m in others)
    assert oai.models.retrieve(model_id).id == model_id
    assert http.get("/v1/models/other").status_code == 404
    assert http.get("/health").json() == {"status": "ok", "model": model_id,
                                          "loaded": [model_id]}


def test_priority_from_header_or_body(engine, http):
    def ttft_count(priority):
        return engine.snapshot()[f"ttft_ms_{priority}"]["count"]

    before = ttft_count("background"), ttft_count("interactive")
    body = {"prompt": PROMPT, "max_tokens": 2}
    assert http.post("/v1/completions", json=body,
                     headers={"X-UMA-Priority": "background"}).status_code == 200
    assert http.post("/v1/completions", json={**body, "priority": "interactive"},
                     headers={"X-UMA-Priority": "background"}).status_code == 200
    assert (ttft_count("background"), ttft_count("interactive")) == (before[0] + 1,
                                                                     before[1] + 1)
    r = http.post("/v1/completions", json=body, headers={"X-UMA-Priority": "urgent"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-UMA-Priority"


def parse_prometheus(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_metrics_in_prometheus_text(engine, http):
    http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "ignore_eos": True})
    r = http.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = r.text
    assert text.count("# TYPE uma_ttft_ms histogram") == 1
    assert "# TYPE uma_requests_submitted_total counter" in text
    assert "# TYPE uma_kv_cells_used gauge" in text
    s = parse_prometheus(text)
    snap = engine.snapshot()
    for klass in ("interactive", "background"):
        for family in ("ttft_ms", "inter_token_ms"):
            count = s[f'uma_{family}_count{{class="{klass}"}}']
            assert count == snap[f"{family}_{klass}"]["count"]
            assert s[f'uma_{family}_bucket{{class="{klass}",le="+Inf"}}'] == count
    buckets = [v for k, v in s.items() if k.startswith('uma_ttft_ms_bucket{class="interactive"')]
    assert buckets == sorted(buckets) and 'uma_ttft_ms_bucket{class="interactive",le="50"}' in s
    assert s["uma_requests_submitted_total"] == snap["requests_submitted_total"]
    assert s["uma_http_requests_total"] >= 1


# --- beside the socket, in `uma run` -----------------------------------------------------------


def test_http_and_socket_clients_share_the_model(tiny_path, model):
    prompts = ["Hello", "The quick brown fox", "a b c", "def main():"]
    opts = {"max_tokens": 12, "ignore_eos": True}
    with testing.run_daemon(tiny_path, "--http", "127.0.0.1:0", "--api-key", KEY,
                            "--parallel", "8", "--ctx", "65536", "--grace", "2",
                            "--threads", str(THREADS),
                            "--max-tokens", str(ENDLESS)) as d:
        url = re.search(r"http://[\d.]+:\d+", "".join(d.stderr)).group(0)
        with Client(d.socket) as c:
            alone = {p: c.generate(p, **opts, logprobs=True) for p in prompts}
        results: dict[tuple[str, int], tuple[list, list]] = {}

        def over_socket(i: int) -> None:
            with Client(d.socket) as c:
                r = c.generate(prompts[i], **opts, logprobs=True)
            results["socket", i] = (
                [model.token_to_piece(t).decode("utf-8", "replace") for t in r.token_ids],
                list(r.logprobs))

        def over_http(i: int) -> None:
            r = httpx.post(f"{url}/v1/completions", timeout=60,
                           headers={"Authorization": f"Bearer {KEY}"},
                           json={"prompt": prompts[i], **opts, "logprobs": 0})
            lp = r.json()["choices"][0]["logprobs"]
            results["http", i] = (lp["tokens"], lp["token_logprobs"])

        threads = [threading.Thread(target=f, args=(i,))
                   for i in range(len(prompts)) for f in (over_socket, over_http)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(results) == 2 * len(prompts)
        for (_, i), (pieces, logprobs) in results.items():
            a = alone[prompts[i]]
            expected = [model.token_to_piece(t).decode("utf-8", "replace") for t in a.token_ids]
            assert_same_greedy(expected, pieces, a.logprobs, logprobs)
        with Client(d.socket) as c:
            snap = c.metrics()
        assert snap["http_requests_total"] == len(prompts)
        assert snap["requests_submitted_total"] == 3 * len(prompts)
        assert snap["kv_cells_used"] == 0

        # SIGTERM in the middle of an HTTP stream: the daemon drains and exits cleanly.
        body = {"prompt": PROMPT, "max_tokens": ENDLESS, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {KEY}"}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")
            d.proc.send_signal(signal.SIGTERM)
            # Draining, the port stays open for the grace period: a new request is told so
            # with a 503, not refused.
            deadline = time.monotonic() + 30
            while httpx.get(f"{url}/health", timeout=30).json()["status"] == "ok":
                assert time.monotonic() < deadline, "the daemon did not begin draining"
            late = httpx.post(f"{url}/v1/completions", json={"prompt": "late"}, timeout=30,
                              headers={"Authorization": f"Bearer {KEY}"})
            assert late.status_code == 503 and late.headers["retry-after"] == "1"
            rest = [line for line in lines if line]
        assert "shutting_down" in rest[-2] and rest[-1] == "data: [DONE]"
        assert d.terminate(timeout=30) == 0
        assert "uma: stopped\n" in d.stderr


def test_the_gpu_modes_serve_the_engines_greedy_tokens_on_both_doors(tiny_path):
    """Overlapped ticks and device sampling (the defaults on a GPU), forced on here: the same
    greedy tokens over the socket and over HTTP as in process with neither. One request at a
    time, so every path decodes the same batch shapes."""
    prompts = ["Hello", "The quick brown fox", "def main():"]
    with Engine(tiny_path, n_ctx=2048, n_seq_max=2, n_threads=THREADS, overlap="off",
                device_sampling="off") as e:
        alone = {p: e.generate(p, max_tokens=16, ignore_eos=True).token_ids for p in prompts}
    with testing.run_daemon(tiny_path, "--http", "127.0.0.1:0", "--api-key", KEY,
                            "--parallel", "2", "--ctx", "2048", "--threads", str(THREADS),
                            "--overlap", "on", "--device-sampling", "on") as d:
        url = re.search(r"http://[\d.]+:\d+", "".join(d.stderr)).group(0)
        for p in prompts:
            with Client(d.socket) as c:
                over_socket = c.generate(p, max_tokens=16, ignore_eos=True)
            assert over_socket.token_ids == alone[p]
            r = httpx.post(f"{url}/v1/completions", timeout=60,
                           headers={"Authorization": f"Bearer {KEY}"},
                           json={"prompt": p, "max_tokens": 16, "ignore_eos": True,
                                 "stream": True, "stream_options": {"include_usage": True}})
            chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                      if line.startswith("data: {")]
            text = "".join(ch["choices"][0]["text"] for ch in chunks if ch["choices"])
            assert chunks[-1]["usage"]["completion_tokens"] == 16
            assert text == over_socket.text


def test_public_bind_needs_a_key_or_allow_public(tmp_path, tiny_path):
    base = {"model": "m.gguf", "socket": "/tmp/s"}
    with pytest.raises(InvalidRequestError, match="allow-public"):
        settings.resolve([{**base, "http": "0.0.0.0:8080"}])
    assert settings.resolve([{**base, "http": "0.0.0.0:8080", "allow_public": True}])
    assert settings.resolve([{**base, "http": "[::1]:8080"}]).server.http == "[::1]:8080"
    key_file = tmp_path / "key"
    key_file.write_text("from-a-file\n")
    s = settings.resolve([{**base, "http": "0.0.0.0:8080", "api_key_file": str(key_file)}])
    assert s.server.api_key == "from-a-file" and "from-a-file" not in repr(s)
    env = settings.from_environment({"UMA_API_KEY": "12345", "UMA_HTTP": "8080"})
    s = settings.resolve([base, env])
    assert (s.server.api_key, s.server.http) == ("12345", "8080")
    with pytest.raises(InvalidRequestError, match="not both"):
        settings.resolve([{**base, "api_key": "a", "api_key_file": str(key_file)}])
    with pytest.raises(InvalidRequestError, match="host:port"):
        settings.resolve([{**base, "http": "localhost:http"}])

    # The command line says why and exits 1, before loading anything.
    out = subprocess.run([sys.executable, "-m", "uma", "run", str(tiny_path), "--socket",
                          testing.short_socket_path(), "--http", "0.0.0.0:0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 4 and "--allow-public" in out.stderr  # a usage error


def test_a_request_in_flight_is_demoted_by_the_id_its_response_carries(gateway, http):
    with http.stream("POST", "/v1/completions", json={
            "prompt": PROMPT, "max_tokens": ENDLESS, "ignore_eos": True, "stream": True}) as r:
        lines = r.iter_lines()  # kept: a closed line iterator closes the stream
        first = next(line for line in lines if line.startswith("data: "))
        rid = json.loads(first[len("data: "):])["id"]
        answer = http.post("/priority", json={"id": rid, "priority": "background"})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"id": rid, "priority": "background"}
        # The compute thread takes the change with the next request it takes in: once a later
        # request has finished, the change is in.
        http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}).raise_for_status()
        handle = gateway.app.state.api.live.get(rid)
        assert handle._request.priority.value == "background"
    # ended (the client left): no longer in flight. The server sees the client go on its own
    # time; it lets go of the request before cancelling it, so once the request has ended
    # it is gone from what /priority finds.
    assert handle.result(timeout=60).finish_reason == "cancelled"
    gone = http.post("/priority", json={"id": rid, "priority": "interactive"})
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "id"


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"id": "cmpl-none", "priority": "background"}, 404, "id"),
    ({"id": 5, "priority": "background"}, 400, "id"),
    ({"id": "cmpl-x", "priority": "urgent"}, 400, "priority"),
    ({"id": "cmpl-x", "priority": ["background"]}, 400, "priority"),
])
def test_a_bad_priority_change_is_refused_naming_the_field(http, body, status, param):
    r = http.post("/priority", json=body)
    assert r.status_code == status and r.json()["error"]["param"] == param


def test_priority_changes_need_the_api_key(gateway):
    r = httpx.post(f"{gateway.url}/priority", json={"id": "x", "priority": "background"})
    assert r.status_code == 401
