"""Token ids from a caller, checked: the one place the real core and the fake one turn a
sequence of ids into the int32 array llama.cpp takes."""

from __future__ import annotations

import numpy as np

from uma import errors


def checked(tokens: object, n_vocab: int) -> np.ndarray:
    """Token ids as a contiguous int32 array, every one checked against the vocabulary before
    the cast: a wider id must not wrap into a valid one (2**32 + 5 is not token 5)."""
    try:
        wide = np.asarray(tokens)
    except (TypeError, ValueError, OverflowError):
        raise errors.InvalidRequestError("tokens must be a sequence of integers") from None
    if wide.ndim != 1:
        raise errors.InvalidRequestError("tokens must be a one-dimensional sequence")
    if wide.size == 0:
        return np.zeros(0, dtype=np.int32)
    if wide.dtype.kind not in "iu":
        if wide.dtype.kind == "O" and all(type(t) is int for t in wide.tolist()):
            raise errors.InvalidTokenError(
                f"token id out of range: the vocabulary has {n_vocab} tokens")
        raise errors.InvalidRequestError("tokens must be integers")
    if wide.min() < 0 or wide.max() >= n_vocab:
        bad = int(wide[(wide < 0) | (wide >= n_vocab)][0])
        raise errors.InvalidTokenError(f"token id {bad} is outside the vocabulary [0, {n_vocab})")
    return np.ascontiguousarray(wide, dtype=np.int32)
