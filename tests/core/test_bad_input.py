"""Bad input gets a clear uma exception, never a crash, and the process keeps working."""

import shutil

import numpy as np
import pytest

from uma import _core
from uma.errors import (
    BatchFullError,
    ClosedError,
    ContextOverflowError,
    InvalidBatchError,
    InvalidModelError,
    InvalidRequestError,
    InvalidTokenError,
    ModelNotFoundError,
    NoKVSlotError,
)


def still_works(model):
    with _core.Context(model, n_ctx=128, n_batch=32) as ctx:
        batch = _core.Batch(32)
        batch.add_sequence(model.tokenize("still alive"), 0, 0)
        assert ctx.decode(batch) == 1
        assert np.isfinite(ctx.logits()).all()


def test_missing_path(tmp_path, model):
    with pytest.raises(ModelNotFoundError, match="not found"):
        _core.Model(tmp_path / "nope.gguf")
    still_works(model)


def test_not_a_gguf(tmp_path, model):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 this is a zip, not a model" * 10)
    with pytest.raises(InvalidModelError, match="not a GGUF"):
        _core.Model(path)
    with pytest.raises(InvalidModelError, match="not a file"):
        _core.Model(tmp_path)
    still_works(model)


@pytest.mark.parametrize("keep", [4, 64, 4096, 0.5, 0.99])
def test_truncated_gguf(tmp_path, tiny_path, model, keep):
    data = tiny_path.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep
    path = tmp_path / "truncated.gguf"
    path.write_bytes(data[:cut])
    with pytest.raises(InvalidModelError, match="could not load"):
        _core.Model(path)
    still_works(model)


def test_progress_callback_is_observed_and_can_cancel(tiny_path, tmp_path):
    seen = []
    with _core.Model(tiny_path, progress=seen.append):
        pass
    assert seen and seen[-1] == pytest.approx(1.0)
    assert seen == sorted(seen)
    with pytest.raises(Exception, match="cancelled"):
        _core.Model(tiny_path, progress=lambda p: False)

    def boom(_):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        _core.Model(tiny_path, progress=boom)
    assert _core.live_handles()["model"] >= 0


def test_prompt_longer_than_the_context(model):
    # A 300-token prompt in chunks of 200: the second chunk runs past the window.
    prompt = np.full(300, 100, dtype=np.int32)
    with _core.Context(model, n_ctx=256, n_batch=256) as ctx:
        assert ctx.n_ctx_seq == 256
        batch = _core.Batch(256)
        batch.add_sequence(prompt[:200], 0, 0)
        ctx.decode(batch)
        batch.clear()
        batch.add_sequence(prompt[200:], 200, 0)
        with pytest.raises(ContextOverflowError, match="context window of 256"):
            ctx.decode(batch)
        assert ctx.seq_pos_max(0) == 199
    still_works(model)


def test_out_of_range_token(model):
    with _core.Context(model, n_ctx=64, n_batch=16) as ctx:
        batch = _core.Batch(16)
        batch.add_sequence(np.array([1, 2, model.n_vocab + 5], dtype=np.int32), 0, 0)
        with pytest.raises(InvalidTokenError, match=str(model.n_vocab + 5)):
            ctx.decode(batch)
        batch.clear()
        batch.add(-1, 0, 0, logits=True)
        with pytest.raises(InvalidTokenError):
            ctx.decode(batch)
    still_works(model)


def test_batch_over_capacity_and_over_n_batch(model):
    batch = _core.Batch(8)
    with pytest.raises(BatchFullError, match="holds 8"):
        batch.add_sequence(np.arange(10, dtype=np.int32), 0, 0)
    assert batch.n_tokens == 0
    big = _core.Batch(64)
    big.add_sequence(np.arange(1, 41, dtype=np.int32), 0, 0)
    with (
        _core.Context(model, n_ctx=128, n_batch=32) as ctx,
        pytest.raises(BatchFullError, match="n_batch is 32"),
    ):
        ctx.decode(big)
    still_works(model)


def test_bad_sequence_ids_and_positions(model):
    with _core.Context(model, n_ctx=64, n_batch=16, n_seq_max=2) as ctx:
        batch = _core.Batch(16)
        batch.add(5, 0, 7, logits=True)
        with pytest.raises(InvalidRequestError, match="seq_id 7"):
            ctx.decode(batch)
        with pytest.raises(InvalidRequestError, match="seq_id"):
            ctx.seq_rm(-1)
    still_works(model)


def test_inconsistent_positions_are_rejected_by_llama_cpp(model):
    with _core.Context(model, n_ctx=64, n_batch=16) as ctx:
        batch = _core.Batch(16)
        batch.add_sequence(model.tokenize("abc"), 0, 0)
        ctx.decode(batch)
        batch.clear()
        batch.add(5, 30, 0, logits=True)  # a gap: the sequence ends at position 3
        with pytest.raises(InvalidBatchError, match="consecutive"):
            ctx.decode(batch)
    still_works(model)


def test_full_kv_cache_is_recoverable(model):
    with _core.Context(model, n_ctx=256, n_batch=256, n_seq_max=4) as ctx:
        batch = _core.Batch(256)
        for seq in range(4):
            batch.add_sequence(np.full(64, 100 + seq, dtype=np.int32), 0, seq)
        ctx.decode(batch)
        batch.clear()
        batch.add(5, 64, 0, logits=True)
        with pytest.raises(NoKVSlotError):
            ctx.decode(batch)
        assert ctx.seq_pos_max(0) == 63  # unchanged by the failed call
        ctx.seq_rm(3)
        assert ctx.decode(batch) == 1


def test_bad_context_parameters(model):
    for kwargs, field in [
        ({"n_ctx": 0}, "n_ctx"),
        ({"n_batch": -1}, "n_batch"),
        ({"n_ubatch": 1024, "n_batch": 512}, "n_ubatch"),
        ({"n_seq_max": 100000}, "n_seq_max"),
        ({"type_k": "q3"}, "type_k"),
        ({"flash_attn": "maybe"}, "flash_attn"),
        ({"n_threads": 0}, "thread"),
    ]:
        with pytest.raises(InvalidRequestError, match=field):
            _core.Context(model, **kwargs)


def test_vocab_only_model_cannot_run(vocab_model):
    with pytest.raises(InvalidRequestError, match="vocab-only"):
        _core.Context(vocab_model)


def test_closed_objects_refuse_use(tiny_path, tmp_path):
    copy = tmp_path / "m.gguf"
    shutil.copy(tiny_path, copy)
    before = _core.live_handles()
    m = _core.Model(copy)
    ctx = _core.Context(m, n_ctx=64, n_batch=16)
    m.close()  # deferred: the context still runs on the weights
    with pytest.raises(ClosedError):
        m.tokenize("x")
    assert _core.live_handles()["model"] == before["model"] + 1
    ctx.close()
    ctx.close()  # idempotent
    m.close()
    assert _core.live_handles() == before
    with pytest.raises(ClosedError):
        ctx.decode(_core.Batch(1))


def test_no_native_handles_leak(tiny_path):
    before = _core.live_handles()
    with _core.Model(tiny_path) as m, _core.Context(m, n_ctx=64, n_batch=16) as ctx:
        batch = _core.Batch(16)
        batch.add_sequence(m.tokenize("leak check"), 0, 0)
        ctx.decode(batch)
        del batch
    s = _core.Sampler(2, 10)
    s.close()
    assert _core.live_handles() == before
