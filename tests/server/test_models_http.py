"""The model directory on the HTTP gateway, in-process on a tiny synthetic model, driven by the
official `openai` and `ollama` clients: both listings show the directory's models beside the
loaded one, and a request for one of them is refused with the reason."""

from __future__ import annotations

import httpx
import numpy as np
import ollama
import openai
import pytest

from uma import Engine, testing
from uma.config import ServerConfig
from uma.server.http import HttpGateway

from ..gguf_files import write_gguf

CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module", autouse=True)
def empty_cache(tiny_path, tmp_path_factory):
    """A model cache without the catalogue's models (those fetched on this machine would be
    listed too), set once the tiny model's path is known."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("UMA_CACHE_DIR", str(cache))
        yield cache


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """A directory of one small model and a damaged file."""
    folder = tmp_path_factory.mktemp("models")
    write_gguf(folder / "qwen.gguf", arch="qwen2", context_length=32768)
    (folder / "broken.gguf").write_bytes(np.random.default_rng(0).bytes(1000))
    return folder


@pytest.fixture(scope="module")
def engine(tiny_path):
    with Engine(tiny_path, n_ctx=2048, n_seq_max=2, n_threads=1) as e:
        yield e


@pytest.fixture(scope="module")
def gateway(engine, models_dir):
    gw = HttpGateway(engine, ServerConfig(socket="/tmp/unused.sock", http="127.0.0.1:0",
                                          models_dir=str(models_dir)))
    gw.start()
    yield gw
    gw.stop()


@pytest.fixture
def oai(gateway):
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0,
                       timeout=30) as c:
        yield c


@pytest.fixture
def olla(gateway):
    return ollama.Client(host=gateway.url)


@pytest.fixture
def name(tiny_path):
    return tiny_path.stem


def test_v1_models_lists_the_loaded_model_then_the_directorys(oai, engine, name, models_dir):
    loaded, qwen = oai.models.list().data  # the damaged file is not offered
    assert (loaded.id, loaded.loaded) == (name, True)
    assert loaded.meta == {"architecture": engine.model.architecture, "quantization": "F32",
                           "n_ctx_train": engine.model.n_ctx_train,
                           "n_params": engine.model.n_params,
                           "size": engine.model.size_bytes + _header_bytes(engine)}
    assert (qwen.id, qwen.loaded, qwen.owned_by) == ("qwen", False, "uma")
    assert qwen.created == int((models_dir / "qwen.gguf").stat().st_mtime)
    assert qwen.meta["architecture"] == "qwen2" and qwen.meta["n_ctx_train"] == 32768
    assert oai.models.retrieve("qwen").meta == qwen.meta
    assert oai.models.retrieve(name).loaded


def _header_bytes(engine) -> int:
    # the file holds the header besides the weights llama.cpp counts
    import os
    return os.path.getsize(engine.config.model) - engine.model.size_bytes


def test_api_tags_lists_the_loaded_model_then_the_directorys(olla, name):
    loaded, qwen = olla.list().models
    assert loaded.model == f"{name}:latest" and qwen.model == "qwen:latest"
    assert qwen.details.family == "qwen2" and qwen.details.quantization_level == "F32"
    assert [m.model for m in olla.ps().models] == [f"{name}:latest"]  # ps: loaded only


def test_a_model_that_is_available_but_not_loaded_is_a_409(oai, olla, name):
    for call in (lambda: oai.chat.completions.create(model="qwen", messages=CHAT),
                 lambda: oai.completions.create(model="qwen", prompt="x"),
                 lambda: oai.embeddings.create(model="qwen", input="x")):
        with pytest.raises(openai.ConflictError) as e:
            call()
        assert e.value.body["code"] == "model_not_loaded"
        assert e.value.body["message"] == (
            f"model 'qwen' is available but not loaded: this server serves {name!r} and "
            f"loads no other while it runs")
    for call in (lambda: olla.chat(model="qwen:latest", messages=CHAT),
                 lambda: olla.generate(model="qwen", prompt="x"),
                 lambda: olla.embed(model="qwen", input="x"),
                 lambda: olla.show("qwen")):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 409 and f"serves '{name}:latest'" in e.value.error


def test_a_model_that_is_nowhere_is_a_404_naming_those_there_are(oai, olla, gateway, name):
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="llama3", messages=CHAT)
    assert e.value.body["message"] == (f"model 'llama3' not found; this server has {name!r} "
                                       f"(loaded), 'qwen'")
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("llama3")
    with pytest.raises(ollama.ResponseError) as e:
        olla.chat(model="llama3", messages=CHAT)
    assert e.value.status_code == 404 and e.value.error == (
        f"model 'llama3' not found; this server has '{name}:latest' (loaded), 'qwen:latest'")
    r = httpx.get(f"{gateway.url}/v1/models/broken")
    assert r.status_code == 404 and "cannot be served: not a GGUF file" in r.text


def test_the_served_model_answers_as_before(oai, olla, name):
    for model in (name, f"{name}.gguf"):
        r = oai.completions.create(model=model, prompt="x", max_tokens=1)
        assert r.model == name
    assert olla.generate(model=f"{name}:latest", prompt="x", raw=True,
                         options={"num_predict": 1}).done


def test_a_model_added_while_serving_is_listed(oai, models_dir):
    write_gguf(models_dir / "later.gguf", tensors={"t": np.zeros((8, 8), np.float16)})
    try:
        assert [m.id for m in oai.models.list().data][1:] == ["later", "qwen"]
        assert oai.models.retrieve("later").meta["quantization"] == "F32"  # its file type
    finally:
        (models_dir / "later.gguf").unlink()


def test_uma_run_models_dir_reaches_the_listing(tiny_path, models_dir, empty_cache):
    with testing.run_daemon(tiny_path, "--http", "127.0.0.1:0", "--models-dir",
                            str(models_dir), "--ctx", "256", "--parallel", "1", "--threads", "1",
                            env={"UMA_CACHE_DIR": str(empty_cache)}) as daemon:
        r = httpx.get(f"{daemon.http_url}/v1/models", timeout=30)
    assert [(m["id"], m["loaded"]) for m in r.json()["data"]] == [
        (tiny_path.stem, True), ("qwen", False)]
