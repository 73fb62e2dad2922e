"""Which cached prefix a new request starts from: a pure function of the candidates the prefix
cache found and of the cost model, like the policy's other steps.

Sharing live cells (the KV tier) copies nothing, so it costs only what the prompt tokens it
covers no longer cost. A host-memory snapshot (the RAM tier) must first be copied back whole;
it is taken where the prefill it saves beyond the live match is predicted to take longer than
that copy, at the bandwidth the cache's copies between the KV cache and host memory have shown
(each snapshot is timed as it is taken, so the first restore is priced by the copy that made
its snapshot: with a fixed guess of 2 GB/s an H100 never restored, since an 8,000-token
snapshot priced at 126 ms looked no faster than its prefill, and it took 37 ms when it did).
Either way the request's time to first token falls by the prefill it no longer does: the
executor starts its sequence there, and the scheduler plans its first chunk at that depth
(SessionView.n_past, n_cached).
"""

from __future__ import annotations

from typing import NamedTuple

from uma.sched.cost import CostEstimate

# A shorter match is not worth a sequence copy: a few tokens prefill in about the time the
# copy and the bookkeeping take, and every prompt shares its first (BOS, template) tokens.
MIN_REUSE_TOKENS = 16
# Host-to-KV bandwidth assumed before any copy was timed (bytes per ms: 2 GB/s), below what
# a memory copy or a PCIe transfer does. Only a cache that never snapshotted prices with it.
RESTORE_BYTES_PER_MS = 2e6


class Candidates(NamedTuple):
    """The longest match of a prompt in each tier (tokens usable: at most all but the last)."""

    kv_tokens: int
    ram_tokens: int
    ram_bytes: int  # the snapshot's size: a restore copies it whole


class Reuse(NamedTuple):
    tier: str  # "kv", "ram" or "" (prefill from the start)
    tokens: int
    saved_ms: float  # predicted prefill time saved, less a restore's copy


def choose_reuse(c: Candidates, cost: CostEstimate, restore_bytes_per_ms: float) -> Reuse:
    """The tier that saves the most predicted time, where it saves any."""
    best = Reuse("", 0, 0.0)
    if c.kv_tokens >= MIN_REUSE_TOKENS:
        best = Reuse("kv", c.kv_tokens, cost.prefill_ms(c.kv_tokens, 0))
    if c.ram_tokens >= MIN_REUSE_TOKENS and c.ram_tokens > best.tokens:
        restore_ms = c.ram_bytes / max(restore_bytes_per_ms, 1.0)
        saved = cost.prefill_ms(c.ram_tokens, 0) - restore_ms
        if saved > best.saved_ms:
            best = Reuse("ram", c.ram_tokens, saved)
    return best
