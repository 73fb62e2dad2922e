"""The model host: loads on demand, one load shared by its callers, keep-alive, LRU under the
caps, never unloading a model under its requests; on stand-in engines for the rules, and on
the real core for two models serving at once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from uma import Engine, synth
from uma.errors import ModelBusyError, ModelLoadError, ModelNotFoundError
from uma.host import ModelHost
from uma.model_dir import ModelFile


class StandIn:
    """An engine as the host sees it: its requests and its memory, and whether it closed."""

    def __init__(self, name: str, memory: int = 100) -> None:
        self.name = name
        self.busy = 0
        self.memory = memory
        self.closed = False

    def status(self) -> dict[str, object]:
        return {"memory": {"model_bytes": self.memory, "kv_bytes": 0}}

    def requests_in_flight(self) -> int:
        return self.busy

    def close(self) -> None:
        self.closed = True


def listing(*names: str, size: int = 100, broken: str = "") -> list[ModelFile]:
    return [ModelFile(n, Path(f"/models/{n}.gguf"), size, 0.0,
                      error="not a GGUF file" if n == broken else None) for n in names]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def host_of(*names: str, **kw) -> tuple[ModelHost, dict[str, StandIn], Clock]:
    opened: dict[str, StandIn] = {}
    clock = Clock()

    def open_model(file: ModelFile, progress=None) -> StandIn:
        opened[file.name] = StandIn(file.name)
        return opened[file.name]

    files = listing(*names, **{k: kw.pop(k) for k in ("size", "broken") if k in kw})
    return ModelHost(open_model, lambda: files, clock=clock, **kw), opened, clock


def test_a_model_is_loaded_on_first_use_and_then_reused():
    host, opened, _ = host_of("chat", "coder")
    with host.use("coder") as engine:
        assert engine is opened["coder"]
    with host.use("coder:latest") as again:  # Ollama's tag names the same model
        assert again is engine
    assert list(opened) == ["coder"]
    assert [e.name for e in host.loaded()] == ["coder"]


def test_callers_of_a_model_loading_wait_for_the_one_load():
    entered, release = threading.Event(), threading.Event()
    calls = []

    def open_model(file: ModelFile, progress=None) -> StandIn:
        calls.append(file.name)
        entered.set()
        release.wait()
        return StandIn(file.name)

    files = listing("chat")
    host = ModelHost(open_model, lambda: files)
    got: list[object] = []
    first = threading.Thread(target=lambda: got.append(host.load("chat").engine))
    first.start()
    entered.wait()
    second = threading.Thread(target=lambda: got.append(host.load("chat").engine))
    second.start()
    release.set()
    first.join()
    second.join()
    assert calls == ["chat"]
    assert got[0] is got[1]


def test_an_unknown_model_names_the_available_ones_and_a_broken_one_says_why():
    host, _, _ = host_of("chat", "coder", "bad", broken="bad")
    with pytest.raises(ModelNotFoundError, match="'gpt-4' not found; available: chat, coder"):
        host.load("gpt-4")
    with pytest.raises(ModelLoadError, match="'bad' cannot be loaded: not a GGUF file"):
        host.load("bad")
    assert host.loaded() == []


def test_a_failed_load_reaches_every_caller_and_the_next_call_tries_again():
    attempts = []

    def open_model(file: ModelFile, progress=None) -> StandIn:
        attempts.append(file.name)
        if len(attempts) == 1:
            raise ModelLoadError("out of memory")
        return StandIn(file.name)

    files = listing("chat")
    host = ModelHost(open_model, lambda: files)
    with pytest.raises(ModelLoadError, match="out of memory"):
        host.load("chat")
    assert host.load("chat").name == "chat"
    assert attempts == ["chat", "chat"]


def test_idle_models_are_unloaded_past_their_keep_alive_and_busy_ones_are_not():
    host, opened, clock = host_of("chat", "coder", "embed", keep_alive_s=300.0)
    host.load("chat")
    host.load("coder", keep_alive_s=60.0)  # a request's own keep-alive
    host.load("embed", keep_alive_s=None)  # kept until unloaded
    clock.now += 61
    assert host.expire() == ["coder"]
    assert opened["coder"].closed
    opened["chat"].busy = 1
    clock.now += 300
    assert host.expire() == []  # its request is running
    opened["chat"].busy = 0
    assert host.expire() == ["chat"]
    clock.now += 10**6
    assert host.expire() == []
    assert [e.name for e in host.loaded()] == ["embed"]


def test_a_use_counts_from_its_end_and_holds_the_model_until_then():
    host, opened, clock = host_of("chat", keep_alive_s=10.0)
    with host.use("chat"):
        clock.now += 60
        assert host.expire() == []  # between asking for it and submitting: held
    assert host.expire() == []  # its keep-alive counts from the end of that use
    clock.now += 10
    assert host.expire() == ["chat"]


def test_the_least_recently_used_idle_model_makes_room():
    host, opened, clock = host_of("a", "b", "c", max_loaded=2)
    host.load("a")
    clock.now += 1
    host.load("b")
    clock.now += 1
    host.load("a")  # used again: b is now the least recent
    clock.now += 1
    host.load("c")
    assert opened["b"].closed and not opened["a"].closed
    assert sorted(e.name for e in host.loaded()) == ["a", "c"]


def test_a_model_with_requests_is_never_pushed_out():
    host, opened, clock = host_of("a", "b", "c", max_loaded=2)
    host.load("a")
    clock.now += 1
    host.load("b")
    opened["a"].busy = 1  # the least recent, but running
    host.load("c")
    assert opened["b"].closed and not opened["a"].closed
    opened["c"].busy = 1
    with pytest.raises(ModelBusyError, match=r"'b' cannot be loaded now: 2 models are loaded "
                                             r"and every one has requests \((a, c|c, a)\)"):
        host.load("b")


def test_the_memory_cap_pushes_models_out_and_refuses_one_too_large():
    host, opened, clock = host_of("a", "b", "c", memory_cap=250, size=100)
    host.load("a")
    opened["a"].memory = 120  # weights and KV cache, as the engine reports them loaded
    clock.now += 1
    host.load("b")  # 120 + 100 on disk fit
    opened["b"].memory = 120
    clock.now += 1
    host.load("a")
    host.load("c")  # 240 + 100 do not: b, the least recent, goes
    assert opened["b"].closed and not opened["a"].closed
    files = listing("big", size=300)
    big = ModelHost(lambda f, _: StandIn(f.name), lambda: files, memory_cap=250)
    with pytest.raises(ModelLoadError, match="'big' takes 300 bytes on disk, more than the "
                                             "250 bytes the loaded models may take"):
        big.load("big")


def test_unload_refuses_a_model_with_requests_and_one_not_loaded():
    host, opened, _ = host_of("chat")
    with pytest.raises(ModelNotFoundError, match="'chat' is not loaded"):
        host.unload("chat")
    host.load("chat")
    opened["chat"].busy = 2
    with pytest.raises(ModelBusyError, match="'chat' has requests queued or running"):
        host.unload("chat")
    assert not opened["chat"].closed
    opened["chat"].busy = 0
    host.unload("chat:latest")
    assert opened["chat"].closed and host.loaded() == []


def test_a_model_given_at_start_stays_until_unloaded():
    host, _, clock = host_of("other")
    first = StandIn("first")
    host.add(first, listing("first")[0])
    clock.now += 10**6
    assert host.expire() == []
    with host.use("first") as engine:
        assert engine is first


# --- the real core ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_models(tiny_path):
    return [ModelFile("tiny", Path(tiny_path), Path(tiny_path).stat().st_size, 0.0),
            ModelFile("tiny-moe", Path(synth.cached_model("tiny-moe")), 1, 0.0)]


def test_two_real_models_serve_at_once_and_unload_only_when_idle(two_models):
    host = ModelHost(lambda f, _: Engine(f.path, n_ctx=256, n_seq_max=2), lambda: two_models)
    try:
        with host.use("tiny") as dense, host.use("tiny-moe") as moe:
            first = dense.submit("Once upon a time", max_tokens=16)
            second = moe.submit("Hello", max_tokens=8)
            with pytest.raises(ModelBusyError):  # in use: held, its request queued
                host.unload("tiny")
        assert len(first.result().token_ids) == 16
        assert len(second.result().token_ids) == 8
        host.unload("tiny")
        assert [e.name for e in host.loaded()] == ["tiny-moe"]
        with host.use("tiny") as again:  # loaded again, on demand
            assert len(again.generate("Once", max_tokens=4).token_ids) == 4
    finally:
        host.close()
    assert host.loaded() == []
