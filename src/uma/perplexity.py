"""Perplexity of a model on a text, computed as llama.cpp's `llama-perplexity` computes it, so
the two can be compared figure for figure (a check that this build runs a model's numbers
right, and a way to compare quantisations):

the text is tokenised with the model's BOS, cut into chunks of n_ctx tokens (the remainder
dropped); each chunk is decoded alone from an empty cache, its first token replaced by BOS where
the model adds one, and only its second half is scored: the log-likelihood of each token from
position n_ctx/2 + 1 on, given all before it. PPL = exp(mean negative log-likelihood).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from uma import _core
from uma.errors import InvalidRequestError


@dataclass(frozen=True)
class Perplexity:
    ppl: float
    nll: float  # mean negative log-likelihood per scored token (nats)
    n_scored: int  # tokens scored
    n_chunks: int


def perplexity(model: _core.Model, text: str, *, n_ctx: int = 512,
               n_threads: int | None = None) -> Perplexity:
    """The model's perplexity on text, in chunks of n_ctx tokens (at least two chunks)."""
    tokens = np.asarray(model.tokenize(text, add_special=True), dtype=np.int32)
    n_chunks = len(tokens) // n_ctx
    if n_ctx < 4 or n_chunks < 2:
        raise InvalidRequestError(
            f"the text has {len(tokens)} tokens; perplexity with a context of {n_ctx} needs "
            f"at least {2 * n_ctx}")
    first = n_ctx // 2
    total, count = 0.0, 0
    with _core.Context(model, n_ctx=n_ctx, n_batch=n_ctx, n_seq_max=1,
                       n_threads=n_threads, n_threads_batch=n_threads) as ctx:
        batch = _core.Batch(n_ctx)
        try:
            for i in range(n_chunks):
                chunk = tokens[i * n_ctx:(i + 1) * n_ctx].copy()
                if model.add_bos:
                    chunk[0] = model.bos
                ctx.clear()
                batch.clear()
                for pos, token in enumerate(chunk.tolist()):
                    batch.add(token, pos, 0, pos >= first)
                ctx.decode(batch)
                rows = np.asarray(ctx.logits(), dtype=np.float64)[:n_ctx - 1 - first]
                targets = chunk[first + 1:]
                peak = rows.max(axis=1)
                log_z = peak + np.log(np.exp(rows - peak[:, None]).sum(axis=1))
                total += float((log_z - rows[np.arange(len(targets)), targets]).sum())
                count += len(targets)
        finally:
            batch.close()
    nll = total / count
    return Perplexity(math.exp(nll), nll, count, n_chunks)
