"""Snapshots in slices (uma.engine.snapshots): on the real core an entry copied out slice by slice
and read back decodes exactly as the sequence it was copied from; on a device whose copies are
slow and priced wrong (the fake core, on a clock of its own), no call overruns its budget by
more than one slice."""

from __future__ import annotations

import contextlib
import time as time_module

import numpy as np
import pytest

from uma import _core
from uma import fake_core as fc
from uma.engine.snapshots import FIRST_SLICE, Snapshots
from uma.errors import UmaError


@contextlib.contextmanager
def decoded(model, n_ctx: int, tokens: np.ndarray):
    """A three-sequence context holding `tokens` in sequence 0, and a batch to decode more."""
    ctx = _core.Context(model, n_ctx=n_ctx, n_seq_max=3)
    batch = _core.Batch(256)
    try:
        batch.add_sequence(tokens, 0, 0)
        ctx.decode(batch)
        yield ctx, batch
    finally:
        batch.close()
        ctx.close()


def next_logits(ctx, batch, token, pos, seq):
    batch.clear()
    batch.add(token, pos, seq, True)
    ctx.decode(batch)
    return np.array(ctx.logits()[0], copy=True)


def test_an_entry_copied_in_slices_reads_back_as_it_was(model):
    """100 positions in seq 0, copied out in slices of growing size (a tiny budget a call),
    their cells freed slice by slice; read back into seq 1, the next token's logits are those
    seq 0 gave before, and a read of the first 40 positions only holds just those."""
    tokens = np.arange(100, 200, dtype=np.int32)
    with decoded(model, 512, tokens) as (ctx, batch):
        expected = next_logits(ctx, batch, 7, 100, 0)
        ctx.seq_rm(0, 100, -1)
        snaps = Snapshots(ctx, scratch=2)
        snaps.start(tokens, 0)
        finished = []
        for _ in range(200):
            # after the first slice, one position a call
            finished += snaps.work(0.001, at_least_one=True).finished
            if finished:
                break
        assert finished and not snaps
        parts = finished[0].parts
        sizes = np.diff([p.start for p in parts] + [100])
        assert parts[0].start == 0 and len(parts) > 3
        assert sizes[0] <= FIRST_SLICE and all(sizes[1:] <= 2 * sizes[:-1])
        assert ctx.seq_pos_max(0) == -1  # every slice's cells freed as it was copied
        assert ctx.seq_pos_max(2) == -1  # the scratch sequence left empty
        assert snaps.restore(1, tuple(parts), 100) == sum(len(p.data) for p in parts)
        assert ctx.seq_pos_min(1) == 0 and ctx.seq_pos_max(1) == 99
        got = next_logits(ctx, batch, 7, 100, 1)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
        ctx.seq_rm(1)
        snaps.restore(1, tuple(parts), 40)
        assert ctx.seq_pos_max(1) >= 39 and ctx.seq_pos_max(1) < 99


def test_a_read_back_with_no_room_leaves_the_sequences_empty(model):
    tokens = np.arange(100, 300, dtype=np.int32)
    with decoded(model, 256, tokens) as (ctx, _):
        snaps = Snapshots(ctx, scratch=2)
        snaps.start(tokens, 0)
        ctx.seq_cp(0, 1, 0, 200)  # another sequence shares every cell: nothing is freed
        parts = snaps.work(float("inf")).finished[0].parts
        ctx.seq_rm(0)
        assert ctx.seq_pos_max(1) == 199  # the cache is full of seq 1's cells
        with pytest.raises(UmaError):
            snaps.restore(0, tuple(parts), 200)
        assert ctx.seq_pos_max(0) == -1 and ctx.seq_pos_max(2) == -1


class SlowCopies:
    """A fake context whose copies take `ms_per_cell` a cell on the test's clock, or a
    hundredth of it for the first `cheap` copies (a price learnt from cells in one run, wrong
    for what comes next); each copy's cost is recorded."""

    def __init__(self, ctx, clock: list[float], ms_per_cell: float, cheap: int = 0):
        self.ctx, self.clock, self.ms, self.cheap = ctx, clock, ms_per_cell, cheap
        self.costs: list[float] = []

    def __getattr__(self, name):
        return getattr(self.ctx, name)

    def seq_state(self, seq):
        cells = self.ctx.seq_pos_max(seq) - self.ctx.seq_pos_min(seq) + 1
        ms = self.ms * cells * (0.01 if self.cheap > 0 else 1.0)
        self.cheap -= 1
        self.clock[0] += ms / 1e3
        self.costs.append(ms)
        return self.ctx.seq_state(seq)


def leave_in_slices(monkeypatch, ms_per_cell: float, cheap: int, budget_ms: float,
                    idle: bool = True):
    """Two 600-position entries copied out by calls of budget_ms each (idle: turns with
    nothing else to do, which copy one position at least); returns the copies' costs call by
    call, and the entries as finished."""
    clock = [0.0]
    monkeypatch.setattr(time_module, "perf_counter", lambda: clock[0])
    with fc.Model("no/such/file.gguf") as model, \
            fc.Context(model, n_ctx=4096, n_seq_max=4, n_batch=1024) as real:
        ctx = SlowCopies(real, clock, ms_per_cell, cheap)
        batch = fc.Batch(2048)
        entries = [(np.arange(600, dtype=np.int32) * k) % 500 for k in (1, 3)]
        for seq, tokens in enumerate(entries):
            batch.clear()
            batch.add_sequence(tokens, 0, seq)
            real.decode(batch)
        snaps = Snapshots(ctx, scratch=3)
        for seq, tokens in enumerate(entries):
            snaps.start(tokens, seq)
        calls, done = [], []
        while snaps and len(calls) < 2_000:
            before = len(ctx.costs)
            done += snaps.work(budget_ms, at_least_one=idle).finished
            calls.append(ctx.costs[before:])
        return calls, done


@pytest.mark.parametrize("ms_per_cell", [0.01, 1.0, 20.0])
@pytest.mark.parametrize("cheap", [0, 3])
def test_a_wrong_price_overruns_a_call_by_its_last_slice_only(monkeypatch, ms_per_cell, cheap):
    """Copies at 0.01-20 ms a cell, with or without a cheap start that prices the next slices
    wrong: in every call all slices but the last end within the budget, each entry's first
    slice is at most FIRST_SLICE positions and each later one at most twice the one before,
    every call copies something, and both entries are copied whole."""
    budget_ms = 5.0
    calls, done = leave_in_slices(monkeypatch, ms_per_cell, cheap, budget_ms)
    assert all(costs for costs in calls)
    assert all(sum(costs[:-1]) <= budget_ms + 1e-9 for costs in calls)
    assert [len(j.tokens) for j in done] == [600, 600]
    for job in done:
        sizes = np.diff([p.start for p in job.parts] + [600])
        assert sizes[0] <= FIRST_SLICE and all(sizes[1:] <= 2 * sizes[:-1])


@pytest.mark.parametrize("ms_per_cell", [0.01, 1.0, 20.0])
def test_where_the_price_holds_no_call_overruns(monkeypatch, ms_per_cell):
    """With one price throughout, only the very first slice (priced by nothing yet) may pass
    the budget; every later call stays within it, or copies a single cell where one costs
    more."""
    budget_ms = 5.0
    calls, _ = leave_in_slices(monkeypatch, ms_per_cell, 0, budget_ms)
    assert all(sum(costs) <= max(budget_ms, ms_per_cell) + 1e-9 for costs in calls[1:])


def test_between_ticks_nothing_is_copied_that_is_not_predicted_to_fit(monkeypatch):
    """20 ms a cell, 5 ms left by each tick: the first slice (priced by nothing yet) is the one
    overrun; after it no tick copies anything, and the entries wait for an idle turn."""
    calls, done = leave_in_slices(monkeypatch, 20.0, 0, 5.0, idle=False)
    assert len(calls[0]) == 1 and not any(calls[1:]) and not done
