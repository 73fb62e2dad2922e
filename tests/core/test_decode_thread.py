"""Every decode of a model with layers on the CPU, whichever thread and context asks, runs on
one thread: the only way to keep a single OpenMP team (csrc/decode_thread.hpp says why). A
model wholly on a GPU decodes on its caller's thread."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from uma import _core
from uma.errors import NoKVSlotError


@pytest.fixture(scope="module")
def cpu_model(tiny_path):
    """The tiny model with every layer on the CPU, whatever devices the build has."""
    m = _core.Model(tiny_path, n_gpu_layers=0)
    yield m
    m.close()


def decode_some(ctx: _core.Context, n: int) -> None:
    batch = _core.Batch(8)
    for pos in range(n):
        batch.clear()
        batch.add(100 + pos, pos, 0, logits=True)
        ctx.decode(batch)


def on_threads(model: _core.Model, n_threads: int = 2, decodes: int = 3) -> list[int]:
    """Decodes on two contexts, each from a thread of its own; returns those threads' ids."""
    callers: list[int] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            callers.append(threading.get_native_id())
            with _core.Context(model, n_ctx=256, n_threads=n_threads) as ctx:
                decode_some(ctx, decodes)
        except BaseException as exc:  # noqa: BLE001 - raised again on the test's thread
            errors.append(exc)

    for _ in range(2):
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    if errors:
        raise errors[0]
    return callers


def test_decodes_from_several_threads_run_on_one(cpu_model):
    before, _ = _core.decode_thread()
    callers = on_threads(cpu_model, decodes=3)
    calls, tid = _core.decode_thread()
    assert calls - before == 6
    assert tid not in (*callers, threading.get_native_id(), 0)
    on_threads(cpu_model, decodes=1)
    assert _core.decode_thread()[1] == tid  # the same thread for good


def test_embeddings_decode_on_it_too(cpu_model):
    before, _ = _core.decode_thread()
    with _core.Embedder(cpu_model, n_ctx=64) as embedder:
        embedder.embed([np.arange(5, 12, dtype=np.int32)])
    assert _core.decode_thread()[0] > before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_two_contexts_on_two_threads_keep_one_openmp_team(cpu_model):
    on_threads(cpu_model, n_threads=2)
    # A team's workers are started by its master and inherit its name: the team of two is the
    # decode thread and a worker (more where an earlier test asked for more threads); a team
    # per caller would have been named after the callers.
    names = [Path(task, "comm").read_text().strip()
             for task in Path("/proc/self/task").iterdir()]
    assert names.count("uma-decode") >= 2


def test_a_model_wholly_on_a_gpu_decodes_on_the_callers_thread(tiny_path, cpu_model):
    assert cpu_model.layers_on_cpu
    gpu = any(d["type"] in ("gpu", "igpu") for d in _core.devices())
    with _core.Model(tiny_path) as offloaded:  # every layer offloaded where a GPU is found
        assert offloaded.layers_on_cpu is not gpu
        before, _ = _core.decode_thread()
        on_threads(offloaded, decodes=2)
        assert _core.decode_thread()[0] - before == (0 if gpu else 4)


@pytest.mark.parametrize("layers", [0, -1], ids=["cpu", "offloaded where a GPU is"])
def test_a_failed_decode_still_says_why(tiny_path, layers):
    with _core.Model(tiny_path, n_gpu_layers=layers) as model, \
            _core.Context(model, n_ctx=256, n_batch=256, n_seq_max=2) as ctx:
        full = _core.Batch(256)  # two sequences of 128 fill the unified cache
        full.add_sequence(np.arange(1000, 1128, dtype=np.int32), 0, 0)
        full.add_sequence(np.arange(2000, 2128, dtype=np.int32), 0, 1)
        ctx.decode(full)
        one = _core.Batch(1)
        one.add(5, 128, 0, logits=True)
        # llama.cpp's reason, logged on the thread that decoded, reaches the caller
        with pytest.raises(NoKVSlotError, match="failed to find a memory slot"):
            ctx.decode(one)
