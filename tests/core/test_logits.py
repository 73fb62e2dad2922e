"""Zero-copy logits views: llama.cpp's own buffer, never stale."""

import gc

import numpy as np
import pytest

from uma import _core
from uma.errors import ClosedError, LogitsInUseError, UmaError


@pytest.fixture
def ctx(model):
    with _core.Context(model, n_ctx=256, n_batch=64, n_seq_max=4) as c:
        yield c
        gc.collect()  # views a failed test left behind must not block close()


def decode_two(ctx, model):
    batch = _core.Batch(64)
    batch.add_sequence(model.tokenize("first sequence"), 0, 0)
    batch.add_sequence(model.tokenize("second one, longer than the first"), 0, 2)
    ctx.decode(batch)
    return batch


def test_view_is_llama_cpps_buffer(ctx, model):
    decode_two(ctx, model)
    view = ctx.logits()
    assert view.shape == (2, model.n_vocab) and view.dtype == np.float32
    assert view.__array_interface__["data"][0] == ctx.logits_address()
    assert not view.flags.writeable and not view.flags.owndata
    assert list(ctx.output_seqs) == [0, 2]


def test_rows_follow_batch_order(ctx, model):
    batch = decode_two(ctx, model)
    assert list(batch.output_seqs()) == [0, 2]
    row1 = np.array(ctx.logits()[1])
    # Decoding sequence 2's prompt alone reproduces row 1.
    with _core.Context(model, n_ctx=256, n_batch=64) as solo:
        b = _core.Batch(64)
        b.add_sequence(model.tokenize("second one, longer than the first"), 0, 0)
        solo.decode(b)
        # Another batch shape may take other kernels: on Vulkan (lavapipe) the rows differ by
        # up to 0.011. Rows out of order differ by whole units.
        np.testing.assert_allclose(solo.logits()[0], row1, rtol=1e-4, atol=2e-2)


def test_decode_refuses_while_a_view_is_alive(ctx, model):
    batch = decode_two(ctx, model)
    view = ctx.logits()
    row = view[0]
    del view
    with pytest.raises(LogitsInUseError, match="still alive"):
        ctx.decode(batch)
    kept = np.array(row)  # a copy is fine to keep
    del row
    batch.clear()
    batch.add(int(np.argmax(kept)), ctx.seq_pos_max(0) + 1, 0, logits=True)
    assert ctx.decode(batch) == 1


def test_close_waits_for_the_last_view(model):
    before = _core.live_handles()["context"]
    ctx = _core.Context(model, n_ctx=256, n_batch=64, n_seq_max=4)
    decode_two(ctx, model)
    view = ctx.logits()
    ctx.close()
    assert ctx.closed and _core.live_handles()["context"] == before + 1
    assert np.isfinite(view).all()  # the memory is still there
    with pytest.raises(ClosedError):
        ctx.logits()
    del view
    assert _core.live_handles()["context"] == before


def test_views_are_read_only(ctx, model):
    decode_two(ctx, model)
    view = ctx.logits()
    with pytest.raises(ValueError):
        view[0, 0] = 1.0


def test_no_logits_before_a_decode(ctx):
    with pytest.raises(UmaError, match="no logits"):
        ctx.logits()
