"""The daemon's model host built from its settings (uma.server.hosting): the first model under
its listing name, the directory's others loadable with the daemon's engine settings, and the
caps on models and memory taken from the settings."""

from __future__ import annotations

import shutil

import pytest

from uma import Engine, synth
from uma.config import ServerConfig
from uma.errors import ModelLoadError
from uma.server.hosting import host_for


@pytest.fixture(scope="module")
def engine(tiny_path):
    with Engine(tiny_path, n_ctx=256, n_seq_max=1, n_threads=1) as e:
        yield e


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("UMA_CACHE_DIR", str(tmp_path / "cache"))  # no fetched models listed
    shutil.copyfile(synth.cached_model("tiny-moe"), tmp_path / "moe.gguf")
    return tmp_path


def test_the_first_model_is_the_default_and_others_load_with_its_settings(engine, folder,
                                                                            tiny_path):
    host, first = host_for(engine, ServerConfig(socket="/tmp/unused.sock",
                                                models_dir=str(folder)))
    try:
        assert first == tiny_path.stem and host.find(first).engine is engine
        moe = host.load("moe").engine
        assert moe.ctx.n_ctx == engine.ctx.n_ctx and moe.config.n_seq_max == 1
    finally:
        host.close(keep=engine)
    assert [e.engine for e in host.loaded()] == [engine]  # the caller's, for it to close


def test_the_memory_cap_setting_reaches_the_host(engine, folder):
    lines: list[str] = []
    host, _ = host_for(engine, ServerConfig(socket="/tmp/unused.sock", models_dir=str(folder),
                                            max_loaded_mb=1), say=lines.append)
    try:
        with pytest.raises(ModelLoadError, match="'moe' takes .* on disk, more than the "
                                                 "1 MiB the loaded models may take"):
            host.load("moe")
    finally:
        host.close(keep=engine)
    assert lines == []  # refused before loading: nothing said
