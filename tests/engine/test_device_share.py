"""Two engines (two models) sharing the device, on the real core with tiny synthetic models:
while one serves an interactive stream, the other's background work runs only inside the
grants of the first one's plan (never at the same time as its ticks), and still makes
progress; with no stream anywhere both run freely."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from uma import Engine
from uma.engine.device_share import DeviceShare

LONG = " ".join(f"word{i}" for i in range(350))  # about 1,300 tokens


def recorded(engine: Engine, name: str, log: list) -> None:
    """Records (name, start, end) of each of the engine's streams-context decodes."""
    runner = engine._scheduler.runner
    run = runner.run
    lock = threading.Lock()

    def timed(*args, **kw):
        start = time.perf_counter()
        try:
            return run(*args, **kw)
        finally:
            with lock:
                log.append((name, start, time.perf_counter()))

    runner.run = timed


@pytest.fixture
def pair(tiny_path, tiny_moe_path):
    share = DeviceShare()
    with Engine(tiny_path, n_ctx=2048, n_seq_max=2, n_threads=1) as a, \
            Engine(tiny_moe_path, n_ctx=2048, n_seq_max=2, n_threads=1,
                   calibrate=False) as b:
        a.share_device(share)
        b.share_device(share)
        yield a, b, share


def test_background_work_on_one_model_runs_only_in_the_other_models_grants(pair):
    a, b, share = pair
    log: list[tuple[str, float, float]] = []
    recorded(a, "a", log)
    recorded(b, "b", log)
    b._contexts.member.trace = []
    stream = a.submit("Once upon a time", max_tokens=200, ignore_eos=True)
    times = []
    job = None
    for _ in stream:
        times.append(time.perf_counter())
        if len(times) == 5:  # the stream decodes: now the background job arrives
            job = b.submit(LONG, max_tokens=8, ignore_eos=True, priority="background")
    assert job is not None and stream.result().finish_reason == "length"
    first, last = times[4], times[-1]
    a_ticks = [(s, e) for n, s, e in log if n == "a" and first <= s and e <= last]
    b_ticks = [(s, e) for n, s, e in log if n == "b" and first <= s and e <= last]
    assert b_ticks, "the background job made no progress while the stream ran"
    for bs, be in b_ticks:
        assert not any(s < be and bs < e for s, e in a_ticks), "the two models decoded at once"
    assert b._contexts.member.trace  # its ticks ran in grants
    assert len(job.result().token_ids) == 8


def test_with_no_stream_anywhere_both_run_freely(pair):
    a, b, _ = pair
    b._contexts.member.trace = []
    first = a.submit(LONG, max_tokens=4, ignore_eos=True, priority="background")
    second = b.submit(LONG, max_tokens=4, ignore_eos=True, priority="background")
    assert len(first.result().token_ids) == 4 and len(second.result().token_ids) == 4
    assert b._contexts.member.trace == []  # no grant needed: no one led


def test_a_closed_engine_leaves_the_share(tiny_path):
    share = DeviceShare()
    with Engine(tiny_path, n_ctx=256, n_seq_max=1, n_threads=1) as e:
        e.share_device(share)
        assert share.members == 1
    assert share.members == 0


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own priority is Linux's")
def test_a_model_beside_others_is_read_at_idle_priority_and_serves_at_normal(tiny_moe_path):
    from uma.config import EngineConfig

    seen: list[int] = []

    def progress(fraction: float) -> bool:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return True

    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with Engine.from_config(EngineConfig(model=str(tiny_moe_path), n_ctx=256, n_seq_max=1,
                                         n_threads=1), progress=progress,
                            beside_others=True) as e:
        assert seen and set(seen) == {19}
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
        compute = e._thread.native_id
        assert os.getpriority(os.PRIO_PROCESS, compute) == mine
        assert len(e.generate("Hello", max_tokens=4, ignore_eos=True).token_ids) == 4
