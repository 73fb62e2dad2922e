"""The model directory on the HTTP gateway, in-process on tiny synthetic models, driven by the
official `openai` and `ollama` clients: both listings show the directory's models beside the
loaded ones, a request for one of them loads it, /load and /unload work on the live gateway,
and a model that cannot load is refused with the reason, the others unaffected."""

from __future__ import annotations

import datetime
import shutil

import httpx
import numpy as np
import ollama
import openai
import pytest

from uma import Engine, synth, testing
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
    """A directory of a model that loads (a tiny mixture of experts), one whose header reads
    but whose weights are not there, and a damaged file."""
    folder = tmp_path_factory.mktemp("models")
    shutil.copyfile(synth.cached_model("tiny-moe"), folder / "moe.gguf")
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
                                          models_dir=str(models_dir), max_loaded=2))
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
    loaded, moe, qwen = oai.models.list().data  # the damaged file is not offered
    assert (moe.id, moe.loaded) == ("moe", False)
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
    loaded, _, qwen = olla.list().models
    assert loaded.model == f"{name}:latest" and qwen.model == "qwen:latest"
    assert qwen.details.family == "qwen2" and qwen.details.quantization_level == "F32"
    assert [m.model for m in olla.ps().models] == [f"{name}:latest"]  # ps: loaded only


def test_a_model_of_the_directory_is_loaded_for_the_request_that_names_it(
        oai, olla, gateway, name):
    try:
        r = oai.chat.completions.create(model="moe", messages=CHAT, max_tokens=3)
        assert r.model == "moe" and r.usage.completion_tokens == 3
        # loaded beside a serving model, it does not time the device (its scratch decodes
        # would take the cores from the other's streams): it learns from its first ticks
        assert gateway.app.state.api.host.find("moe").engine.calibration == (0, 0)
        assert olla.generate(model="moe:latest", prompt="x", raw=True,
                             options={"num_predict": 2}).eval_count == 2
        assert len(oai.embeddings.create(model="moe", input="x").data[0].embedding) > 0
        ps = olla.ps().models  # the most recently used first, each until its keep-alive
        assert [m.model for m in ps] == ["moe:latest", f"{name}:latest"]
        assert ps[0].expires_at.year > 2000 and ps[1].expires_at.year == 1
        assert [(m.id, m.loaded) for m in oai.models.list().data] == [
            ("moe", True), (name, True), ("qwen", False)]
        # the first model still answers beside it
        assert oai.completions.create(model=name, prompt="x", max_tokens=1).model == name
    finally:
        httpx.post(f"{gateway.url}/unload", json={"model": "moe"}, timeout=30)
    assert [m.model for m in olla.ps().models] == [f"{name}:latest"]


def test_load_and_unload_on_the_live_gateway(gateway, name):
    url = gateway.url
    r = httpx.post(f"{url}/load", json={"model": "moe"}, timeout=60)
    assert r.status_code == 200 and r.json()["model"] == "moe" and r.json()["loaded"]
    try:
        # a model in use is not unloaded under it (held here as a request is between its
        # arrival and its submission; a running one counts the same, tests/test_host.py)
        host = gateway.app.state.api.host
        entry = host.hold("moe")
        r = httpx.post(f"{url}/unload", json={"model": "moe"}, timeout=30)
        assert r.status_code == 409 and r.json()["error"]["code"] == "model_busy"
        host.release(entry)
    finally:
        assert httpx.post(f"{url}/unload", json={"model": "moe:latest"},
                          timeout=30).json() == {"model": "moe", "loaded": False}
    r = httpx.post(f"{url}/unload", json={"model": "moe"}, timeout=30)
    assert r.status_code == 404 and "'moe' is not loaded" in r.text
    r = httpx.post(f"{url}/load", json={"name": "moe"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = httpx.post(f"{url}/load", json={"model": "llama3"}, timeout=30)
    assert r.status_code == 404 and f"'{name}' (loaded), 'moe', 'qwen'" in r.text


def test_ollama_loads_with_an_empty_request_and_unloads_with_keep_alive_0(olla, name):
    assert olla.generate(model="moe", keep_alive="1m").done_reason == "load"
    moe = next(m for m in olla.ps().models if m.model == "moe:latest")
    left = (moe.expires_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    assert 0 < left <= 60  # the request's keep-alive, not the daemon's 300 s
    assert olla.chat(model="moe", messages=[], keep_alive=0).done_reason == "unload"
    assert [m.model for m in olla.ps().models] == [f"{name}:latest"]
    with pytest.raises(ollama.ResponseError) as e:
        olla.generate(model="moe", keep_alive="soon")
    assert e.value.status_code == 400 and "keep_alive must be a duration" in e.value.error


def test_a_model_that_cannot_load_says_why_and_the_others_serve_on(oai, olla, name):
    with pytest.raises(openai.InternalServerError) as e:
        oai.chat.completions.create(model="qwen", messages=CHAT)
    assert e.value.body["code"] == "model_load_failed" and "qwen" in e.value.body["message"]
    with pytest.raises(ollama.ResponseError) as e:
        olla.generate(model="qwen", prompt="x")
    assert e.value.status_code == 500
    assert oai.completions.create(model=name, prompt="x", max_tokens=1).model == name
    assert [m.model for m in olla.ps().models] == [f"{name}:latest"]


def test_a_model_that_is_nowhere_is_a_404_naming_those_there_are(oai, olla, gateway, name):
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="llama3", messages=CHAT)
    assert e.value.body["message"] == (f"model 'llama3' not found; this server has {name!r} "
                                       f"(loaded), 'moe', 'qwen'")
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("llama3")
    with pytest.raises(ollama.ResponseError) as e:
        olla.chat(model="llama3", messages=CHAT)
    assert e.value.status_code == 404 and e.value.error == (
        f"model 'llama3' not found; this server has '{name}:latest' (loaded), 'moe:latest', "
        f"'qwen:latest'")
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
        assert [m.id for m in oai.models.list().data][1:] == ["later", "moe", "qwen"]
        assert oai.models.retrieve("later").meta["quantization"] == "F32"  # its file type
    finally:
        (models_dir / "later.gguf").unlink()


def test_uma_run_models_dir_reaches_the_listing(tiny_path, models_dir, empty_cache):
    with testing.run_daemon(tiny_path, "--http", "127.0.0.1:0", "--models-dir",
                            str(models_dir), "--ctx", "256", "--parallel", "1", "--threads", "1",
                            env={"UMA_CACHE_DIR": str(empty_cache)}) as daemon:
        r = httpx.get(f"{daemon.http_url}/v1/models", timeout=30)
    assert [(m["id"], m["loaded"]) for m in r.json()["data"]] == [
        (tiny_path.stem, True), ("moe", False), ("qwen", False)]
