"""Real models through the daemon's doors, as users reach them: the official `openai` client
over HTTP (chat, a named tool, tool_choice required, a strict JSON schema, a GBNF grammar, each
answer validated), special-token text in /v1/completions and over the socket, and llama-server's
/infill against llama-server itself."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest

from uma import synth, testing
from uma.client import Client

from .conftest import llama_server, servers

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 32},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a time zone.",
        # bounded: a small model may otherwise run on inside the string to max_tokens
        "parameters": {"type": "object",
                       "properties": {"zone": {"type": "string", "maxLength": 32}},
                       "required": ["zone"], "additionalProperties": False},
    },
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 40},
                   "age": {"type": "integer", "minimum": 0, "maximum": 150},
                   "languages": {"type": "array", "items": {"type": "string", "maxLength": 20},
                                 "maxItems": 3}},
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def daemon(real_model):
    with testing.run_daemon(real_model, "--http", "127.0.0.1:0", "--threads", "2",
                            "--ctx", "4096", "--parallel", "2") as d:
        yield d


@pytest.fixture(scope="module")
def oai(daemon):
    with openai.OpenAI(base_url=f"{daemon.http_url}/v1", api_key="unused",
                       max_retries=0, timeout=300) as client:
        yield client


def _chat(oai, content, **kwargs):
    return oai.chat.completions.create(
        model=oai.models.list().data[0].id, max_tokens=kwargs.pop("max_tokens", 96),
        messages=[{"role": "user", "content": content}], temperature=0, **kwargs)


def test_a_chat_answers_in_words(oai, real_model):
    answer = _chat(oai, "What is 2+2? Answer briefly.", max_tokens=32)
    text = answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert re.search(r"[A-Za-z]{3,}", text), text  # words, not byte soup
    if "SmolLM2" in real_model.name:  # the instruction-tuned one answers (as llama-server's)
        assert "4" in text, text


def _arguments(call, tool):
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, tool["function"]["parameters"])
    return args


def test_a_named_tool_is_called_with_arguments_that_match_its_schema(oai):
    answer = _chat(oai, "What is the weather like in Lisbon?", tools=[WEATHER, TIME],
                   tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    _arguments(call, WEATHER)


def test_a_required_tool_call_picks_one_of_the_tools(oai):
    answer = _chat(oai, "What time is it in Tokyo?", tools=[WEATHER, TIME],
                   tool_choice="required")
    calls = answer.choices[0].message.tool_calls
    assert calls and answer.choices[0].finish_reason == "tool_calls"
    tools = {"get_weather": WEATHER, "get_time": TIME}
    for call in calls:
        _arguments(call, tools[call.function.name])


def test_a_strict_json_schema_answer_validates(oai):
    answer = _chat(oai, "Describe a person who speaks two languages, as JSON.",
                   max_tokens=160, response_format={
                       "type": "json_schema",
                       "json_schema": {"name": "person", "strict": True, "schema": PERSON}})
    assert answer.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(answer.choices[0].message.content), PERSON)


def test_a_gbnf_grammar_bounds_the_answer(oai):
    grammar = 'root ::= ("yes" | "no") ", because " [a-z ]{1,40} "."'
    answer = _chat(oai, "Is the sea salty? Answer yes or no, with a reason.",
                   extra_body={"grammar": grammar})
    text = answer.choices[0].message.content
    assert re.fullmatch(r"(yes|no), because [a-z ]{1,40}\.", text), text


def test_special_token_text_in_a_completion_prompt_is_read_as_those_tokens(daemon, oai,
                                                                          real_model):
    text = ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            if "SmolLM2" in real_model.name
            else "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n")
    model = oai.models.list().data[0].id
    special = oai.completions.create(model=model, prompt=text, max_tokens=1, temperature=0)
    plain = oai.completions.create(model=model, prompt=text, max_tokens=1, temperature=0,
                                   extra_body={"parse_special": False})
    tokens = httpx.post(f"{daemon.http_url}/tokenize",
                        json={"content": text, "parse_special": True}).json()["tokens"]
    assert special.usage.prompt_tokens == len(tokens)
    assert plain.usage.prompt_tokens > special.usage.prompt_tokens
    with Client(daemon.socket) as client:  # the socket reads text prompts the same way
        result = client.generate(text, max_tokens=1)
        kept = client.generate(text, max_tokens=1, parse_special=False)
    assert result.usage.prompt_tokens == special.usage.prompt_tokens
    assert kept.usage.prompt_tokens == plain.usage.prompt_tokens


# --- /infill ---------------------------------------------------------------------------------

INFILL = {
    "input_prefix": "def add(a, b):\n    ",
    "input_suffix": "\n\nprint(add(1, 2))\n",
    "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
    "prompt": "return",
    "n_predict": 12, "temperature": 0, "return_tokens": True, "cache_prompt": False,
}


@pytest.fixture(scope="module")
def fim_model():
    """A synthetic model on deepseek-coder's vocabulary, which has FIM tokens."""
    return synth.cached_model("tiny-fim")


def test_infill_lays_out_the_prompt_and_completes_as_llama_server(fim_model, llama_bin):
    with llama_server(llama_bin, fim_model, args=("-b", "512")) as server:
        # random weights write invalid UTF-8, which llama-server's chat parser refuses with a
        # 500 unless told to accept anything (benches/servers.py)
        theirs = httpx.post(f"http://127.0.0.1:{server.port}/infill", json={
            **INFILL, "chat_parser": servers.ACCEPT_ANYTHING}, timeout=120).json()
    with testing.run_daemon(fim_model, "--http", "127.0.0.1:0", "--ctx", "2048",
                            "--parallel", "1", "--batch", "512", "--prefix-cache", "0") as d:
        ours = httpx.post(f"{d.http_url}/infill", json=INFILL, timeout=120).json()
        chunks = _sse(httpx.post(f"{d.http_url}/infill", json={**INFILL, "stream": True},
                                 timeout=120))
    assert ours["tokens_evaluated"] == theirs["tokens_evaluated"]
    assert ours["tokens"] == theirs["tokens"] and ours["stop"] is True
    assert ours["content"] == theirs["content"]
    # streamed: llama-server's chunks (content, stop: false), the last one stop: true, no [DONE]
    assert chunks[-1]["stop"] is True and not any(c["stop"] for c in chunks[:-1])
    assert "".join(c["content"] for c in chunks) == ours["content"]


def _sse(response) -> list[dict]:
    assert response.status_code == 200, response.text
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert "[DONE]" not in events
    return [json.loads(e) for e in events]


def test_infill_is_refused_on_a_model_without_fim_tokens(daemon):
    r = httpx.post(f"{daemon.http_url}/infill", json=INFILL, timeout=60)
    assert r.status_code == 501
    assert "infill is not supported by this model" in r.json()["error"]["message"]
    r = httpx.post(f"{daemon.http_url}/infill", json={"input_prefix": "a"}, timeout=60)
    assert r.status_code in (400, 501)
