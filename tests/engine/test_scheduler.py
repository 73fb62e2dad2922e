"""The scheduler: calibration before serving (on the real core) and its tick spread."""

import numpy as np
import pytest

import uma
from uma.engine.tick_stats import TickSpread, p95
from uma.sched.cost import CostEstimate


def test_calibration_prices_ticks_at_what_the_device_charges_and_leaves_the_cache_empty(
        tiny_path):
    with uma.Engine(tiny_path, n_ctx=512, n_seq_max=4) as e:
        # The compute thread calibrates before its first tick, so this waits for it.
        assert e.generate("Hello", max_tokens=4, ignore_eos=True).usage.completion_tokens == 4
        est = e._scheduler.cost.estimate
        generic = CostEstimate()
        # A 2-layer model costs microseconds a prompt token, not the generic prior's 0.5 ms.
        # (The fixed and per-row terms have already learned from the real ticks, whose first
        # ones pay one-off costs: not compared here.)
        assert 0 < est.per_prefill_ms < generic.per_prefill_ms / 10
        assert all(e.ctx.seq_pos_max(seq) == -1 for seq in range(e.ctx.n_seq_max))
    # After close (the compute thread has joined: a result can reach its caller before the
    # tick that produced it is counted). Scratch batches are not ticks: the prompt in one,
    # then three decode steps.
    snap = e.snapshot()
    assert snap["ticks_total"] == 4 and snap["kv_cells_used"] == 0


def test_tick_spread_reports_the_p95_of_recent_ratios_every_16_samples():
    spread = TickSpread(size=64)
    for _ in range(31):
        spread.add(2.0, 1.0, None, decode_only=True)
    assert spread.decode == 1.0  # not enough samples yet
    spread.add(2.0, 1.0, None, decode_only=True)
    assert spread.decode == 2.0
    for _ in range(15):  # the window now says 1.0, but only every 16th sample recomputes
        spread.add(1.0, 1.0, 1.0, decode_only=True)
    assert spread.decode == 2.0 and spread.alone == 0.0
    for _ in range(200):
        spread.add(1.0, 1.0, 1.0, decode_only=True)
    assert spread.decode == 1.0 and spread.alone == 1.0
    assert spread.alone_sorted == (1.0,) * 64  # the window behind it, for policies' tails



def test_the_spreads_p95_is_numpys_without_numpys_first_call():
    rng = np.random.default_rng(3)
    for n in (1, 2, 32, 63, 256):
        values = rng.lognormal(size=n).tolist()
        assert p95(sorted(values)) == pytest.approx(float(np.percentile(values, 95)))


def test_tick_spread_keeps_background_prompt_ticks_apart_from_decode_ticks():
    spread = TickSpread(size=64)
    for _ in range(64):
        spread.add(1.5, 1.0, None, decode_only=False, background_prompt=True)
        spread.add(9.0, 1.0, None, decode_only=False)  # an interactive prompt: neither
        spread.add(1.0, 1.0, None, decode_only=True)
    assert spread.prompt == 1.5 and spread.decode == 1.0


def test_every_tick_reports_how_far_the_cost_model_missed_it(tiny_path):
    with uma.Engine(tiny_path, n_ctx=512, n_seq_max=2) as e:
        e.generate("Hello", max_tokens=8, ignore_eos=True)
    errors = e.snapshot()["cost_model_error_pct"]
    assert errors["count"] == e.snapshot()["ticks_total"] and errors["p50"] >= 0
