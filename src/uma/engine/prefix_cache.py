"""The prefix cache: finished requests' KV kept in the context (and, once it must leave, in host
memory), reused by new prompts that start with the same tokens.

A request that ends leaves its cells to a spare sequence of the context instead of freeing
them: `llama_memory_seq_cp` with one KV buffer for all sequences (kv_unified) shares cells
rather than copying them, so keeping costs no copy and no memory beyond what the request
already held. A new request whose prompt starts with cached tokens gets those cells the same
way and prefills only the rest; a prompt that is all cached still re-evaluates its last token,
whose logits are needed to sample from. A chat's next turn, or another app sending the same
system prompt, then starts where the last request left off.

Which prefixes exist and which to drop is uma.engine.prefix_index's (a radix trie); this
module owns the spare sequences and the calls into the context. Entries leave when the spare
sequences or the token budget run out, and whenever the KV cache has no room for running work
(`evict_one`), those worth least to keep first (uma.sched.reuse.keep_value: a prompt several
apps reuse outlives one-off conversations, an entry nobody reuses for long goes): the cache
never fails a request. `reuse` and `keep` are told the request's app, and the record of who
reused an entry and how often goes with its KV from the KV tier to host memory and, restored,
to the entry its request leaves.
An entry that leaves is snapshotted to host memory first (`llama_state_seq_get_data`) while
the RAM budget allows: an entry over the token budget or the spare sequences leaves through
uma.engine.snapshots, copied in slices in the time ticks leave free (`save`), its cells held until
copied; one that must leave at once, for room a running request needs now, is copied whole
only where nothing runs or waits (`idle`), and otherwise dropped unsaved. A later prompt can get
a snapshot restored into its sequence, trimmed to the match. Which tier a prompt starts from is
uma.sched.reuse's choice: this module finds the candidates and carries the choice out
(`reuse`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from uma.engine.prefix_disk import DiskTier
from uma.engine.prefix_index import PrefixIndex, Reuses
from uma.engine.snapshots import Leaving, Part, Snapshots
from uma.errors import UmaError
from uma.sched.cost import CostEstimate
from uma.sched.reuse import (
    MIN_REUSE_TOKENS,
    RESTORE_BYTES_PER_MS,
    Candidates,
    choose_reuse,
    worth_a_snapshot,
)

if TYPE_CHECKING:
    from uma import _core


class KvPrefixCache:
    """Cached prefixes in spare sequences `seqs` of `ctx`, at most `budget` tokens in all.
    Used by the scheduler's thread only."""

    def __init__(self, ctx: _core.Context, seqs: range, budget: int,
                 ram_budget: int = 0, disk: DiskTier | None = None) -> None:
        """ram_budget: bytes of host memory for snapshots of entries that leave the KV cache
        (0: they are dropped). With a RAM budget and two sequences or more, the last of `seqs`
        is kept empty for slicing snapshots (uma.engine.snapshots). disk: where snapshots go to
        outlive the process (uma.engine.prefix_disk; needs a RAM budget): those that leave
        host memory having been reused, and the rest as the engine closes (persist)."""
        self.ctx = ctx
        self.budget = budget
        self.ram_budget = ram_budget
        self.disk = disk if ram_budget > 0 else None
        self.index = PrefixIndex()
        slicing = ram_budget > 0 and len(seqs) >= 2
        self._free = list(seqs[:-1] if slicing else seqs)
        # spare sequences kept free while entries leave in slices, so that a request that ends
        # finds one without an entry dropped unsaved (none with a handful of spares or fewer)
        self._reserve = 1 if len(self._free) >= 4 else 0
        self.snapshots = Snapshots(ctx, seqs[-1] if slicing else None)
        self._seq_of: dict[int, int] = {}  # "kv" entry -> the spare sequence holding its cells
        self._tokens_of: dict[int, np.ndarray] = {}  # "kv" entry -> its tokens (to snapshot)
        # "ram" entry -> its tokens (for the disk) and its state, in slices
        self._snapshot: dict[int, tuple[np.ndarray, tuple[Part, ...]]] = {}
        self._leaving: dict[int, Reuses] = {}  # sequence leaving in slices -> its entry's record
        # request's sequence -> the record of the snapshot restored into it, and the tokens
        # restored: the entry the request leaves is that snapshot back in the KV tier
        self._restored: dict[int, tuple[Reuses, np.ndarray]] = {}
        self.restored_bytes = 0  # snapshot bytes read back into the KV cache, in all
        self.restore_ms = 0.0  # the time those restores took: the bandwidth they are priced at
        # (not the snapshots': llama.cpp reads a sequence's state off a GPU several times
        # slower than it writes it back)
        # called as an entry leaves a tier for room: "kv" (the KV cache, snapshotted or not),
        # "ram" (a snapshot, for the RAM budget); the scheduler counts them
        self.on_evict: Callable[[str], None] = lambda tier: None
        self.on_unsaved: Callable[[], None] = lambda: None  # an entry worth saving was not
        # whether nothing runs or waits: an entry that must leave at once is copied whole
        # then, and dropped unsaved otherwise (the scheduler's)
        self.idle: Callable[[], bool] = lambda: True
        # what an entry of n tokens would take to prefill (the scheduler's cost model): what
        # its snapshot would save, against the copy's measured time (worth_a_snapshot)
        self.prefill_ms: Callable[[int], float] = lambda n: float("inf")

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

    @property
    def snapshot_seconds(self) -> float:
        """The time snapshots took, in all (none of the ticks' work)."""
        return self.snapshots.seconds

    @property
    def saving(self) -> bool:
        """Whether entries are leaving in slices: `save` has work."""
        return bool(self.snapshots)

    def keep(self, seq: int, tokens: np.ndarray, *, app: str = "") -> None:
        """A request of `app` on `seq` ended holding the KV of `tokens` (positions 0..len-1):
        keeps it, unless too short, already covered by a longer entry, or over the budget
        alone."""
        restored = self._restored.pop(seq, None)
        n = len(tokens)
        if n < MIN_REUSE_TOKENS or n > self.budget:
            return
        existing = self.index.covering(tokens, "kv")
        if existing is not None:
            self.index.touch(existing, app)
            return
        if not self._free:
            self.evict_one()
        spare = self._free.pop()
        self.ctx.seq_cp(seq, spare, 0, n)
        reuses = None
        if restored is not None and np.array_equal(tokens[:len(restored[1])], restored[1]):
            reuses = restored[0]
        entry = self.index.insert(tokens, "kv", app=app, reuses=reuses)
        self._seq_of[entry] = spare
        self._tokens_of[entry] = np.array(tokens, np.int32)
        for victim in self.index.evictions("kv", self.budget).victims:
            self._leave(victim)
        # entries already leaving count as free: their sequences come back once copied
        while len(self._free) + len(self.snapshots) < self._reserve and len(self._seq_of) > 1:
            victims = self.index.evictions("kv", self.index.total("kv") - 1).victims
            if not victims:
                break
            self._leave(victims[0])

    def save(self, budget_ms: float, idle: bool = False) -> None:
        """Copies slices of the leaving entries to host memory for about budget_ms at most
        (uma.engine.snapshots), and files those complete in the "ram" tier. idle: nothing else is
        to be done, so one position at least is copied."""
        worked = self.snapshots.work(budget_ms, self._still_worth, at_least_one=idle)
        for job in worked.finished:
            self._file(job.tokens, tuple(job.parts), self._leaving[job.seq])
            self._release(job.seq)
        for job in worked.dropped:
            self._release(job.seq)

    def _still_worth(self, job: Leaving) -> bool:
        """Whether a leaving entry is worth the rest of its copy at what its own slices cost
        (not counted unsaved if not: nothing worth it is lost)."""
        n = len(job.tokens)
        return worth_a_snapshot(n, job.ms_per_token, self.prefill_ms(n))

    @property
    def restore_bytes_per_ms(self) -> float:
        """The bandwidth restores have shown (RESTORE_BYTES_PER_MS before the first)."""
        if self.restore_ms <= 0.0:
            return RESTORE_BYTES_PER_MS
        return self.restored_bytes / self.restore_ms

    def reuse(self, seq: int, tokens: np.ndarray, cost: CostEstimate | None = None,
              prompt_ms_per_token: float = 0.0, *, app: str = "") -> int:
        """Gives the empty sequence `seq` the cached prefix of `tokens` that saves the most
        predicted time (uma.sched.reuse.choose_reuse: shared live cells or a restore); returns
        how many tokens it holds now (0: none worth reusing, or a restore found no room). A
        match counts at most all but the last token: the prompt's last one is decoded again
        for its logits. The entry reused counts a hit by `app` ("": not told)."""
        self._restored.pop(seq, None)  # a request before on `seq` that left no entry
        kv = self.index.longest(tokens, "kv")
        ram = self.index.longest(tokens, "ram") if self._snapshot else None
        last = len(tokens) - 1
        candidates = Candidates(min(kv.length, last) if kv is not None else 0,
                                min(ram.length, last) if ram is not None else 0,
                                self.index.entry(ram.entry).nbytes if ram is not None else 0)
        choice = choose_reuse(candidates, cost or CostEstimate(), self.restore_bytes_per_ms,
                              prompt_ms_per_token)
        if choice.tier == "ram" and ram is not None:
            if not self._restore(seq, ram.entry, choice.tokens, app):
                return 0
            self._restored[seq] = (self.index.entry(ram.entry).reuses,
                                   np.array(tokens[:choice.tokens]))
            return choice.tokens
        if choice.tier == "kv" and kv is not None:
            self.ctx.seq_cp(self._seq_of[kv.entry], seq, 0, choice.tokens)
            self.index.hit(kv.entry, app, choice.tokens)
            return choice.tokens
        return 0

    def _restore(self, seq: int, entry: int, n: int, app: str) -> bool:
        """Reads a snapshot back into the empty sequence `seq`, keeping its first n positions
        (a hit by `app`); False (and `seq` left empty) where the KV cache has no room for it."""
        start = time.perf_counter()
        try:
            read = self.snapshots.restore(seq, self._snapshot[entry][1], n)
        except UmaError:
            return False
        self.restore_ms += 1e3 * (time.perf_counter() - start)
        self.ctx.seq_rm(seq, n, -1)
        self.index.hit(entry, app, n)
        self.restored_bytes += read
        return True

    def evict_one(self) -> bool:
        """Frees cells now, for a running request or a spare sequence: an entry still leaving
        in slices first (dropped unsaved), else the entry worth least to keep (copied whole
        where nothing runs or waits, dropped unsaved otherwise). False when there is none."""
        job = self.snapshots.drop_oldest()
        if job is not None:
            self.on_unsaved()
            self._release(job.seq)
            return True
        if not self._seq_of:
            return False
        victims = self.index.evictions("kv", self.index.total("kv") - 1).victims
        if not victims:
            return False
        self._leave_now(*self._forget(victims[0]))
        return True

    def clear(self) -> None:
        while (job := self.snapshots.drop_oldest()) is not None:
            self._release(job.seq)
        self._restored.clear()
        for entry in list(self._seq_of):
            self._release(self._forget(entry, counted=False)[0])
        for entry in list(self._snapshot):
            self.index.remove(entry)
            del self._snapshot[entry]

    def _leave(self, entry: int) -> None:
        """An entry leaves the KV cache for the budget: through slices where it is worth a
        snapshot (the PagedKV idea: an idle chat's KV leaves the device and comes back on its
        next turn), its cells held until copied; freed at once otherwise."""
        spare, tokens, reuses = self._forget(entry)
        if self._worth_saving(tokens) and self.snapshots.scratch is not None:
            self.snapshots.start(tokens, spare)
            self._leaving[spare] = reuses
        else:
            self._leave_now(spare, tokens, reuses)

    def _leave_now(self, spare: int, tokens: np.ndarray, reuses: Reuses) -> None:
        """An entry's cells are freed now: copied whole first where it is worth it and
        nothing runs or waits, counted unsaved where something does."""
        if self._worth_saving(tokens):
            if self.idle():
                self._file(tokens, self.snapshots.whole(tokens, spare), reuses)
            else:
                self.on_unsaved()
        self._release(spare)

    def _forget(self, entry: int, counted: bool = True) -> tuple[int, np.ndarray, Reuses]:
        """Takes the entry out of the "kv" tier; returns its sequence, tokens and record."""
        spare = self._seq_of.pop(entry)
        tokens = self._tokens_of.pop(entry)
        reuses = self.index.entry(entry).reuses
        self.index.remove(entry)
        if counted:
            self.on_evict("kv")
        return spare, tokens, reuses

    def _worth_saving(self, tokens: np.ndarray) -> bool:
        """A RAM budget, no snapshot covering it yet, and a prefill worth the copy at the
        last copies' price."""
        n = len(tokens)
        return self.ram_budget > 0 and self.index.covering(tokens, "ram") is None \
            and worth_a_snapshot(n, self.snapshots.ms_per_token, self.prefill_ms(n))

    def warm(self) -> int:
        """Files the newest snapshots on disk in the "ram" tier, within the RAM budget (a
        daemon that starts again restores what it had cached); returns how many."""
        if self.disk is None:
            return 0
        n = 0
        for saved in self.disk.read(self.ram_budget - self.ram_bytes):
            n += self._file(saved.tokens, saved.parts, None)
        return n

    def persist(self) -> None:
        """Writes every entry worth keeping to disk, as the engine closes (nothing runs then):
        those leaving in slices are finished, those in host memory written (the disk skips
        those it holds), those still in the KV cache copied whole; then waits for the writes."""
        if self.disk is None:
            return
        try:
            self.save(float("inf"), idle=True)
            for tokens, parts in self._snapshot.values():
                self.disk.write(tokens, parts)
            for entry, spare in list(self._seq_of.items()):
                tokens = self._tokens_of[entry]
                if self.index.covering(tokens, "ram") is None:
                    self.disk.write(tokens, self.snapshots.whole(tokens, spare))
        finally:
            self.disk.close()

    def _file(self, tokens: np.ndarray, parts: tuple[Part, ...], reuses: Reuses | None
              ) -> bool:
        """Keeps a complete snapshot in the "ram" tier, within the RAM budget, with the record
        of the entry it was; whether it was kept. The disk gets what leaves host memory
        having been reused and is held by no longer entry (what is worth a file past the RAM
        budget), and the rest as the engine closes (persist): not every snapshot as it is
        made, which on a busy day wrote gigabytes an hour of entries never read again."""
        nbytes = sum(len(p.data) for p in parts)
        if nbytes > self.ram_budget or self.index.covering(tokens, "ram") is not None:
            return False
        saved = self.index.insert(tokens, "ram", nbytes=nbytes, reuses=reuses)
        self._snapshot[saved] = (tokens, parts)
        for victim in self.index.evictions("ram", self.ram_budget).victims:
            reuses = self.index.entry(victim).reuses
            self.index.remove(victim)
            tokens, parts = self._snapshot.pop(victim)
            if reuses.hits:
                self._write_reused(tokens, parts, reuses)
            self.on_evict("ram")
        return True

    def _write_reused(self, tokens: np.ndarray, parts: tuple[Part, ...],
                      reuses: Reuses) -> None:
        """Writes the part of a reused entry that was reused: its first `matched` tokens, with
        the slices holding them (agents' entries, each a shared system prompt and a question
        of its own, become one file of the shared prompt: the disk writes a prompt it holds
        only once), unless an entry held in memory holds the whole entry (a chat's earlier
        turn, reused by the next)."""
        if self.disk is None or self.index.covering(tokens, "ram") is not None \
                or self.index.covering(tokens, "kv") is not None:
            return
        n = reuses.matched or len(tokens)
        self.disk.write(tokens[:n], tuple(p for p in parts if p.start < n))

    def _release(self, spare: int) -> None:
        """Frees the cells of a spare sequence no running request shares, and the sequence."""
        self._leaving.pop(spare, None)
        self.ctx.seq_rm(spare)
        self._free.append(spare)
