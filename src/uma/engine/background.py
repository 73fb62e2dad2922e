"""The background context: background requests in a second context on the same weights
(EngineConfig.background_ctx), so the streams' attention never spans a long background prompt.

The streams' scheduler decides when it runs and for how long: its policy grants the time each
tick's limit leaves (PlanNotes.apart_ms, uma.sched.bound's `apart_time`), from the view this
lane gives it (`view`), and the lane runs background ticks back to back in that grant just
before the streams' tick. Its own scheduler (uma.engine.scheduler) packs each of them with the
baseline policy, the grant's time left as its tick budget. The two schedulers share the compute
thread, the output stage and the metrics (the lane's gauges are named background_...), so a
request is served the same whichever context holds it; only its KV, and so its attention, is
apart.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from uma.engine.output import OutputStage
from uma.engine.scheduler import Scheduler
from uma.metrics import Registry
from uma.sched.baseline import BaselinePolicy
from uma.sched.policy import prefill_rank
from uma.sched.state import ApartView, Phase

if TYPE_CHECKING:
    from uma import _core

# the smallest prompt chunk a background tick is worth (the baseline policy's least)
MIN_CHUNK = 16


def _never() -> bool:
    return False


class Granted:
    """A scheduler whose ticks run only in time another scheduler's plan grants it: its work as
    that plan sees it (view), and its ticks back to back within a grant (run_within), each
    packed by the baseline policy with the grant's time left as its tick target. The background
    context's lane is one (below); an engine with only background work while another model's
    engine serves streams is another (uma.engine.device_share)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.policy = BaselinePolicy(min_prefill=MIN_CHUNK)

    def view(self) -> ApartView | None:
        """Its work as the granting policy sees it (None: nothing to run)."""
        if self.scheduler.idle:
            return None
        depth = self._next_depth()
        cost = self.scheduler.cost.estimate
        return ApartView(least_ms=self._least_ms(MIN_CHUNK, depth),
                         one_ms=self._least_ms(1, depth),
                         read_ms=cost.chunk_overhead_ms(depth) if depth else 0.0,
                         prompt=depth is not None)

    def run_within(self, grant_ms: float, arrived: Callable[[], bool],
                   interrupted: Callable[[], bool] = _never) -> tuple[float, int]:
        """Ticks back to back, each packed within the grant's time left (the first, at least
        one token), while it has room for one worth a call (MIN_CHUNK prompt tokens). A grant
        may be longer than one full chunk takes (n_batch tokens), and one tick per grant left
        background prompts about twice as slow as running ticks while the grant lasts
        (docs/lab/2026-11-26-rides.md). arrived: a new request came in (the grant ends at the
        next tick); interrupted: the last tick was cut short (it ends now). Returns (seconds
        taken, prompt tokens run)."""
        t0 = time.perf_counter()
        own = self.scheduler.policy
        left, prompt = grant_ms, 0
        spent = 0.0
        try:
            while left > 0 and not self.scheduler.idle:
                # A grant too short for a chunk worth a call (a pause where MIN_CHUNK tokens
                # cost more than the gap bound leaves) takes what fits in it, down to one token.
                least = MIN_CHUNK if left >= self._least_ms(MIN_CHUNK, self._next_depth()) \
                    else 1
                self.scheduler.policy = dataclasses.replace(self.policy, tick_target_ms=left,
                                                            min_prefill=least)
                ran = self.scheduler.step()
                if ran:
                    prompt += sum(i.n_tokens for i in self.scheduler.last_plan.items
                                  if i.phase is Phase.PREFILL)
                spent = time.perf_counter() - t0
                left = grant_ms - spent * 1e3
                if interrupted() or not ran or arrived() \
                        or left < self._least_ms(MIN_CHUNK, self._next_depth()):
                    break
        finally:
            self.scheduler.policy = own
        return spent, prompt

    def _next_depth(self) -> int | None:
        """Where the prompt next in line stands (its KV positions; 0 for one still queued);
        None: no prompt to prefill."""
        prompts = [r.view() for r in self.scheduler.running.values()
                   if r.phase is Phase.PREFILL]
        if prompts:
            return min(prompts, key=prefill_rank).n_past
        return 0 if self.scheduler.n_waiting else None

    def _least_ms(self, chunk: int, depth: int | None) -> float:
        """A tick, predicted: its decoders, and a prompt chunk of `chunk` tokens at `depth`
        where a prompt prefills (MIN_CHUNK: the least worth a call)."""
        cost = self.scheduler.cost.estimate
        decoders = [r for r in self.scheduler.running.values() if r.phase is Phase.DECODE]
        ms = cost.predict(0, len(decoders), sum(r.n_past for r in decoders))
        return ms if depth is None else ms + cost.prefill_ms(chunk, depth, len(decoders))


class BackgroundLane:
    """Runs background requests on ctx for the time the streams' plan grants."""

    def __init__(self, ctx: _core.Context, output: OutputStage, metrics: Registry,
                 core: ModuleType, device_sampling: bool = False) -> None:
        self.ctx = ctx
        # Not overlapped: its tokens go out at the end of its own tick, which may be many of
        # the streams' ticks before the next. Settled: a GPU's decode returns once queued, and
        # a prompt chunk without logits would end its grant at once, its work landing in the
        # streams' next tick and its cost model learning it for free (the streams' tail was
        # then as long as with no background context:
        # docs/lab/2026-11-26-background-context-lane.md).
        self.scheduler = Scheduler(ctx, BaselinePolicy(min_prefill=MIN_CHUNK), output,
                                   metrics.lane("background_"), core,
                                   device_sampling=device_sampling, overlap=False,
                                   fair_share=False, settle=True)
        self._granted = Granted(self.scheduler)
        # set to a list to record (grant ms, ms spent, prompt tokens run) of every grant, for
        # traces and tests; None costs nothing
        self.trace: list[tuple[float, float, int]] | None = None
        # A grant in progress, and whether a newcomer stopped its decode (interrupt): the
        # lock keeps the abort flag from outliving the grant it was meant for.
        self._lock = threading.Lock()
        self._granting = False
        self._interrupted = False
        self.interrupts = self.scheduler.m.interrupts  # one counter, with the streams'

    @property
    def idle(self) -> bool:
        return self.scheduler.idle

    def view(self) -> ApartView | None:
        """Its work as the streams' policy sees it (None: nothing to run)."""
        return self._granted.view()

    def run(self, grant_ms: float, arrived: Callable[[], bool] = _never) -> float:
        """Background ticks back to back within the grant (Granted.run_within); returns the
        seconds they took. arrived: whether a new request came in meanwhile; the grant then
        ends at the next tick (with no stream decoding, so that a newcomer waits for one
        background tick, not the grant). An interactive newcomer ends it sooner, mid-decode
        (interrupt)."""
        with self._lock:
            self._granting = True
        try:
            spent, prompt = self._granted.run_within(grant_ms, arrived, self._interrupt_seen)
        finally:
            with self._lock:
                self._granting = False
                self._end_interrupt()
        if self.trace is not None:
            self.trace.append((grant_ms, spent * 1e3, prompt))
        return spent

    def interrupt(self) -> None:
        """Ends the grant in progress at once, its decode in flight abandoned (rolled back:
        the work is done again later): an interactive request has arrived and waits for the
        compute thread. Called from any thread; does nothing between grants. A decode stops
        at its next graph node on CPU backends; elsewhere it ends the grant after it."""
        with self._lock:
            if self._granting and not self._interrupted:
                self._interrupted = True
                self.interrupts.inc()
                self.ctx.abort()

    def _interrupt_seen(self) -> bool:
        with self._lock:
            return self._end_interrupt()

    def _end_interrupt(self) -> bool:
        """Clears an interrupt (under the lock); whether there was one."""
        if not self._interrupted:
            return False
        self._interrupted = False
        self.ctx.abort(False)
        return True

    def close(self) -> None:
        self.scheduler.close()
