"""Embeddings: each input's hidden states pooled into one vector by a second llama.cpp context
over the loaded model (uma._core.Embedder), for /v1/embeddings and Engine.embed.

The vectors are meaningful only from an embedding model (one trained for it, whose GGUF names
its pooling); a generative model's pooled states are what they are. A request is embedded a
decode at a time on the engine's compute thread, between its ticks: a decode holds at most
EngineConfig.embedding_ctx tokens, so streams pause for at most one such decode, never for a
whole batch of inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from uma.errors import InvalidRequestError

if TYPE_CHECKING:
    from uma import _core

MAX_INPUTS = 2048  # inputs in one request (OpenAI's limit)


@dataclass(frozen=True, slots=True)
class Embeddings:
    """Engine.embed's answer: one row per input, in order."""

    vectors: np.ndarray  # float32 (inputs, dimensions); unit length when normalised
    prompt_tokens: int  # the tokens of all inputs
    pooling: str  # how the inputs were pooled: mean, cls or last


def inputs_of(value: object) -> list[str | list[int]]:
    """OpenAI's input forms as a list of texts and token lists: a text, a list of texts, a list
    of token ids, or a list of those. InvalidRequestError naming what is wrong."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise InvalidRequestError("input must be a text, token ids, or a non-empty list of "
                                  "either")
    if all(_is_token(t) for t in value):
        return [list(value)]
    if len(value) > MAX_INPUTS:
        raise InvalidRequestError(f"input holds {len(value)} inputs; at most {MAX_INPUTS}")
    out: list[str | list[int]] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, (list, tuple)) and item and all(_is_token(t) for t in item):
            out.append(list(item))
        else:
            raise InvalidRequestError(f"input[{i}] must be a text or a non-empty list of "
                                      f"token ids")
    return out


def decode_end(lengths: Sequence[int], first: int, n_ctx: int, n_seq_max: int) -> int:
    """Where the decode that starts at input `first` ends: as many inputs as fit n_ctx tokens
    and n_seq_max sequences (one at least: each input fits n_ctx on its own)."""
    last, n = first, 0
    while last < len(lengths) and last - first < n_seq_max and n + lengths[last] <= n_ctx:
        n += lengths[last]
        last += 1
    return max(last, first + 1)


def _is_token(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class EmbeddingJob:
    """One request's inputs, embedded a decode at a time on the compute thread; the future
    gets the Embeddings or the error."""

    def __init__(self, tokens: Sequence[np.ndarray], normalize: bool) -> None:
        self.tokens = list(tokens)
        self.lengths = [len(t) for t in self.tokens]
        self.normalize = normalize
        self.future: Future[Embeddings] = Future()
        self._rows: list[np.ndarray] = []
        self._started = False

    def step(self, embedder: _core.Embedder) -> bool:
        """Embeds the next inputs that fit one decode; True once the job is over (done, or
        cancelled by its caller)."""
        if not self._started:
            self._started = True
            if not self.future.set_running_or_notify_cancel():
                return True
        first = len(self._rows)
        last = decode_end(self.lengths, first, embedder.n_ctx, embedder.n_seq_max)
        self._rows.extend(embedder.embed(self.tokens[first:last]))
        if len(self._rows) < len(self.tokens):
            return False
        vectors = np.stack(self._rows)
        if self.normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.where(norms > 0, norms, 1.0)
        self.future.set_result(Embeddings(vectors.astype(np.float32, copy=False),
                                          sum(self.lengths),
                                          embedder.pooling))
        return True

    def fail(self, exc: BaseException) -> None:
        """Ends the job with exc, unless it has ended already."""
        if not self.future.done():
            if not self._started:
                self._started = True
                if not self.future.set_running_or_notify_cancel():
                    return
            self.future.set_exception(exc)
