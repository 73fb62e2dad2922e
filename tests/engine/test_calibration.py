"""Timing the device before serving (uma.engine.calibration.DeviceTiming): what a change of a
decode tick's shape costs, on a stand-in device whose clock the test keeps. The timing's
shapes on the real core are tests/engine/test_scheduler.py's and test_kept_timing.py's."""

from __future__ import annotations

import pytest

from uma import fake_core
from uma.engine import calibration
from uma.engine.calibration import DeviceTiming


class CapturingDevice:
    """A device that runs a batch whose shape (tokens, first position) differs from the last
    one's op by op, `change_ms` dearer, and captures it on the next, dearer again: CUDA's
    graphs at the vendored commit. Every tick of a settled shape takes 1 ms a token."""

    def __init__(self, change_ms: float) -> None:
        self.change_ms = change_ms
        self.now_s = 0.0
        self.shape: tuple[int, int] | None = None
        self.runs = 0

    def clock(self) -> float:
        return self.now_s

    def decode(self, batch: fake_core.Batch) -> None:
        shape = (batch.n_tokens, int(batch._pos[0]))
        self.runs = self.runs + 1 if shape == self.shape else 0
        self.shape = shape
        ms = batch.n_tokens + (self.change_ms if self.runs < 2 else 0.0)
        self.now_s += ms / 1e3


@pytest.mark.parametrize("change_ms", [0.0, 3.0])
def test_a_change_of_shape_and_a_row_are_timed_on_settled_ticks(monkeypatch, change_ms):
    device = CapturingDevice(change_ms)
    monkeypatch.setattr(calibration.time, "perf_counter", device.clock)
    model = fake_core.Model("x")
    with fake_core.Context(model, n_ctx=1024, n_seq_max=4) as ctx:
        ctx.before_decode = device.decode
        timing = DeviceTiming(ctx, fake_core.Batch(512)).run()
    assert timing.ticks
    # each of the first two ticks of a new shape pays the change; a row costs 1 ms settled
    assert timing.change_ms == pytest.approx(2 * change_ms)
    assert timing.row_ms == pytest.approx(1.0)
    settled = {(p, d): ms for p, d, _, _, ms in timing.ticks}
    assert settled[0, 1] == pytest.approx(1.0)  # the settled tick, not the change's


def test_a_slow_device_running_each_shape_twice_leaves_the_change_untimed(monkeypatch):
    device = CapturingDevice(0.0)
    monkeypatch.setattr(calibration.time, "perf_counter", device.clock)
    monkeypatch.setattr(DeviceTiming, "SLOW_ROW_MS", 0.5)  # one row's 1 ms is slow
    model = fake_core.Model("x")
    with fake_core.Context(model, n_ctx=1024, n_seq_max=4) as ctx:
        ctx.before_decode = device.decode
        timing = DeviceTiming(ctx, fake_core.Batch(512)).run()
    assert timing.ticks and timing.change_ms is None and timing.row_ms is None
