"""The bound policy: every interactive gap bounded by construction, background work in the
time the bound leaves.

While an interactive stream decodes, every tick is planned within one of two limits
(docs/design/scheduling.md, "The latency bound"):

- the *line*: latency_cap × the streams' p95 alone, less how far ticks stray past their
  prediction. Ordinary ticks stay under it, so the streams' p95 moves at most to the cap.
- the *gap bound*: the worst interactive gap allowed, max(gap_ms, gap_factor × the p95
  alone), planned with the same margin. A tick may go past the line (a *pause*) only up to
  it, and only one tick in as many as the p95 leaves free (pause_rate).

Background work takes what the line leaves in every tick and, in a pause, the share of the
streams' time it is owed (background_share over the ticks between two pauses). New
interactive prompts come first, in chunks that keep their tick within the gap bound.

The cost model prices every chunk at the depth it runs at; each tick's measured time then
bounds the next tick of its kind: background chunks are priced at the cost model's price ×
what the last background tick of that size measured against it (`prices`, one per size band
of its tokens: a price learned on one-token chunks says nothing of a 64-token chunk's), which
follows an overrun at once, in every band (shrink), and a tick that came in under by at most
a fifth a tick, in its own band (grow slowly). So a price the model got wrong, however wrong,
costs one tick, not a streak. A slow start (a
token cap doubling from min_prefill while used) bounds the first chunks, before any has
been measured.

New interactive prompts go the one due first first (first_token_order): a short one passes
long ones that came before it. With no stream decoding there is no one between two tokens to
protect: the prompt due first goes in whole (a newcomer that would wait on it ends its tick,
uma.engine.runner.Runner.interrupt), and background work runs in ticks of idle_budget_ms (a
newcomer waits for at most one), stretched deep into a long prompt until a chunk's work
amortises its read of the cache.

Background work in a context of its own (EngineConfig.background_ctx: its KV apart from the
streams', so their attention never spans it) is paid from the same limits and the same
ledger: it runs just before the tick, for what the tick's limit leaves past the tick's own
work (`apart_time`), so an ordinary tick with it stays under the line and a pause within the
gap bound. Its measured time bounds its next grant as a background chunk's does (shrink at
once on an overrun, grow by a quarter a tick).

A pure function of the snapshot; what it remembers travels in BoundMemory (Plan.memory).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from uma.config import EngineConfig
from uma.sched.cost import CostEstimate
from uma.sched.policy import (
    admit_by_class,
    bmt_room,
    decode_kv,
    first_token_due_ns,
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

# A tick's background tokens below 4, below 16, below 64, below 256, and more: a price is
# learned per band, because the cost model's error differs with the rows (a CPU's cliff at 64
# rows, a call's fixed part that one token cannot amortise).
PRICE_EDGES = (1, 4, 16, 64, 256)


def price_band(tokens: int) -> int:
    return max(bisect.bisect_right(PRICE_EDGES, tokens) - 1, 0)


@dataclass(frozen=True, slots=True)
class BoundMemory:
    """What the policy carries from one tick to the next."""

    since_pause: int = 1 << 30  # ticks since the last pause
    cap: int = 0  # most background prompt tokens a tick may carry (0: not yet set)
    planned_ms: float = 0.0  # the last plan's predicted time
    decode_ms: float = 0.0  # ... of which all but its background prompt chunks
    back_tokens: int = 0  # background prompt tokens it carried
    # background chunks' measured time / the cost model's, lately: one per band of a tick's
    # background tokens (PRICE_EDGES)
    prices: tuple[float, ...] = (1.0,) * len(PRICE_EDGES)
    overruns: int = 0  # background ticks that ran past their plan, in all
    apart_ms: float = 0.0  # the background context's last grant
    apart_price: float = 1.0  # what its grants took / the grant, lately (at least 1)

    def price_of(self, tokens: int) -> float:
        """The price of a tick carrying this many background prompt tokens."""
        return self.prices[price_band(tokens)]

    @property
    def price(self) -> float:
        """The price the last plan's background chunks were set at."""
        return self.price_of(self.back_tokens)


@dataclass(frozen=True, slots=True)
class BoundPolicy:
    latency_cap: float = 1.20  # the streams' gap p95 allowed, × their p95 alone
    tick_budget_ms: float | None = None  # an explicit line instead of the cap
    background_share: float = 0.3  # the streams' time owed to background work (0: only
    # what the line leaves)
    gap_ms: float = 100.0  # the worst interactive gap allowed is the larger of this...
    gap_factor: float = 4.0  # ... and this × the streams' p95 alone
    idle_budget_ms: float = 100.0  # a tick's time while no stream decodes
    # internal constants (the [slo] table of the config file)
    gap_margin: float = 1.25  # a pause is planned to the gap bound / this, at least
    quantile: float = 0.95  # the percentile latency_cap is judged at
    tail_margin: float = 0.005  # share of ticks kept free of pauses below 1 - quantile
    max_pause_rate: float = 0.04  # most ticks that may be pauses
    min_pause_rate: float = 0.01  # ... however much of the tail the streams take alone
    min_prefill: int = 16  # the slow start's first background chunk
    ttft_burst_tokens: int = 128  # a new interactive prompt of at most this many new
    # tokens goes in whole (within the gap bound)
    ttft_stretch: float = 1.25  # a longer one's first token comes within this × its time
    # in whole
    idle_amortise: float = 4.0  # with no stream decoding, a background chunk's work is at
    # least this × its read of the cache
    name: str = "bound"

    @classmethod
    def from_config(cls, config: EngineConfig) -> BoundPolicy:
        return cls(latency_cap=config.latency_cap, tick_budget_ms=config.tick_budget_ms,
                   **own_knobs(cls, config.slo))  # type: ignore[arg-type]

    def admit(self, waiting: Sequence[Waiting], free: int) -> tuple[int, ...]:
        return admit_by_class(waiting, free)

    def first_token_due(self, arrival_ns: int, n_new: int, n_cached: int,
                        cost: CostEstimate) -> float:
        """ttft_stretch × its new tokens' time alone after its arrival."""
        return arrival_ns + 1e6 * self.ttft_stretch * cost.prefill_ms(n_new, n_cached)

    def shed(self, plan: Plan, sessions: Sequence[SessionView]) -> Shed:
        return shed_for_room(plan, sessions)

    def schedule_tick(self, state: SchedulerState) -> Plan:
        mem = remembered(self, state)
        firsts = first_token_order(self, state)
        limits = tick_limits(self, state, mem, firsts)
        decoders = served_decoders(self, state, limits)
        decode_ms = state.cost.predict(0, len(decoders), decode_kv(decoders))
        first = first_tokens(self, state, limits, decoders, decode_ms, firsts)
        back = background_chunks(state, limits, decoders, decode_ms, first, mem)
        own_ms = decode_ms + first.ms + back.price * back.ms if decoders or first.items \
            or back.items else 0.0  # no tick of its own: no call to pay for
        apart = apart_time(state, limits, own_ms, first, back, mem)
        return settled(state, limits, decoders, decode_ms, first, back, apart, mem)


@dataclass(frozen=True, slots=True)
class Limits:
    """One tick's limits (ms, predicted)."""

    streams: bool  # an interactive stream decodes: there is a gap to bound
    solo_ms: float  # the interactive decoders alone
    line_ms: float  # what an ordinary tick may take
    gap_ms: float  # what any tick may take (the gap bound, with its margin)
    target_ms: float  # latency_cap × the streams' p95 alone (0: no stream decodes)
    pause: bool  # this tick may go past the line to give background work its share
    pause_ms: float  # a pause's time past the decode rows (0: no pause)
    back_ids: frozenset[int]  # the background sessions' sequences

    @property
    def tick_ms(self) -> float:
        """What this tick may take: a pause's time, or the line's."""
        return self.solo_ms + self.pause_ms if self.pause else self.line_ms


class Chunks(NamedTuple):
    """Prompt chunks of one kind, in batch order, their time at the cost model's price, and
    the measured price they are planned at (background chunks)."""

    items: tuple[BatchItem, ...] = ()
    ms: float = 0.0
    price: float = 1.0


def remembered(policy: BoundPolicy, state: SchedulerState) -> BoundMemory:
    """The memory, updated with what the last tick measured. Where it carried background
    prompt work that was a fair part of it (a quarter of its plan, or 5 ms: less, and the
    decode rows' noise decides the ratio), the price of its band becomes the ratio of that
    work's measured time to its plan: at once where it ran over (and every band's, to at least
    that: a chunk of another size may be as wrong), by at most a fifth a tick where it ran
    under (its band's only). A tick that used at least half the slow start's cap and held
    doubles the cap."""
    mem = state.memory if isinstance(state.memory, BoundMemory) else BoundMemory()
    if mem.cap == 0:
        mem = dataclasses.replace(mem, cap=policy.min_prefill)
    mem = dataclasses.replace(mem, since_pause=mem.since_pause + 1)
    if mem.apart_ms > 0 and state.last_apart_ms > 0:
        ratio = min(mem.apart_price * state.last_apart_ms / mem.apart_ms, MAX_PRICE)
        price = ratio if ratio > mem.apart_price else max(1.0, 0.8 * mem.apart_price)
        over = ratio > mem.apart_price * max(1.1, state.decode_noise)
        mem = dataclasses.replace(mem, apart_price=price, overruns=mem.overruns + over)
    n = mem.back_tokens
    if n == 0 or state.last_tick_ms <= 0:
        return mem
    planned = mem.planned_ms - mem.decode_ms  # the background chunks' part, at its price
    took = state.last_tick_ms - mem.decode_ms
    if planned >= max(5.0, 0.25 * mem.planned_ms):
        band, price = price_band(n), mem.price_of(n)
        ratio = min(max(price * took / planned, MIN_PRICE), MAX_PRICE)
        if ratio > price:
            prices = tuple(max(p, ratio) for p in mem.prices)
        else:
            prices = tuple(max(ratio, 0.8 * p) if b == band else p
                           for b, p in enumerate(mem.prices))
        over = ratio > price * max(1.1, state.decode_noise)
        mem = dataclasses.replace(mem, prices=prices, overruns=mem.overruns + over)
        if over:
            return mem
    if 2 * n >= mem.cap:
        return dataclasses.replace(mem, cap=min(2 * mem.cap, max(state.n_batch, 1)))
    return mem


MIN_PRICE, MAX_PRICE = 0.25, 64.0  # how far the measured price may part from the model's


def pause_rate(policy: BoundPolicy, state: SchedulerState, cap: float) -> float:
    """The share of ticks that may be pauses: what the streams' p95 leaves free above the
    line, less a margin (uma.sched.policy.free_tail_share); between min_pause_rate and
    max_pause_rate."""
    if not state.alone_ratios:
        return policy.max_pause_rate
    free = free_tail_share(state, cap, policy.quantile, policy.tail_margin)
    return min(policy.max_pause_rate, max(policy.min_pause_rate, free))


def tick_limits(policy: BoundPolicy, state: SchedulerState, mem: BoundMemory,
                firsts: Sequence[SessionView]) -> Limits:
    """The tick's limits; firsts: the new interactive prompts, the one due first first
    (first_token_order)."""
    cost = state.cost
    inter = [s for s in state.sessions if s.priority is Priority.INTERACTIVE]
    inter_dec = [s for s in inter if s.phase is Phase.DECODE]
    back = [s for s in state.sessions if s.priority is Priority.BACKGROUND]
    back_ids = frozenset(s.seq_id for s in back)
    solo_ms = cost.predict(0, len(inter_dec), decode_kv(inter_dec))
    if not inter_dec:
        # Deep into a long prompt a chunk's read of the cache grows to tens of ms on a CPU;
        # the tick stretches until its work amortises that read (a newcomer waits as long).
        prompts = [s for s in back if s.phase is Phase.PREFILL]
        head = firsts[0] if firsts else min(prompts, key=prefill_rank) if prompts else None
        read_ms = cost.chunk_overhead_ms(head.n_past) if head is not None else 0.0
        if state.apart is not None:
            read_ms = max(read_ms, state.apart.read_ms)
        idle = max(policy.idle_budget_ms, (1 + policy.idle_amortise) * read_ms)
        return Limits(False, solo_ms, idle, idle, 0.0, False, 0.0, back_ids)
    # An app's own latency cap: every stream shares the tick, the most demanding one sets it.
    cap = min((s.latency_cap or policy.latency_cap for s in inter_dec),
              default=policy.latency_cap)
    alone = max(state.alone_p95_ratio, state.decode_noise, 1.0)
    # the streams' p95 alone, as a time: every interactive sequence as a decode row (as the
    # scheduler measures it alone, new prompts' ticks among them)
    alone_ms = alone * cost.predict(0, len(inter), decode_kv(inter))
    target_ms = cap * alone_ms
    margin = max(state.prompt_noise, state.decode_noise, 1.0)
    if policy.tick_budget_ms is not None:
        line_ms = max(policy.tick_budget_ms, solo_ms)
    else:
        line_ms = max(cap * solo_ms, target_ms / margin)
    gap_ms = max(line_ms, max(policy.gap_ms, policy.gap_factor * alone_ms)
                 / max(margin, policy.gap_margin))
    waiting = state.apart is not None \
        or any(s.phase is Phase.PREFILL or s.phase is Phase.DECODE for s in back)
    spacing, pause_ms = pause_shape(policy, state, pause_rate(policy, state, cap), solo_ms,
                                    line_ms, gap_ms, back)
    pause = policy.background_share > 0 and waiting and mem.since_pause >= spacing
    return Limits(True, solo_ms, line_ms, gap_ms, target_ms, pause,
                  pause_ms if pause else 0.0, back_ids)


def pause_shape(policy: BoundPolicy, state: SchedulerState, rate: float, solo_ms: float,
                line_ms: float, gap_ms: float, back: Sequence[SessionView]
                ) -> tuple[float, float]:
    """(ticks from one pause to the next, a pause's time past the streams' decode rows), so
    that the background gets its share of the streams' time: T ordinary ticks of d ms and a
    pause of P ms past them, of which the line's leftover L is every tick's, give
    (P - L) / (T d + P) = share; never more often than the pause rate allows.

    While a background prompt waits, its chunks take any length: each pause is as long as
    the gap bound allows and pauses come as rarely as the share permits (the fewest for the
    same time, so a p95 judged at one tick in 20 is left alone however fast the ticks).
    Background decoders alone move one token a call: pauses as often as the rate allows,
    each as long as the share owes."""
    least = math.ceil(1 / rate) if rate > 0 else math.inf
    share = min(policy.background_share, 0.9)
    full = gap_ms - solo_ms
    leftover = line_ms - solo_ms
    if share <= 0 or solo_ms <= 0:
        return least, full
    apart = state.apart
    if any(s.phase is Phase.PREFILL for s in back) or (apart is not None and apart.prompt):
        owed = max(full - leftover, 0.0) * (1 - share) / (share * solo_ms)
        return max(least, math.ceil(owed)), full
    return least, min(full, share * least * solo_ms / (1 - share) + leftover)


def served_decoders(policy: BoundPolicy, state: SchedulerState,
                    lim: Limits) -> tuple[SessionView, ...]:
    """Every interactive decoder; background decoders, rotated so each is left out equally
    often, while the tick stays within the line (a pause's time, in a pause). The first
    decoder of a tick goes in whatever the prediction says: with nobody else in the tick
    there is no one to protect, and a model that had learned an inflated step on an overloaded
    CPU once parked a lone background request for good."""
    cost = state.cost
    served = [s for s in state.sessions
              if s.priority is Priority.INTERACTIVE and s.phase is Phase.DECODE]
    limit_ms = lim.tick_ms
    back_dec = [s for s in state.sessions
                if s.priority is Priority.BACKGROUND and s.phase is Phase.DECODE]
    kv = decode_kv(served)
    for s in rotated(back_dec, state.tick):
        if len(served) >= state.n_batch:
            break
        kv += decode_kv((s,))
        if served and cost.predict(0, len(served) + 1, kv) > limit_ms:
            break
        served.append(s)
    return tuple(served[:state.n_batch])


def first_tokens(policy: BoundPolicy, state: SchedulerState, lim: Limits,
                 decoders: tuple[SessionView, ...], decode_ms: float,
                 firsts: Sequence[SessionView]) -> Chunks:
    """New interactive prompts (firsts), before any background work, the one due first first
    (first_token_order). With no stream decoding that one goes in whole, and the others fill
    what keeps it within its due time (at least the tick's limit). Beside streams, one with
    at most ttft_burst_tokens new tokens goes in whole where that keeps the tick within the
    gap bound; a longer one takes the chunk that brings its first token within ttft_stretch ×
    its time in whole (counted from its arrival), at least what the line leaves, at most what
    the gap bound leaves, and at least one token."""
    cost = state.cost
    rows = len(decoders)
    items: list[BatchItem] = []
    used, ms, limit_ms = 0, 0.0, 0.0
    for s in firsts:
        at = rows + used
        room = state.n_batch - at
        whole_ms = cost.prefill_ms(s.prefill_left, s.n_past, at)
        if not lim.streams:
            if not items:
                n = s.prefill_left
                until_due_ms = (first_token_due_ns(policy, s, cost) - state.now_ns) / 1e6
                limit_ms = max(lim.tick_ms, decode_ms + whole_ms, until_due_ms)
            else:
                spare_ms = limit_ms - decode_ms - ms
                n = s.prefill_left if whole_ms <= spare_ms \
                    else cost.chunk_tokens(spare_ms, s.n_past, at)
        elif s.n_prompt - s.n_cached <= policy.ttft_burst_tokens \
                and whole_ms <= lim.gap_ms - decode_ms - ms:
            n = s.prefill_left
        else:
            new = s.n_prompt - s.n_cached
            beside_ms = decode_ms + ms
            due_ms = policy.ttft_stretch * (cost.prefill_ms(new, s.n_cached, at) + beside_ms)
            left_ms = due_ms - (state.now_ns - s.arrival_ns) / 1e6
            chunk_ms = ttft_chunk_ms(cost.work_ms(s.prefill_left, s.n_past, at),
                                     cost.chunk_overhead_ms(s.n_past, at), beside_ms, left_ms)
            chunk_ms = min(lim.gap_ms - decode_ms - ms,
                           max(lim.line_ms - decode_ms - ms, chunk_ms))
            n = max(cost.chunk_tokens(chunk_ms, s.n_past, at), 0 if items else 1)
        n = min(s.prefill_left, room, n)
        if n <= 0:
            break
        items.append(prompt_chunk(s, n))
        used += n
        ms += cost.prefill_ms(n, s.n_past, at)
    return Chunks(tuple(items), ms)


def first_token_order(policy: BoundPolicy, state: SchedulerState) -> list[SessionView]:
    """The interactive prompts waiting for their first token, the one due first first
    (first_token_due_ns). A short prompt is due soon and passes long ones that came before it
    (in order of arrival a 10-token request waited behind three 2,000-token prompts for their
    whole time, 400x its own), while a long one that has waited becomes due in its turn: none
    waits for ever behind newcomers."""
    waiting = [s for s in state.sessions
               if s.phase is Phase.PREFILL and s.priority is Priority.INTERACTIVE]
    return sorted(waiting, key=lambda s: (first_token_due_ns(policy, s, state.cost), s.rid))


def background_chunks(state: SchedulerState, lim: Limits, decoders: tuple[SessionView, ...],
                      decode_ms: float, first: Chunks, mem: BoundMemory) -> Chunks:
    """Background prompt chunks, shortest prompt first, each priced at its own depth (× the
    measured price of the tick's size band), in what the tick's limit leaves after the
    decoders and the first tokens: the line's, or a pause's. The largest tick whose tokens
    fit at their own band's price: a price learned on small chunks never sets a large one's.
    At most the cap (the slow start) and the bandwidth guard's tokens. A pause, and a tick
    with nothing else in it, moves at least one token (the cost model may overprice a deep
    prompt; what one token really costs then corrects it), unless new interactive prompts
    wait for more than the tick gives them. Their time is returned at the model's price,
    unmeasured, with the price they are planned at."""
    prompts = [s for s in shortest_background_first(state.sessions)
               if s.phase is Phase.PREFILL and s.seq_id in lim.back_ids]
    if not prompts:
        return Chunks()
    rows = len(decoders)
    used = sum(i.n_tokens for i in first.items)
    spare_ms = lim.tick_ms - decode_ms - first.ms
    cap = min(mem.cap, bmt_room(state, lim.tick_ms, decoders, state.n_batch - rows - used))
    # At the lowest price the most tokens any band could take: no band above theirs can
    # take its own least, and where theirs is that lowest price they are the answer (the
    # usual case, every band at one price): one packing a tick, not one a band.
    cheapest = min(mem.prices)
    most_any = packed(state, prompts, rows + used, spare_ms, cap, cheapest)
    top = price_band(sum(i.n_tokens for i in most_any.items))
    if most_any.items and mem.prices[top] == cheapest:
        return most_any
    for band in reversed(range(top + 1)):
        most = min(cap, PRICE_EDGES[band + 1] - 1) if band + 1 < len(PRICE_EDGES) else cap
        if most < PRICE_EDGES[band]:
            continue
        chunks = packed(state, prompts, rows + used, spare_ms, most, mem.prices[band])
        if sum(i.n_tokens for i in chunks.items) >= PRICE_EDGES[band]:
            return chunks
    # ... unless a new interactive prompt is still waiting for tokens this tick did not give
    left_out = sum(s.prefill_left for s in state.sessions
                   if s.phase is Phase.PREFILL and s.priority is Priority.INTERACTIVE) > used
    must = (lim.pause or (not lim.streams and not first.items)) and not left_out
    s = prompts[0]
    if must and s.prefill_left > 0 and state.n_batch > rows + used:
        return Chunks((prompt_chunk(s, 1),), state.cost.prefill_ms(1, s.n_past, rows + used),
                      mem.price_of(1))
    return Chunks()


def packed(state: SchedulerState, prompts: Sequence[SessionView], at: int, spare_ms: float,
           most: int, price: float) -> Chunks:
    """Chunks of the prompts in turn, at most `most` tokens in all, within spare_ms at this
    price; the batch's rows start at `at`."""
    cost = state.cost
    items: list[BatchItem] = []
    ms = 0.0
    for s in prompts:
        n = fitting(state, spare_ms / price, s.n_past, at,
                    min(s.prefill_left, most - sum(i.n_tokens for i in items),
                        state.n_batch - at))
        if n <= 0:
            break
        items.append(prompt_chunk(s, n))
        chunk_ms = cost.prefill_ms(n, s.n_past, at)
        spare_ms -= price * chunk_ms
        ms += chunk_ms
        at += n
    return Chunks(tuple(items), ms, price)


def fitting(state: SchedulerState, ms: float, depth: int, rows: int, most: int) -> int:
    """The most prompt tokens, at most `most`, a chunk at `depth` may take within ms. The
    largest chunk the time buys may be past WIDE_ROWS, where attention is cheaper; cut to
    `most` it may fall back below, where the same tokens cost more: then the largest that
    fits below (the price grows with the tokens within one path)."""
    cost = state.cost
    n = min(most, cost.chunk_tokens(ms, depth, rows))
    if n <= 0 or cost.prefill_ms(n, depth, rows) <= ms + 1e-9:
        return max(n, 0)
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost.prefill_ms(mid, depth, rows) <= ms + 1e-9:
            lo = mid
        else:
            hi = mid - 1
    return lo


def apart_time(state: SchedulerState, lim: Limits, predicted: float, first: Chunks,
               back: Chunks, mem: BoundMemory) -> float:
    """The background context's time before this tick: what the tick's limit (the line, a
    pause's, or the idle budget) leaves past the tick's own work, at its measured price; none
    while a new interactive prompt waits for its first token with no stream decoding (nobody
    else is in a gap then, and the newcomer would wait). A grant in an ordinary tick is one
    worth a call (apart.least_ms); a pause, or a tick with nothing else to move, grants at
    least the call that moves one token: background work always moves, and a chunk too dear
    for the bound costs one tick past it."""
    apart = state.apart
    if apart is None or (not lim.streams and first.items):
        return 0.0
    left = (lim.tick_ms - predicted) / mem.apart_price
    if left >= apart.least_ms:
        return left
    must = (lim.pause and not back.items) or not lim.streams
    return max(left, apart.one_ms) if must else 0.0


def settled(state: SchedulerState, lim: Limits, decoders: tuple[SessionView, ...],
            decode_ms: float, first: Chunks, back: Chunks, apart_ms: float,
            mem: BoundMemory) -> Plan:
    """The plan, its figures, and what the next tick must remember."""
    rows = len(decoders)
    own_ms = decode_ms + first.ms  # all but the background chunks
    predicted = own_ms + back.price * back.ms
    back_tokens = sum(i.n_tokens for i in back.items)
    back_decoders = frozenset(s.seq_id for s in decoders if s.seq_id in lim.back_ids)
    paused = lim.pause and (back_tokens > 0 or bool(back_decoders) or apart_ms > 0) \
        and predicted + apart_ms > lim.line_ms + 1e-9
    mem = dataclasses.replace(mem, since_pause=0 if paused else mem.since_pause,
                              planned_ms=predicted, decode_ms=own_ms,
                              back_tokens=back_tokens, apart_ms=apart_ms)
    served = {s.seq_id for s in decoders}
    parked = frozenset(s.seq_id for s in state.sessions
                       if s.phase is Phase.DECODE and s.seq_id not in served)
    prefill = first.items + back.items
    notes = PlanNotes(
        # the tick's own: the background context's grant runs before it
        budget_ms=max((lim.tick_ms if paused else lim.line_ms) - apart_ms, 0.0),
        predicted_ms=predicted, line_ms=lim.line_ms, target_ms=lim.target_ms,
        pause_ms=lim.pause_ms, served_decoders=rows, parked=len(parked), parked_seqs=parked,
        chunk_cap=mem.cap, overruns=mem.overruns,
        bmt_bytes=state.bmt.tick_bytes(rows + sum(i.n_tokens for i in prefill),
                                       sum(s.n_past for s in decoders)) if state.bmt else 0.0,
        background=back_decoders | frozenset(i.seq_id for i in back.items),
        apart_ms=apart_ms, paused=paused)
    items = [BatchItem(s.seq_id, Phase.DECODE, 1, logits=True) for s in decoders] + list(prefill)
    return Plan(items=tuple(items), token_budget=rows + mem.cap, notes=notes, memory=mem)
