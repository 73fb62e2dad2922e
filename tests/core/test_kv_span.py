"""Context.kv_span on the real core: how far a tick's attention runs in one KV buffer (the
highest cell in use, padded to 256 as llama.cpp pads it), not how many cells are in use."""

import numpy as np
import pytest

from uma import _core
from uma.errors import ClosedError


def fill(ctx, batch, seq, n):
    batch.clear()
    batch.add_sequence(np.arange(5, 5 + n, dtype=np.int32), 0, seq, logits_last=True)
    ctx.decode(batch)


def test_the_span_follows_the_highest_cell_in_use_not_the_cells_in_use(model):
    ctx = _core.Context(model, n_ctx=2048, n_seq_max=3)
    batch = _core.Batch(512)
    try:
        assert ctx.kv_span == 256  # llama.cpp's least
        fill(ctx, batch, 0, 100)
        fill(ctx, batch, 1, 500)  # above sequence 0: cells 100-599
        fill(ctx, batch, 2, 100)  # above that: 600-699
        assert ctx.kv_span == 768
        ctx.seq_rm(0)  # the lowest cells: the span stays
        ctx.seq_rm(1)  # the middle ones, 500 of the 600 in use: it stays
        assert ctx.kv_span == 768
        ctx.seq_rm(2)  # the highest: it falls
        assert ctx.kv_span == 256
    finally:
        batch.close()
        ctx.close()


def test_a_kv_buffer_per_sequence_has_no_one_span(model):
    ctx = _core.Context(model, n_ctx=2048, n_seq_max=2, kv_unified=False)
    try:
        assert ctx.kv_span == -1
    finally:
        ctx.close()


def test_a_closed_context_refuses(model):
    ctx = _core.Context(model, n_ctx=512)
    ctx.close()
    with pytest.raises(ClosedError):
        _ = ctx.kv_span
