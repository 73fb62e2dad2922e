"""The online tick cost model: what it learns and how the policies ask it for prompt room."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from uma.sched.cost import (
    RAGGED_EDGES,
    ROW_EDGES,
    WIDE_ROWS,
    CostEstimate,
    CostModel,
    attended,
    next_even_rows,
    ragged_span,
    row_steps,
)

TRUE = CostEstimate(fixed_ms=3.0, per_prefill_ms=0.6, per_decode_ms=1.2, per_kv_kpos_ms=0.08,
                    per_prompt_kv_kpos_ms=0.05, row_steps_ms=row_steps(r8=1.5))
# Vulkan on an H100, roughly: one prompt token beside eight decoders costs more than their
# tick, the next few cost little, and the batch pays again as it passes the kernels' size
# classes (measured: benches/chunk_cost.py).
VULKAN = CostEstimate(fixed_ms=4.0, per_prefill_ms=0.1, per_decode_ms=0.1,
                      row_steps_ms=row_steps(r8=9.0, r32=5.0, r64=10.0))
# What uma.engine.calibration times beside eight decoders: none, one token, then the batch 8 rows
# into each row class past eight.
MIXED = (0, 1, 8, 16, 32, 64, 128, 256)


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
        # half the ticks decode only; the prompt chunks' sizes spread over the row edges
        prefill = int(np.exp(rng.uniform(0, np.log(300)))) if rng.random() < 0.5 else 0
        kv, pkv = decode * rng.integers(1, 3000), attended(int(depth), int(prefill))
        model.observe(int(prefill), int(decode), kv,
                      TRUE.predict(int(prefill), int(decode), kv, pkv) + rng.normal(0, 0.05), pkv)
    est = model.estimate
    assert abs(est.per_prefill_ms - TRUE.per_prefill_ms) < 0.02
    assert abs(est.per_decode_ms - TRUE.per_decode_ms) < 0.1
    assert abs(est.per_kv_kpos_ms - TRUE.per_kv_kpos_ms) < 0.005
    assert abs(est.per_prompt_kv_kpos_ms - TRUE.per_prompt_kv_kpos_ms) < 0.005
    assert est.row_steps_ms == pytest.approx(TRUE.row_steps_ms, abs=0.3)
    assert model.error_ewma_ms < 0.2
    assert est.samples == 400


def test_the_chunk_that_takes_a_tick_past_eight_rows_pays_the_step():
    assert TRUE.prefill_ms(10, 0) == pytest.approx(TRUE.prefill_ms(10, 0, rows=10) + 1.5)
    assert TRUE.prefill_ms(8, 0) == pytest.approx(TRUE.prefill_ms(8, 0, rows=10))  # in 8 rows
    assert TRUE.chunk_tokens(1.0, 0, rows=8) == 0  # saved-up time below the step buys nothing
    assert TRUE.chunk_tokens(1.0, 0, rows=10) == 1
    assert TRUE.chunk_tokens(1.0, 0, rows=0) == 1  # one token stays within eight rows
    assert TRUE.predict(1, 8) - TRUE.predict(0, 8) == pytest.approx(0.6 + 1.5)
    assert TRUE.predict(0, 10) - TRUE.predict(0, 8) == pytest.approx(2 * 1.2 + 1.5)  # decoders too


def test_a_chunk_takes_the_largest_size_its_time_buys_past_the_kernels_size_classes():
    # Beside eight decoders: 12 ms buys the step at eight rows and fills the small class (24
    # tokens) but not the medium one's step; 20 ms buys that too and fills the medium class
    # (56), where 60 tokens would pass the large one's; 40 ms buys 160.
    assert VULKAN.chunk_tokens(8.0, 0, rows=8) == 0
    assert VULKAN.chunk_tokens(12.0, 0, rows=8) == 24
    assert VULKAN.chunk_tokens(20.0, 0, rows=8) == 56
    assert VULKAN.chunk_tokens(40.0, 0, rows=8) == 160
    assert VULKAN.prefill_ms(56, 0, rows=8) == pytest.approx(9.0 + 5.0 + 5.6)
    # the step a chunk pays is its own: after a chunk that passed it, the next pays none
    assert VULKAN.prefill_ms(4, 0, rows=12) == pytest.approx(0.4)
    assert VULKAN.chunk_overhead_ms(0, rows=8, n_tokens=60) == pytest.approx(24.0)


@given(spare=st.floats(0, 200), rows=st.integers(0, 300), depth=st.integers(0, 5000),
       steps=st.lists(st.floats(0, 20), min_size=len(ROW_EDGES), max_size=len(ROW_EDGES)))
def test_chunk_tokens_is_the_largest_chunk_its_time_buys(spare, rows, depth, steps):
    est = CostEstimate(per_prefill_ms=0.2, per_kv_kpos_ms=0.5, per_prompt_kv_kpos_ms=0.01,
                       row_steps_ms=tuple(steps))
    n = est.chunk_tokens(spare, depth, rows)
    assert est.prefill_ms(n, depth, rows) <= spare + 1e-6
    # steps are non-negative, so the price only grows with the chunk
    assert est.prefill_ms(n + 1, depth, rows) > spare - 1e-6


# ggml's CPU flash attention, roughly (134M, 2 threads): a tick of up to 64 rows scores prompt
# tokens one query row at a time, ten times what the tiled path past them costs.
CPU_FA = CostEstimate(fixed_ms=14.0, per_prefill_ms=0.5, per_decode_ms=1.6, per_kv_kpos_ms=2.0,
                      per_prompt_kv_kpos_ms=6.0, per_prompt_kv_wide_kpos_ms=0.6)


def test_a_chunk_that_takes_the_tick_past_wide_rows_scores_at_the_wide_price():
    deep = 2000
    narrow, wide = WIDE_ROWS - 3, WIDE_ROWS + 1 - 3  # beside three decoders: 64 and 65 rows
    assert CPU_FA.prefill_ms(wide, deep, rows=3) < CPU_FA.prefill_ms(32, deep, rows=3) \
        < CPU_FA.prefill_ms(narrow, deep, rows=3)
    # the time of a 9-token chunk buys one past the edge, where one price made it 9 tokens
    nine_ms = CPU_FA.prefill_ms(9, deep, rows=3)
    assert CPU_FA.chunk_tokens(nine_ms, deep, rows=3) >= wide
    one_price = dataclasses.replace(CPU_FA, per_prompt_kv_wide_kpos_ms=None)
    assert one_price.chunk_tokens(nine_ms + 1e-6, deep, rows=3) == 9
    # a tick's prediction prices its prompt tokens the same way
    assert CPU_FA.predict(wide, 3, deep, attended(deep, wide)) - CPU_FA.predict(0, 3) \
        == pytest.approx(CPU_FA.prefill_ms(wide, deep, rows=3))


@given(spare=st.floats(0, 400), rows=st.integers(0, 100), depth=st.integers(0, 5000),
       narrow=st.floats(0, 10), wide=st.floats(0, 10),
       steps=st.lists(st.floats(0, 20), min_size=len(ROW_EDGES), max_size=len(ROW_EDGES)))
def test_with_a_wide_price_chunk_tokens_is_still_the_largest_chunk_its_time_buys(
        spare, rows, depth, narrow, wide, steps):
    est = CostEstimate(per_prefill_ms=0.2, per_kv_kpos_ms=0.5, per_prompt_kv_kpos_ms=narrow,
                       per_prompt_kv_wide_kpos_ms=wide, row_steps_ms=tuple(steps))
    n = est.chunk_tokens(spare, depth, rows)
    assert n == 0 or est.prefill_ms(n, depth, rows) <= spare + 1e-6
    # past the edge the price only grows again, so no size up to one past it fits either
    for m in range(n + 1, max(n + 2, WIDE_ROWS + 2 - rows)):
        assert est.prefill_ms(m, depth, rows) > spare - 1e-6


def test_the_model_learns_the_wide_price_apart_and_calibration_ties_it_where_unseen():
    rng = np.random.default_rng(1)
    model = CostModel()
    for _ in range(400):
        decode, depth = int(rng.integers(0, 9)), int(rng.integers(0, 3000))
        prefill = int(np.exp(rng.uniform(0, np.log(200)))) if rng.random() < 0.5 else 0
        kv, pkv = decode * int(rng.integers(1, 3000)) + (depth if prefill else 0), \
            attended(depth, prefill)
        model.observe(prefill, decode, kv, CPU_FA.predict(prefill, decode, kv, pkv), pkv)
    est = model.estimate
    assert est.per_prompt_kv_kpos_ms == pytest.approx(6.0, abs=0.3)
    assert est.per_prompt_kv_wide_kpos_ms == pytest.approx(0.6, abs=0.3)
    # A short calibration without a wide tick scoring prompt tokens knows nothing of their
    # price: it takes the narrow one rather than the generic prior's (free).
    short = CostModel()
    short.calibrate([(p, d, 0, attended(100, p), CPU_FA.predict(p, d, 0, attended(100, p)))
                     for p, d in [(0, 1), (0, 4), (1, 0), (8, 0), (32, 0), (1, 8), (16, 8)]])
    assert short.estimate.per_prompt_kv_wide_kpos_ms == short.estimate.per_prompt_kv_kpos_ms > 1


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
                       row_steps_ms=row_steps(r8=1.4))
    calibrated, generic = CostModel(), CostModel()
    calibrated.calibrate([(p, d, 0, 0, gpu.predict(p, d))
                          for p, d in [(0, 1), (0, 4), (8, 0), (64, 0), (0, 8), (1, 8), (16, 8)]])
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
    assert cpu.chunk_tokens(14.0, 1500) == 0
    n = cpu.chunk_tokens(30.0, 1500)
    assert cpu.prefill_ms(n, 1500) <= 30.0 < cpu.prefill_ms(n + 1, 1500)


def test_decode_rows_and_prompt_tokens_pay_for_attention_apart():
    # The same CPU-like device. A storm's ticks are mostly three decoders whose caches grow;
    # one in twenty-five carries two tokens deep into a prompt, which read the cache before
    # them once and score it per token.
    cpu = CostEstimate(fixed_ms=7.0, per_prefill_ms=2.0, per_decode_ms=3.0, per_kv_kpos_ms=10.0,
                       per_prompt_kv_kpos_ms=1.0, row_steps_ms=row_steps(r8=0.5))
    shapes = [(0, 1, 1, 0, 0), (0, 4, 4, 0, 0), (1, 0, 0, 0, 0), (8, 0, 0, 0, 0),
              (64, 0, 0, 0, 0), (1, 0, 0, 256, 0), (8, 0, 0, 256, 0), (0, 1, 257, 0, 0)] \
        + [(p, 8, 8, 0, 0) for p in MIXED]
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
    assert sum(est.row_steps_ms) < 2.0


def test_row_steps_names_its_edges():
    assert row_steps(r8=1.4)[ROW_EDGES.index(8)] == 1.4
    assert sum(row_steps(r8=1.4)) == 1.4
    with pytest.raises(ValueError, match="no row edge at 9"):
        row_steps(r9=1.0)


def test_calibration_shapes_across_the_size_classes_price_each_step():
    shapes = [(0, 1), (0, 4), (1, 0), (8, 0), (64, 0)] + [(p, 8) for p in MIXED]
    model = CostModel()
    model.calibrate([(p, d, 0, 0, VULKAN.predict(p, d)) for p, d in shapes])
    for rows in (0, 8, 12, 40):
        for n in (1, 8, 24, 60, 200):
            assert model.estimate.prefill_ms(n, 0, rows) == pytest.approx(
                VULKAN.prefill_ms(n, 0, rows), abs=0.3), (rows, n)


# Vulkan on an H100, roughly (benches/chunk_cost.py): a tick of 32, 64, 128 or 256 rows runs
# its matrix tiles whole; between them it pays a ragged price besides the row steps.
RAGGED = dataclasses.replace(VULKAN, ragged_ms=(4.0, 6.0, 20.0, 8.0))


def test_a_tick_is_ragged_past_16_rows_where_its_rows_are_not_a_power_of_two():
    assert [ragged_span(r) for r in (8, 16, 17, 31, 32, 33, 64, 65, 128, 129, 256, 300, 512)] \
        == [-1, -1, 0, 0, -1, 1, -1, 2, -1, 3, -1, 3, -1]
    assert [next_even_rows(r) for r in (5, 16, 17, 39, 64, 70, 129)] \
        == [5, 16, 32, 64, 64, 128, 256]
    # from 32 rows to 33 the tick passes a step and turns ragged; from 63 to 64 it evens out
    assert RAGGED.predict(25, 8) - RAGGED.predict(24, 8) == pytest.approx(0.1 + 5.0 + 6.0)
    assert RAGGED.predict(56, 8) - RAGGED.predict(55, 8) == pytest.approx(0.1 - 6.0)


def test_a_chunk_that_evens_out_a_ragged_tick_costs_less_than_nothing_and_chunks_prefer_it():
    # a new 32-token prompt beside seven decoders is 39 rows; 25 more tokens make it 64
    assert RAGGED.prefill_ms(25, 0, rows=39) == pytest.approx(25 * 0.1 - 6.0)
    assert RAGGED.prefill_ms(24, 0, rows=39) == pytest.approx(24 * 0.1)
    # beside eight decoders, 20 ms buys the 56 tokens that end at 64 rows, where none of the
    # ragged sizes above 32 rows fits (they pay 6 ms more)
    assert RAGGED.prefill_ms(25, 0, rows=8) > 20.0 >= RAGGED.prefill_ms(56, 0, rows=8)
    assert RAGGED.chunk_tokens(20.0, 0, rows=8) == 56
    assert RAGGED.chunk_tokens(19.0, 0, rows=8) == 24  # 32 rows


@given(spare=st.floats(0, 200), rows=st.integers(0, 300), depth=st.integers(0, 5000),
       steps=st.lists(st.floats(0, 20), min_size=len(ROW_EDGES), max_size=len(ROW_EDGES)),
       ragged=st.lists(st.floats(0, 30), min_size=len(RAGGED_EDGES),
                       max_size=len(RAGGED_EDGES)))
def test_with_ragged_prices_chunk_tokens_is_still_the_largest_chunk_its_time_buys(
        spare, rows, depth, steps, ragged):
    est = CostEstimate(per_prefill_ms=0.2, per_kv_kpos_ms=0.5, per_prompt_kv_kpos_ms=0.01,
                       row_steps_ms=tuple(steps), ragged_ms=tuple(ragged))
    n = est.chunk_tokens(spare, depth, rows)
    assert n == 0 or est.prefill_ms(n, depth, rows) <= spare + 1e-6
    # no larger chunk fits, the even sizes past it included
    for m in [*range(n + 1, n + 80), *(next_even_rows(rows + n + k) - rows for k in (1, 100))]:
        assert est.prefill_ms(m, depth, rows) > spare - 1e-6


def test_calibration_tells_the_ragged_prices_from_the_steps():
    # uma.engine.calibration's shapes beside eight decoders: ragged ones 8 rows into each row class,
    # even ones at the top of each from 32 rows (decode rows alone and a chunk alone besides)
    shapes = [(0, 1), (0, 4), (1, 0), (8, 0), (64, 0), (0, 8), (1, 8)]
    shapes += [(total - 8, 8) for total in (16, 24, 32, 40, 64, 72, 128, 136, 256, 264)]
    model = CostModel()
    model.calibrate([(p, d, 0, 0, RAGGED.predict(p, d)) for p, d in shapes])
    est = model.estimate
    # the pairs pin the ragged prices near the truth (the shapes leave a little slack between
    # them and the steps), and the shapes between the pairs are priced as they cost
    assert est.ragged_ms == pytest.approx(RAGGED.ragged_ms, rel=0.2)
    for total in (20, 48, 100, 200):
        assert est.predict(total - 8, 8) == pytest.approx(RAGGED.predict(total - 8, 8), abs=1.0)
    assert est.predict(56, 8) < est.predict(32, 8) and est.predict(120, 8) < est.predict(64, 8)


# --- the prompt attention correction: a misprediction costs one tick --------------------------

def _device(depth_growth: float = 0.0, narrow_x: float = 6.0):
    """A device whose prompt attention the model knows nothing of: per 1000 attended positions
    2 ms in a wide tick, narrow_x times that in a narrow one (the CPU's flash attention below
    64 query rows), and dearer still deeper in (depth_growth per 1000 positions)."""
    def cost(prefill: int, decode: int, depth: int) -> float:
        rows = prefill + decode
        price = 2.0 * (1 + depth_growth * depth / 1000.0) * (narrow_x if rows <= WIDE_ROWS else 1)
        return 5.0 + 0.3 * prefill + 1.0 * decode + price * attended(depth, prefill) / 1000.0
    return cost


BELIEF = CostEstimate(fixed_ms=5.0, per_prefill_ms=0.3, per_decode_ms=1.0,
                      per_prompt_kv_kpos_ms=0.04)  # attention 50-300x too cheap


def _run_prompt(model: CostModel, device, budget_ms: float, length: int, decoders: int = 3
                ) -> list[tuple[int, int, float, float]]:
    """A prompt prefilled beside `decoders` decode rows, each chunk the largest the estimate
    says fits the budget (at least one token): (depth, chunk, predicted, measured) a tick."""
    ticks, depth = [], 0
    while depth < length:
        est = model.estimate
        spare = budget_ms - est.predict(0, decoders)
        chunk = min(length - depth, max(1, est.chunk_tokens(spare, depth, decoders)))
        predicted = est.predict(chunk, decoders, 0, attended(depth, chunk))
        measured = device(chunk, decoders, depth)
        model.observe(chunk, decoders, 0, measured, attended(depth, chunk))
        ticks.append((depth, chunk, predicted, measured))
        depth += chunk
    return ticks


@pytest.mark.parametrize("depth_growth", [0.0, 0.5])
@pytest.mark.parametrize("narrow_x", [1.0, 6.0, 50.0])
def test_an_attention_misprediction_costs_one_tick_per_path_never_a_streak(depth_growth,
                                                                            narrow_x):
    budget = 40.0
    ticks = _run_prompt(CostModel(BELIEF), _device(depth_growth, narrow_x), budget, 3000)
    # the first chunk deep enough to show the error runs long, once per path at most; after
    # it every chunk is priced at what the last one really cost
    wrong = [t for t in ticks if t[3] > 1.5 * t[2]]
    assert len(wrong) <= 2, wrong[:5]
    assert sum(chunk for _, chunk, _, _ in ticks) == 3000
    if depth_growth == 0 and narrow_x <= 6:  # where one token fits the budget at every depth,
        late = ticks[len(ticks) // 4:]  # every chunk does
        assert max(measured for *_, measured in late) <= 1.5 * budget


def test_the_correction_is_what_would_have_predicted_the_overrun_and_eases_back_slowly():
    model = CostModel(BELIEF)
    device = _device(narrow_x=6.0)
    depth, chunk = 2000, 20
    measured = device(chunk, 3, depth)
    model.observe(chunk, 3, 0, measured, attended(depth, chunk))
    again = model.estimate.predict(chunk, 3, 0, attended(depth, chunk))
    assert again == pytest.approx(measured, rel=0.05)  # the next such chunk is priced right
    extra = model.attention_extra[0]
    assert extra > 0 and model.attention_extra[1] == 0  # the narrow path's alone
    cheaper = _device(narrow_x=3.0)(chunk, 3, depth)
    model.observe(chunk, 3, 0, cheaper, attended(depth, chunk))
    assert 0.8 * extra < model.attention_extra[0] < extra  # down, but slowly
    for _ in range(200):
        model.observe(chunk, 3, 0, cheaper, attended(depth, chunk))
    assert model.estimate.predict(chunk, 3, 0, attended(depth, chunk)) \
        == pytest.approx(cheaper, rel=0.1)


def test_an_overrun_without_prompt_attention_leaves_the_correction_alone():
    model = CostModel(BELIEF)
    model.observe(0, 3, 0, 500.0)  # a decode tick stalled (a page fault)
    # a shallow chunk (136 positions: a sliver of its predicted time) stalled just the same:
    # nothing says attention did it, and raising its price for a stall priced the one-token
    # chunks of a CPU storm out of every tick
    model.observe(16, 3, 0, 500.0, attended(0, 16))
    assert model.attention_extra == [0.0, 0.0]
    # a chunk whose attention is a fair share of its time: the overrun is put down to it
    model = CostModel(BELIEF)
    model.observe(16, 3, 0, 500.0, attended(3000, 16))
    assert model.attention_extra[0] > 0 and model.attention_extra[1] == 0


def test_one_overrun_raises_an_attention_price_at_most_eightfold():
    # a 2 s stall of a small chunk: what the correction adds is bounded, so one stall does not
    # price prompts out for long (the correction's own step, the fit held still)
    model = CostModel(BELIEF)
    price = model.estimate.prompt_kv_ms(7)
    model._correct((4, 3, 0, attended(500, 4)), 2000.0, overran=True)
    assert 0 < model.estimate.prompt_kv_ms(7) <= 8 * max(price, BELIEF.per_prefill_ms) + 1e-9


def _active_set(model: CostModel, a: np.ndarray, b: np.ndarray, ridge: float) -> np.ndarray:
    """The constrained fit by the active set alone, pinning negative coefficients at zero."""
    n = len(b)
    free, theta = np.ones(n, bool), np.zeros(n)
    while free.any():
        m = a[np.ix_(free, free)] + ridge * np.eye(int(free.sum()))
        sol = np.linalg.solve(m, b[free] + ridge * model._prior[free]
                              - a[np.ix_(free, ~free)] @ theta[~free])
        if (sol >= 0).all():
            theta[free] = sol
            break
        idx = np.flatnonzero(free)[sol < 0]
        free[idx], theta[idx] = False, 0.0
    return theta


@given(st.integers(0, 2**32 - 1), st.booleans())
def test_the_fit_is_the_constrained_least_squares_whether_or_not_a_coefficient_is_pinned(
        seed, pinned):
    model = CostModel()
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 2, (40, model._N))
    truth = rng.uniform(0.1, 1, model._N)
    if pinned:  # a coefficient the data wants negative: the fit pins it at zero
        truth[rng.integers(model._N)] = -3.0
    a, b = x.T @ x, x.T @ (x @ truth)
    got = model._solve(a, b, ridge=1e-3)
    assert (got >= 0).all()
    np.testing.assert_allclose(got, _active_set(model, a, b, 1e-3), rtol=1e-9, atol=1e-12)
