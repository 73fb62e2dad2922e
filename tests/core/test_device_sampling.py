"""Sampling on the device (llama.cpp's backend samplers through Context.set_sampler): the same
greedy tokens as the host sampler, host rows untouched beside device rows, chains kept."""

import numpy as np
import pytest

from uma import _core
from uma.errors import InvalidRequestError

PROMPT = np.arange(100, 116, dtype=np.int32)
STREAMS = 3
# Mesa's CPU Vulkan driver, which ggml uses when GGML_VK_VISIBLE_DEVICES names it
LAVAPIPE = any(d["backend"] == "Vulkan" and "llvmpipe" in d["description"]
               for d in _core.devices())


def generate(model, steps, device, host_seqs=(), **options):
    """Greedy-decodes STREAMS copies of PROMPT (each its own sequence) for `steps` tokens;
    sequences in `device` sample there with `options`, the others with the host sampler."""
    ctx = _core.Context(model, n_ctx=512, n_batch=64, n_seq_max=STREAMS)
    batch = _core.Batch(64)
    sampler = _core.Sampler(STREAMS, model.n_vocab)
    try:
        for seq in range(STREAMS):
            sampler.configure(seq, **options)
            if seq in device:
                assert ctx.set_sampler(seq, **options)
            batch.add_sequence(PROMPT + seq, 0, seq, logits_last=True)
        ctx.decode(batch)
        out = [[] for _ in range(STREAMS)]
        for step in range(steps):
            rows = np.arange(STREAMS, dtype=np.int32)
            on_device = ctx.sampled_tokens()
            host = sampler.sample(ctx, rows, ctx.output_seqs)
            batch.clear()
            for seq in range(STREAMS):
                if seq in device:
                    token = int(on_device[seq])
                else:
                    assert on_device[seq] == -1
                    token = int(host[seq])
                out[seq].append(token)
                batch.add(token, len(PROMPT) + step, seq, True)
            ctx.decode(batch)
        return out
    finally:
        sampler.close()
        batch.close()
        ctx.close()


def test_greedy_on_the_device_equals_the_host(model):
    host = generate(model, 24, device=())
    assert generate(model, 24, device=(0, 1, 2)) == host
    # mixed: the host rows' logits are still copied beside the device rows
    assert generate(model, 24, device=(1,)) == host


def test_filters_that_leave_one_token_are_greedy(model):
    host = generate(model, 12, device=())
    for options in ({"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}):
        if "min_p" in options and LAVAPIPE:
            pytest.xfail("lavapipe: llama.cpp's device min-p draws the last token every time "
                         "(its graph takes log(0) for the tokens it drops, which GLSL leaves "
                         "undefined: the likely cause)")
        assert generate(model, 12, device=(0, 1, 2), temperature=0.9, seed=5,
                        **options) == host, options


def test_a_seeded_draw_repeats_and_differs_by_seed(model):
    a = generate(model, 16, device=(0, 1, 2), temperature=1.5, seed=11)
    assert generate(model, 16, device=(0, 1, 2), temperature=1.5, seed=11) == a
    assert generate(model, 16, device=(0, 1, 2), temperature=1.5, seed=12) != a
    assert a != generate(model, 16, device=())  # not greedy


def test_a_kept_chain_restarts_its_draws(model):
    """A sequence's chain serves the next request with the same options: from the seed."""
    ctx = _core.Context(model, n_ctx=256, n_seq_max=1)
    batch = _core.Batch(32)
    draws = []
    try:
        for _ in range(2):
            assert ctx.set_sampler(0, temperature=1.5, seed=9)
            ctx.seq_rm(0)
            batch.clear()
            batch.add_sequence(PROMPT, 0, 0, logits_last=True)
            out = []
            for step in range(8):
                ctx.decode(batch)
                out.append(int(ctx.sampled_tokens()[0]))
                batch.clear()
                batch.add(out[-1], len(PROMPT) + step, 0, True)
            draws.append(out)
        assert draws[0] == draws[1]
    finally:
        batch.close()
        ctx.close()


def test_chains_are_kept_until_changed_or_cleared(model):
    ctx = _core.Context(model, n_ctx=256, n_seq_max=2)
    try:
        assert not ctx.device_sampled(0)
        assert ctx.set_sampler(0) and ctx.set_sampler(0)  # the same again: kept
        assert ctx.set_sampler(0, temperature=0.5, top_k=model.n_vocab * 2, seed=1)
        assert ctx.device_sampled(0) and not ctx.device_sampled(1)
        ctx.clear_sampler(0)
        ctx.clear_sampler(1)  # none: a no-op
        assert not ctx.device_sampled(0)
        batch = _core.Batch(8)
        batch.add(5, 0, 0, True)
        ctx.decode(batch)
        assert ctx.sampled_tokens().tolist() == [-1]
        assert ctx.logits().shape == (1, model.n_vocab)
        batch.close()
    finally:
        ctx.close()


def test_bad_options_and_sequences_are_refused(model):
    ctx = _core.Context(model, n_ctx=256, n_seq_max=2)
    try:
        with pytest.raises(InvalidRequestError, match="seq_id 2"):
            ctx.set_sampler(2)
        with pytest.raises(InvalidRequestError, match="top_p"):
            ctx.set_sampler(0, temperature=1.0, top_p=0.0)
        with pytest.raises(InvalidRequestError, match="temperature"):
            ctx.set_sampler(0, temperature=float("nan"))
        with pytest.raises(InvalidRequestError, match="seed"):
            ctx.set_sampler(0, temperature=1.0, seed=-1)
        assert not ctx.device_sampled(0)
    finally:
        ctx.close()


def test_a_device_sampler_samples_every_row_of_a_verify_when_the_context_allows_it(model):
    """A speculating stream's verify item has several logits rows of one sequence: sampled on
    the device only in a context made for it (n_outputs_per_seq), each row as the host would."""
    rows = 4
    got = {}
    for allowed, device in ((rows, True), (1, True), (1, False)):
        ctx = _core.Context(model, n_ctx=256, n_batch=64, n_outputs_per_seq=allowed)
        batch = _core.Batch(64)
        sampler = _core.Sampler(1, model.n_vocab)
        try:
            assert ctx.n_outputs_per_seq == allowed
            sampler.configure(0)
            if device:
                assert ctx.set_sampler(0)
            batch.add_rows(PROMPT[:rows], np.arange(rows, dtype=np.int32),
                           np.zeros(rows, np.int32))
            if device and allowed < rows:
                with pytest.raises(Exception, match="decode"):
                    ctx.decode(batch)
                continue
            ctx.decode(batch)
            got[device] = ctx.sampled_tokens().tolist() if device \
                else sampler.sample(ctx, np.arange(rows, dtype=np.int32),
                                    np.zeros(rows, np.int32)).tolist()
        finally:
            ctx.close()
            batch.close()
            sampler.close()
    assert got[True] == got[False]
    with pytest.raises(InvalidRequestError, match="n_outputs_per_seq must be in"):
        _core.Context(model, n_ctx=256, n_batch=64, n_outputs_per_seq=65)
