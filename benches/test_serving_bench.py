"""Micro-benchmarks of the serving hot paths above the core: wire framing, one policy plan at
1/64/256 sequences, and a whole engine tick on the tiny model (timed and reported; CI compares
them against a committed baseline with benches/regress.py, never against a wall-clock bound)."""

import dataclasses

import pytest

import uma
from uma import synth
from uma.sched.cost import CostEstimate, row_steps
from uma.sched.policies import create_policy
from uma.sched.state import Phase, Priority, SchedulerState, SessionView
from uma.wire import framing, protocol


def test_reference_calibration(benchmark):
    """Not a hot path: a fixed mix of Python and numpy work, the yardstick every other result
    is divided by (benches/regress.py), so a slower or faster CI machine cancels out."""
    import numpy as np

    data = np.arange(20000, dtype=np.float64)

    def work():
        total = 0
        for i in range(2000):
            total += i * i % 7
        return total + float(np.sort(data[::-1])[5])

    benchmark(work)


def test_frame_token_event_roundtrip(benchmark):
    decoder = framing.FrameDecoder()
    event = protocol.token_event("req-1", " hello", [15043], [-0.25])

    def roundtrip():
        return decoder.feed(framing.encode(event))

    assert benchmark(roundtrip) == [event]


def _state(n: int) -> SchedulerState:
    sessions = tuple(
        SessionView(seq_id=i, rid=i, phase=Phase.DECODE if i % 4 else Phase.PREFILL,
                    priority=Priority.INTERACTIVE if i % 3 else Priority.BACKGROUND,
                    n_prompt=500, n_prefilled=500 if i % 4 else 100, n_generated=10,
                    n_past=510 if i % 4 else 100, arrival_ns=i, first_token_ns=0,
                    last_token_ns=0)
        for i in range(n))
    return SchedulerState(now_ns=0, sessions=sessions, n_waiting=0, n_batch=512,
                          n_seq_max=256, decode_ms_ewma=8.0,
                          cost=CostEstimate(fixed_ms=2.0, per_prefill_ms=0.5, per_decode_ms=1.0,
                                            per_kv_kpos_ms=0.3, row_steps_ms=row_steps(r8=1.0)),
                          tick=7,
                          last_tick_ms=8.0, last_tick_tokens=n, memory=None)


@pytest.mark.parametrize("policy", ["bound", "baseline"])
@pytest.mark.parametrize("n", [1, 64, 256])
def test_plan_one_tick(benchmark, policy, n):
    p = create_policy(policy)
    state = _state(n)
    plan = p.schedule_tick(state)  # the memory a running policy would carry
    state = dataclasses.replace(state, memory=plan.memory)
    assert benchmark(p.schedule_tick, state).items


def test_engine_64_ticks_8_streams_tiny(benchmark):
    """Whole ticks (plan, batch, decode, sample, apply, events): 8 streams of 64 tokens each
    after one-token prompts, so about 65 ticks of 8 decoders."""
    with uma.Engine(synth.cached_model("tiny"), n_ctx=4096, n_seq_max=8, n_threads=2) as eng:
        prompts = [[1, 100 + i] for i in range(8)]

        def run():
            handles = [eng.submit(p, max_tokens=64, ignore_eos=True) for p in prompts]
            return sum(len(h.result().token_ids) for h in handles)

        assert benchmark.pedantic(run, rounds=10, warmup_rounds=1) == 8 * 64
