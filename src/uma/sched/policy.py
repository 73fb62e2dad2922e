"""What every batch policy is, and the helpers policies share.

A policy is a pure function from a SchedulerState to a Plan: it never touches the model, the
clock or any mutable state of its own; anything it needs to remember between ticks (cost
estimates, tick count) arrives in the snapshot. That makes every decision reproducible from the
snapshot alone, which is how the tests check them. The policies themselves are in
uma.sched.bound (the default) and uma.sched.baseline; uma.sched.policies names them.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Protocol

from uma.sched.cost import CostEstimate, attended
from uma.sched.state import (
    BatchItem,
    Phase,
    Plan,
    Priority,
    SchedulerState,
    SessionView,
    Shed,
    Waiting,
)


class BatchPolicy(Protocol):
    """What the scheduler needs from a policy: every decision it acts on."""

    @property
    def name(self) -> str:
        """How configuration names it (`--policy`)."""
        ...

    def admit(self, waiting: Sequence[Waiting], free: int) -> tuple[int, ...]:
        """Which queued requests get one of `free` KV sequences now (request ids, in order)."""
        ...

    def schedule_tick(self, state: SchedulerState) -> Plan:
        """Decides one tick's batch."""
        ...

    def shed(self, plan: Plan, sessions: Sequence[SessionView]) -> Shed:
        """What to run instead when the KV cache has no room for `plan`."""
        ...

    def first_token_due(self, arrival_ns: int, n_new: int, n_cached: int,
                        cost: CostEstimate) -> float:
        """When an interactive request's first token is due, for a prompt of n_new tokens
        to compute after n_cached the prefix cache holds: the order its prompt is admitted
        and run in, and whether a prompt gives it way (uma.sched.demotion.give_way)."""
        ...


def first_token_due_ns(policy: BatchPolicy, s: SessionView, cost: CostEstimate) -> float:
    """When a running prompt's first token is due: the policy's first_token_due for the new
    tokens it had at admission after what the prefix cache held."""
    return policy.first_token_due(s.arrival_ns, s.n_prompt - s.n_cached, s.n_cached, cost)


def admit_by_class(waiting: Sequence[Waiting], free: int) -> tuple[int, ...]:
    """Interactive before background; within a class, the one due first first (Waiting.due_ns;
    all 0: first come, first served)."""
    order = sorted(waiting, key=lambda w: (w.priority is not Priority.INTERACTIVE, w.due_ns,
                                           w.rid))
    return tuple(w.rid for w in order[:max(free, 0)])


def shed_for_room(plan: Plan, sessions: Sequence[SessionView]) -> Shed:
    """Prompt chunks go first; a plan of prompt chunks alone keeps half of its first chunk
    (dropping them all ran nothing, and the next tick planned the same chunks: two prompts
    that fit the cache one at a time but not together spun for ever); if decode rows alone,
    or a one-token chunk, do not fit, the newest request (background first) goes back to the
    queue; a sequence alone that does not fit has filled the context."""
    prompts = [i for i in plan.items if i.phase is Phase.PREFILL]
    decodes = tuple(i for i in plan.items if i.phase is Phase.DECODE)
    if prompts and decodes:
        return Shed(dataclasses.replace(plan, items=decodes))
    if prompts and prompts[0].n_tokens > 1:
        first = prompts[0]
        half = BatchItem(first.seq_id, Phase.PREFILL, first.n_tokens // 2, logits=False)
        return Shed(dataclasses.replace(plan, items=(half,)))
    victims = sorted(sessions, key=lambda s: (s.priority is Priority.INTERACTIVE, -s.rid))
    if len(victims) <= 1:
        return Shed(Plan.empty(), finish=victims[0].seq_id if victims else None)
    out = victims[0].seq_id
    return Shed(dataclasses.replace(plan, items=tuple(i for i in plan.items if i.seq_id != out)),
                preempt=out)


def rotated(sessions: Sequence[SessionView], tick: int) -> list[SessionView]:
    """The sessions starting at a tick-dependent offset, so that whenever not all fit, each is
    left out equally often."""
    if not sessions:
        return []
    k = tick % len(sessions)
    return [*sessions[k:], *sessions[:k]]


def prefill_order(sessions: Sequence[SessionView]) -> list[SessionView]:
    """TTFT first: interactive before background, then by arrival."""
    return sorted(sessions, key=lambda s: (s.priority is not Priority.INTERACTIVE, s.rid))


def shortest_background_first(sessions: Sequence[SessionView]) -> list[SessionView]:
    """Interactive prompts by arrival (TTFT first), then background prompts by what is left of
    them, shortest first: behind a long one, a short background prompt would wait for the whole
    of it (a short prompt behind one a few times longer took dozens of times its time alone), and
    shortest-remaining-first is what minimises the mean completion time."""
    return sorted(sessions, key=prefill_rank)


def prefill_rank(s: SessionView) -> tuple[bool, int, int]:
    """shortest_background_first's order, as a sort key."""
    interactive = s.priority is Priority.INTERACTIVE
    return (not interactive, 0 if interactive else s.prefill_left, s.rid)


def decode_kv(sessions: Sequence[SessionView]) -> int:
    """The cost model's attention feature for one decode token of each session."""
    return sum(attended(s.n_past, 1) for s in sessions)


def prompt_chunk(s: SessionView, n: int) -> BatchItem:
    """A chunk of n of the session's prompt tokens; only the chunk that ends the prompt asks
    for logits (its first token)."""
    return BatchItem(s.seq_id, Phase.PREFILL, n, logits=n == s.prefill_left)


def chunk_prefills(sessions: Sequence[SessionView], budget: int) -> list[BatchItem]:
    """Gives the budget to prefilling sessions in order, in chunks as large as possible."""
    items = []
    for s in sessions:
        if budget <= 0:
            break
        n = min(s.prefill_left, budget)
        items.append(prompt_chunk(s, n))
        budget -= n
    return items


def own_knobs(policy: type, knobs: Iterable[tuple[str, object]]) -> dict[str, object]:
    """The knobs given (EngineConfig.slo, checked by uma.knobs) that are fields of this
    policy dataclass: each policy reads its own and leaves the other's."""
    fields = {f.name for f in dataclasses.fields(policy)}
    return {name: value for name, value in knobs if name in fields}


def ttft_chunk_ms(work_ms: float, overhead_ms: float, beside_ms: float,
                  left_ms: float) -> float:
    """The shortest chunk (ms) that finishes a prompt's work_ms within left_ms. In chunks of
    c ms, each paying overhead_ms (its read of the cache) and each in a tick with beside_ms of
    other work, it takes work / (c - overhead) ticks of beside + c ms: at most left_ms where
    c >= (work × beside + left × overhead) / (left - work). Infinite (in whole) with nothing
    beside it to protect, or where even in whole it is due."""
    if beside_ms <= 0.0 or left_ms <= work_ms + overhead_ms + beside_ms:
        return math.inf
    return (work_ms * beside_ms + left_ms * overhead_ms) / (left_ms - work_ms)


def bmt_room(state: SchedulerState, budget_ms: float, decoders: Sequence[SessionView],
             allowance: int) -> int:
    """The ΣBMT guard: the most of `allowance` prompt tokens whose tick, beside `decoders`,
    moves no more bytes than bandwidth × budget_ms."""
    if not state.bmt or state.bmt_budget_gbps <= 0 or allowance <= 0:
        return allowance
    limit = state.bmt_budget_gbps * 1e6 * budget_ms  # GB/s × ms = 1e6 bytes
    kv = sum(s.n_past for s in decoders)
    lo, hi = 0, allowance
    while lo < hi:  # the largest allowance whose bytes fit
        mid = (lo + hi + 1) // 2
        if state.bmt.tick_bytes(len(decoders) + mid, kv) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return lo


def free_tail_share(state: SchedulerState, cap: float, quantile: float, margin: float) -> float:
    """The share of ticks that may run past the p95 line without moving the streams' p95
    past `cap` × its value alone: 1 - quantile, less their own ticks past that line while no
    background work existed (state.alone_ratios: new prompts, stalls), less `margin`. None
    (1 - quantile - margin) where nothing was measured alone yet."""
    ratios = state.alone_ratios
    tail = 1 - bisect.bisect_right(ratios, cap * state.alone_p95_ratio) / len(ratios) \
        if ratios else 0.0
    return 1 - quantile - tail - margin

