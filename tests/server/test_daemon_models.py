"""Several models over the socket: `uma run` in a subprocess on the tiny synthetic model with a
model directory beside it (the tiny mixture of experts, a damaged file), driven by the client
and the CLI. A request naming a model loads it and waits; load, unload and ps work on the
live daemon; a model with requests is never unloaded; a model that cannot load is refused
with its reason while the other model's stream goes on."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from uma import Engine, synth, testing
from uma.client import AsyncClient, Client, ServerError

from ..helpers import assert_same_greedy

GREEDY = {"max_tokens": 12, "ignore_eos": True, "logprobs": True}


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    shutil.copyfile(synth.cached_model("tiny-moe"), folder / "moe.gguf")
    (folder / "broken.gguf").write_bytes(np.random.default_rng(0).bytes(1000))
    return folder


@pytest.fixture(scope="module")
def daemon(tiny_path, models_dir, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")  # no catalogue models fetched on this machine
    with testing.run_daemon(tiny_path, "--models-dir", str(models_dir), "--max-loaded", "2",
                            "--ctx", "2048", "--parallel", "2",
                            env={"UMA_CACHE_DIR": str(cache)}) as d:
        yield d


@pytest.fixture(scope="module")
def moe_alone(models_dir):
    """What the mixture of experts answers served on its own."""
    with Engine(models_dir / "moe.gguf", n_ctx=2048, n_seq_max=2) as e:
        return e.generate("Once upon a time", **GREEDY)


def unloaded(client: Client, name: str) -> None:
    if any(m["name"] == name for m in client.ps()):
        client.unload(name)


def test_a_request_naming_a_model_loads_it_and_gets_its_answer(daemon, moe_alone):
    with Client(daemon.socket) as c:
        unloaded(c, "moe")
        r = c.generate("Once upon a time", model="moe", **GREEDY)
        assert_same_greedy(moe_alone.token_ids, r.token_ids, moe_alone.logprobs, r.logprobs)
        loaded = {m["name"]: m for m in c.ps()}
        assert loaded["moe"]["requests"] == 0 and loaded["moe"]["memory_bytes"] > 0
        assert any(m["default"] for m in loaded.values()) and not loaded["moe"]["default"]
        # its file's name names it too
        again = c.generate("Once upon a time", model="moe.gguf", **GREEDY)
        assert again.token_ids == r.token_ids
    assert any("uma: loaded moe in" in line for line in daemon.stderr)


def test_load_reports_progress_and_unload_frees_the_model(daemon):
    with Client(daemon.socket) as c:
        unloaded(c, "moe")
        seen: list[float] = []
        m = c.load("moe", keep_alive=-1, progress=seen.append)
        assert m["name"] == "moe" and m["keep_alive_s"] is None and m["load_ms"] > 0
        assert seen and all(0.0 <= f <= 1.0 for f in seen)
        assert c.load("moe")["load_ms"] < m["load_ms"]  # loaded already: at once
        assert c.unload("moe") == "moe"
        assert [x["name"] for x in c.ps()] == [daemon_first(c)]
        with pytest.raises(ServerError, match="'moe' is not loaded") as err:
            c.unload("moe")
        assert err.value.code == "E_MODEL_001"


def daemon_first(client: Client) -> str:
    return next(m["name"] for m in client.ps() if m["default"])


def test_a_model_with_a_request_is_not_unloaded_under_it(daemon):
    with Client(daemon.socket) as c:
        stream = c.submit("Hello", model="moe", max_tokens=2000, ignore_eos=True)
        next(iter(stream))  # running
        with pytest.raises(ServerError, match="'moe' has requests") as err:
            c.unload("moe")
        assert err.value.code == "E_BUSY_001"
        stream.cancel()
        assert stream.result().finish_reason == "cancelled"
        c.unload("moe")


def test_two_models_stream_at_once(daemon, tiny_path):
    with Client(daemon.socket) as c:
        first = c.submit("The quick brown fox", max_tokens=24, ignore_eos=True)
        second = c.submit("Once upon a time", model="moe", max_tokens=24, ignore_eos=True)
        assert len(first.result().token_ids) == 24
        assert len(second.result().token_ids) == 24
        assert {m["name"] for m in c.ps()} == {tiny_path.stem, "moe"}


def test_a_model_that_cannot_load_is_refused_and_the_other_stream_goes_on(daemon):
    with Client(daemon.socket) as c, Client(daemon.socket) as other:
        stream = other.submit("Hello", max_tokens=40, ignore_eos=True)
        with pytest.raises(ServerError, match="'broken' cannot be loaded: ") as err:
            c.generate("Hello", model="broken", max_tokens=4)
        assert err.value.code == "E_MODEL_001"
        with pytest.raises(ServerError, match="'gpt-4' not found; available: ") as err:
            c.tokenize("Hello", model="gpt-4")
        assert "moe" in str(err.value)
        assert len(stream.result().token_ids) == 40


def test_tokenize_detokenize_and_embed_name_their_model(daemon, models_dir):
    with Client(daemon.socket) as c:
        ids = c.tokenize("Hello world", add_special=False, model="moe")
        assert c.detokenize(ids, model="moe").strip() == "Hello world"
        vectors = c.embed(["Hello", "world"], model="moe").vectors
        assert vectors.shape[0] == 2 and np.allclose(np.linalg.norm(vectors, axis=1), 1.0)


def test_bad_model_fields_are_refused_by_name(daemon):
    with Client(daemon.socket) as c:
        for bad in ("", "x" * 300):
            with pytest.raises(ServerError, match="model must be a model's name") as err:
                c.generate("Hello", model=bad, max_tokens=2)
            assert err.value.code == "E_PROTO_003"
        with pytest.raises(ServerError, match="keep_alive must be a number"):
            c.load("moe", keep_alive=float("nan"))


def test_callers_waiting_for_one_load_all_get_it(daemon):
    with Client(daemon.socket) as c:
        unloaded(c, "moe")
    results: list[int] = []

    def one() -> None:
        with Client(daemon.socket) as c:
            results.append(len(c.generate("Hi", model="moe", max_tokens=6,
                                          ignore_eos=True).token_ids))

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [6, 6, 6]
    assert sum("uma: loading moe" in line for line in daemon.stderr) == \
        sum("uma: loaded moe in" in line for line in daemon.stderr)


def test_the_async_client_loads_and_lists(daemon):
    async def session() -> tuple[dict, set[str], int]:
        async with AsyncClient(daemon.socket) as c:
            m = await c.load("moe")
            names = {x["name"] for x in await c.ps()}
            r = await c.generate("Hi", model="moe", max_tokens=3, ignore_eos=True)
            return m, names, len(r.token_ids)

    m, names, n = asyncio.run(session())
    assert m["name"] == "moe" and "moe" in names and n == 3


def uma(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "uma", *args], capture_output=True,
                          text=True, timeout=120)


def test_the_cli_loads_lists_and_unloads(daemon):
    with Client(daemon.socket) as c:
        unloaded(c, "moe")
    done = uma("load", "moe", "--keep-alive", "600", "--socket", daemon.socket)
    assert done.returncode == 0, done.stderr
    assert "moe loaded in" in done.stderr and "kept 600 s after its last request" in done.stderr
    listing = uma("ps", "--socket", daemon.socket)
    assert listing.returncode == 0
    rows = listing.stdout.splitlines()
    assert rows[0].split() == ["NAME", "MEMORY", "REQUESTS", "IDLE", "UNTIL"]
    assert rows[1].startswith("moe ") and "unloaded in" in rows[1]
    assert "(default)" in listing.stdout
    out = uma("generate", "-p", "Hi", "--max-tokens", "3", "-m", "moe",
              "--socket", daemon.socket)
    assert out.returncode == 0, out.stderr
    assert uma("unload", "moe", "--socket", daemon.socket).returncode == 0
    refused = uma("unload", "moe", "--socket", daemon.socket)
    assert refused.returncode == 2 and "'moe' is not loaded" in refused.stderr
