"""Time slices for a background context: when background requests, whose KV lives in a second
context on the same weights (EngineConfig.background_ctx), may run a tick of their own.

With one KV buffer for every request, a background prompt's cells are in the streams' buffer
and every stream's attention spans them: under Vulkan on an H100 (1B f16, 8 streams, two
6,000-token background prompts) the streams' decode tick went from 5.4 to 8.2 ms whatever the
scheduler did. In a context of their own they cost the streams nothing but the time of the
background's own ticks, which run between the streams' ticks; this policy decides how long
each may be. Where it gives none, background work waits.

The streams' gap is their tick and the background slice before it, so a slice fills what the
streams' tick leaves of their p95 alone (the p95 of their ticks that no slice preceded):
filled to it, a storm's gaps stay under the p95 the streams have alone. A tick that carries an
interactive prompt is the streams' own tail and gets no fill. Background work is also owed
background_share of the time the streams take; what filling did not pay is paid in planned
pauses (up to pause_factor × that p95, at most pause_share of the ticks), as the SLO policy's
floor is. With no interactive request in the engine, background ticks run back to back, each
at most idle_ms (a new interactive request waits for at most one).

A pure function of a frozen snapshot, as every policy here; the lane (uma.background) keeps
the memory and runs the slices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SliceKnobs:
    fill: float = 1.0  # a slice fills the streams' gap up to this × their p95 alone
    background_share: float = 0.15  # least share of the streams' time owed to background
    pause_factor: float = 1.8  # a pause stretches the gap up to this × the p95 alone
    pause_share: float = 0.04  # most ticks followed by a pause
    idle_ms: float = 100.0  # a background tick's time while no interactive request is in


@dataclass(frozen=True, slots=True)
class SliceView:
    """What the slice is decided on: the moment before the streams' next tick runs."""

    streams: bool  # interactive requests are running or waiting
    prompt_next: bool  # the streams' next tick carries prompt tokens (their plan says so)
    tick_ms: float  # that tick, predicted (0: none is planned)
    alone_p95_ms: float  # p95 of their ticks with no slice before (0: not known yet)
    min_ms: float  # the background's least useful tick, predicted (its decoders, or a chunk)
    owed_ms: float  # background time owed and not yet paid
    since_pause: int  # streams' ticks since the last pause


@dataclass(frozen=True, slots=True)
class Slice:
    ms: float  # the background tick's budget (0: no tick now)
    pause: bool = False  # a planned pause, paid from what is owed


def background_slice(view: SliceView, knobs: SliceKnobs) -> Slice:
    if not view.streams:
        return Slice(max(knobs.idle_ms, view.min_ms))
    if view.alone_p95_ms <= 0:  # nothing to measure a gap against yet: pauses only
        line = max(view.tick_ms, view.min_ms)
    else:
        line = view.alone_p95_ms
        room = knobs.fill * line - view.tick_ms
        if not view.prompt_next and room >= view.min_ms:
            return Slice(room)
    pause = max(knobs.pause_factor * line - view.tick_ms, view.min_ms)
    spacing = math.ceil(1 / knobs.pause_share) if knobs.pause_share > 0 else math.inf
    if knobs.background_share > 0 and view.owed_ms >= pause and view.since_pause >= spacing:
        return Slice(pause, pause=True)
    return Slice(0.0)


def owed_after(owed_ms: float, streams_ms: float, background_ms: float, knobs: SliceKnobs,
               cap_ms: float) -> float:
    """What background is owed after the streams took streams_ms and it took background_ms:
    background_share of their time accrues, its own time pays it off. Kept within ±cap_ms, so
    a long stretch of either side does not buy the other an unbounded run later."""
    owed = owed_ms + knobs.background_share * streams_ms - background_ms
    return min(max(owed, -cap_ms), cap_ms)
