"""Ollama's dialect as protocol (uma.server.ollama_api): each body as the OpenAI body the
gateway checks, what is refused and how it is named, and the answer objects."""

from __future__ import annotations

import json

import pytest

from uma.handle import Result, Timings, Usage
from uma.server import ollama_api as O
from uma.server.openai_api import ApiError
from uma.tools import ToolCall

SERVED = O.Served("SmolLM2-135M-Instruct.Q4_1", ("smollm2",))


@pytest.mark.parametrize("model", ["smollm2", "smollm2:latest", "SmolLM2-135M-Instruct.Q4_1",
                                   "SmolLM2-135M-Instruct.Q4_1:latest",
                                   "SmolLM2-135M-Instruct.Q4_1.gguf"])
def test_the_model_answers_to_its_catalogue_name_and_its_file_name(model):
    SERVED.check({"model": model})
    assert SERVED.name == "smollm2:latest"
    assert O.Served("mine").name == "mine:latest"


@pytest.mark.parametrize("model, status", [("llama3", 404), ("smollm2:7b", 404), (3, 404),
                                           (None, 400)])
def test_another_model_is_not_found_naming_the_one_served(model, status):
    with pytest.raises(ApiError) as e:
        SERVED.check({"model": model})
    assert e.value.status == status
    if status == 404:
        assert "'smollm2:latest'" in e.value.message


def test_generate_goes_through_the_chat_template_unless_raw():
    req = O.parse_generate({"model": "smollm2", "prompt": "Hi", "system": "Be brief",
                            "options": {"num_predict": 12, "temperature": 0.2, "top_k": 5,
                                        "repeat_last_n": 32, "num_ctx": 8192}}, SERVED)
    assert req.chat and req.stream and req.answer == "generate"
    assert req.openai == {"model": SERVED.model_id, "stream": True, "max_tokens": 12,
                          "temperature": 0.2, "top_k": 5, "penalty_last_n": 32,
                          "messages": [{"role": "system", "content": "Be brief"},
                                       {"role": "user", "content": "Hi"}]}
    raw = O.parse_generate({"model": "smollm2", "prompt": "Hi", "raw": True, "stream": False,
                            "options": {"num_predict": -1}}, SERVED)
    assert not raw.chat and not raw.stream
    assert raw.openai == {"model": SERVED.model_id, "stream": True, "prompt": "Hi"}


@pytest.mark.parametrize("fmt, expected", [
    ("json", {"type": "json_object"}),
    ({"type": "object"}, {"type": "json_schema",
                          "json_schema": {"name": "format", "schema": {"type": "object"}}}),
])
def test_format_becomes_the_response_format(fmt, expected):
    req = O.parse_chat({"model": "smollm2", "messages": [], "format": fmt}, SERVED)
    assert req.openai["response_format"] == expected


def test_chat_messages_carry_tool_calls_and_results_as_openai_ones():
    req = O.parse_chat({"model": "smollm2", "tools": [{"type": "function", "function": {
        "name": "f"}}], "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "f", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "f"}]}, SERVED)
    call = req.openai["messages"][1]["tool_calls"][0]
    assert call["function"] == {"name": "f", "arguments": json.dumps({"city": "Oslo"})}
    assert call["id"] == "call_0" and call["type"] == "function"
    assert req.openai["messages"][2] == {"role": "tool", "content": "sunny", "name": "f"}
    assert req.openai["tools"][0]["function"]["name"] == "f" and req.answer == "chat"


@pytest.mark.parametrize("value, seconds", [
    ("5m", 300.0), ("1h30m", 5400.0), ("10s", 10.0), ("250ms", 0.25), ("1.5h", 5400.0),
    (90, 90.0), (2.5, 2.5), ("90", 90.0), (0, 0.0), ("0s", 0.0),
    ("-1m", None), (-1, None), ("-1", None)])
def test_keep_alive_is_a_duration_or_seconds_and_negative_is_for_good(value, seconds):
    assert O.keep_alive_s({"keep_alive": value}) == seconds


def test_no_keep_alive_leaves_the_daemons():
    assert O.keep_alive_s({}) is ... and O.keep_alive_s({"keep_alive": None}) is ...


@pytest.mark.parametrize("value", ["5 minutes", "m", "", "5m5", "1x", True, [5], {"m": 5}])
def test_a_keep_alive_that_is_no_duration_is_refused_by_name(value):
    with pytest.raises(ApiError) as e:
        O.keep_alive_s({"keep_alive": value})
    assert e.value.status == 400 and e.value.param == "keep_alive"


def test_a_request_without_prompt_or_messages_loads_the_model():
    assert O.parse_generate({"model": "smollm2"}, SERVED).empty
    assert not O.parse_generate({"model": "smollm2", "prompt": "x"}, SERVED).empty
    assert O.parse_chat({"model": "smollm2", "messages": []}, SERVED).empty
    answer = O.Answer(O.parse_chat({"model": "smollm2", "messages": []}, SERVED), SERVED)
    loaded = answer.loaded("unload")
    assert (loaded["done"], loaded["done_reason"], loaded["message"]["content"]) \
        == (True, "unload", "")


@pytest.mark.parametrize("parse, body, words", [
    (O.parse_generate, {"images": ["aGk="]}, "images is not supported"),
    (O.parse_generate, {"context": [1, 2]}, "context is not supported"),
    (O.parse_generate, {"template": "{{ .Prompt }}"}, "template is not supported"),
    (O.parse_generate, {"prompt": 3}, "prompt must be a string"),
    (O.parse_generate, {"raw": "yes"}, "raw must be true or false"),
    (O.parse_generate, {"stream": "no"}, "stream must be true or false"),
    (O.parse_generate, {"keep_alive": [5]}, "keep_alive must be a duration"),
    (O.parse_generate, {"options": {"bogus": 1}}, "options.'bogus' is not a known option"),
    (O.parse_generate, {"options": []}, "options must be an object"),
    (O.parse_generate, {"format": "yaml"}, 'format must be "json" or a JSON schema'),
    (O.parse_chat, {"messages": "hi"}, "messages must be a list"),
    (O.parse_chat, {"messages": [{"role": "robot", "content": "x"}]},
     "messages[0].role must be one of"),
    (O.parse_chat, {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
     "messages[0].images is not supported"),
    (O.parse_chat, {"messages": [{"role": "assistant", "tool_calls": [{"name": "f"}]}]},
     "messages[0].tool_calls[0] must be"),
])
def test_what_cannot_be_served_is_refused_by_name(parse, body, words):
    with pytest.raises(ApiError) as e:
        parse({"model": "smollm2", "messages": [], **body}, SERVED)
    assert e.value.status == 400 and words in e.value.message
    assert O.error_body(e.value) == {"error": e.value.message}


def test_embed_takes_a_text_or_texts_and_the_older_prompt():
    assert O.parse_embed({"model": "smollm2", "input": "a"}, SERVED) == (["a"], False)
    assert O.parse_embed({"model": "smollm2", "input": ["a", "b"], "keep_alive": "5m"},
                         SERVED) == (["a", "b"], False)
    assert O.parse_embed({"model": "smollm2", "prompt": "a"}, SERVED, legacy=True) == (
        ["a"], True)
    for body in ({"input": []}, {"input": [1]}, {"input": "a", "dimensions": 8}):
        with pytest.raises(ApiError):
            O.parse_embed({"model": "smollm2", **body}, SERVED)


def _result(**kw) -> Result:
    base = dict(text="Paris.", token_ids=(1, 2), finish_reason="stop",
                usage=Usage(prompt_tokens=40, completion_tokens=2),
                timings=Timings(admitted_ns=1, queue_ms=1.0, ttft_ms=11.0, total_ms=31.0))
    return Result(**{**base, **kw})


def test_the_last_object_carries_the_reason_and_figures_in_nanoseconds():
    req = O.parse_chat({"model": "smollm2", "messages": []}, SERVED)
    answer = O.Answer(req, SERVED)
    last = answer.final(_result(), "Paris.")
    assert last["message"] == {"role": "assistant", "content": "Paris."}
    assert last["done"] and last["done_reason"] == "stop" and last["model"] == "smollm2:latest"
    assert (last["prompt_eval_count"], last["eval_count"]) == (40, 2)
    assert last["total_duration"] == 31_000_000 and last["prompt_eval_duration"] == 10_000_000
    assert last["eval_duration"] == 20_000_000 and last["created_at"].endswith("Z")
    chunk = answer.chunk("Pa")
    assert chunk["message"] == {"role": "assistant", "content": "Pa"} and not chunk["done"]
    gen = O.Answer(O.parse_generate({"model": "smollm2", "prompt": "x"}, SERVED), SERVED)
    assert gen.chunk("Pa")["response"] == "Pa" and "message" not in gen.chunk("Pa")
    assert O.line({"a": "é"}) == '{"a": "é"}\n'.encode()


def test_tool_calls_come_back_with_their_arguments_as_objects():
    answer = O.Answer(O.parse_chat({"model": "smollm2", "messages": []}, SERVED), SERVED)
    calls = (ToolCall("f", '{"city": "Oslo"}', "call_0"),)
    last = answer.final(_result(finish_reason="tool_calls", tool_calls=calls, content=""), "")
    assert last["done_reason"] == "stop"
    assert last["message"]["tool_calls"] == [{"function": {"name": "f",
                                                           "arguments": {"city": "Oslo"}}}]
    assert answer.calls(calls)["message"]["tool_calls"][0]["function"]["name"] == "f"


