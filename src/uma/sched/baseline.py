"""The baseline policy: decode first, then chunked prefill within a time budget."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from uma.config import EngineConfig
from uma.sched.cost import CostEstimate
from uma.sched.policy import (
    admit_by_class,
    chunk_prefills,
    decode_kv,
    prefill_order,
    rotated,
    shed_for_room,
)
from uma.sched.state import (
    BatchItem,
    Phase,
    Plan,
    PlanNotes,
    SchedulerState,
    SessionView,
    Shed,
    Waiting,
)


@dataclass(frozen=True)
class BaselinePolicy:
    """Decode first, then chunked prefill within a time budget (seed tracker, scheduler v0).

    Every decoding sequence gets one token per tick (rotated fairly when more decode than the
    batch holds). Prompt tokens fill what the learned cost model predicts still fits in
    `tick_target_ms`, but at least `min_prefill` so prompts always progress. Background work
    in a context of its own gets `tick_target_ms` before every tick: no guard.
    """

    tick_target_ms: float = 30.0
    min_prefill: int = 16
    name: str = "baseline"

    @classmethod
    def from_config(cls, config: EngineConfig) -> BaselinePolicy:
        return cls(tick_target_ms=config.tick_target_ms)

    def admit(self, waiting: Sequence[Waiting], free: int) -> tuple[int, ...]:
        return admit_by_class(waiting, free)

    def first_token_due(self, arrival_ns: int, n_new: int, n_cached: int,
                        cost: CostEstimate) -> float:
        return float(arrival_ns)  # first come, first served

    def shed(self, plan: Plan, sessions: Sequence[SessionView]) -> Shed:
        return shed_for_room(plan, sessions)

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
        notes = None if state.apart is None else PlanNotes(apart_ms=self.tick_target_ms)
        return Plan(items=tuple(items), token_budget=len(served) + budget, notes=notes)
