"""The executor on the real core: calibration before serving."""

import uma
from uma.sched.cost import CostEstimate


def test_calibration_prices_ticks_at_what_the_device_charges_and_leaves_the_cache_empty(
        tiny_path):
    with uma.Engine(tiny_path, n_ctx=512, n_seq_max=4) as e:
        # The compute thread calibrates before its first tick, so this waits for it.
        assert e.generate("Hello", max_tokens=4, ignore_eos=True).usage.completion_tokens == 4
        est = e._executor.cost.estimate
        generic = CostEstimate()
        # A 2-layer model costs microseconds a prompt token, not the generic prior's 0.5 ms.
        # (The fixed and per-row terms have already learned from the real ticks, whose first
        # ones pay one-off costs: not compared here.)
        assert 0 < est.per_prefill_ms < generic.per_prefill_ms / 10
        assert all(e.ctx.seq_pos_max(seq) == -1 for seq in range(4))
        snap = e.snapshot()
        # scratch batches are not ticks: the prompt in one, then three decode steps
        assert snap["ticks_total"] == 4 and snap["kv_cells_used"] == 0
