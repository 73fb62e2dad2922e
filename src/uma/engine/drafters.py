"""Drafters: where a speculating stream's guesses come from.

`NgramDrafter` is model-free prompt lookup: the stream's last few tokens are looked up in its
own history (prompt and output), and the tokens that followed their latest earlier occurrence
are the guesses. Output that repeats its input (a file being edited, a quoted passage, code
refactored in place) is guessed for free; elsewhere it finds nothing and costs nothing (the
policy verifies no guess it does not have).

A drafter only guesses; the scheduler decides how many guesses are verified
(uma.sched.speculation) and the runner verifies them in the tick's batch.
"""

from __future__ import annotations

import itertools

import numpy as np

from uma.request import Request

# the shortest suffix looked up (a single token matches too often to be worth a row), and the
# longest agreement counted: how far back an earlier occurrence agrees with the stream's last
# tokens tells how likely its continuation is right (inside a quoted passage it agrees for
# dozens of tokens, at a common phrase for two or three)
NGRAM_MIN = 2
MATCH_MAX = 32
# of the earlier occurrences of the last NGRAM_MIN tokens, the latest this many are compared
CANDIDATES = 64


class _History:
    """A request's tokens (prompt, then output) in a growing buffer, with where each pair of
    consecutive tokens starts: a lookup then reads the earlier occurrences of the last pair
    instead of scanning the whole history each tick (it runs every tick of every stream that
    speculates, where a GPU's tick is a millisecond or two)."""

    __slots__ = ("buf", "n", "seen", "pairs")

    def __init__(self, prompt: np.ndarray) -> None:
        self.buf = np.empty(max(64, 2 * len(prompt)), np.int32)
        self.buf[:len(prompt)] = prompt
        self.n = len(prompt)
        self.seen = 0  # output tokens copied in
        self.pairs: dict[tuple[int, int], list[int]] = {}
        tokens = prompt.tolist()
        for i in range(len(tokens) - 1):
            self.pairs.setdefault((tokens[i], tokens[i + 1]), []).append(i)

    def sync(self, generated: list[int]) -> np.ndarray:
        new = generated[self.seen:]
        if new:
            if self.n + len(new) > len(self.buf):
                grown = np.empty(2 * (self.n + len(new)), np.int32)
                grown[:self.n] = self.buf[:self.n]
                self.buf = grown
            self.buf[self.n:self.n + len(new)] = new
            # from the pair that ends at the first new token on, as Python ints (a numpy
            # scalar a token made catching up a stream's hundreds of quiet ticks 5x dearer)
            first = max(self.n - 1, 0)
            tokens = ([] if self.n == 0 else [int(self.buf[first])]) + new
            pairs = self.pairs
            for i, pair in enumerate(itertools.pairwise(tokens), first):
                pairs.setdefault(pair, []).append(i)
            self.n += len(new)
            self.seen = len(generated)
        return self.buf[:self.n]

    def earlier(self) -> list[int]:
        """Where the last pair occurs before its own place at the end, latest last."""
        if self.n < 2:
            return []
        starts = self.pairs.get((int(self.buf[self.n - 2]), int(self.buf[self.n - 1])), [])
        return starts[-CANDIDATES - 1:-1]


def lookup(history: np.ndarray, k: int, earlier: list[int] | None = None
           ) -> tuple[np.ndarray, int]:
    """Up to k tokens that followed the earlier occurrence of history's last NGRAM_MIN tokens
    that agrees with history's end the furthest back (the latest of those), and how far it
    agrees (at most MATCH_MAX). Empty, 0: none occurs earlier. earlier: where those tokens
    occur before the end, latest last (None: found by scanning the history)."""
    size = len(history)
    n = NGRAM_MIN
    if size <= n or k <= 0:
        return history[:0], 0
    if earlier is None:
        tail = history[size - n:]
        hit = history[:size - n] == tail[0]
        for j in range(1, n):
            hit &= history[j:size - n + j] == tail[j]
        starts = np.flatnonzero(hit)[-CANDIDATES:]
    else:
        starts = np.array(earlier[-CANDIDATES:], np.int64)
    if not len(starts):
        return history[:0], 0
    # how many tokens before each occurrence agree with the ones before the tail
    back = np.arange(MATCH_MAX - n)
    mine = size - n - 1 - back
    theirs = starts[:, None] - 1 - back[None, :]
    same = (theirs >= 0) & (mine[None, :] >= 0)
    same &= history[np.maximum(theirs, 0)] == history[np.maximum(mine, 0)][None, :]
    agree = n + np.cumprod(same, axis=1).sum(axis=1)
    best = len(agree) - 1 - int(np.argmax(agree[::-1]))  # the latest of the longest
    after = int(starts[best]) + n
    found = history[after:after + k]
    if len(found) < k:  # the match runs into the end: a repeating stretch, which repeats on
        found = np.resize(found, min(k, MATCH_MAX))
    return found, int(agree[best])


class NgramDrafter:
    """Prompt lookup over each request's own tokens (see `lookup`)."""

    name = "ngram"

    def __init__(self) -> None:
        self._histories: dict[int, _History] = {}

    def propose(self, req: Request, k: int) -> tuple[np.ndarray, int]:
        """Up to k guesses of the tokens after req's last one (its last sampled token is the
        end of its history), and how far back the lookup agreed (`lookup`)."""
        history = self._histories.get(req.rid)
        if history is None:
            history = self._histories[req.rid] = _History(req.prompt)
        tokens = history.sync(req.generated)
        earlier = history.earlier()
        if not earlier:
            return tokens[:0], 0
        return lookup(tokens, k, earlier)

    def forget(self, rid: int) -> None:
        self._histories.pop(rid, None)
