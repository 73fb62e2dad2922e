"""Ollama's endpoints on the HTTP gateway, in-process on a tiny synthetic model, driven by the
official `ollama` client: each answers what the engine itself answers."""

from __future__ import annotations

import httpx
import ollama
import pytest

from uma import Engine, SamplingParams
from uma.config import ServerConfig
from uma.server.http import HttpGateway

KEY = "test-key-123"
GREEDY = {"temperature": 0, "num_predict": 8}


@pytest.fixture(scope="module")
def engine(tiny_path):
    with Engine(tiny_path, n_ctx=8192, n_seq_max=4, n_threads=1, chat_template="chatml") as e:
        yield e


@pytest.fixture(scope="module")
def gateway(engine):
    gw = HttpGateway(engine, ServerConfig(socket="/tmp/unused.sock", http="127.0.0.1:0",
                                          api_key=KEY))
    gw.start()
    yield gw
    gw.stop()


@pytest.fixture
def client(gateway):
    return ollama.Client(host=gateway.url, headers={"Authorization": f"Bearer {KEY}"})


@pytest.fixture
def name(tiny_path):
    return tiny_path.stem


def greedy(engine, prompt, n=8) -> str:
    return engine.generate(prompt, SamplingParams(temperature=0, max_tokens=n)).text


def test_chat_answers_what_the_engine_answers_whole_and_streamed(engine, client, name):
    messages = [{"role": "user", "content": "Say something"}]
    expected = engine.chat(messages, SamplingParams(temperature=0, max_tokens=8)).text
    r = client.chat(model=name, messages=messages, options=GREEDY)
    assert r.message.role == "assistant" and r.message.content == expected
    assert r.done and r.done_reason in ("stop", "length") and r.model == f"{name}:latest"
    assert r.eval_count <= 8 and r.prompt_eval_count > 0 and r.total_duration > 0
    parts = list(client.chat(model=f"{name}:latest", messages=messages, options=GREEDY,
                             stream=True))
    assert "".join(p.message.content for p in parts) == expected
    assert parts[-1].done and not any(p.done for p in parts[:-1])


def test_generate_raw_is_the_prompt_as_it_is_and_templated_otherwise(engine, client, name):
    raw = client.generate(model=name, prompt="Once upon a time", raw=True, options=GREEDY)
    assert raw.response == greedy(engine, "Once upon a time")
    templated = client.generate(model=name, prompt="Once upon a time", options=GREEDY)
    expected = engine.chat([{"role": "user", "content": "Once upon a time"}],
                           SamplingParams(temperature=0, max_tokens=8)).text
    assert templated.response == expected
    streamed = "".join(p.response for p in client.generate(
        model=name, prompt="Once upon a time", raw=True, options=GREEDY, stream=True))
    assert streamed == raw.response


def test_json_format_answers_json(client, name):
    import json

    r = client.generate(model=name, prompt="data:", raw=True, format="json",
                        options={"temperature": 0, "num_predict": 40})
    if r.done_reason == "stop":  # a whole object within 40 tokens
        json.loads(r.response)
    assert r.response.lstrip().startswith("{")


def test_embeddings_are_the_engines(engine, client, name):
    r = client.embed(model=name, input=["hello", "world"])
    mine = engine.embed(["hello", "world"]).vectors
    assert len(r.embeddings) == 2
    assert r.embeddings[0] == pytest.approx(mine[0].tolist(), abs=1e-5)
    old = client.embeddings(model=name, prompt="hello")
    assert old.embedding == pytest.approx(mine[0].tolist(), abs=1e-5)


def test_the_lists_show_and_version(engine, client, name):
    listed = client.list().models[0]  # the loaded model first (test_models_http.py)
    assert listed.model == f"{name}:latest" and listed.details.format == "gguf"
    assert listed.details.family == engine.model.architecture
    [running] = client.ps().models
    assert running.model == f"{name}:latest" and running.context_length == engine.n_ctx_seq
    shown = client.show(name)
    assert shown.details.quantization_level == "F32" and "completion" in shown.capabilities
    assert shown.modelinfo["general.architecture"] == engine.model.architecture


@pytest.mark.parametrize("call, status, words", [
    (lambda c, n: c.chat(model="llama3", messages=[]), 404, "'llama3' not found"),
    (lambda c, n: c.generate(model=n, prompt="x", images=["aGk="]), 400,
     "images is not supported"),
    (lambda c, n: c.chat(model=n, messages=[{"role": "user", "content": "x"}],
                         options={"num_predict": -5}), 400, "max_tokens"),
])
def test_errors_come_back_in_ollamas_shape(client, name, call, status, words):
    with pytest.raises(ollama.ResponseError) as e:
        call(client, name)
    assert e.value.status_code == status and words in e.value.error


def test_an_unknown_path_and_a_missing_key_answer_in_ollamas_shape(gateway):
    r = httpx.get(f"{gateway.url}/api/nothing", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 404 and isinstance(r.json()["error"], str)
    r = httpx.get(f"{gateway.url}/api/tags")
    assert r.status_code == 401
