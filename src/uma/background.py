"""The background lane: background requests in a second context on the same weights, run in
time slices between the interactive requests' ticks (EngineConfig.background_ctx).

Its own executor (uma.executor) runs them, with the baseline policy given each slice as its
tick budget; uma.sched.slices decides the slices from the streams' next plan, between its
planning and its run. The two executors share the compute thread, the output stage and the
metrics (the lane's gauges are named background_...), so a request is served the same whichever
context holds it; only its KV, and so its attention, is apart.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from uma.executor import Executor
from uma.metrics import Registry
from uma.output import OutputStage
from uma.sched.baseline import BaselinePolicy
from uma.sched.slices import Slice, SliceKnobs, SliceView, background_slice, owed_after
from uma.sched.state import Phase, Plan
from uma.tick_stats import p95

if TYPE_CHECKING:
    from uma import _core

# the smallest prompt chunk a background tick is worth (the baseline policy's least)
MIN_CHUNK = 16
ALONE_WINDOW = 256  # the streams' recent ticks their p95 alone is taken over
ALONE_EVERY = 16  # ticks between two takes of it


def _never() -> bool:
    return False


class BackgroundLane:
    """Runs background requests on ctx between the streams' ticks, as the slices allow."""

    def __init__(self, ctx: _core.Context, output: OutputStage, metrics: Registry,
                 core: ModuleType, knobs: SliceKnobs, device_sampling: bool = False) -> None:
        self.ctx = ctx
        self.knobs = knobs
        self.policy = BaselinePolicy(tick_target_ms=knobs.idle_ms, min_prefill=MIN_CHUNK)
        # Not overlapped: its tokens go out at the end of its own tick, which may be many of
        # the streams' ticks before the next. Settled: a GPU's decode returns once queued, and
        # a prompt chunk without logits would end its slice at once, its work landing in the
        # streams' next tick and its cost model learning it for free (under Vulkan on an H100
        # the storm's gaps were as long as with one KV buffer).
        self.ex = Executor(ctx, self.policy, output, metrics.lane("background_"), core,
                           device_sampling=device_sampling, overlap=False, fair_share=False,
                           settle=True)
        self._alone: collections.deque[float] = collections.deque(maxlen=ALONE_WINDOW)
        self._pushed = 0
        self.alone_p95_ms = 0.0
        self.owed_ms = 0.0
        self._since_slice = 0
        self._sliced = False  # a slice ran before the streams' tick now running
        self._seen = 0  # the streams' ticks seen measured
        # set to a list to record (view, slice, its ms, the prompt tokens it ran) of every
        # decision, for traces and tests; None costs nothing
        self.trace: list[tuple[SliceView, Slice, float, int]] | None = None

    @property
    def idle(self) -> bool:
        return self.ex.idle

    def run_slice(self, streams: Executor, plan: Plan,
                  arrived: Callable[[], bool] = _never) -> float:
        """Called between the streams' plan and its run: runs background ticks for as long as
        the slice policy gives them; returns the seconds they took. Decided here, not after
        the streams' tick, because the plan says what their next tick is: one that carries a
        new prompt is their own tail, and a slice rides before it. arrived: whether a new
        request came in since the plan; an idle slice (no stream to plan for) ends at the
        next background tick when one did, so that it waits for one tick, not the slice."""
        if streams.n_ticks != self._seen:  # their last tick, measured
            self._seen = streams.n_ticks
            self._measured_streams(streams.last_tick_ms)
        if self.ex.idle:
            self._sliced = False
            return 0.0
        view = self._view(streams, plan)
        cut = background_slice(view, self.knobs)
        spent, prompt = 0.0, 0
        if plan.items:
            self._since_slice += 1
        if cut.ms > 0:
            spent, prompt = self._run(cut.ms, arrived if cut.kind == "idle" else _never)
            if cut.kind != "idle":
                self._since_slice = 0
        self._sliced = cut.kind == "pause"
        if view.streams:
            cap = self.knobs.pause_factor * max(view.alone_p95_ms, view.tick_ms) * 4
            self.owed_ms = owed_after(self.owed_ms, view.tick_ms, spent * 1e3, self.knobs, cap)
        else:
            self.owed_ms = 0.0
        if self.trace is not None:
            self.trace.append((view, cut, spent * 1e3, prompt))
        return spent

    def _run(self, budget_ms: float, arrived: Callable[[], bool]) -> tuple[float, int]:
        """Background ticks back to back while the slice has room for the least useful one:
        a ride may be longer than one full chunk takes (n_batch tokens), and under Vulkan on
        an H100 one tick a ride left two background prompts 30-41x slower than alone where
        several made them 17x. Returns the seconds they took and, while tracing, the prompt
        tokens they ran."""
        t0 = time.perf_counter()
        left, prompt = budget_ms, 0
        while True:
            self.ex.policy = dataclasses.replace(self.policy, tick_target_ms=left)
            ran = self.ex.step()
            if ran and self.trace is not None:  # counted for traces only
                prompt += sum(i.n_tokens for i in self.ex.last_plan.items
                              if i.phase is Phase.PREFILL)
            spent = time.perf_counter() - t0
            left = budget_ms - spent * 1e3
            if not ran or self.ex.idle or left < self._least_ms() or arrived():
                return spent, prompt

    def _measured_streams(self, ms: float) -> None:
        """The streams' tick that just ran: part of their p95 alone if no slice preceded it.
        Ticks, not gaps: weighted by the tokens each sampled, the p95 of an H100's eight
        streams under Vulkan read 7.2 ms where their clients measured 11.6 (a token published
        a tick late is a gap of two), and slices never fitted."""
        if not self._sliced:
            self._note_alone(ms)
        self._sliced = False

    def _view(self, streams: Executor, plan: Plan) -> SliceView:
        notes = plan.notes
        tick_ms = 0.0
        if plan.items:
            tick_ms = notes.predicted_ms if notes is not None and notes.predicted_ms > 0 \
                else streams.last_tick_ms
        return SliceView(
            streams=bool(plan.items) or bool(streams.running) or bool(streams.n_waiting),
            prompt_next=any(i.phase is Phase.PREFILL for i in plan.items),
            decoding=any(i.phase is Phase.DECODE for i in plan.items),
            tick_ms=tick_ms, alone_p95_ms=self.alone_p95_ms, min_ms=self._least_ms(),
            owed_ms=self.owed_ms, since_slice=self._since_slice)

    def _note_alone(self, ms: float) -> None:
        self._alone.append(ms)
        self._pushed += 1
        if len(self._alone) >= 2 * ALONE_EVERY and self._pushed % ALONE_EVERY == 0:
            self.alone_p95_ms = p95(sorted(self._alone))

    def _least_ms(self) -> float:
        """The background's least useful tick, predicted: its decoders, and a prompt chunk of
        MIN_CHUNK tokens where one prefills."""
        decoders = [r for r in self.ex.running.values() if r.phase is Phase.DECODE]
        kv = sum(r.n_past for r in decoders)
        prefill = MIN_CHUNK if len(decoders) < len(self.ex.running) or self.ex.n_waiting else 0
        return self.ex.cost.estimate.predict(prefill, len(decoders), kv)

    def close(self) -> None:
        self.ex.close()

