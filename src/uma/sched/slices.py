"""Time slices for a background context: when background requests, whose KV lives in a second
context on the same weights (EngineConfig.background_ctx), may run a tick of their own.

With one KV buffer for every request, a background prompt's cells are in the streams' buffer
and every stream's attention spans them: under Vulkan on an H100 (1B f16, 8 streams, two
6,000-token background prompts) the streams' decode tick went from 5.4 to 8.2 ms whatever the
scheduler did. In a context of their own they cost the streams nothing but the time of the
background's own ticks, which run between the streams' ticks; this policy decides how long
each may be. Where it gives none, background work waits.

A client's gap is the streams' tick and the slice before it, and the streams' p95 counts how
many gaps pass a line, not by how much. Their own ticks that carry a new interactive prompt
are the tail already: under Vulkan on an H100 such a tick (a 128-token prompt beside seven
decoders) costs 14-17 ms against 5.5 for a decode tick, and 6-8 % of the streams' gaps are
theirs alone. A slice run just before one lengthens a gap that is past the line (or near it)
anyway; a slice before a decode tick makes a new one. So a slice *rides*: before the streams'
next prompt tick that also decodes (with no stream between two tokens a ride would only delay
the new request's first token), up to `ride` × that tick for the whole gap (the tick counted
at no less than their p95 alone and at most ride_cap × it), at most one slice in
1 / pause_share of their ticks (each adds a tail gap where the prompt tick alone would have
stayed under the line). Where no prompt tick comes for as many ticks again, background work
owed (background_share of the streams' time) is paid in a planned pause (up to pause_factor ×
that p95). With no interactive request in the engine, slices of
idle_ms run background ticks back to back; the lane ends one at the next tick once a request
arrives, so a new interactive request waits for one background tick.

Filling the streams' decode ticks up to their p95 alone, the first version of this policy,
made tail gaps of its own: their ticks' p95 is their prompt ticks' (one in eight ticks
carries a prompt; their clients' gaps, a prompt tick among seven or eight decode gaps, put it
at 11-14 ms), so a fill stretched decode gaps to 13-15 ms, past 1.2x the clients' p95 alone.

A pure function of a frozen snapshot, as every policy here; the lane (uma.background) keeps
the memory and runs the slices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SliceKnobs:
    ride: float = 4.0  # a ride stretches the gap to this × the prompt tick it precedes, at
    # most (0: no rides)
    ride_cap: float = 2.0  # ... where that tick is at most this × the streams' p95 alone
    background_share: float = 0.15  # least share of the streams' time owed to background
    pause_factor: float = 1.8  # a pause stretches the gap up to this × the p95 alone
    pause_share: float = 0.04  # most ticks preceded by a slice (0: none while streams run)
    idle_ms: float = 100.0  # a background tick's time while no interactive request is in
    # the gap bound (uma.sched.bound): no slice makes a gap past the larger of gap_ms and
    # gap_factor x the p95 alone, divided by gap_margin (gap_ms 0: no bound)
    gap_ms: float = 0.0
    gap_factor: float = 4.0
    gap_margin: float = 1.25


@dataclass(frozen=True, slots=True)
class SliceView:
    """What the slice is decided on: the moment before the streams' next tick runs."""

    streams: bool  # interactive requests are running or waiting
    prompt_next: bool  # the streams' next tick carries prompt tokens (their plan says so)
    decoding: bool  # that tick has decode rows: some client is waiting between two tokens
    tick_ms: float  # that tick, predicted (0: none is planned)
    alone_p95_ms: float  # p95 of their ticks with no pause before (0: not known yet)
    min_ms: float  # the background's least useful tick, predicted (its decoders, or a chunk)
    owed_ms: float  # background time owed and not yet paid
    since_slice: int  # streams' ticks since the last slice


@dataclass(frozen=True, slots=True)
class Slice:
    ms: float  # the background ticks' budget (0: none now)
    kind: str = "none"  # idle, ride, pause or none


NONE = Slice(0.0)


def background_slice(view: SliceView, knobs: SliceKnobs) -> Slice:
    if not view.streams:
        return Slice(max(knobs.idle_ms, view.min_ms), "idle")
    spacing = math.ceil(1 / knobs.pause_share) if knobs.pause_share > 0 else math.inf
    if view.since_slice < spacing:
        return NONE
    # before the p95 alone is known, gaps are measured against the tick itself
    line = view.alone_p95_ms if view.alone_p95_ms > 0 else max(view.tick_ms, view.min_ms)
    if view.prompt_next:
        if not view.decoding:
            # no client between two tokens: the slice would hide in no one's gap and only
            # make the new request wait for its first token
            return NONE
        # Sized from the prompt tick it rides before, not from the p95 alone: that p95 sits on
        # the edge between decode and prompt ticks and moves with how many ticks carry a
        # prompt (under Vulkan, 4.8 % against 6.3 % of ticks put it at 7.6 against 16.4 ms,
        # rides at 23 against 48 ms, and the background at 55.9 against 10-12 s); the prompt
        # tick does not move. At most ride_cap x the p95 alone: on a CPU a new prompt's tick
        # can be several times the p95, and 4x it made a 662 ms gap (134M, 2 cores).
        unit = max(line, min(view.tick_ms, knobs.ride_cap * line))
        ride = min(knobs.ride * unit, gap_bound(view, knobs, line)) - view.tick_ms
        return Slice(ride, "ride") if ride >= view.min_ms else NONE
    pause = max(min(knobs.pause_factor * line, gap_bound(view, knobs, line)) - view.tick_ms,
                view.min_ms)
    if knobs.background_share > 0 and view.owed_ms >= pause and view.since_slice >= 2 * spacing:
        return Slice(pause, "pause")
    return NONE


def gap_bound(view: SliceView, knobs: SliceKnobs, line: float) -> float:
    """The longest gap a slice may make, its tick included (inf: no bound)."""
    if knobs.gap_ms <= 0:
        return math.inf
    return max(knobs.gap_ms, knobs.gap_factor * line) / knobs.gap_margin


def owed_after(owed_ms: float, streams_ms: float, background_ms: float, knobs: SliceKnobs,
               cap_ms: float) -> float:
    """What background is owed after the streams took streams_ms and it took background_ms:
    background_share of their time accrues, its own time pays it off. Kept within ±cap_ms, so
    a long stretch of either side does not buy the other an unbounded run later."""
    owed = owed_ms + knobs.background_share * streams_ms - background_ms
    return min(max(owed, -cap_ms), cap_ms)
