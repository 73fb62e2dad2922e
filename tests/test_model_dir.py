"""uma.model_dir: the models on this machine, from their headers alone; names unique, each file
once, and a file that cannot be read listed with its reason rather than failing the listing."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from uma import catalog
from uma.model_dir import ModelFile, default_dir, list_models
from uma.synth import models_cache_dir

from .gguf_files import write_gguf


@pytest.fixture(autouse=True)
def no_catalogue_models(tmp_path, monkeypatch):
    """The model cache (where the catalogue's models are fetched) empty, in tmp_path."""
    monkeypatch.setenv("UMA_CACHE_DIR", str(tmp_path / "cache"))


def names(listing) -> list[str]:
    return [m.name for m in listing]


def test_a_model_is_described_from_its_header(tmp_path, model, tiny_path):
    [m] = list_models(tmp_path, [tiny_path])
    assert m == ModelFile(
        name=tiny_path.stem, path=tiny_path, size=os.path.getsize(tiny_path),
        modified=os.path.getmtime(tiny_path), architecture=model.architecture,
        quantization="F32", context_length=model.n_ctx_train, n_params=model.n_params)
    assert m.usable
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.name = "other"  # type: ignore[misc]


def test_the_directory_lists_its_gguf_files_by_name(tmp_path):
    for name in ("b.gguf", "a.gguf", "C.GGUF"):
        write_gguf(tmp_path / name)
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "folder.gguf").mkdir()
    write_gguf(tmp_path / ".a.gguf.part")  # a download in progress
    write_gguf(tmp_path / ".hidden.gguf")
    assert names(list_models(tmp_path)) == ["C", "a", "b"]


def test_a_split_model_is_listed_once_by_its_first_part(tmp_path):
    for part in (1, 2, 3):
        write_gguf(tmp_path / f"big-0000{part}-of-00003.gguf", extra={"split.count": 3})
    [m] = list_models(tmp_path)
    assert m.name == "big-00001-of-00003" and m.usable
    assert m.n_params is None  # the other parts hold the rest


def test_names_are_unique_and_a_file_is_listed_once(tmp_path):
    write_gguf(tmp_path / "m.gguf")
    (tmp_path / "other").mkdir()
    elsewhere = write_gguf(tmp_path / "other" / "m.gguf")
    listing = list_models(tmp_path, [elsewhere, tmp_path / "m.gguf", elsewhere])
    assert [(m.name, m.path) for m in listing] == [("m", elsewhere), ("m-2", tmp_path / "m.gguf")]


def test_fetched_catalogue_models_come_under_their_names(tmp_path, monkeypatch):
    models_cache_dir().mkdir(parents=True)
    fetched = write_gguf(models_cache_dir() / "Mini-1B.Q8_0.gguf")
    entry = dataclasses.replace(catalog.CATALOG["smollm2"], name="mini",
                                filename=fetched.name, size=fetched.stat().st_size)
    monkeypatch.setitem(catalog.CATALOG, "mini", entry)
    assert default_dir() == fetched.parent
    # from the catalogue, from the directory and named: one file, one name
    for listing in (list_models(tmp_path), list_models(), list_models(tmp_path, [fetched])):
        assert [(m.name, m.path.resolve()) for m in listing] == [("mini", fetched.resolve())]


def test_quantization_is_the_file_type_else_the_weights_type(tmp_path):
    write_gguf(tmp_path / "q.gguf", file_type=gguf.LlamaFileType.MOSTLY_Q4_K_M)
    write_gguf(tmp_path / "guessed.gguf", file_type=gguf.LlamaFileType.MOSTLY_Q8_0 | 1024)
    write_gguf(tmp_path / "untold.gguf", file_type=None, tensors={
        "big": np.zeros((64, 64), np.float16), "norm": np.zeros(64, np.float32)})
    assert {m.name: m.quantization for m in list_models(tmp_path)} == {
        "q": "Q4_K_M", "guessed": "Q8_0", "untold": "F16"}


def test_what_cannot_be_served_is_listed_with_its_reason(tmp_path):
    whole = write_gguf(tmp_path / "good.gguf").read_bytes()
    (tmp_path / "cut-in-data.gguf").write_bytes(whole[:-100])
    (tmp_path / "cut-in-header.gguf").write_bytes(whole[:60])
    (tmp_path / "random.gguf").write_bytes(np.random.default_rng(0).bytes(4096))
    (tmp_path / "empty.gguf").write_bytes(b"")
    write_gguf(tmp_path / "vocab-only.gguf", tensors={})
    (tmp_path / "dangling.gguf").symlink_to(tmp_path / "gone.gguf")  # no file: not listed
    listing = list_models(tmp_path, [tmp_path / "missing.gguf"])
    errors = {m.name: m.error for m in listing}
    assert errors.pop("good") is None
    assert errors == {
        "missing": "No such file or directory",
        "cut-in-data": f"cut short: {len(whole) - 100} bytes of the {len(whole)} its header "
                       f"describes",
        "cut-in-header": "its header runs past the end of the file (60 bytes)",
        "empty": "not a GGUF file (it starts with b'')",
        "random": errors["random"],
        "vocab-only": "it holds no weights (a tokenizer-only file?)",
    }
    assert errors["random"].startswith("not a GGUF file")
    broken = [m for m in listing if m.name != "good"]
    assert not any(m.usable or m.architecture or m.quantization for m in broken)


def test_a_file_changed_in_place_is_read_again(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", context_length=2048)
    assert list_models(tmp_path)[0].context_length == 2048
    write_gguf(path, context_length=8192, tensors={"t": np.zeros((64, 64), np.float32)})
    assert list_models(tmp_path)[0].context_length == 8192


def test_a_missing_directory_adds_nothing(tmp_path):
    assert list_models(tmp_path / "nowhere") == ()
    assert list_models() == ()  # the model cache, before anything was fetched


def test_a_directory_given_with_a_tilde_is_the_users(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write_gguf(tmp_path / "m.gguf")
    assert names(list_models("~")) == ["m"]
    assert list_models("~")[0].path == Path(tmp_path / "m.gguf")
