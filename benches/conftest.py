"""Fixtures for the micro-benchmarks: the same cached synthetic models the tests use."""

import pytest

from uma import _core, synth


@pytest.fixture(scope="session")
def tiny_model():
    with _core.Model(synth.cached_model("tiny")) as m:
        yield m
