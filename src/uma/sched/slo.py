"""The SLO policy: keeps interactive streams flat while background work still completes.

One tick's plan is built in stages, each a pure function of the snapshot:

1. QoS lanes: every interactive decoder gets its token. At most S background decoders are
   served, rotated so each is left out equally often, in bursts of k consecutive ticks when no
   interactive stream is decoding (fewer distinct sequences a tick: fewer KV streams and, for
   an MoE, fewer experts).
2. LatencyGuard: the tick budget is latency_cap × what a tick of the interactive decoders
   alone is predicted to take (or an explicit tick_budget_ms). Background decoders that would
   break it are parked; prompt tokens get what the cost model predicts still fits, unless
   a background chunk would be mostly the row steps it passes (a GPU's, as the batch leaves
   its matrix-vector kernels) or its read of the cache. Unused time is
   saved and spent in larger chunks: first in a tick that stays under the p95 line
   (latency_cap × the streams' p95 alone, less how far background prompt ticks stray past
   their prediction); where nothing fits there, in one past it (up to pause_factor × that p95),
   only while such ticks stay under the share of recent ones that the p95 leaves free (at most
   pause_share). After a tick overruns its budget, prompts are held back for hold_ticks ticks,
   then let in gradually.
   The prompt allowance also grows no faster than it has been proven: it may at most double
   the largest chunk that last ran within budget (slow start). A cost model fitted over ticks
   that all looked alike cannot tell a prompt token's cost from the fixed cost, and its first
   extrapolation to a large chunk was once off by 20x (a 700 ms tick predicted at 36 ms).
3. ΣBMT guard: if the tick would move more bytes than bandwidth × budget, prompt chunks shrink
   first, then background decoders are parked.
4. TTFT first: new interactive prompts go before any background prompt work; one with at most
   ttft_burst_tokens left goes in whole, so its first token comes this tick.
5. Background floor: while streams decode, background work is owed background_share of the
   measured time, split evenly between decoders and prompts while both wait. A decoder the
   budget would park is served where its owed time pays for it; where the steps before gave
   background prompts nothing and what is owed pays for a floor chunk, they get one (a planned
   pause, spaced so that floor pauses take at most pause_share of the ticks). With no stream
   decoding, the idle budget stretches until a chunk's work amortises its read of the cache
   (idle_amortise): background runs at full speed.
   Before a floor chunk of its own, background prompts ride in ticks that a new interactive
   prompt stretches anyway (ride_along): such ticks are the streams' own tail, alone as in a
   storm, and a chunk adding at most ride_share to one adds no gap past the p95.
   Last, a ragged tick (rows past 16, not a power of two) takes the background tokens that
   even it out where the cost model prices that at no more (even_out): free work, and a
   shorter tick, on a backend whose matrix kernels run whole tiles only at some sizes.
6. No starvation, the backstop: background work that made no progress for max_starve_ticks
   ticks gets one decoder served, or the prompt chunk that fits rescue_slack × budget (at
   least one token; where one token outgrows every pause, a chunk that amortises its read of
   the cache).

7. Throughput sweet spot: S and k are hill-climbed in turn on tokens per ms, with a deadband.

Whatever the policy must remember (the hold, the ramp, S and k, the hill-climb) travels in
SloMemory: the executor hands back the plan's memory in the next snapshot.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from uma.config import EngineConfig
from uma.sched.cost import CostEstimate, next_even_rows
from uma.sched.policy import (
    admit_by_class,
    bmt_room,
    decode_kv,
    free_tail_share,
    own_knobs,
    prefill_rank,
    prompt_chunk,
    rotated,
    shed_for_room,
    shortest_background_first,
    ttft_chunk_ms,
)
from uma.sched.state import (
    BatchItem,
    Phase,
    Plan,
    PlanNotes,
    Priority,
    SchedulerState,
    SessionView,
    Shed,
    Waiting,
)


@dataclass(frozen=True, slots=True)
class SloMemory:
    budget_ms: float = 0.0  # the time the last plan was allowed (its budget, plus credit spent)
    credit_ms: float = 0.0  # prompt time saved from earlier ticks' unused budget
    hold: int = 0  # ticks prompts are still held back after an overrun
    ramp: float = 1.0  # share of the prompt allowance let in again after a hold (0..1)
    s: int = 0  # background decoders served per tick (0: not yet set)
    k: int = 0  # ticks a burst keeps the same background decoders (0: not yet set)
    starve: int = 0  # ticks since background work last progressed
    over_mask: int = 0  # bit i: background work put the tick i ticks ago past the p95 line
    chunk_cap: int = 0  # slow start: the most prompt tokens the next tick may take (0: unset)
    last_prefill: int = 0  # prompt tokens the last plan took
    overruns: int = 0  # ticks that took longer than their budget, in all
    # the background floor: time owed to background prompts and to background decoders (split
    # evenly while both wait), and what the last plan gave each
    owed_ms: float = 0.0
    owed_dec_ms: float = 0.0
    owing: bool = False  # the last plan ran while streams decoded and a background prompt waited
    owing_dec: bool = False  # ... and a background decoder
    back_ms: float = 0.0  # its background prompt chunks' predicted time
    back_dec_ms: float = 0.0  # what its background decoders added, predicted
    planned_ms: float = 0.0  # its whole predicted time
    # throughput hill-climb over windows of ticks, S and k in turn
    direction: int = 1  # S's
    k_direction: int = 1
    climb_k: bool = False  # the current window moves k (only if no interactive decoder ran)
    window_interactive: bool = False  # an interactive decoder ran in this window
    window_tokens: int = 0
    window_ms: float = 0.0
    window_ticks: int = 0
    window_overrun: bool = False
    last_rate: float = 0.0


@dataclass(frozen=True)
class SloPolicy:
    latency_cap: float = 1.20  # interactive tick time allowed, relative to their own decode time
    tick_budget_ms: float | None = None  # an explicit budget instead of the cap
    idle_budget_ms: float = 100.0  # budget when no interactive stream decodes (bounds TTFT)
    pause_factor: float = 1.8  # longest tick with interactive decoders: × their p95 alone
    # (background work on saved time) or × their jittered solo time (a new interactive prompt)
    pause_share: float = 0.04  # most ticks past the budget, of the last pause_window...
    min_pause_share: float = 0.01  # ...less the streams' own tail (see _pause_share), to this
    pause_window: int = 100
    quantile: float = 0.95  # the interactive gap percentile latency_cap is judged at
    tail_margin: float = 0.005  # kept free of pauses below 1 - quantile
    hold_ticks: int = 4  # H: ticks without prompt tokens after an overrun
    hold_on_decode_overrun: bool = True  # also hold after a tick that had no prompt tokens
    ramp_steps: int = 4  # ticks to let the prompt allowance back in after a hold
    overrun_slack: float = 1.10  # a tick is over budget when it took this much more,
    overrun_slack_ms: float = 1.0  # plus this (scheduling noise on sub-millisecond ticks)
    interactive_reserve: float = 0.5  # share of the prompt allowance kept for interactive prompts
    initial_s: int = 8  # S for a dense model; an MoE starts at moe_initial_s
    moe_initial_s: int = 2
    burst: int = 2  # k to start, when no interactive stream decodes
    max_burst: int = 8
    max_starve_ticks: int = 50  # a rescue is the backstop, not the path
    rescue_slack: float = 1.5  # a starvation rescue may stretch a tick this far over budget
    min_prefill: int = 16  # interactive prompts' floor, and the slow start's first chunk
    step_amortise: float = 1.0  # a background chunk works this × what it pays beyond its
    # work (the row steps it passes, its read of the cache)
    climb_window: int = 16  # ticks per hill-climb step of S or k
    climb_deadband: float = 0.03  # a rate this much lower reverses a climb; less is noise
    background_share: float = 0.15  # least share of the time owed to background prompts
    # while interactive streams decode (0: no floor)
    ride_share: float = 0.0  # a background chunk riding in a tick that a new interactive
    # prompt stretches anyway adds at most this × the tick to it (0: never rides)
    even_rows: bool = True  # a ragged tick takes the background tokens that make its rows a
    # power of two where the cost model prices that at no more (cost.ragged_span)
    floor_growth: float = 1.5  # a floor chunk grows, up to twice its time, where that moves
    # at least this × the tokens per ms (and runs less often)
    ttft_burst_tokens: int = 128  # an interactive request with at most this many new
    # tokens goes in whole, in one tick, even while streams decode
    ttft_stretch: float = 1.25  # a longer one's first token comes within this × the time it
    # would take in whole beside the streams (in chunks the streams' ticks stretch instead)
    idle_amortise: float = 4.0  # with no stream decoding, a background chunk's work is at
    # least this × its read of the cache (the idle budget stretches to allow it)
    name: str = "slo"

    @classmethod
    def from_config(cls, config: EngineConfig) -> SloPolicy:
        return cls(latency_cap=config.latency_cap, tick_budget_ms=config.tick_budget_ms,
                   **own_knobs(cls, config.slo))  # type: ignore[arg-type]

    def admit(self, waiting: Sequence[Waiting], free: int) -> tuple[int, ...]:
        return admit_by_class(waiting, free)

    def shed(self, plan: Plan, sessions: Sequence[SessionView]) -> Shed:
        return shed_for_room(plan, sessions)

    def schedule_tick(self, state: SchedulerState) -> Plan:
        """One tick's plan: the steps below in order, each a pure function of the snapshot and
        of the records of the steps it builds on (tested one by one)."""
        d = lanes(self, state)
        b = latency_budget(self, state, d)
        dec = qos_decoders(self, state, d, b)
        a = prompt_allowance(self, state, d, b, dec)
        cap = bmt_guard(self, state, d, b, dec, a)
        f = first_tokens(self, state, d, a)
        c = ride_along(self, state, d, a, f, prompt_chunks(self, state, d, a, cap, f))
        c = even_out(self, state, d, a, background_floor(self, state, d, a, f, c))
        return settle(self, state, d, b, dec, a, cap, c)

    # --- stages ------------------------------------------------------------------------------

    def _background(self, waiting: list[SessionView], cost: CostEstimate, spare_ms: float,
                    largest_ms: float, cap: int, room: int, rescue_ms: float | None,
                    rows: int) -> list[BatchItem]:
        """Background prompt chunks that spend spare_ms, each priced at its own depth (the last
        chunks of a long prompt cost several times its first). A chunk goes in only when its
        own work (its tokens and their attention) is at least step_amortise × its overhead (the
        row steps it passes and its read of the cache before it), or
        it is as large as any tick could make it (largest_ms); otherwise the time is saved. On
        an H100 five prompt tokens a tick were 0.14 ms of work and 0.45 ms of step: every tick
        of the storm ran 18 % slower, and the prompt took twice as long as in rare large chunks
        on saved time. On a CPU one token 600 positions deep cost 9 ms, eight 27 ms. A
        starving background prompt (rescue_ms given) gets what fits rescue_ms, and at least one
        token (where one token outgrows every pause, a chunk that amortises its overhead),
        when the guards left it none. `rows`: the tick's rows before these chunks.
        Chunks take at most `cap` tokens (the slow start and the bandwidth guard) and `room`
        batch rows."""
        items: list[BatchItem] = []
        used = 0
        for s in waiting:
            at = rows + used
            n = min(s.prefill_left, cap - used, cost.chunk_tokens(spare_ms, s.n_past, at))
            if rescue_ms is None and 0 < n < min(
                    s.prefill_left, cap - used, cost.chunk_tokens(largest_ms, s.n_past, at)) \
                    and cost.work_ms(n, s.n_past, at) \
                    < self.step_amortise * cost.chunk_overhead_ms(s.n_past, at, n):
                n = 0  # mostly overhead: the time is worth more saved for a chunk that amortises it
            if n <= 0 and not items and rescue_ms is not None:
                n = max(1, cost.chunk_tokens(rescue_ms, s.n_past, at))
                if cost.chunk_tokens(largest_ms, s.n_past, at) == 0:
                    # Deep into a long prompt one token outgrows every pause (on the 134M CPU
                    # model its read of the cache alone, past ~2,000 positions), so nothing
                    # but rescues move it; one token each, paying that read whole, put a
                    # 3,000-token prompt's first token at 1,525 s (1,500 tokens: 389 s).
                    n = max(n, cost.amortising_tokens(s.n_past, at, self.step_amortise))
                n = min(s.prefill_left, room - used, n)
            if n <= 0:
                break
            items.append(prompt_chunk(s, n))
            used += n
            spare_ms -= cost.prefill_ms(n, s.n_past, at)
        return items

    def _pause_share(self, state: SchedulerState, cap: float) -> float:
        """The share of ticks background work may push past the p95 line. The streams' p95 may
        grow to `cap` (the tick's latency cap: Lanes.cap) × its value alone only if at most
        1 - quantile of their gaps are longer than that; their own long ticks (new prompts,
        stalls, measured while no background request exists) already take part of that
        share. On the CPU mixed load 2 % of the gaps alone were that long, and 4 % of pauses
        on top put the p95 at 1.20-1.26x."""
        if not state.alone_ratios:
            return self.pause_share
        free = free_tail_share(state, cap, self.quantile, self.tail_margin)
        return min(self.pause_share, max(self.min_pause_share, free))

    def _starving(self, mem: SloMemory) -> bool:
        return mem.starve >= self.max_starve_ticks

    def _remember(self, state: SchedulerState, interactive: bool) -> SloMemory:
        """Updates the memory with what the previous tick measured: overrun → hold and a
        halved chunk cap; within budget → the ramp, and a doubled cap if it was used; then the
        hill-climb of S and k."""
        mem = state.memory if isinstance(state.memory, SloMemory) else SloMemory()
        if mem.s == 0:
            moe = state.bmt is not None and state.bmt.n_expert > 0
            mem = dataclasses.replace(mem, s=self.moe_initial_s if moe else self.initial_s,
                                      k=self.burst)
        if mem.chunk_cap == 0:
            mem = dataclasses.replace(mem, chunk_cap=self.min_prefill)
        if state.last_tick_ms <= 0 or mem.budget_ms <= 0:
            return mem
        if mem.owing or mem.owing_dec:  # the floor: the share owed for the last tick, less
            # what it gave (its prediction scaled to what the tick measured)
            scale = state.last_tick_ms / max(mem.planned_ms, 1e-9)
            share = self.background_share * state.last_tick_ms / (mem.owing + mem.owing_dec)
            mem = dataclasses.replace(
                mem, owed_ms=max(0.0, mem.owed_ms + share * mem.owing - mem.back_ms * scale),
                owed_dec_ms=max(0.0, mem.owed_dec_ms + share * mem.owing_dec
                                - mem.back_dec_ms * scale))
        # Over budget is past what plain decode ticks themselves stray (their p95 over the
        # model's mean): a GPU's jitter alone would otherwise halve the prompt chunks for good.
        slack = max(self.overrun_slack, state.decode_noise)
        over = state.last_tick_ms > mem.budget_ms * slack + self.overrun_slack_ms
        if over and not (mem.last_prefill or self.hold_on_decode_overrun):
            mem = dataclasses.replace(mem, overruns=mem.overruns + 1)
        elif over:
            # Twice what was allowed is no longer noise: the cost model is wrong about this
            # kind of chunk (a prompt's deep end), so the slow start begins again.
            far = state.last_tick_ms > 2 * mem.budget_ms + 2 * self.overrun_slack_ms
            cap = self.min_prefill if far else max(self.min_prefill, mem.chunk_cap // 2)
            mem = dataclasses.replace(mem, hold=self.hold_ticks, ramp=0.0, credit_ms=0.0,
                                      overruns=mem.overruns + 1, chunk_cap=cap)
        else:
            if mem.last_prefill * 2 >= mem.chunk_cap:  # the cap was used, and the tick held
                mem = dataclasses.replace(
                    mem, chunk_cap=min(2 * mem.chunk_cap, max(state.n_batch, self.min_prefill)))
            if mem.hold:
                mem = dataclasses.replace(mem, hold=mem.hold - 1)
            elif mem.ramp < 1.0:
                mem = dataclasses.replace(mem, ramp=min(1.0, mem.ramp + 1.0 / self.ramp_steps))
        return self._climb(mem, state, over, interactive)

    def _climb(self, mem: SloMemory, state: SchedulerState, over: bool,
               interactive: bool) -> SloMemory:
        """Hill-climbs S and k in turn on tokens per ms over windows of climb_window ticks.
        A climb keeps its direction until a window is worse than the last by more than
        climb_deadband (hysteresis: noise does not turn it around); a window with an overrun
        counts as worse, so the guard wins over throughput. k only matters while no
        interactive stream decodes (`interactive`: one does now), so a window that served one
        moves S instead."""
        mem = dataclasses.replace(
            mem, window_tokens=mem.window_tokens + state.last_tick_tokens,
            window_ms=mem.window_ms + state.last_tick_ms, window_ticks=mem.window_ticks + 1,
            window_overrun=mem.window_overrun or over,
            window_interactive=mem.window_interactive or interactive)
        if mem.window_ticks < self.climb_window:
            return mem
        rate = mem.window_tokens / mem.window_ms if mem.window_ms else 0.0
        worse = mem.window_overrun or rate < mem.last_rate * (1 - self.climb_deadband)
        step = dataclasses.replace(mem, last_rate=rate, window_tokens=0, window_ms=0.0,
                                   window_ticks=0, window_overrun=False,
                                   window_interactive=False, climb_k=not mem.climb_k)
        if mem.climb_k and not mem.window_interactive:
            direction = -mem.k_direction if worse else mem.k_direction
            k = min(max(1, mem.k + direction), self.max_burst)
            return dataclasses.replace(step, k=k, k_direction=direction)
        direction = -mem.direction if worse else mem.direction
        n_back = sum(1 for s in state.sessions if s.priority is Priority.BACKGROUND)
        s = min(max(1, mem.s + direction), max(1, n_back, self.initial_s))
        return dataclasses.replace(step, s=s, direction=direction)


def _cache_read(sessions: list[SessionView]) -> int:
    """KV positions a tick reads for these decoders: each reads its whole cache once."""
    return sum(s.n_past for s in sessions)


# --- the steps -----------------------------------------------------------------------------------
# Each is a pure function: the policy (its knobs), the snapshot, and the records of the steps
# it builds on, in; its own small record out. schedule_tick wires them in order; a new step
# takes what it needs and adds its record.


class Lanes(NamedTuple):
    """QoS classes and phases, and the memory updated with what the last tick measured."""

    mem: SloMemory
    inter: tuple[SessionView, ...]  # interactive sessions (decoding or starting a prompt)
    back: tuple[SessionView, ...]  # background sessions
    inter_dec: tuple[SessionView, ...]  # interactive decoders: served every tick
    back_dec: tuple[SessionView, ...]  # background decoders: up to S of them
    back_ids: frozenset[int]  # the background sessions' sequences
    cap: float  # the latency cap the tick is held to: the lowest of its decoding apps'


class Budget(NamedTuple):
    """latency_budget's: the tick's time budget and what it is relative to (ms)."""

    solo_ms: float  # the interactive decoders' tick alone, predicted
    jitter: float  # how far decode ticks stray past their prediction (p95)
    alone: float  # the streams' p95 alone, relative to solo_ms (at least the jitter)
    budget_ms: float  # latency_cap × solo, a fixed budget, or the idle one


class Decoders(NamedTuple):
    """qos_decoders': who decodes this tick."""

    served: tuple[SessionView, ...]
    k: int  # ticks a burst keeps its background decoders (1 while streams decode)
    back_ms: float  # what the background decoders add to the tick, predicted
    owed_ms: float  # time still owed to background decoders after them (the floor)


class Allowance(NamedTuple):
    """prompt_allowance's: the time prompt tokens may take this tick, and its limits (ms)."""

    rows: int  # the decoders' rows in the batch
    room: int  # batch rows left after them
    decode_ms: float  # the served decoders' tick, predicted
    spare_ms: float  # the budget left for prompt tokens
    pause_ms: float  # the longest a tick with background work may run, past decode_ms
    floor_ms: float  # what a new interactive prompt may always take, past decode_ms
    target_ms: float  # latency_cap × the streams' p95 alone (0 with no stream decoding)
    line_ms: float  # the p95 line: the target less how far prompt ticks stray
    under_ms: float  # saved time this tick may spend and stay under the line
    pause_to_ms: float  # saved time it may spend past the line (a pause)
    rescue_ms: float | None  # a starving background prompt's time (None: not starving)
    waiting: tuple[SessionView, ...]  # sessions with prompt tokens: interactive first, by
    # arrival, then background, shortest left first
    largest_ms: float  # the largest chunk any tick may take (amortisation's yardstick)


class FirstTokens(NamedTuple):
    """first_tokens': the interactive prompt chunks, first in the batch."""

    items: tuple[BatchItem, ...]
    ms: float  # their predicted time


class Chunks(NamedTuple):
    """prompt_chunks' and background_floor's: the prompt tokens in the batch."""

    prefill: tuple[BatchItem, ...]
    prefill_ms: float  # their predicted time
    back_ms: float  # the background chunks' share of it
    floor_ms: float  # a floor chunk's time this tick (0: no floor applies)


def lanes(policy: SloPolicy, state: SchedulerState) -> Lanes:
    """The lanes (QoS classes and phases) and the memory updated with the last tick."""
    inter = tuple(s for s in state.sessions if s.priority is Priority.INTERACTIVE)
    back = tuple(s for s in state.sessions if s.priority is Priority.BACKGROUND)
    inter_dec = tuple(s for s in inter if s.phase is Phase.DECODE)
    back_dec = tuple(s for s in back if s.phase is Phase.DECODE)
    mem = policy._remember(state, bool(inter_dec))
    # Every stream shares the tick, so the most demanding app decoding sets its cap (an
    # app's own latency_cap: EngineConfig.app_latency_caps).
    cap = min((s.latency_cap or policy.latency_cap for s in inter_dec),
              default=policy.latency_cap)
    return Lanes(mem, inter, back, inter_dec, back_dec, frozenset(s.seq_id for s in back), cap)


def latency_budget(policy: SloPolicy, state: SchedulerState, d: Lanes) -> Budget:
    """LatencyGuard, the budget: latency_cap × the interactive decoders' predicted solo tick
    (or tick_budget_ms; idle_budget_ms while no stream decodes, bounding a prompt's TTFT)."""
    solo_ms = state.cost.predict(0, len(d.inter_dec), decode_kv(d.inter_dec))
    # What the streams see alone, at the 95th percentile, relative to solo_ms: jitter and
    # their own new prompts. The budget itself stays latency_cap × solo: planning every
    # tick up to latency_cap × that p95 (less jitter) put the p95 of a CPU storm at 1.46x,
    # since prompt chunks deep into a long prompt stray further than decode ticks do.
    jitter = state.decode_noise
    alone = max(state.alone_p95_ratio, jitter)
    if policy.tick_budget_ms is not None:
        budget = max(policy.tick_budget_ms, solo_ms)
    elif d.inter_dec:
        budget = d.cap * solo_ms
    else:
        # Deep into a long prompt a chunk's read of the cache grows to tens of ms on a CPU (10
        # ms per 1,000 positions on the 134M model): within 50 ms, a 3,000-token prompt alone
        # ran at a fraction of its speed. The tick stretches so that the work amortises it; a
        # new interactive request waits that much longer for the tick in flight.
        back = [s for s in d.back if s.phase is Phase.PREFILL]
        read_ms = state.cost.chunk_overhead_ms(min(back, key=prefill_rank).n_past) \
            if back else 0.0
        budget = max(policy.idle_budget_ms, (1 + policy.idle_amortise) * read_ms)
    return Budget(solo_ms, jitter, alone, budget)


def qos_decoders(policy: SloPolicy, state: SchedulerState, d: Lanes, b: Budget) -> Decoders:
    """Admission/QoS for decoders: every interactive one; background ones up to S, rotated in
    bursts of k ticks while no stream decodes, parked where they would break the budget unless
    the time owed to background work (the floor, step 5) pays for them; one served anyway when
    background work is starving. Background decoders come before background prompts on the
    floor: each is a few tokens from done. Parked with nothing owed to them, a background
    request that had its first token after 15 s took 59 s more for 64 tokens on the CPU (one
    decode row at 1,000 positions costs half a tick there, more than the budget leaves)."""
    cost, mem = state.cost, d.mem
    served = list(d.inter_dec)
    k = 1 if d.inter_dec else mem.k
    owed = mem.owed_dec_ms if policy.background_share > 0 and d.inter_dec else 0.0
    candidates = rotated(list(d.back_dec), state.tick // k)[: max(mem.s, 0)]
    for s in candidates:
        trial = served + [s]
        tick_ms = cost.predict(0, len(trial), decode_kv(trial))
        # The first decoder of a tick goes in whatever the prediction says: with nobody else
        # in the tick there is no one to protect, and a cost model that had learned a 191 ms
        # step on an overloaded CPU parked a lone background request for good (no tick ran
        # to correct it; the compute thread spun on empty plans).
        if tick_ms > b.budget_ms and served and not policy._starving(mem):
            extra = tick_ms - cost.predict(0, len(served), decode_kv(served))
            if extra > owed:
                break
            owed -= extra
        served.append(s)
    served = served[: state.n_batch]
    if d.back_dec and not any(s.priority is Priority.BACKGROUND for s in served) \
            and policy._starving(mem):
        served.append(rotated(list(d.back_dec), state.tick)[0])
    alone = [s for s in served if s.priority is Priority.INTERACTIVE]
    back_ms = cost.predict(0, len(served), decode_kv(served)) \
        - cost.predict(0, len(alone), decode_kv(alone)) if len(alone) < len(served) else 0.0
    return Decoders(tuple(served), k, back_ms, owed)


def prompt_allowance(policy: SloPolicy, state: SchedulerState, d: Lanes, b: Budget,
                     dec: Decoders) -> Allowance:
    """LatencyGuard, the prompt time: what is left of the budget (held back after an overrun,
    let in again on a ramp), and where a background prompt waits, saved time to spend under
    the p95 line or, rarely, in a pause past it (module docstring, step 2)."""
    cost, mem = state.cost, d.mem
    served = list(dec.served)
    room = state.n_batch - len(served)
    kv = decode_kv(served)
    decode_ms = cost.predict(0, len(served), kv)
    spare_ms = max(0.0, b.budget_ms - decode_ms)
    # The longest tick background work may cause: pause_factor × the streams' p95 alone
    # (rare: see pause_share). New interactive prompts get pause_factor × their jittered
    # solo time; basing theirs on the p95 alone, which they raise, would feed back.
    pause_ms = max(b.budget_ms, policy.pause_factor * b.solo_ms * b.alone) - decode_ms
    floor_ms = max(b.budget_ms, policy.pause_factor * b.solo_ms * b.jitter) - decode_ms
    # The p95 target: latency_cap × the streams' p95 alone, relative to the time all
    # interactive sequences would take to decode, those starting a prompt included (as the
    # executor measures it alone): one figure for every tick, as the p95 of gaps is.
    # Relative to each tick's own decoders it came out a fifth lower in ticks where a
    # stream's new prompt left two of three decoding, the ticks most of the streams' own
    # tail is made of. The line is the target less how far ticks with background prompt
    # tokens stray past their plan (at least the decode jitter), so that a tick planned up
    # to it lands past the target rarely: prompt ticks stray further than decode ticks, and
    # less only the decode jitter the p95 of a 1B storm on an H100 rose from 1.06x (pauses
    # alone) to 1.26x, of a 1,500-token storm on CPU to 1.23x.
    target_ms = d.cap * b.alone * cost.predict(0, len(d.inter), decode_kv(d.inter)) \
        if d.inter_dec else 0.0
    line_ms = max(b.budget_ms, target_ms / max(b.jitter, state.prompt_noise))
    under_ms = pause_to_ms = 0.0  # what this tick may spend beyond its own spare time:
    # under the line, or past it (a pause) where nothing fits under it
    pauses = policy._pause_share(state, d.cap) * policy.pause_window  # of the window's ticks
    if d.inter_dec and not mem.hold:  # the hold protects interactive streams
        spare_ms *= mem.ramp
        # Saved time is spent in a tick that stays under the line; in one past it (a
        # pause, up to pause_ms) only where nothing fits under it, while such ticks stay
        # under the share the p95 leaves free (_pause_share), or in a tick a new
        # interactive prompt stretches anyway. Spending it only in pauses starved a
        # background prompt on CPU: one prompt token deep into it costs more than a tick's
        # spare, so the prompt moved only in the 1-4 % of ticks that may pause (a
        # 1,000-token prompt took 256 s, 4.5 % of the time; 119 s with ticks under the
        # line). Pauses come second: each is a gap past the target, where a tick under the
        # line is one only by chance.
        under_ms = max(0.0, min(mem.credit_ms, line_ms - decode_ms - spare_ms))
        rare = mem.over_mask.bit_count() + 1 <= pauses
        if rare or any(s.phase is Phase.PREFILL for s in d.inter):
            pause_to_ms = max(0.0, min(mem.credit_ms, pause_ms - spare_ms))
    elif d.inter_dec:
        spare_ms = 0.0
    rescue_ms = None  # not starving
    if policy._starving(mem):
        rescue_ms = b.budget_ms * policy.rescue_slack - cost.predict(0, len(served), kv)
    waiting = shortest_background_first(
        [s for s in state.sessions if s.phase is Phase.PREFILL])
    # A new interactive prompt is someone waiting for a first token: it may stretch the
    # decoders' tick to floor_ms, whatever the hold says; with no decoder to protect, it
    # goes in whole (chunking it would only delay its first token).
    if not d.inter_dec:
        floor_ms = spare_ms if served else math.inf
    # The largest chunk any tick may take: a pause's, where pauses are allowed at all.
    largest_ms = pause_ms if pauses >= 1 else max(spare_ms, line_ms - decode_ms)
    return Allowance(len(served), room, decode_ms, spare_ms, pause_ms, floor_ms, target_ms,
                     line_ms, under_ms, pause_to_ms, rescue_ms, tuple(waiting), largest_ms)


def bmt_guard(policy: SloPolicy, state: SchedulerState, d: Lanes, b: Budget, dec: Decoders,
              a: Allowance) -> int:
    """The ΣBMT guard and the slow start: the most background prompt tokens, capped where the
    tick's bytes would pass bandwidth × budget, and at twice the largest chunk last run in
    budget."""
    return min(a.room, d.mem.chunk_cap, bmt_room(state, b.budget_ms, dec.served, a.room))


def first_tokens(policy: SloPolicy, state: SchedulerState, d: Lanes,
                 a: Allowance) -> FirstTokens:
    """TTFT first: new interactive prompts go in before any background work. A request with
    at most ttft_burst_tokens new tokens (not counting what the prefix cache held) goes in
    whole, its first token this tick (one longer tick for the streams, as llama-server gives
    every prompt). A longer one gets the most of: what fits the floor, the spare and saved
    time under the line, and its stretch chunk (ttft_chunk_ms: what brings its first token
    within ttft_stretch × its time in whole, counted from its arrival); and at least one
    token. Chunking short prompts to the budget once one stream decoded put the third of
    three streams starting together at 352 ms to its first token, against llama-server's
    62-72 ms; without the stretch chunk a 232-token chat turn beside a stream moved 1-3
    tokens a tick, waited for the stream to end, and went in whole then (TTFT 1.1-1.7 s on
    the CPU)."""
    cost, used, ms = state.cost, 0, 0.0
    items: list[BatchItem] = []
    time_ms = max(a.spare_ms + a.under_ms, a.floor_ms)
    for s in a.waiting:
        if s.seq_id in d.back_ids:
            continue
        at = a.rows + used
        new = s.n_prompt - s.n_cached
        if new <= policy.ttft_burst_tokens:
            n = s.prefill_left
        else:
            beside_ms = a.decode_ms + ms
            overhead_ms = cost.chunk_overhead_ms(s.n_past, at)
            work_ms = cost.work_ms(s.prefill_left, s.n_past, at)
            # its time in whole beside this tick's decoders, had it gone in at arrival
            due_ms = policy.ttft_stretch * (cost.prefill_ms(new, s.n_cached, at) + beside_ms)
            left_ms = due_ms - (state.now_ns - s.arrival_ns) / 1e6
            chunk_ms = max(time_ms - ms, ttft_chunk_ms(work_ms, overhead_ms, beside_ms, left_ms))
            n = max(cost.chunk_tokens(chunk_ms, s.n_past, at), 0 if items else 1)
        n = min(s.prefill_left, a.room - used, n)
        if n <= 0:
            break
        items.append(prompt_chunk(s, n))
        used += n
        ms += cost.prefill_ms(n, s.n_past, at)
    return FirstTokens(tuple(items), ms)


def prompt_chunks(policy: SloPolicy, state: SchedulerState, d: Lanes, a: Allowance, cap: int,
                  f: FirstTokens) -> Chunks:
    """Background prompt chunks with what the first tokens leave: the spare time and the saved
    time under the line; where that moves no background prompt, the saved time of a pause
    instead (SloPolicy._background). While an interactive prompt also waits, they take at
    most 1 - interactive_reserve of the time."""
    back = [s for s in a.waiting if s.seq_id in d.back_ids]
    inter_waiting = len(back) < len(a.waiting)
    used = sum(i.n_tokens for i in f.items)
    rescue_ms = None if a.rescue_ms is None else a.rescue_ms - f.ms
    if rescue_ms is None and not f.items and a.room == state.n_batch:
        # Nothing else in the tick: a background prompt moves whatever the cost model
        # predicts (as a starving one does), or a mispriced model stalls it for good.
        rescue_ms = a.spare_ms

    def spend(extra_ms: float) -> list[BatchItem]:
        total_ms = a.spare_ms + extra_ms
        spare_ms = total_ms - f.ms
        if inter_waiting:
            spare_ms = min(spare_ms, (1 - policy.interactive_reserve) * total_ms)
        return policy._background(back, state.cost, spare_ms, a.largest_ms, cap - used,
                                  a.room - used, rescue_ms, a.rows + used)

    items = spend(a.under_ms) if back else []
    if back and a.pause_to_ms > a.under_ms and not items:
        items = spend(a.pause_to_ms)
    return _priced(state, a.rows, f.items + tuple(items), d.back_ids, 0.0)


def ride_along(policy: SloPolicy, state: SchedulerState, d: Lanes, a: Allowance,
               f: FirstTokens, c: Chunks) -> Chunks:
    """A background prompt chunk in a tick that a new interactive prompt stretches anyway,
    while the floor is owed time and nothing else moved background prompts this tick. It adds
    at most ride_share to the tick, after the first tokens (they come this tick all the same).
    Such ticks are the streams' own tail, as often alone as in a storm, so a longer one is no
    new gap past their p95; a floor chunk of its own is one. Under Vulkan on an H100, where a
    stream's new 32-token prompt beside eight decoders took 20 ms against 4 ms for a decode
    tick, floor chunks made 2.9 % of the storm's ticks and put its p95 at 1.4-2.4x alone.
    The chunk pays the floor what it adds to the tick."""
    back = [s for s in a.waiting if s.seq_id in d.back_ids]
    if policy.ride_share <= 0 or not f.items or not d.inter_dec or not back \
            or c.back_ms > 0 or d.mem.owed_ms <= 0:
        return c
    s, cost = back[0], state.cost
    used = sum(i.n_tokens for i in c.prefill)
    at = a.rows + used
    ride_ms = min(policy.ride_share * (a.decode_ms + c.prefill_ms), d.mem.owed_ms)
    n = min(s.prefill_left, a.room - used, cost.chunk_tokens(ride_ms, s.n_past, at))
    if n <= 0:
        return c
    item = prompt_chunk(s, n)
    return _priced(state, a.rows, c.prefill + (item,), d.back_ids, c.floor_ms)


def background_floor(policy: SloPolicy, state: SchedulerState, d: Lanes, a: Allowance,
                     f: FirstTokens, c: Chunks) -> Chunks:
    """The background floor: while interactive streams decode, background prompts are owed
    background_share of the time (SloMemory.owed_ms, from the ticks' measured times). Where
    the steps before gave them nothing this tick and what is owed pays for a floor chunk, the
    first waiting background prompt gets one, whatever the hold and the pause share say; never
    in a tick that gives a first token (TTFT first). A floor chunk is the larger of a pause,
    a chunk that amortises its overhead, and background_share × the decode tick spread over
    the pause share of ticks (pause_share), so that floor pauses alone leave the p95 alone.
    Without it, a 3,000-token prompt on the CPU moved only in rescues and reached its first
    token after 889 s (alone: 6.4 s)."""
    back = [s for s in a.waiting if s.seq_id in d.back_ids]
    if policy.background_share <= 0 or not d.inter_dec or not back:
        return c
    s = back[0]
    used = sum(i.n_tokens for i in c.prefill)
    rides = policy.ride_share > 0
    # Where background prompts ride in the streams' own prompt ticks (ride_along), a floor
    # chunk of its own waits until what is owed reaches its cap (two chunks), for a ride to
    # pay it first. The cap then counts chunks of its own (right after the decoders) in every
    # tick: priced past a prompt's row steps, it fell short of the debt, and rides were never
    # owed enough to take a chunk.
    chunk_ms = floor_chunk_ms(policy, state, s, a, 0 if rides else used)
    if f.items or c.back_ms > 0 or d.mem.owed_ms < (2 * chunk_ms - 1e-9 if rides else chunk_ms):
        return c._replace(floor_ms=chunk_ms)
    n, due_ms = grown_floor_chunk(policy, state, s, a.rows + used, chunk_ms)
    if d.mem.owed_ms < due_ms:  # a grown chunk waits for its own time to be owed
        return c._replace(floor_ms=chunk_ms)
    # Not capped by the slow start: a floor chunk is a planned pause, sized by its time, and
    # the GPU's decode jitter kept halving the cap (11-16 % of its ticks overran even with no
    # background work), so that capped floor chunks of 16-64 tokens gave an 8B model's
    # 6,000-token prompts a fraction of their share.
    n = min(s.prefill_left, a.room - used, n)
    if n <= 0:
        return c._replace(floor_ms=chunk_ms)
    item = prompt_chunk(s, n)
    return _priced(state, a.rows, c.prefill + (item,), d.back_ids, chunk_ms)


def grown_floor_chunk(policy: SloPolicy, state: SchedulerState, s: SessionView, rows: int,
                      chunk_ms: float) -> tuple[int, float]:
    """A floor chunk's tokens, and what must be owed before it runs: what chunk_ms buys in a
    tick of `rows` rows, or what twice chunk_ms buys, where that moves at least floor_growth
    × the tokens per ms; it then waits for its own time to be owed (at most the cap, two
    chunks). Fewer, longer floor pauses for the same work: on the 2-core CPU a floor chunk of
    9 tokens took 105 ms where 61 took about as long (ggml's CPU flash attention scores fewer
    than 64 query rows one at a time), and under Vulkan on an H100 248 background tokens
    beside eight decoders took 42 ms where 504 took 51 (uma.sched.cost's ragged prices)."""
    cost = state.cost
    n = max(1, cost.chunk_tokens(chunk_ms, s.n_past, rows))
    grown = min(s.prefill_left, cost.chunk_tokens(2 * chunk_ms, s.n_past, rows))
    if grown <= n:
        return n, chunk_ms
    grown_ms = cost.prefill_ms(grown, s.n_past, rows)
    if grown * cost.prefill_ms(n, s.n_past, rows) >= policy.floor_growth * n * grown_ms:
        return grown, max(chunk_ms, grown_ms)
    return n, chunk_ms


def floor_chunk_ms(policy: SloPolicy, state: SchedulerState, s: SessionView, a: Allowance,
                   used: int) -> float:
    """A floor chunk's time: at least a pause (pause_ms), a chunk whose work amortises its
    overhead, and what is owed over 1 / pause_share ticks, that pause included (F owed for
    F + decode_ms / pause_share of time: F = share × decode / (pause_share × (1 - share))).
    `used`: prompt tokens already in the tick."""
    cost, share, rows = state.cost, policy.background_share, a.rows + used
    amortised = cost.prefill_ms(
        cost.amortising_tokens(s.n_past, rows, policy.step_amortise), s.n_past, rows)
    spaced = share * a.decode_ms / (max(policy.pause_share, 1e-3) * (1 - min(share, 0.9)))
    return max(a.pause_ms, amortised, spaced)


def even_out(policy: SloPolicy, state: SchedulerState, d: Lanes, a: Allowance,
             c: Chunks) -> Chunks:
    """Where the tick as planned is ragged (its rows past 16 and not a power of two), a
    background prompt takes the tokens that bring it to the next power of two, if the cost
    model prices the tick that way at no more than as planned: on a backend whose matrix
    kernels run whole tiles only for some batch sizes, they move background work for free
    and shorten the tick. Under Vulkan on an H100 a stream's new 32-token prompt beside seven
    decoders (39 rows) took 18 ms and the same beside 25 background tokens (64 rows) 15-17;
    56 background tokens beside eight decoders took 14 (uma.sched.cost). A background prompt
    already in the tick grows only if its chunk is the last; one too short to fill the rows
    is passed over. On a CPU the ragged prices are about nothing and no tokens are free."""
    back = [s for s in a.waiting if s.seq_id in d.back_ids]
    used = sum(i.n_tokens for i in c.prefill)
    n = next_even_rows(a.rows + used) - a.rows - used
    if not policy.even_rows or not back or n <= 0 or n > a.room - used:
        return c
    last = c.prefill[-1].seq_id if c.prefill else None
    for s in back:
        grows = s.seq_id == last  # its chunk is the tick's last: it grows by n
        if not grows and any(i.seq_id == s.seq_id for i in c.prefill):
            continue
        prefill = c.prefill[:-1] if grows else c.prefill
        tokens = n + (c.prefill[-1].n_tokens if grows else 0)
        if tokens > s.prefill_left:
            continue
        even = _priced(state, a.rows, prefill + (prompt_chunk(s, tokens),), d.back_ids,
                       c.floor_ms)
        return even if even.prefill_ms <= c.prefill_ms + 1e-9 else c
    return c


def _priced(state: SchedulerState, rows: int, prefill: tuple[BatchItem, ...],
            back_ids: frozenset[int], floor_ms: float) -> Chunks:
    """The prompt chunks, after `rows` decode rows, with their predicted time, in all and of
    the background ones (none less than nothing: a chunk that evens out a ragged tick may
    take time off it, even_out, and the floor counts it as free)."""
    depth = {s.seq_id: s.n_past for s in state.sessions}
    before = itertools.accumulate((i.n_tokens for i in prefill), initial=rows)
    times = [state.cost.prefill_ms(i.n_tokens, depth[i.seq_id], at)
             for i, at in zip(prefill, before, strict=False)]
    back_ms = sum(max(t, 0.0) for t, i in zip(times, prefill, strict=True)
                  if i.seq_id in back_ids)
    return Chunks(prefill, sum(times), back_ms, floor_ms)


def settle(policy: SloPolicy, state: SchedulerState, d: Lanes, b: Budget, dec: Decoders,
           a: Allowance, cap: int, c: Chunks) -> Plan:
    """The plan, and what the next tick must remember: saved time carried over, whether
    background work pushed this tick past the line (the pause share), starvation."""
    served, prefill, mem, back_ids = dec.served, c.prefill, d.mem, d.back_ids
    # Unused prompt time carries over while a background prompt waits: one token deep into
    # a long prompt can cost more than a tick's whole spare (2.75 ms against 1.8 ms on CPU),
    # and on a GPU the step into prompt work costs more than a tick's spare.
    credit = min(mem.credit_ms + a.spare_ms - c.prefill_ms, a.pause_ms) if d.inter_dec and any(
        s.priority is Priority.BACKGROUND for s in a.waiting) else 0.0
    # Only background work counts against the pause share, and not where it rides along:
    # ticks that new interactive prompts stretch happen as often when the streams run
    # alone, so they are already part of the tail the share leaves room for, and making
    # one longer does not add a gap past the p95.
    # Nor does a tick that stays under the line (latency_cap × the streams' p95 alone, less
    # the jitter): past the budget but not past the p95 the cap is judged on (on the CPU
    # mixed load, counting those used the share up while gaps past the line rose only
    # from 1.9 to 2.4 %). Without the jitter margin, a third of an MoE storm's ticks went
    # just under the line, their tail over it, and the p95 to 1.34x.
    back_prompt = any(i.seq_id in back_ids for i in prefill)
    interactive_prompt = any(i.seq_id not in back_ids for i in prefill)
    over = a.decode_ms + c.prefill_ms > a.line_ms + 1e-9 and back_prompt \
        and not interactive_prompt
    back_progress = back_prompt or any(s.priority is Priority.BACKGROUND for s in served)
    n_prefill = sum(i.n_tokens for i in prefill)
    owing = bool(d.inter_dec) and any(s.seq_id in back_ids for s in a.waiting)
    owing_dec = bool(d.inter_dec and d.back_dec)
    mem = dataclasses.replace(
        mem, budget_ms=max(b.budget_ms, a.decode_ms + c.prefill_ms),
        credit_ms=max(0.0, credit), owing=owing, owing_dec=owing_dec, back_ms=c.back_ms,
        back_dec_ms=dec.back_ms, planned_ms=a.decode_ms + c.prefill_ms,
        # what is owed is capped at two floor chunks (two budgets for decoders): after a long
        # hold the floor catches up in a pause or two, not in a streak of them
        owed_ms=min(mem.owed_ms, 2 * c.floor_ms) if owing else 0.0,
        owed_dec_ms=min(mem.owed_dec_ms, 2 * b.budget_ms) if owing_dec else 0.0,
        over_mask=((mem.over_mask << 1) | over) & ((1 << policy.pause_window) - 1),
        starve=0 if back_progress or not d.back else mem.starve + 1, last_prefill=n_prefill)
    notes = PlanNotes(
        budget_ms=b.budget_ms, predicted_ms=a.decode_ms + c.prefill_ms, line_ms=a.line_ms,
        target_ms=a.target_ms, pause_ms=a.pause_ms, credit_ms=max(0.0, credit),
        served_decoders=len(served), parked=len(d.inter_dec) + len(d.back_dec) - len(served),
        parked_seqs=frozenset(s.seq_id for s in d.back_dec) - {s.seq_id for s in served},
        guard_active=bool(mem.hold or mem.ramp < 1.0), s=mem.s, k=dec.k, chunk_cap=mem.chunk_cap,
        bmt_bytes=state.bmt.tick_bytes(len(served) + n_prefill, _cache_read(list(served)))
        if state.bmt else 0.0, overruns=mem.overruns,
        background=frozenset(back_ids & ({s.seq_id for s in served} | {i.seq_id for i in prefill})))
    items = [BatchItem(s.seq_id, Phase.DECODE, 1, logits=True) for s in served] + list(prefill)
    return Plan(items=tuple(items), token_budget=len(served) + cap, notes=notes, memory=mem)

