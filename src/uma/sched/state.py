"""The policy layer's contracts: a frozen snapshot in, a plan out.

`SchedulerState` is what a policy may look at; `Plan` is all it may say. Policies are pure
functions of these values (no model, no clock, no I/O), so they are tested without llama.cpp and
replaced without touching the scheduler and runner that build and run the batch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from uma.priority import Priority
from uma.sched.bmt import BmtModel
from uma.sched.cost import CostEstimate

__all__ = ["ApartView", "BatchItem", "Phase", "Plan", "PlanNotes", "Priority", "SchedulerState",
           "SessionView", "Shed", "Waiting"]


class Phase(enum.Enum):
    PREFILL = "prefill"  # prompt tokens still to be put through the model
    DECODE = "decode"  # generating: one token per step


@dataclass(frozen=True, slots=True)
class SessionView:
    """One request that holds a KV sequence, as the policy sees it."""

    seq_id: int  # its KV sequence (and sampler slot)
    rid: int  # request id, increasing with arrival
    phase: Phase
    priority: Priority
    n_prompt: int  # tokens to prefill in all (prompt, plus generated tokens after a preemption)
    n_prefilled: int  # of those, already in the KV cache
    n_generated: int  # tokens generated so far
    n_past: int  # KV positions the sequence holds (what a decode step attends to)
    arrival_ns: int  # when the request was submitted
    first_token_ns: int  # when its first token was sampled; 0 before that
    last_token_ns: int  # when its latest token was sampled; 0 before the first
    n_cached: int = 0  # of n_prompt, tokens the prefix cache held at admission
    app: str = ""  # the app that sent it (uma.sched.fair)
    weight: float = 1.0  # its app's weight
    latency_cap: float = 0.0  # its app's own latency cap (0: the policy's)

    @property
    def prefill_left(self) -> int:
        return self.n_prompt - self.n_prefilled


@dataclass(frozen=True, slots=True)
class Waiting:
    """A request queued for a KV sequence, as the policy sees it when admitting."""

    rid: int  # request id, increasing with arrival
    priority: Priority
    n_prompt: int  # tokens it will prefill
    arrival_ns: int
    app: str = ""  # the app that sent it (uma.sched.fair)
    weight: float = 1.0  # its app's weight
    # when its first token is due (the policy's first_token_due; interactive requests only,
    # 0 for the others: they go in order of arrival)
    due_ns: float = 0.0


@dataclass(frozen=True, slots=True)
class Shed:
    """What to do when the KV cache has no room for a plan: run `plan` instead, after sending
    `preempt` back to the queue (its KV freed; it prefills again later) or ending `finish`
    as 'length' (a sequence alone in the cache that still does not fit has filled it)."""

    plan: Plan
    preempt: int | None = None  # a sequence id
    finish: int | None = None  # a sequence id


@dataclass(frozen=True, slots=True)
class ApartView:
    """Background work in a context of its own (EngineConfig.background_ctx), as the policy
    sees it: its KV is apart from the streams', so it never slows their attention, and it
    runs in decode calls of its own just before the tick, for the time the plan grants it
    (PlanNotes.apart_ms). That context's own cost model prices it."""

    least_ms: float  # its least worthwhile call: its decoders, and a small prompt chunk
    one_ms: float = 0.0  # its least call that moves: its decoders, or one prompt token
    read_ms: float = 0.0  # its next prompt chunk's read of that context's cache (0: none)
    prompt: bool = False  # whether a prompt waits to prefill there (else decoders only)


@dataclass(frozen=True, slots=True)
class SchedulerState:
    """Everything a policy may base one tick's plan on."""

    now_ns: int  # monotonic clock at snapshot time
    sessions: tuple[SessionView, ...]  # running requests, in admission order
    n_waiting: int  # requests queued for a free sequence
    n_batch: int  # hard cap on tokens in one decode call (the context's n_batch)
    n_seq_max: int  # sequences the context holds at once
    decode_ms_ewma: float  # recent decode time per tick (0 before the first tick)
    cost: CostEstimate  # the learned tick cost model, to predict a plan's time
    tick: int  # ticks run so far
    last_tick_ms: float = 0.0  # what the previous tick took, measured (0 before the first)
    last_tick_tokens: int = 0  # tokens sampled in the previous tick
    memory: object = None  # the policy's own state, as its previous plan left it (Plan.memory)
    decode_noise: float = 1.0  # p95 of measured / predicted time of recent decode-only ticks
    prompt_noise: float = 1.0  # the same, of recent ticks with background prompt tokens
    # p95 of ticks while no background request exists / the predicted time of all their
    # sequences as decode rows: what interactive streams see without background work
    # (0: not known yet)
    alone_p95_ratio: float = 0.0
    alone_ratios: tuple[float, ...] = ()  # the recent ones behind it, sorted
    bmt: BmtModel | None = None  # bytes a tick moves, from the model's shape
    bmt_budget_gbps: float = 0.0  # memory bandwidth the ticks may use; 0: no ΣBMT guard
    apart: ApartView | None = None  # background work waiting in its own context (None: none)
    last_apart_ms: float = 0.0  # what that context ran before the previous tick, measured


@dataclass(frozen=True, slots=True)
class BatchItem:
    """Tokens of one sequence to put in this tick's batch."""

    seq_id: int  # which sequence
    phase: Phase  # PREFILL: the next n_tokens prompt tokens; DECODE: its last sampled token
    n_tokens: int  # how many tokens (1 for DECODE, 1 + len(draft) for a verify item)
    logits: bool  # sample after this item (DECODE always; PREFILL when it ends the prompt)
    # DECODE only: guesses of the tokens after the last one, each put in the batch after it
    # and sampled (uma.sched.speculation); the runner keeps those the model agrees with
    draft: tuple[int, ...] = ()


class PlanNotes(NamedTuple):
    """Why a plan is what it is: the policy's figures for the tick (ms unless named
    otherwise), which the scheduler's metrics and the traces read."""

    budget_ms: float = 0.0  # the time the tick was allowed
    predicted_ms: float = 0.0  # what the cost model predicts the plan takes
    line_ms: float = 0.0  # what an ordinary tick may take while streams decode
    target_ms: float = 0.0  # latency_cap × the streams' p95 alone (0: no stream decodes)
    pause_ms: float = 0.0  # the longest a tick with background work may run past its decoders
    served_decoders: int = 0  # decoding sequences in the batch
    parked: int = 0  # decoding sequences left out of it
    parked_seqs: frozenset[int] = frozenset()  # which: parked to keep the budget
    chunk_cap: int = 0  # most background prompt tokens (slow start)
    bmt_bytes: float = 0.0  # bytes the tick moves through memory (estimate)
    overruns: int = 0  # ticks over budget so far
    background: frozenset[int] = frozenset()  # the batch's sequences that are background work
    apart_ms: float = 0.0  # the background context's time before this tick (0: none)
    paused: bool = False  # planned past the line for background work (a pause)


@dataclass(frozen=True, slots=True)
class Plan:
    """One tick's work. The runner runs items in order and changes nothing else."""

    items: tuple[BatchItem, ...] = ()  # what goes in the batch, in batch order
    token_budget: int = 0  # the budget the policy planned against (for metrics)
    notes: PlanNotes | None = None  # why (None: a policy that keeps no figures)
    # The policy's own state, opaque to everyone else: handed back to it in the next snapshot
    # (SchedulerState.memory).
    memory: object = None

    @classmethod
    def empty(cls) -> Plan:
        return cls()

    @property
    def n_tokens(self) -> int:
        return sum(item.n_tokens for item in self.items)

    @property
    def n_drafted(self) -> int:
        """Guesses its verify items carry."""
        return sum(len(item.draft) for item in self.items)
