"""The engine's contexts under one scheduling turn: which context a request runs in, and the
turn that gives the background context the time the streams' plan grants it.

    plan = streams.schedule()                   # the streams' order, with its grant
    lane.run(plan.notes.apart_ms)               # background ticks in the grant (if any)
    streams.tick(plan, away)                    # the streams' tick, told what ran before it

Without a background context (EngineConfig.background_ctx 0) a turn is the streams'
scheduler's step. A background request runs in the background context when there is one and
its prompt fits that context's sequence; any other request runs in the streams'. A queued
request that changes class moves to the other context's queue; a running one keeps the
context whose KV holds it. Everything here runs on the compute thread.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TypeVar

from uma.engine.background import BackgroundLane
from uma.engine.device_share import Member
from uma.engine.scheduler import Scheduler
from uma.errors import UmaError
from uma.priority import Priority
from uma.request import Request
from uma.sched.state import ApartView, Plan

log = logging.getLogger("uma.engine")

T = TypeVar("T")


def _never() -> bool:
    return False


class Contexts:
    """The streams' scheduler and, if configured, the background lane, driven as one."""

    def __init__(self, streams: Scheduler, lane: BackgroundLane | None) -> None:
        self.streams = streams
        self.lane = lane
        # its part in the device other models' engines share (uma.engine.device_share)
        self.member: Member | None = None
        # the streams' policy grants time to the background context (uma.engine.background)
        # and to a parked follower
        streams.apart = self._apart

    def _apart(self) -> ApartView | None:
        """The work the streams' plan may grant time to: the background context's, else
        another model's engine's that waits for a grant."""
        view = self.lane.view() if self.lane is not None else None
        if view is None and self.member is not None and not self.member.alone:
            return self.member.neighbour()
        return view

    def _interactive(self) -> bool:
        """Whether the streams' context has interactive work, running or queued."""
        return bool(self.streams.waiting[Priority.INTERACTIVE]) or any(
            r.priority is Priority.INTERACTIVE for r in self.streams.running.values())

    def rest(self) -> None:
        """The compute thread waits for work: it leads no one now."""
        if self.member is not None:
            self.member.lead(False)

    @property
    def schedulers(self) -> tuple[Scheduler, ...]:
        return (self.streams,) if self.lane is None else (self.streams, self.lane.scheduler)

    def scheduler_for(self, req: Request) -> Scheduler:
        """Where a request runs: the background context for a background request whose
        prompt fits its sequence, when there is one; else the streams'."""
        if self.lane is not None and req.priority is Priority.BACKGROUND \
                and len(req.tokens) <= self.lane.scheduler.n_ctx_seq:
            return self.lane.scheduler
        return self.streams

    def room(self, priority: Priority) -> int:
        """The longest prompt a request of this class may have."""
        if self.lane is not None and priority is Priority.BACKGROUND:
            return max(self.streams.n_ctx_seq, self.lane.scheduler.n_ctx_seq)
        return self.streams.n_ctx_seq

    def enqueue(self, req: Request) -> None:
        self.scheduler_for(req).enqueue(req)

    def move(self, req: Request, prio: Priority) -> None:
        """A new class for a request. A queued one moves to the queue of its new class's
        context; a running one keeps its context, whose KV holds it, and is seen in its new
        class there."""
        holder = next((s for s in self.schedulers if s.holds(req)), None)
        if holder is None:
            return
        holder.reprioritize(req, prio)
        target = self.scheduler_for(req)
        if target is not holder and req.seq_id < 0 and holder.withdraw(req):
            target.enqueue(req)

    @property
    def n_waiting(self) -> int:
        return sum(s.n_waiting for s in self.schedulers)

    @property
    def idle(self) -> bool:
        return all(s.idle for s in self.schedulers)

    @property
    def busy(self) -> bool:
        """Whether the compute thread has work without a new request: a tick to run, or the
        prefix cache's copies to make."""
        return not self.idle or self.streams.saving

    def release_all(self, reason: str, error: UmaError | None = None) -> None:
        for s in self.schedulers:
            s.release_all(reason, error)

    def turn(self, arrived: Callable[[], bool] = _never) -> None:
        """One turn of the compute thread: the streams' tick, and before it the background
        ticks its plan grants time to. arrived: whether a new request came in meanwhile (a
        grant given while no stream decodes ends at its next background tick)."""
        streams, lane, member = self.streams, self.lane, self.member
        if member is not None and member.alone:
            member = None  # one model loaded: its turns are its own, at no cost
        if member is not None:
            member.lead(self._interactive())
            if member.follows():  # another model's streams decode: wait for their grant
                _guarded(streams, functools.partial(member.follow, arrived))
                return
        if lane is None and member is None:
            _guarded(streams, streams.step)
            return
        plan = _guarded(streams, streams.schedule) or Plan.empty()
        grant = plan.notes.apart_ms if plan.notes is not None else 0.0
        away = 0.0
        if member is not None and member.offering:
            away = member.lend(grant)
        elif grant > 0 and lane is not None:
            done = arrived if not plan.items else _never
            away = _guarded(lane.scheduler, functools.partial(lane.run, grant, done)) or 0.0
        _guarded(streams, functools.partial(streams.tick, plan, away))

    def interrupt(self, n_tokens: int) -> None:
        """A new interactive request, its prompt n_tokens long, arrived (any thread): the
        streams' tick in flight ends early where it runs only prompt chunks that would take
        longer than the newcomer's (Scheduler.interrupt_for), and so does the background
        context's grant (BackgroundLane.interrupt)."""
        self.streams.interrupt_for(n_tokens)
        if self.lane is not None:
            self.lane.interrupt()

    def abort(self) -> None:
        """Stops the decodes in flight in every context (closing, cancelled work)."""
        self.streams.ctx.abort()
        if self.lane is not None:
            self.lane.ctx.abort()

    def close(self) -> None:
        if self.member is not None:
            self.member.leave()
        self.streams.close()
        if self.lane is not None:
            self.lane.close()


def _guarded(scheduler: Scheduler, step: Callable[[], T]) -> T | None:
    """Runs part of one scheduler's turn; None if it failed."""
    try:
        return step()
    except Exception as exc:  # noqa: BLE001 - a bug must end requests, not hang them
        # The scheduler ends what fails for one request alone; what reaches here broke the
        # tick itself (the policy, say): no request can be blamed, so all in flight in that
        # context end with the cause named, their KV is freed, and serving goes on.
        log.exception("tick failed")
        scheduler.release_all("error", UmaError(
            f"internal error in the engine's tick, which ended every request in flight: "
            f"{exc!r}"))
        return None
