"""Shared fixtures: tiny synthetic models written once per machine (seeded, cached)."""

from __future__ import annotations

import pytest

from uma import _core, synth


@pytest.fixture(scope="session")
def tiny_path():
    """A 2-layer llama with random weights and the real Llama-2 (SPM) tokenizer."""
    return synth.cached_model("tiny")


@pytest.fixture(scope="session")
def tiny_moe_path():
    return synth.cached_model("tiny-moe")


@pytest.fixture(scope="session")
def model(tiny_path):
    m = _core.Model(tiny_path)
    yield m
    # Contexts made by tests are closed by then; close() refuses otherwise.
    m.close()


@pytest.fixture(scope="session")
def vocab_model():
    m = _core.Model(synth.vocab_path("llama-spm"), vocab_only=True)
    yield m
    m.close()
