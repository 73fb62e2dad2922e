"""The engines of one process (one per loaded model) taking turns on the device while any of
them serves streams, so that background work on one model keeps to the latency target of the
streams on another.

Each engine has its own compute thread. Left alone, two engines decode at once: on a CPU their
threads split the cores (a long background prompt on model B doubled the time of model A's
decode ticks), on a GPU their kernels queue behind each other. Instead, while an engine
*leads* (has interactive requests), an engine with only background work *follows*: it parks
before each turn and runs only in time the leader's plan grants it, exactly as the leader's
own background context would (uma.engine.background): the leader's policy sees the follower's
work as apart work (an ApartView), grants it time by the same rules (its share, pauses within
the gap bound), hands the grant over and waits for it to end, then runs its own tick told
what ran before it. With no leader every engine runs freely; two leaders run side by side as
before (each one's streams are its own policy's).

    leader (model A's thread)              follower (model B's thread)
    plan = streams.schedule()  <- view --  parked
    lend(plan.notes.apart_ms)  -- grant -> ticks within the grant
                               <- spent --  parked again
    streams.tick(plan, spent)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from uma.engine.background import Granted
from uma.engine.scheduler import Scheduler
from uma.sched.state import ApartView

# How often a parked follower looks whether its own engine got new work (its engine's
# condition is not the share's): a follower only parks while it has work, so this costs
# nothing to an idle daemon.
_LOOK_S = 0.005


def _never() -> bool:
    return False


class DeviceShare:
    """The members (one an engine) of one process's device."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._members: list[Member] = []

    def join(self, streams: Scheduler) -> Member:
        """A new member: an engine's streams scheduler, driven by its compute thread."""
        member = Member(self, streams)
        with self._cond:
            self._members.append(member)
        return member

    def leave(self, member: Member) -> None:
        with self._cond:
            if member in self._members:
                self._members.remove(member)
            member.leading = False
            self._cond.notify_all()

    @property
    def members(self) -> int:
        with self._cond:
            return len(self._members)

    def _led_by_other(self, member: Member) -> bool:
        return any(m.leading for m in self._members if m is not member)


class Member:
    """One engine's part in the share, used on its compute thread only."""

    def __init__(self, share: DeviceShare, streams: Scheduler) -> None:
        self._share = share
        self._granted = Granted(streams)
        self.leading = False  # it has interactive work (set by its own thread each turn)
        self.parked = False  # waiting for a grant
        self._grant_ms = 0.0  # a leader's grant to it, while parked
        self._spent: float | None = None  # what that grant took, once done
        self._offered: Member | None = None  # the follower whose view its plan last saw
        # set to a list to record (grant ms, ms spent) of every grant it ran, for tests
        self.trace: list[tuple[float, float]] | None = None

    # --- every member ----------------------------------------------------------------------

    def leave(self) -> None:
        """Out of the share (its engine closes)."""
        self._share.leave(self)

    @property
    def offering(self) -> bool:
        """Whether its last plan saw a follower's work (its grant goes there)."""
        return self._offered is not None

    @property
    def alone(self) -> bool:
        """Whether no other engine shares the device (one model loaded): its turns are its
        own. Read without the lock: a member joining counts from the next turn."""
        return len(self._share._members) < 2

    def lead(self, leading: bool) -> None:
        """Whether it has interactive work now (each turn, and False when it goes idle)."""
        if leading != self.leading:
            with self._share._cond:
                self.leading = leading
                self._share._cond.notify_all()  # parked followers look again

    def follows(self) -> bool:
        """Whether its turn waits for a grant: it has no interactive work, another does."""
        if self.leading:
            return False
        with self._share._cond:
            return self._share._led_by_other(self)

    # --- a follower ------------------------------------------------------------------------

    def follow(self, arrived: Callable[[], bool] = _never) -> float:
        """Parks until a leader grants it time, then runs its ticks within the grant; returns
        the seconds they took (0: it left without one, because no one leads any more or its
        own engine got new work, arrived())."""
        cond = self._share._cond
        with cond:
            self.parked = True
            cond.notify_all()
            try:
                while self._grant_ms <= 0:
                    if not self._share._led_by_other(self) or arrived():
                        return 0.0
                    cond.wait(_LOOK_S)
                grant = self._grant_ms
            finally:
                self.parked = False
        spent = 0.0
        try:
            spent, _ = self._granted.run_within(grant, arrived)
        finally:
            with cond:
                self._grant_ms = 0.0
                self._spent = spent
                cond.notify_all()
        if self.trace is not None:
            self.trace.append((grant, spent * 1e3))
        return spent

    # --- a leader --------------------------------------------------------------------------

    def neighbour(self) -> ApartView | None:
        """The work of a parked follower as this member's policy sees it (the one its grant
        goes to), else None. Called while planning, on this member's thread."""
        cond = self._share._cond
        with cond:
            self._offered = None
            members = self._share._members
            for member in members:
                if member is not self and member.parked and not member.leading:
                    view = member._granted.view()  # parked: its thread does not touch it
                    if view is not None:
                        self._offered = member
                        members.remove(member)  # the next grant goes to another first
                        members.append(member)
                        return view
        return None

    def lend(self, grant_ms: float) -> float:
        """Hands the grant to the follower its plan saw and waits for it to end; returns the
        seconds it took (0 where that follower is no longer parked)."""
        cond = self._share._cond
        with cond:
            follower, self._offered = self._offered, None
            if grant_ms <= 0 or follower is None or not follower.parked \
                    or follower not in self._share._members:
                return 0.0
            began = time.perf_counter()
            follower._spent = None
            follower._grant_ms = grant_ms
            cond.notify_all()
            while follower._spent is None:  # set once its grant ends, whatever happens
                cond.wait()
            return time.perf_counter() - began  # the hand-over's time is away from it too
