"""The online tick cost model: what it learns and how the policies ask it for prompt room."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from uma.sched.cost import CostEstimate, CostModel, attended

TRUE = CostEstimate(fixed_ms=3.0, per_prefill_ms=0.6, per_decode_ms=1.2, per_kv_kpos_ms=0.08,
                    per_prompt_kv_kpos_ms=0.05, prefill_step_ms=1.5)


def test_attended_counts_the_cache_and_the_causal_chunk():
    assert attended(0, 1) == 1
    assert attended(100, 1) == 101  # a decode token sees the cache and itself
    assert attended(0, 4) == 1 + 2 + 3 + 4
    assert attended(10, 3) == 11 + 12 + 13


def test_the_model_learns_a_known_cost_with_attention_from_varied_ticks():
    rng = np.random.default_rng(0)
    model = CostModel()
    for _ in range(400):
        decode, depth = rng.integers(0, 9), rng.integers(0, 4000)
        prefill = rng.integers(1, 300) if rng.random() < 0.5 else 0  # half the ticks decode only
        kv, pkv = decode * rng.integers(1, 3000), attended(int(depth), int(prefill))
        model.observe(int(prefill), int(decode), kv,
                      TRUE.predict(int(prefill), int(decode), kv, pkv) + rng.normal(0, 0.05), pkv)
    est = model.estimate
    assert abs(est.per_prefill_ms - TRUE.per_prefill_ms) < 0.02
    assert abs(est.per_decode_ms - TRUE.per_decode_ms) < 0.1
    assert abs(est.per_kv_kpos_ms - TRUE.per_kv_kpos_ms) < 0.005
    assert abs(est.per_prompt_kv_kpos_ms - TRUE.per_prompt_kv_kpos_ms) < 0.005
    assert abs(est.prefill_step_ms - TRUE.prefill_step_ms) < 0.2
    assert model.error_ewma_ms < 0.2
    assert est.samples == 400


def test_the_first_chunk_of_a_tick_pays_the_step():
    assert TRUE.prefill_ms(10, 0) == TRUE.prefill_ms(10, 0, first=False) + 1.5
    assert TRUE.chunk_tokens(1.0, 0) == 0  # saved-up time below the step buys nothing
    assert TRUE.chunk_tokens(1.0, 0, first=False) == 1
    assert TRUE.predict(1, 0) - TRUE.predict(0, 0) == pytest.approx(0.6 + 1.5)


def test_less_of_a_prompt_fits_a_tick_deep_into_it():
    assert TRUE.max_prefill(50.0, 2, 3000, depth=3000) < TRUE.max_prefill(50.0, 2, 3000, 0)
    flat = CostEstimate(fixed_ms=3.0, per_prefill_ms=0.6, per_decode_ms=1.2)
    assert flat.max_prefill(50.0, 2, 0, depth=3000) == flat.max_prefill(50.0, 2, 0, 0) == 74


@given(budget=st.floats(0, 500), decode=st.integers(0, 32), depth=st.integers(0, 30000),
       per_kv=st.floats(0, 1), per_prompt_kv=st.floats(0, 1))
def test_max_prefill_is_the_largest_chunk_within_budget(budget, decode, depth, per_kv,
                                                        per_prompt_kv):
    est = CostEstimate(fixed_ms=2.0, per_prefill_ms=0.3, per_decode_ms=1.0,
                       per_kv_kpos_ms=per_kv, per_prompt_kv_kpos_ms=per_prompt_kv)
    kv = decode * 500
    c = est.max_prefill(budget, decode, kv, depth)

    def cost(n):  # the chunk reads the cache before it once
        return est.predict(n, decode, kv + (depth if n else 0), attended(depth, n))

    if c == 0:
        assert cost(1) > budget - 1e-6 or est.predict(0, decode, kv) >= budget
    else:
        assert cost(c) <= budget + 1e-6
        assert cost(c + 1) > budget - 1e-6


def test_a_calibrated_model_keeps_the_prompt_cost_ticks_alike_do_not_show():
    # A GPU-like device: a prompt token costs 0.04 ms, leaving the decode graph 1.4 ms. In a
    # storm every tick is 8 decoders and 1 prompt token, which cannot tell the two apart.
    gpu = CostEstimate(fixed_ms=2.5, per_prefill_ms=0.04, per_decode_ms=0.05,
                       prefill_step_ms=1.4)
    calibrated, generic = CostModel(), CostModel()
    calibrated.calibrate([(p, d, 0, 0, gpu.predict(p, d)) for p, d in [(0, 1), (0, 4), (8, 0),
                                                                       (64, 0)]])
    assert calibrated.estimate.prefill_ms(64, 0) == pytest.approx(gpu.prefill_ms(64, 0), rel=0.01)
    rng = np.random.default_rng(0)
    for _ in range(500):
        ms = gpu.predict(1, 8) + rng.normal(0, 0.1)
        for model in (calibrated, generic):
            model.observe(1, 8, 0, ms)
    # Both fit the storm's ticks; only the calibrated one still prices a real chunk.
    for model in (calibrated, generic):
        assert model.estimate.predict(1, 8) == pytest.approx(gpu.predict(1, 8), abs=0.1)
    assert calibrated.estimate.prefill_ms(64, 0) == pytest.approx(gpu.prefill_ms(64, 0),
                                                                  rel=0.15)
    assert generic.estimate.prefill_ms(64, 0) > 5 * gpu.prefill_ms(64, 0)


def test_a_prompt_chunk_reads_the_cache_before_it_once():
    # CPU-like: reading 1k cache positions costs 10 ms, scoring 1k positions per token 1 ms
    # (the 134M model on two cores: one token 1,500 deep costs 17 ms, each further one ~3).
    cpu = CostEstimate(fixed_ms=7.0, per_prefill_ms=2.0, per_decode_ms=3.0, per_kv_kpos_ms=10.0,
                       per_prompt_kv_kpos_ms=1.0)
    assert cpu.prefill_ms(1, 1500) - cpu.prefill_ms(1, 0) == pytest.approx(15.0 + 1.5)
    # deep into a prompt, a larger chunk is far cheaper per token: the read is shared
    assert cpu.prefill_ms(8, 1500) / 8 < cpu.prefill_ms(1, 1500) / 3
    # what a tick's spare buys: nothing where it does not cover the read
    assert cpu.chunk_tokens(14.0, 1500, first=False) == 0
    n = cpu.chunk_tokens(30.0, 1500, first=False)
    assert cpu.prefill_ms(n, 1500, False) <= 30.0 < cpu.prefill_ms(n + 1, 1500, False)


def test_amortising_tokens_is_the_fewest_whose_work_covers_the_overhead():
    cpu = CostEstimate(fixed_ms=7.0, per_prefill_ms=2.0, per_decode_ms=3.0, per_kv_kpos_ms=10.0,
                       per_prompt_kv_kpos_ms=1.0, prefill_step_ms=0.5)
    for depth in (0, 600, 3000):
        n = cpu.amortising_tokens(depth)
        overhead = cpu.chunk_overhead_ms(depth)
        assert cpu.prefill_ms(n, depth) - overhead >= overhead
        assert n == 1 or cpu.prefill_ms(n - 1, depth) - overhead < overhead
    assert cpu.amortising_tokens(3000, factor=2.0) > cpu.amortising_tokens(3000)
    assert CostEstimate(per_kv_kpos_ms=0.0).amortising_tokens(500, first=False) == 1


def test_decode_rows_and_prompt_tokens_pay_for_attention_apart():
    # The same CPU-like device. A storm's ticks are mostly three decoders whose caches grow;
    # one in twenty-five carries two tokens deep into a prompt, which read the cache before
    # them once and score it per token.
    cpu = CostEstimate(fixed_ms=7.0, per_prefill_ms=2.0, per_decode_ms=3.0, per_kv_kpos_ms=10.0,
                       per_prompt_kv_kpos_ms=1.0, prefill_step_ms=0.5)
    shapes = [(0, 1, 1, 0, 0), (0, 4, 4, 0, 0), (1, 0, 0, 0, 0), (8, 0, 0, 0, 0),
              (64, 0, 0, 0, 0), (1, 0, 0, 256, 0), (8, 0, 0, 256, 0), (0, 1, 257, 0, 0)]
    model = CostModel()
    model.calibrate([(p, d, kv + depth, attended(depth, p), cpu.predict(
        p, d, kv + depth, attended(depth, p))) for p, d, kv, depth, _ in shapes])
    rng = np.random.default_rng(0)
    for t in range(1000):
        prompt, depth = (2, 1000 + t) if t % 25 == 0 else (0, 0)
        kv, pkv = 3 * (40 + t % 120) + depth, attended(depth, prompt)
        model.observe(prompt, 3, kv, cpu.predict(prompt, 3, kv, pkv) * rng.uniform(0.95, 1.1),
                      pkv)
    est = model.estimate
    assert est.prefill_ms(2, 2000) == pytest.approx(cpu.prefill_ms(2, 2000), rel=0.15)
    assert est.prefill_ms(1, 100) == pytest.approx(cpu.prefill_ms(1, 100), rel=0.25)
    assert est.predict(0, 3, 480) == pytest.approx(cpu.predict(0, 3, 480), rel=0.1)
    # the read is not mistaken for a step: a shallow chunk is not charged a deep one's read
    assert est.prefill_step_ms < 2.0
