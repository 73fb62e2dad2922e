"""Which cached prefix a new request starts from: a pure function of the candidates the prefix
cache found and of the cost model, like the policy's other steps.

Sharing live cells (the KV tier) copies nothing, so it costs only what the prompt tokens it
covers no longer cost. A host-memory snapshot (the RAM tier) must first be copied back whole;
it is taken where the prefill it saves beyond the live match is predicted to take longer than
that copy, at the bandwidth restores have shown (RESTORE_BYTES_PER_MS before the first).
A prefill is priced at the cost model's prediction or at the prompt throughput large chunks
have shown, whichever is slower: the cost model learns from ticks whose prompt chunks are
mostly small, and on a GPU it priced a long prompt's prefill about an order of magnitude below
what it took, which made every restore look slower than the prefill it saved
(docs/design/prefix-cache.md).
Either way the request's time to first token falls by the prefill it no longer does: the
scheduler starts its sequence there, and the policy plans its first chunk at that depth
(SessionView.n_past, n_cached).

Which cached entry goes first when a tier is over its budget is `keep_value`'s: the prefill an
entry is expected to save per unit it holds, from its length, how often and by how many apps it
was reused, and how long ago it was last used (under least-recent use six apps' shared system
prompt was lost to four one-off conversations). uma.engine.prefix_index orders its victims by
it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from uma.sched.cost import CostEstimate

# A shorter match is not worth a sequence copy: a few tokens prefill in about the time the
# copy and the bookkeeping take, and every prompt shares its first (BOS, template) tokens.
MIN_REUSE_TOKENS = 16
# Host-to-KV bandwidth assumed before the first restore is timed (bytes per ms: 4 GB/s),
# below what a memory copy or a PCIe transfer does (docs/results/prefix-reuse.md has restores).
RESTORE_BYTES_PER_MS = 4e6
# A snapshot is taken where the prefill it would save is at least this many times its copy
# out: it pays if one such entry in this many comes back. One-off requests that decoded
# beside others are cheap to prefill on a GPU and dear to copy (cells scattered a few apart):
# copying every one of them took the time of the background's prompts.
SNAPSHOT_PAYBACK = 2.0
# An entry's keep value halves every this many uses of the prefix cache (inserts, refreshes and
# hits: one or two a request) that pass it by, not seconds, since only traffic needs the room:
# an entry one other app reused (worth four fresh ones) outlasts fresh one-off entries for 128
# uses after its last, 64 to 128 requests, eight turnovers or more of the default eight spare
# sequences; a prompt its apps stopped sending still goes.
KEEP_HALF_LIFE = 64
# Distinct apps an entry remembers: a prefix eight apps send already weighs eight times what one
# app's conversation does a reuse, and more would only slow its going once they stop.
MAX_APPS = 8


class Candidates(NamedTuple):
    """The longest match of a prompt in each tier (tokens usable: at most all but the last)."""

    kv_tokens: int
    ram_tokens: int
    ram_bytes: int  # the snapshot's size: a restore copies it whole


class Reuse(NamedTuple):
    tier: str  # "kv", "ram" or "" (prefill from the start)
    tokens: int
    saved_ms: float  # predicted prefill time saved, less a restore's copy


def prefill_ms(n: int, cost: CostEstimate, prompt_ms_per_token: float = 0.0) -> float:
    """A prompt of n tokens' prefill from the start: the cost model's price, or what large
    prompt chunks have cost a token (0: unknown), whichever is more."""
    return max(cost.prefill_ms(n, 0), n * prompt_ms_per_token)


def worth_a_snapshot(n: int, copy_ms_per_token: float | None, prefill: float) -> bool:
    """Whether an entry of n tokens is worth copying to host memory, at the copies' measured
    time per token (None: none measured yet, so this one is, to learn it), where its prefill
    would take `prefill` ms."""
    return copy_ms_per_token is None or prefill >= SNAPSHOT_PAYBACK * copy_ms_per_token * n


def keep_value(tokens: int, cost: float, hits: int, apps: int, age: int) -> float:
    """What keeping a cached entry is worth per unit of what it holds (`cost`: its cells in the
    KV tier, its bytes in the RAM tier): the prompt `tokens` a reuse of it saves that no other
    entry would (its length, less any prefix another entry keeps), times the reuses to expect,
    halved every KEEP_HALF_LIFE of `age`, the uses of the cache since its last.

    The reuses to expect are (1 + hits) x apps: the insert counts as one use, so a fresh entry
    is worth one and every reuse adds one; each distinct app (at most MAX_APPS; none told
    counts as one) is another sender of the prefix, which stays useful while any of them sends
    it, where one app's repeats end with its conversation. For a KV entry that shares nothing
    tokens and cells are one count (and with one KV buffer each live cell lengthens every
    decode's attention), so its length cancels: with no reuse recorded, entries rank by
    recency alone."""
    expected = (1 + hits) * max(1, min(apps, MAX_APPS))
    return tokens * expected * math.pow(0.5, age / KEEP_HALF_LIFE) / max(cost, 1.0)


def choose_reuse(c: Candidates, cost: CostEstimate, restore_bytes_per_ms: float,
                 prompt_ms_per_token: float = 0.0) -> Reuse:
    """The tier that saves the most predicted time, where it saves any. prompt_ms_per_token:
    what large prompt chunks have cost a token (0: unknown), the least a prefill is priced."""
    best = Reuse("", 0, 0.0)
    if c.kv_tokens >= MIN_REUSE_TOKENS:
        best = Reuse("kv", c.kv_tokens, prefill_ms(c.kv_tokens, cost, prompt_ms_per_token))
    if c.ram_tokens >= MIN_REUSE_TOKENS and c.ram_tokens > best.tokens:
        restore_ms = c.ram_bytes / max(restore_bytes_per_ms, 1.0)
        saved = prefill_ms(c.ram_tokens, cost, prompt_ms_per_token) - restore_ms
        if saved > best.saved_ms:
            best = Reuse("ram", c.ram_tokens, saved)
    return best
