"""Batch policies: pure functions from a SchedulerState to a Plan.

A policy never touches the model, the clock or any mutable state of its own; anything it needs
to remember between ticks (cost estimates, tick count) arrives in the snapshot. That makes every
decision reproducible from the snapshot alone, which is how the tests check them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from uma.errors import InvalidRequestError
from uma.sched.cost import attended
from uma.sched.state import BatchItem, Phase, Plan, Priority, SchedulerState, SessionView


class BatchPolicy(Protocol):
    """What the executor needs from a policy."""

    name: str

    def schedule_tick(self, state: SchedulerState) -> Plan:
        """Decides one tick's batch."""
        ...


def rotated(sessions: list[SessionView], tick: int) -> list[SessionView]:
    """The sessions starting at a tick-dependent offset, so that whenever not all fit, each is
    left out equally often."""
    if not sessions:
        return sessions
    k = tick % len(sessions)
    return sessions[k:] + sessions[:k]


def prefill_order(sessions: list[SessionView]) -> list[SessionView]:
    """TTFT first: interactive before background, then by arrival."""
    return sorted(sessions, key=lambda s: (s.priority is not Priority.INTERACTIVE, s.rid))


def decode_kv(sessions: list[SessionView]) -> int:
    """The cost model's attention feature for one decode token of each session."""
    return sum(attended(s.n_past, 1) for s in sessions)


def chunk_prefills(sessions: list[SessionView], budget: int) -> list[BatchItem]:
    """Gives the budget to prefilling sessions in order, in chunks as large as possible."""
    items = []
    for s in sessions:
        if budget <= 0:
            break
        n = min(s.prefill_left, budget)
        items.append(BatchItem(s.seq_id, Phase.PREFILL, n, logits=n == s.prefill_left))
        budget -= n
    return items


@dataclass(frozen=True)
class BaselinePolicy:
    """Decode first, then chunked prefill within a time budget (seed tracker, scheduler v0).

    Every decoding sequence gets one token per tick (rotated fairly when more decode than the
    batch holds). Prompt tokens fill what the learned cost model predicts still fits in
    `tick_target_ms`, but at least `min_prefill` so prompts always progress.
    """

    tick_target_ms: float = 30.0
    min_prefill: int = 16
    name: str = "baseline"

    @classmethod
    def from_config(cls, config) -> BaselinePolicy:
        return cls(tick_target_ms=config.tick_target_ms)

    def schedule_tick(self, state: SchedulerState) -> Plan:
        decoders = [s for s in state.sessions if s.phase is Phase.DECODE]
        prefills = [s for s in state.sessions if s.phase is Phase.PREFILL]
        served = rotated(decoders, state.tick)[: state.n_batch]
        items = [BatchItem(s.seq_id, Phase.DECODE, 1, logits=True) for s in served]
        room = state.n_batch - len(items)
        budget = 0
        if prefills and room > 0:
            prefills = prefill_order(prefills)
            budget = state.cost.max_prefill(self.tick_target_ms, len(items), decode_kv(served),
                                            depth=prefills[0].n_past)
            budget = min(room, max(budget, self.min_prefill))
            items += chunk_prefills(prefills, budget)
        return Plan(items=tuple(items), token_budget=len(served) + budget)


def create_policy(name: str, config=None, **options) -> BatchPolicy:
    """The policy registered under `name`, built from an EngineConfig or from `options`."""
    from uma.sched.slo import SloPolicy  # slo builds on this module's helpers

    policies = {"baseline": BaselinePolicy, "slo": SloPolicy}
    try:
        cls = policies[name]
    except KeyError:
        raise InvalidRequestError(
            f"unknown policy: {name!r} (known: {', '.join(policies)})") from None
    return cls.from_config(config) if config is not None else cls(**options)
