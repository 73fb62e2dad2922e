"""The SLO policy: keeps interactive streams flat while background work still completes.

One tick's plan is built in stages, each a pure function of the snapshot:

1. QoS lanes: every interactive decoder gets its token. At most S background decoders are
   served, rotated so each is left out equally often, in bursts of k consecutive ticks when no
   interactive stream is decoding (fewer distinct sequences a tick: fewer KV streams and, for
   an MoE, fewer experts).
2. LatencyGuard: the tick budget is latency_cap × what a tick of the interactive decoders alone
   is predicted to take (or an explicit tick_budget_ms). Background decoders that would break
   it are parked; prompt tokens get what the cost model predicts still fits. After a tick
   overruns its budget, prompts are held back for hold_ticks ticks, then let in gradually.
3. ΣBMT guard: if the tick would move more bytes than bandwidth × budget, prompt chunks shrink
   first, then background decoders are parked.
4. No starvation: background work that made no progress for max_starve_ticks ticks gets one
   decoder served or one minimum prompt chunk, whatever the guards say.

Whatever the policy must remember (the hold, the ramp, S and k, the hill-climb) travels in
SloMemory: the executor hands back the plan's memory in the next snapshot.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from uma.sched.policy import chunk_prefills, prefill_order, rotated
from uma.sched.state import BatchItem, Phase, Plan, Priority, SchedulerState, SessionView


@dataclass(frozen=True, slots=True)
class SloMemory:
    budget_ms: float = 0.0  # the budget the last plan was made for
    hold: int = 0  # ticks prompts are still held back after an overrun
    ramp: float = 1.0  # share of the prompt allowance let in again after a hold (0..1)
    s: int = 0  # background decoders served per tick (0: not yet set)
    starve: int = 0  # ticks since background work last progressed
    overruns: int = 0  # ticks that took longer than their budget, in all
    # throughput hill-climb over windows of ticks
    direction: int = 1
    window_tokens: int = 0
    window_ms: float = 0.0
    window_ticks: int = 0
    window_overrun: bool = False
    last_rate: float = 0.0


@dataclass(frozen=True)
class SloPolicy:
    latency_cap: float = 1.20  # interactive tick time allowed, relative to their own decode time
    tick_budget_ms: float | None = None  # an explicit budget instead of the cap
    idle_budget_ms: float = 50.0  # budget when no interactive stream decodes (bounds TTFT)
    hold_ticks: int = 4  # H: ticks without prompt tokens after an overrun
    ramp_steps: int = 4  # ticks to let the prompt allowance back in after a hold
    overrun_slack: float = 1.10  # a tick is over budget when it took this much more,
    overrun_slack_ms: float = 1.0  # plus this (scheduling noise on sub-millisecond ticks)
    interactive_reserve: float = 0.5  # share of the prompt allowance kept for interactive prompts
    initial_s: int = 8  # S for a dense model; an MoE starts at moe_initial_s
    moe_initial_s: int = 2
    burst: int = 2  # k when no interactive stream decodes
    max_starve_ticks: int = 8
    min_prefill: int = 16
    climb_window: int = 16  # ticks per hill-climb step of S
    name: str = "slo"

    @classmethod
    def from_config(cls, config) -> SloPolicy:
        return cls(latency_cap=config.latency_cap, tick_budget_ms=config.tick_budget_ms)

    def schedule_tick(self, state: SchedulerState) -> Plan:
        mem = self._remember(state)
        inter = [s for s in state.sessions if s.priority is Priority.INTERACTIVE]
        back = [s for s in state.sessions if s.priority is Priority.BACKGROUND]
        inter_dec = [s for s in inter if s.phase is Phase.DECODE]
        back_dec = [s for s in back if s.phase is Phase.DECODE]
        cost = state.cost

        solo_ms = cost.predict(0, len(inter_dec), _kv(inter_dec))
        if self.tick_budget_ms is not None:
            budget = max(self.tick_budget_ms, solo_ms)
        elif inter_dec:
            budget = self.latency_cap * solo_ms
        else:
            budget = self.idle_budget_ms

        # 1-2. decoders: interactive always, background up to S, within the budget
        served = list(inter_dec)
        k = 1 if inter_dec else self.burst
        candidates = rotated(back_dec, state.tick // k)[: max(mem.s, 0)]
        for s in candidates:
            trial = served + [s]
            if cost.predict(0, len(trial), _kv(trial)) > budget and not self._starving(mem):
                break
            served.append(s)
        served = served[: state.n_batch]
        if back_dec and not any(s.priority is Priority.BACKGROUND for s in served) \
                and self._starving(mem):
            served.append(rotated(back_dec, state.tick)[0])

        # 2-3. prompt tokens within what is left of the budget, bandwidth and batch
        room = state.n_batch - len(served)
        allowance = cost.max_prefill(budget, len(served), _kv(served))
        if inter_dec:  # the hold protects interactive streams; with none decoding, no need
            allowance = int(allowance * (0.0 if mem.hold else mem.ramp))
        allowance = min(room, self._bmt_room(state, budget, served, allowance))
        items = [BatchItem(s.seq_id, Phase.DECODE, 1, logits=True) for s in served]
        prefill = self._prefill([s for s in inter if s.phase is Phase.PREFILL],
                                [s for s in back if s.phase is Phase.PREFILL],
                                allowance, room, mem)
        items += prefill

        served_back = sum(1 for s in served if s.priority is Priority.BACKGROUND)
        back_progress = served_back or any(
            i.seq_id in {s.seq_id for s in back} for i in prefill)
        mem = dataclasses.replace(
            mem, budget_ms=budget, starve=0 if back_progress or not back else mem.starve + 1)
        n_prefill = sum(i.n_tokens for i in prefill)
        kv = _kv(served)
        notes = {
            "budget_ms": budget, "predicted_ms": cost.predict(n_prefill, len(served), kv),
            "served_decoders": len(served), "parked": len(inter_dec) + len(back_dec)
            - len(served), "guard_active": bool(mem.hold or mem.ramp < 1.0), "s": mem.s,
            "k": k, "bmt_bytes": state.bmt.tick_bytes(len(served) + n_prefill, kv)
            if state.bmt else 0.0, "overruns": mem.overruns,
        }
        return Plan(items=tuple(items), token_budget=len(served) + allowance, notes=notes,
                    memory=mem)

    # --- stages ------------------------------------------------------------------------------

    def _prefill(self, inter: list[SessionView], back: list[SessionView], allowance: int,
                 room: int, mem: SloMemory) -> list[BatchItem]:
        """Interactive prompts first, background ones with what they leave, within at least
        interactive_reserve of the allowance kept for interactive work when both wait.
        Interactive prompts always get min_prefill tokens: someone is waiting for their first
        token, and a guard that held them back for good would never let them start."""
        inter_budget = max(allowance, min(self.min_prefill, room)) if inter else 0
        items = chunk_prefills(prefill_order(inter), inter_budget)
        used = sum(i.n_tokens for i in items)
        back_budget = max(0, allowance - used)
        if inter and back:
            back_budget = min(back_budget, int(allowance * (1 - self.interactive_reserve)))
        if back and back_budget <= 0 and self._starving(mem):
            back_budget = min(self.min_prefill, room - used)
        items += chunk_prefills(prefill_order(back), back_budget)
        return items

    def _bmt_room(self, state: SchedulerState, budget_ms: float, served: list[SessionView],
                  allowance: int) -> int:
        """The prompt allowance shrunk until the tick's bytes fit bandwidth × budget."""
        if not state.bmt or state.bmt_budget_gbps <= 0 or allowance <= 0:
            return allowance
        limit = state.bmt_budget_gbps * 1e6 * budget_ms  # GB/s × ms = 1e6 bytes
        kv = _kv(served)
        lo, hi = 0, allowance
        while lo < hi:  # the largest allowance whose bytes fit
            mid = (lo + hi + 1) // 2
            if state.bmt.tick_bytes(len(served) + mid, kv) <= limit:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _starving(self, mem: SloMemory) -> bool:
        return mem.starve >= self.max_starve_ticks

    def _remember(self, state: SchedulerState) -> SloMemory:
        """Updates the memory with what the previous tick measured: overrun → hold, the ramp,
        and the hill-climb of S."""
        mem = state.memory if isinstance(state.memory, SloMemory) else SloMemory()
        if mem.s == 0:
            moe = state.bmt is not None and state.bmt.n_expert > 0
            mem = dataclasses.replace(mem, s=self.moe_initial_s if moe else self.initial_s)
        if state.last_tick_ms <= 0 or mem.budget_ms <= 0:
            return mem
        over = state.last_tick_ms > mem.budget_ms * self.overrun_slack + self.overrun_slack_ms
        if over:
            mem = dataclasses.replace(mem, hold=self.hold_ticks, ramp=0.0,
                                      overruns=mem.overruns + 1)
        elif mem.hold:
            mem = dataclasses.replace(mem, hold=mem.hold - 1)
        elif mem.ramp < 1.0:
            mem = dataclasses.replace(mem, ramp=min(1.0, mem.ramp + 1.0 / self.ramp_steps))
        return self._climb(mem, state, over)

    def _climb(self, mem: SloMemory, state: SchedulerState, over: bool) -> SloMemory:
        """Hill-climbs S on tokens per ms over windows of ticks; a window with an overrun
        counts as worse, so the guard wins over throughput."""
        mem = dataclasses.replace(
            mem, window_tokens=mem.window_tokens + state.last_tick_tokens,
            window_ms=mem.window_ms + state.last_tick_ms, window_ticks=mem.window_ticks + 1,
            window_overrun=mem.window_overrun or over)
        if mem.window_ticks < self.climb_window:
            return mem
        rate = mem.window_tokens / mem.window_ms if mem.window_ms else 0.0
        direction = mem.direction
        if mem.window_overrun or rate < mem.last_rate:
            direction = -direction
        n_back = sum(1 for s in state.sessions if s.priority is Priority.BACKGROUND)
        s = min(max(1, mem.s + direction), max(1, n_back, self.initial_s))
        return dataclasses.replace(mem, s=s, direction=direction, last_rate=rate,
                                   window_tokens=0, window_ms=0.0, window_ticks=0,
                                   window_overrun=False)


def _kv(sessions: list[SessionView]) -> int:
    return sum(s.n_past for s in sessions)
