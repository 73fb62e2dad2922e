"""The prefix cache: finished requests' KV kept in the context (and, once it must leave, in host
memory), reused by new prompts that start with the same tokens.

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
An entry that leaves is snapshotted to host memory first (`llama_state_seq_get_data`) while
the RAM budget allows, and while the executor lets it (`may_snapshot`): llama.cpp reads a
sequence's state one run of cells at a time per layer, and a request that decoded beside
others holds a cell every few, so on a GPU whose every read waits for the device the snapshot
can stall all streams (160 tokens decoded beside 7 others: 197 ms on an H100 under Vulkan,
2 ms for the same tokens in one run). A later prompt can get a snapshot restored
(`_set_data`) into its sequence, trimmed to the match. Which tier a prompt starts from is
uma.sched.reuse's choice: this module finds the candidates and carries the choice out
(`reuse`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from uma.errors import UmaError
from uma.prefix_index import PrefixIndex
from uma.sched.cost import CostEstimate
from uma.sched.reuse import MIN_REUSE_TOKENS, RESTORE_BYTES_PER_MS, Candidates, choose_reuse

if TYPE_CHECKING:
    from uma import _core


class KvPrefixCache:
    """Cached prefixes in spare sequences `seqs` of `ctx`, at most `budget` tokens in all.
    Used by the executor's thread only."""

    def __init__(self, ctx: _core.Context, seqs: range, budget: int,
                 ram_budget: int = 0, snapshot_ms_per_token: float | None = None) -> None:
        """ram_budget: bytes of host memory for snapshots of entries that leave the KV cache
        (0: they are dropped). snapshot_ms_per_token: what a snapshot is expected to cost
        before one is timed (None: unknown, as on a GPU)."""
        self.ctx = ctx
        self.budget = budget
        self.ram_budget = ram_budget
        self.index = PrefixIndex()
        self._free = list(seqs)
        self._seq_of: dict[int, int] = {}  # "kv" entry -> the spare sequence holding its cells
        self._tokens_of: dict[int, np.ndarray] = {}  # "kv" entry -> its tokens (to snapshot)
        self._snapshot: dict[int, bytes] = {}  # "ram" entry -> its sequence state
        self.restored_bytes = 0  # snapshot bytes read back into the KV cache, in all
        self.restore_ms = 0.0  # the time those restores took: the bandwidth they are priced at
        # (not the snapshots': llama.cpp reads a sequence's state off a GPU at a seventh of the
        # speed it writes it back, 1.2 against 7.8 GB/s on an H100)
        # called as an entry leaves a tier for room: "kv" (the KV cache, snapshotted or not),
        # "ram" (a snapshot, for the RAM budget); the executor counts them
        self.on_evict: Callable[[str], None] = lambda tier: None
        # asked before each snapshot with its predicted ms (None: none timed yet, no prior);
        # False drops the entry unsaved (the executor's: uma.executor.Executor._may_snapshot)
        self.may_snapshot: Callable[[float | None], bool] = lambda predicted_ms: True
        self.snapshot_ms_per_token = snapshot_ms_per_token  # timed snapshots, weighted to
        # the recent ones (a run of cells or a scattered sequence: 100x apart on a GPU)
        self.snapshot_seconds = 0.0  # the time snapshots took, in all (not the ticks' work)

    def __len__(self) -> int:
        return len(self._seq_of)

    @property
    def tokens(self) -> int:
        """Tokens the cached entries hold (cells shared with running requests included)."""
        return self.index.total("kv")

    @property
    def ram_bytes(self) -> int:
        """Bytes the host-memory snapshots take."""
        return self.index.total("ram")

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
        self._tokens_of[entry] = np.array(tokens, np.int32)
        for victim in self.index.evictions("kv", self.budget).victims:
            self._drop(victim)

    @property
    def restore_bytes_per_ms(self) -> float:
        """The bandwidth restores have shown (RESTORE_BYTES_PER_MS before the first)."""
        if self.restore_ms <= 0.0:
            return RESTORE_BYTES_PER_MS
        return self.restored_bytes / self.restore_ms

    def reuse(self, seq: int, tokens: np.ndarray, cost: CostEstimate | None = None,
              prompt_ms_per_token: float = 0.0) -> int:
        """Gives the empty sequence `seq` the cached prefix of `tokens` that saves the most
        predicted time (uma.sched.reuse.choose_reuse: shared live cells or a restore); returns
        how many tokens it holds now (0: none worth reusing, or a restore found no room). A
        match counts at most all but the last token: the prompt's last one is decoded again
        for its logits."""
        kv = self.index.longest(tokens, "kv")
        ram = self.index.longest(tokens, "ram") if self._snapshot else None
        last = len(tokens) - 1
        candidates = Candidates(min(kv.length, last) if kv is not None else 0,
                                min(ram.length, last) if ram is not None else 0,
                                len(self._snapshot[ram.entry]) if ram is not None else 0)
        choice = choose_reuse(candidates, cost or CostEstimate(), self.restore_bytes_per_ms,
                              prompt_ms_per_token)
        if choice.tier == "ram" and ram is not None:
            return choice.tokens if self._restore(seq, ram.entry, choice.tokens) else 0
        if choice.tier == "kv" and kv is not None:
            self.ctx.seq_cp(self._seq_of[kv.entry], seq, 0, choice.tokens)
            self.index.touch(kv.entry)
            return choice.tokens
        return 0

    def _restore(self, seq: int, entry: int, n: int) -> bool:
        """Reads a snapshot back into the empty sequence `seq`, keeping its first n positions;
        False (and `seq` left empty) where the KV cache has no room for it."""
        data = self._snapshot[entry]
        start = time.perf_counter()
        try:
            self.ctx.set_seq_state(seq, data)
        except UmaError:
            self.ctx.seq_rm(seq)
            return False
        self.restore_ms += 1e3 * (time.perf_counter() - start)
        self.ctx.seq_rm(seq, n, -1)
        self.index.touch(entry)
        self.restored_bytes += len(data)
        return True

    def evict_one(self) -> bool:
        """Takes the least recently used entry out of the KV cache (to host memory where the
        budget allows); False when there is none."""
        if not self._seq_of:
            return False
        victims = self.index.evictions("kv", self.index.total("kv") - 1).victims
        if not victims:
            return False
        self._drop(victims[0])
        return True

    def clear(self) -> None:
        for entry in list(self._seq_of):
            self._drop(entry, keep=False)
        for entry in list(self._snapshot):
            self.index.remove(entry)
            del self._snapshot[entry]

    def _drop(self, entry: int, keep: bool = True) -> None:
        """An entry leaves the KV cache: snapshotted to host memory where the budget allows
        (the PagedKV idea: an idle chat's KV leaves the device and comes back on its next
        turn), then its cells are freed."""
        spare = self._seq_of.pop(entry)
        tokens = self._tokens_of.pop(entry)
        if keep and self.ram_budget and self.index.covering(tokens, "ram") is None:
            data = self._snapshot_of(spare, len(tokens))
            if data is not None and len(data) <= self.ram_budget:
                saved = self.index.insert(tokens, "ram", nbytes=len(data))
                self._snapshot[saved] = data
                for victim in self.index.evictions("ram", self.ram_budget).victims:
                    self.index.remove(victim)
                    del self._snapshot[victim]
                    self.on_evict("ram")
        self.ctx.seq_rm(spare)  # frees the cells no running request shares
        self.index.remove(entry)
        self._free.append(spare)
        if keep:
            self.on_evict("kv")

    def _snapshot_of(self, seq: int, n_tokens: int) -> bytes | None:
        """The sequence's state, timed into snapshot_ms_per_token; None where may_snapshot
        refuses the predicted time."""
        rate = self.snapshot_ms_per_token
        if not self.may_snapshot(None if rate is None else rate * n_tokens):
            return None
        start = time.perf_counter()
        data = self.ctx.seq_state(seq)
        took = time.perf_counter() - start
        self.snapshot_seconds += took
        per_token = 1e3 * took / max(1, n_tokens)
        self.snapshot_ms_per_token = per_token if rate is None else 0.5 * (rate + per_token)
        return data
