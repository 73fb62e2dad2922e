"""The prefix cache's KV tier: finished requests' KV kept in the context, reused by new prompts
that start with the same tokens.

A request that ends leaves its cells to a spare sequence of the context instead of freeing
them: `llama_memory_seq_cp` with one KV buffer for all sequences (kv_unified) shares cells
rather than copying them, so keeping costs no copy and no memory beyond what the request
already held. A new request whose prompt starts with cached tokens gets those cells the same
way and prefills only the rest; a prompt that is all cached still re-evaluates its last token,
whose logits are needed to sample from. A chat's next turn, or another app sending the same
system prompt, then starts where the last request left off.

Which prefixes exist and which to drop is uma.prefix_index's (a radix trie with LRU
recency); this module owns the spare sequences and the calls into the context. Entries leave
least recently used first when the spare sequences or the token budget run out, and whenever
the KV cache has no room for running work (`evict_one`): the cache never fails a request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from uma.prefix_index import PrefixIndex

if TYPE_CHECKING:
    from uma import _core

# A shorter match is not worth a sequence copy: a few tokens prefill in about the time the
# copy and the bookkeeping take, and every prompt shares its first (BOS, template) tokens.
MIN_REUSE_TOKENS = 16


class KvPrefixCache:
    """Cached prefixes in spare sequences `seqs` of `ctx`, at most `budget` tokens in all.
    Used by the executor's thread only."""

    def __init__(self, ctx: _core.Context, seqs: range, budget: int) -> None:
        self.ctx = ctx
        self.budget = budget
        self.index = PrefixIndex()
        self._free = list(seqs)
        self._seq_of: dict[int, int] = {}  # entry -> the spare sequence holding its cells

    def __len__(self) -> int:
        return len(self._seq_of)

    @property
    def tokens(self) -> int:
        """Tokens the cached entries hold (cells shared with running requests included)."""
        return self.index.total("kv")

    def keep(self, seq: int, tokens: np.ndarray) -> None:
        """A request on `seq` ended holding the KV of `tokens` (positions 0..len-1): keeps
        it, unless too short, already covered by a longer entry, or over the budget alone."""
        n = len(tokens)
        if n < MIN_REUSE_TOKENS or n > self.budget:
            return
        existing = self.index.covering(tokens, "kv")
        if existing is not None:
            self.index.touch(existing)
            return
        if not self._free:
            self.evict_one()
        spare = self._free.pop()
        self.ctx.seq_cp(seq, spare, 0, n)
        entry = self.index.insert(tokens, "kv")
        self._seq_of[entry] = spare
        for victim in self.index.evictions("kv", self.budget).victims:
            self._drop(victim)

    def reuse(self, seq: int, tokens: np.ndarray) -> int:
        """Gives the empty sequence `seq` the longest cached prefix of `tokens`; returns how
        many tokens it holds now (0: none worth reusing). At most all but the last token: the
        prompt's last one is decoded again for its logits."""
        match = self.index.longest(tokens, "kv")
        if match is None:
            return 0
        n = min(match.length, len(tokens) - 1)
        if n < MIN_REUSE_TOKENS:
            return 0
        self.ctx.seq_cp(self._seq_of[match.entry], seq, 0, n)
        self.index.touch(match.entry)
        return n

    def evict_one(self) -> bool:
        """Drops the least recently used entry; False when there is none."""
        if not self._seq_of:
            return False
        victims = self.index.evictions("kv", self.index.total("kv") - 1).victims
        if not victims:
            return False
        self._drop(victims[0])
        return True

    def clear(self) -> None:
        for entry in list(self._seq_of):
            self._drop(entry)

    def _drop(self, entry: int) -> None:
        spare = self._seq_of.pop(entry)
        self.ctx.seq_rm(spare)  # frees the cells no running request shares
        self.index.remove(entry)
        self._free.append(spare)
