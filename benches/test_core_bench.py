"""Micro-benchmarks of the compiled core's hot paths (timed and reported, never asserted)."""

import numpy as np

from uma import _core

TEXT_4K = (
    "UMA Serve keeps interactive streams snappy while long prompts run. 🦙 中文 naïve café. "
    * 64
)[:4096]


def test_batch_fill_512_tokens(benchmark):
    batch = _core.Batch(512)
    tokens = np.arange(1, 385, dtype=np.int32)
    decode_tokens = np.arange(128, dtype=np.int32)
    decode_seqs = np.arange(128, dtype=np.int32) % 64

    def fill():
        batch.clear()
        batch.add_sequence(tokens, 0, 0)  # a 384-token prompt chunk
        batch.add_rows(decode_tokens, decode_tokens, decode_seqs)  # 128 decode rows
        return batch.n_tokens

    assert benchmark(fill) == 512


def test_sample_32_rows_of_32k_vocab(benchmark):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(32, 32000)).astype(np.float32) * 3
    sampler = _core.Sampler(32, 32000)
    for slot in range(32):
        if slot % 2:
            sampler.configure(slot, temperature=0.8, top_p=0.95, top_k=40, seed=slot)
    slots = np.arange(32, dtype=np.int32)
    tokens = benchmark(sampler.sample_array, logits, slots)
    assert tokens.shape == (32,)
    sampler.close()


def test_sample_8_rows_of_128k_vocab_at_temperature(benchmark):
    # temperature alone (the OpenAI clients' default): the sampler's direct draw
    logits = np.random.default_rng(0).normal(size=(8, 128256)).astype(np.float32) * 3
    sampler = _core.Sampler(8, 128256, 1)
    for slot in range(8):
        sampler.configure(slot, temperature=1.0, seed=slot)
    tokens = benchmark(sampler.sample_array, logits, np.arange(8, dtype=np.int32))
    assert tokens.shape == (8,)
    sampler.close()


def test_tokenize_4kb(benchmark, tiny_model):
    tokens = benchmark(tiny_model.tokenize, TEXT_4K)
    assert len(tokens) > 500
