"""uma.gguf_header: a GGUF file's header read without its weights, as llama.cpp reads it, and
every damaged file refused with InvalidModelError (never another exception)."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uma.errors import InvalidModelError
from uma.gguf_header import read_header

from .gguf_files import write_gguf


def test_a_model_reads_as_llama_cpp_loads_it(model, tiny_path):
    header = read_header(tiny_path)
    arch = header.text("general.architecture")
    assert arch == model.architecture
    assert header.integer(f"{arch}.context_length") == model.n_ctx_train
    assert sum(t.n_elements for t in header.tensors) == model.n_params
    assert header.data_end() == os.path.getsize(tiny_path)


def test_arrays_are_read_only_where_asked(model, tiny_path):
    skipped = read_header(tiny_path).kv["tokenizer.ggml.tokens"]
    assert skipped.value is None and skipped.length == model.n_vocab
    tokens = read_header(tiny_path, arrays=lambda key: key == "tokenizer.ggml.tokens")
    pieces = tokens.get("tokenizer.ggml.tokens")
    assert len(pieces) == model.n_vocab and all(type(p) is bytes for p in pieces)


def test_tensors_keep_ggml_order_and_type(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", tensors={
        "a": np.zeros((3, 5), np.float32), "b": np.zeros(7, np.float16)})
    a, b = read_header(path).tensors
    assert (a.name, a.shape, a.type) == ("a", (5, 3), 0)  # row length first; 0: F32
    assert (b.name, b.shape, b.type) == ("b", (7,), 1)  # 1: F16


@pytest.mark.parametrize("content, words", [
    (b"", "not a GGUF file (it starts with b'')"),
    (b"PK\x03\x04 a zip file", "not a GGUF file (it starts with b'PK\\x03\\x04')"),
    (b"GGUF", "runs past the end"),
    (b"GGUF\x01\x00\x00\x00" + bytes(16), "GGUF version 1"),
    (b"GGUF\x00\x00\x00\x03" + bytes(16), "big-endian"),
    (b"GGUF\x03\x00\x00\x00" + (1 << 40).to_bytes(8, "little") + bytes(8), "more than"),
])
def test_what_is_not_a_gguf_header_is_named(tmp_path, content, words):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(InvalidModelError) as e:
        read_header(path)
    assert words in str(e.value)


def test_every_cut_of_a_header_is_refused(tmp_path):
    whole = write_gguf(tmp_path / "m.gguf").read_bytes()
    end = read_header(tmp_path / "m.gguf").data_offset
    cut = tmp_path / "cut.gguf"
    for n in range(4, end - 32):  # the last bytes before the data are alignment padding
        cut.write_bytes(whole[:n])
        with pytest.raises(InvalidModelError):
            read_header(cut)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A valid file's bytes, and a path to write damaged copies to."""
    folder = tmp_path_factory.mktemp("fuzz")
    return write_gguf(folder / "m.gguf").read_bytes(), folder / "damaged.gguf"


@settings(max_examples=300, deadline=None)
@given(noise=st.binary(max_size=512), at=st.integers(min_value=0, max_value=400))
def test_damaged_bytes_give_a_header_or_invalid_model_error(scratch, noise, at):
    valid, path = scratch
    damaged = bytearray(valid)
    damaged[at:at + len(noise)] = noise
    path.write_bytes(bytes(damaged))
    with contextlib.suppress(InvalidModelError):  # anything else fails the test
        read_header(path, arrays=lambda key: True)
