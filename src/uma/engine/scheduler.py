"""The scheduler: the side of the tick that decides, on one llama.cpp context.

    order = scheduler.schedule(now)             # release what ended, admit, ask the policy
    ran = runner.run(order)                     # batch, decode, sample (uma.engine.runner)
    scheduler.update(order, ran)                # advance sequences, hand tokens on, report

(`tick` makes the three calls; the runner is also handed the running requests,
`self.runner.run(order, self.running)`, which it reads and never changes.)

It owns the requests: their queues, their KV sequences (one per running request), admission
and parking (the policy's or fair share's choice), preemption, the prefix cache, and which
request ends how. It decides nothing about the tick's contents: who gets a sequence, which
sequences run, how many prompt tokens they get and what to shed on a full cache are the
policy's (uma.sched). The runner only runs and hands back what happened, failures included,
as data; a request that failed on its own is ended here alone, with its own error, and the
others go on. A request that ends, is cancelled or fails has its KV cleared before its result
is published.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import logging
import time
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from uma.engine.calibration import DeviceTiming, KeptTiming, Timing
from uma.engine.draft_model import ModelDrafter
from uma.engine.output import Ended, Event, Logits, OutputStage, Token
from uma.engine.prefix_cache import KvPrefixCache
from uma.engine.runner import Ran, Runner
from uma.engine.speculator import Speculator
from uma.engine.tick_stats import TickReport, TickStats
from uma.errors import UmaError
from uma.handle import TokenLogprob
from uma.metrics import Counter, LoadMeter, Registry
from uma.request import Request
from uma.sched import demotion, fair, reuse
from uma.sched.bmt import BmtModel
from uma.sched.cost import CostModel, attended
from uma.sched.policy import BatchPolicy, first_token_due_ns
from uma.sched.state import ApartView, BatchItem, Phase, Plan, Priority, SchedulerState

if TYPE_CHECKING:
    from uma import _core
    from uma.grammar import Grammars
    from uma.sched.state import SessionView, Waiting

log = logging.getLogger("uma.scheduler")

# The time the prefix cache's snapshots get per turn of the compute thread while nothing runs
# or waits: what a request that comes in meanwhile may wait for before its first tick.
IDLE_SAVE_MS = 10.0


def _nothing_apart() -> ApartView | None:
    return None


class Scheduler:
    """Owns the context's sequences and runs ticks. Used by one thread (the compute thread)."""

    def __init__(self, ctx: _core.Context, policy: BatchPolicy, output: OutputStage,
                 metrics: Registry, core: ModuleType, bmt: BmtModel | None = None,
                 bmt_budget_gbps: float = 0.0, device_sampling: bool = False,
                 overlap: bool = False, n_running: int | None = None,
                 prefix: KvPrefixCache | None = None, fair_share: bool = False,
                 fair_quantum_ms: float | None = None,
                 grammars: Grammars | None = None, settle: bool = False,
                 demote: bool = True, speculation: str = "off",
                 draft: ModelDrafter | None = None,
                 newcomer_waiting: Callable[[], bool] | None = None) -> None:
        """core: the module whose Batch and Sampler go with ctx (uma._core, or a stand-in).
        device_sampling: sample on the device the rows of requests whose options it can
        compute (Context.set_sampler); the host sampler takes the others.
        overlap: publish a tick's tokens and statistics while the device runs the next
        decode (for devices whose decode call returns once the work is queued: GPUs).
        n_running: sequences for requests (the first ones; default all); prefix: the prefix
        cache, which holds the context's other sequences. fair_share: sequences are shared
        between apps (uma.sched.fair), parking requests of apps over their share for apps
        waiting below theirs, and time-slicing apps served fair_quantum_ms apart (None: half
        the service of the largest recent request); otherwise the policy admits (first come,
        first served). grammars: the token masks of constrained requests (uma.grammar;
        needed once a request has a matcher). settle: every decode is waited for on the
        device before the tick ends (a tick that must end within its time slice, and be
        measured whole: uma.engine.background). demote: running background requests give
        their sequences to interactive ones waiting for one, at the next tick boundary
        (uma.sched.demotion). speculation: the drafter of requests that do not choose one
        ("off": none; uma.engine.speculator); draft: the draft model's drafter, if one is
        loaded (closed with the scheduler). newcomer_waiting: whether work came in that the
        compute thread has not taken yet (uma.engine.runner.Runner)."""
        self.ctx = ctx
        self.model = ctx.model
        self.policy = policy
        self.output = output
        self.runner = Runner(ctx, core, device_sampling, grammars, settle, newcomer_waiting)
        self.overlap = overlap
        if overlap:  # the last tick's output goes out while the device runs the next
            self.runner.during = self._flush_overlapped
        self.fair_share = fair_share
        self.demote = demote
        self.fair_quantum_ms = fair_quantum_ms
        self.ledger = fair.Ledger()  # what each app has been served (uma.sched.fair)
        self._rows: list[tuple[Request, float]] = []  # the tick's requests and their price
        # What the tick hands on, kept until _flush: output events in order, the tokens'
        # latencies for the metrics, and the tick's report for the statistics.
        self._outbox: list[Event] = []
        # (class, app, ms, first token, no background request existed)
        self._latencies: list[tuple[Priority, str, float, bool, bool]] = []
        self._fifth: list[tuple[Priority, float]] = []  # (class, submit to fifth token ms)
        self._due: TickReport | None = None
        # Overlapped ticks only: the last plan, while it can be run again unchanged (every
        # request an interactive decoder in it, none queued), and the count of changes to
        # the running set (admissions, releases, preemptions, new classes) it was made at.
        self._steady: Plan | None = None
        self._steady_at = -1
        self._changes = 0
        self.n_ctx_seq = ctx.n_ctx_seq
        self.speculator = Speculator(speculation, metrics, self.n_ctx_seq, draft)
        self.eog = frozenset(int(t) for t in self.model.eog_tokens())
        # Free sequence ids, lowest handed out first, so the sequences decoding together stay a
        # contiguous range. With per-sequence KV (kv_unified=False) llama.cpp puts only
        # consecutive ids in one micro-batch (build), and each micro-batch reads all the
        # weights again: three decoders on streams 0, 1, 3 run as two, and took a step about 1.6
        # times as long as on 0, 1, 2 (docs/design/scheduling.md).
        self.n_running = ctx.n_seq_max if n_running is None else n_running
        self.free_seqs = list(range(self.n_running))  # a heap
        self.prefix = prefix
        self.waiting: dict[Priority, collections.deque[Request]] = {
            p: collections.deque() for p in Priority}
        self.running: dict[int, Request] = {}
        self.cost = CostModel()
        self.stats = TickStats(metrics, self.cost)
        self.m = self.stats.m  # what requests' results record (TTFT, gaps, finishes)
        if prefix is not None:  # the cache's sizes are read when asked, not tracked
            self.m.prefix_cached.fn = lambda: prefix.tokens
            self.m.prefix_ram.fn = lambda: prefix.ram_bytes
            if prefix.disk is not None:
                disk = prefix.disk
                self.m.prefix_disk.fn = lambda: disk.bytes
                self.m.prefix_loaded.fn = lambda: disk.loaded
            prefix.on_evict = lambda tier: self.m.prefix_evicted[tier].inc()
            prefix.idle = self._may_hold
            prefix.prefill_ms = lambda n: reuse.prefill_ms(n, self.cost.estimate,
                                                           self.stats.prompt_ms_per_token)
            prefix.on_unsaved = self.m.prefix_unsaved.inc
        self.bmt = bmt
        self.bmt_budget_gbps = bmt_budget_gbps
        self.m.bmt_budget.set(bmt_budget_gbps)
        self.m.kv_span.set(ctx.kv_span)
        self._tick_start = 0.0
        self._tick_snapshots = 0.0  # the prefix cache's snapshot_seconds as the tick began
        self._cache_read = self._prompt_attended = 0
        self._background_prompt = False
        self._timer: DeviceTiming | None = None  # the start-up calibration, once begun
        # the device's timing, taken at the start or kept from before (what another scheduler
        # on the same device may start from)
        self.timing = Timing()
        # The batch's sequences as decode rows, and their attention: what the streams' ticks
        # alone are measured against (a stream's new prompt counted as the row it will be).
        self._solo = (0, 0)
        # The decode rows ready at the tick, every running request past its prompt: the
        # scorecard's scheduler efficiency is the rows run over these.
        self._ready_rows = 0
        self._apart_busy = False  # the background context had work at the last schedule()
        self._memory: object = None  # the policy's, from its last executed plan
        # That plan's tick as measured (ms, tokens sampled): the policy's feedback, paired
        # with the memory of the plan it measured (see update).
        self._measured = (0.0, 0)
        # ticks applied (stats.ticks counts them when their report is handed on, a tick
        # later when overlapped): last_tick_ms is new when this changes
        self.n_ticks = 0
        self.last_plan = Plan.empty()  # the last tick's plan, as run
        # Background work in a context of its own (uma.engine.background), as the policy sees it,
        # and what that context ran before the last tick (ms): its plan grants it time.
        self.apart: Callable[[], ApartView | None] = _nothing_apart
        self._apart_ms = 0.0

    @property
    def trace(self) -> list[tuple[Any, ...]] | None:
        """Set to a list to record (prefill tokens, decode tokens, decode s, sample s, tick s,
        llama_decode s, plan) of every tick, for profiling and tests; None costs nothing."""
        return self.stats.trace

    @trace.setter
    def trace(self, value: list[tuple[Any, ...]] | None) -> None:
        self.stats.trace = value

    @property
    def last_tick_ms(self) -> float:
        """The last tick's time, as measured (the policy's feedback)."""
        return self._measured[0]

    @property
    def ticks(self) -> int:
        return self.stats.ticks

    @property
    def load(self) -> LoadMeter:
        return self.stats.load

    def calibrate(self, kept: KeptTiming | None = None) -> None:
        """Times the device before serving (uma.engine.calibration) and anchors the cost model
        there; `calibration` shows its progress. kept: a timing kept from an earlier start,
        used where it has one (and the new timing kept there where not)."""
        timing = kept.load() if kept is not None else None
        if timing is None:
            calibration = DeviceTiming(self.ctx, self.runner.batch)
            self._timer = calibration
            timing = calibration.run()
            if kept is not None and timing.ticks:
                kept.save(timing)
        self.adopt_calibration(timing)

    def adopt_calibration(self, timing: Timing) -> None:
        """Anchors the cost model at a device's timing: this scheduler's, or another's (a
        second context on the same device and weights), instead of timing its own."""
        self.timing = timing
        if timing.ticks:
            self.cost.calibrate(timing.ticks)
            self.speculator.calibrated(timing)

    @property
    def calibration(self) -> tuple[int, int]:
        """(scratch decodes done, planned) of the start-up timing."""
        return self._timer.progress if self._timer is not None else (0, 0)

    # --- requests in and out -----------------------------------------------------------------

    def enqueue(self, req: Request) -> None:
        if self.fair_share:
            active = {r.app for r in self.running.values()}
            active.update(r.app for q in self.waiting.values() for r in q)
            self.ledger.arrive(req.app, req.weight, active)
        self.waiting[req.priority].append(req)

    def reprioritize(self, req: Request, priority: Priority) -> None:
        """Moves a request to another class: a queued one changes queue (keeping its arrival
        order there), a running one is simply seen in its new class by the policy."""
        if req.done or req.priority is priority:
            return
        self._changes += 1
        queue = self.waiting[req.priority]
        if req in queue:
            queue.remove(req)
            target = self.waiting[priority]
            later = next((i for i, r in enumerate(target) if r.rid > req.rid), len(target))
            target.insert(later, req)
        req.priority = priority

    def withdraw(self, req: Request) -> bool:
        """Takes a queued request out of its queue (to be queued by another scheduler);
        False if it is not queued here."""
        queue = self.waiting[req.priority]
        if req not in queue:
            return False
        queue.remove(req)
        self._changes += 1
        return True

    def holds(self, req: Request) -> bool:
        """Whether the request is queued or running here."""
        return (req.seq_id >= 0 and self.running.get(req.seq_id) is req) \
            or req in self.waiting[req.priority]

    @property
    def n_waiting(self) -> int:
        """Requests queued for a sequence (safe to read from any thread)."""
        return sum(len(q) for q in self.waiting.values())

    @property
    def idle(self) -> bool:
        return not self.running and not any(self.waiting.values())

    def release(self, req: Request, reason: str, error: UmaError | None = None) -> None:
        """Ends a request: its result is queued, then its KV goes to the prefix cache and
        its sequence is cleared (a snapshot that makes room hands the result on first)."""
        self._changes += 1
        seq, req.seq_id = req.seq_id, -1
        if seq >= 0:
            self.runner.forget(seq)
            del self.running[seq]  # before _keep: a snapshot asks who else runs
        self.speculator.forget(req)
        req.done = True
        if self.fair_share:
            self.ledger.ended(req.service_ms)
        self.m.finished[reason].inc()
        self.m.app_requests.child(req.app).inc()
        self.m.app_tokens.child(req.app).inc(req.n_sampled)
        self.m.running.set(len(self.running))
        self.m.kv_cells.set(sum(r.n_past for r in self.running.values()))
        # Its result is queued before its KV goes to the prefix cache, whose snapshot of an
        # entry leaving for room may hold this thread: the output goes out first (_may_hold).
        self._outbox.append(Ended(req, reason, error, time.monotonic_ns()))
        if seq >= 0:
            if reason != "error":
                self._keep(req, seq)
            self.ctx.seq_rm(seq)
            heapq.heappush(self.free_seqs, seq)
            self.m.kv_span.set(self.ctx.kv_span)

    def release_all(self, reason: str, error: UmaError | None = None) -> None:
        for req in list(self.running.values()):
            self.release(req, reason, error)
        for q in self.waiting.values():
            while q:
                self.release(q.popleft(), reason, error)
        self._flush()

    def abandon(self, queued: list[Request], error: UmaError) -> None:
        """Ends every request (these queued ones too) with error, from another thread, once
        the compute thread is gone for good (held in a ggml abort): nothing here touches the
        context, whose state that thread left mid-decode."""
        now = time.monotonic_ns()
        reqs = [*self.running.values(), *(r for q in self.waiting.values() for r in q), *queued]
        for req in reqs:
            req.done = True
        self.output.publish([Ended(req, "error", error, now) for req in reqs])

    def _flush_overlapped(self) -> None:
        """_flush while the device runs the next decode (the runner's `during`)."""
        self._flush(overlapped=True)

    def _flush(self, overlapped: bool = False) -> None:
        """Hands on what the ticks so far produced: the output events in one batch, the
        latencies to the metrics, the last tick's report to the statistics. overlapped:
        while the device runs the next decode (the gauge overlap_active says which it was)."""
        # Each is taken before it is handed on, and the events go out whatever the statistics
        # do: a report that fails is not recorded again by the recovery's flush (once, a
        # failing one stopped the compute thread and every request waited for ever).
        outbox, self._outbox = self._outbox, []
        try:
            if self._due is not None:
                due, self._due = self._due, None
                self.m.overlap_active.set(1 if overlapped else 0)
                self.stats.record(due)
            if self._latencies:
                latencies, self._latencies = self._latencies, []
                m = self.m
                interactive = Priority.INTERACTIVE
                for priority, app, ms, first, alone in latencies:
                    (m.ttft if first else m.itl)[priority].observe(ms)
                    (m.app_ttft if first else m.app_itl).child(app).observe(ms)
                    if alone and not first and priority is interactive:
                        m.itl_alone.observe(ms)
                m.generated_tokens.inc(len(latencies))  # one a token
            if self._fifth:
                fifth, self._fifth = self._fifth, []
                for priority, ms in fifth:
                    self.m.ttf5[priority].observe(ms)
        finally:
            if outbox:
                self.output.publish(outbox)

    def fail(self, req: Request, exc: BaseException) -> None:
        """Ends one request with an error of its own; every other request goes on. An error
        that is not a UmaError is a bug: logged with its traceback, reported as internal."""
        if req.done:
            return
        if isinstance(exc, UmaError):
            error = exc
        else:
            log.error("request %d failed", req.rid, exc_info=exc)
            error = UmaError(f"internal error: {exc!r}")
        self.release(req, "error", error)

    def _reap(self) -> None:
        """Releases what was cancelled, hit a stop string or failed on the output thread since
        the last tick."""
        for req in [r for r in self.running.values()
                    if r.cancelled or r.stop_hit or r.failure is not None]:
            if req.failure is not None:
                self.fail(req, req.failure)
            else:
                self.release(req, "stop" if req.stop_hit else "cancelled")
        for q in self.waiting.values():
            if any(r.cancelled for r in q):
                for req in [r for r in q if r.cancelled]:
                    q.remove(req)
                    self.release(req, "cancelled")

    def _first_token_due(self, s: SessionView) -> float:
        return first_token_due_ns(self.policy, s, self.cost.estimate)

    def _queued(self) -> list[Waiting]:
        """The queued requests as the policy sees them, interactive ones with the time their
        first token is due."""
        cost = self.cost.estimate
        return [dataclasses.replace(w, due_ns=self.policy.first_token_due(
                    w.arrival_ns, w.n_prompt, 0, cost))
                if w.priority is Priority.INTERACTIVE else w
                for w in (r.waiting() for q in self.waiting.values() for r in q)]

    def _admit(self) -> None:
        """Gives free sequences to the queued requests the policy picks (with fair share: the
        apps furthest below their share first, after parking requests of apps over theirs
        where an app waits with none free), after setting background requests aside for the
        interactive ones that wait with none free (demote)."""
        if not any(self.waiting.values()):
            return
        # The queued views are priced once, and again only after a preemption queued more.
        views = self._queued()
        if self.fair_share:
            sessions = [r.view() for r in self.running.values()]
            if self._preempt_all(fair.park(sessions, views, len(self.free_seqs), self.n_running,
                                           self.ledger.served,
                                           self.fair_quantum_ms or self.ledger.quantum_ms),
                                 self.m.fair_parked):
                views = self._queued()
        if self.demote:
            if self._preempt_all(demotion.demote([r.view() for r in self.running.values()],
                                                 views, len(self.free_seqs)), self.m.demoted):
                views = self._queued()
            if self._preempt_all(demotion.give_way([r.view() for r in self.running.values()],
                                                   views, len(self.free_seqs),
                                                   self._first_token_due)):
                views = self._queued()
        if not self.free_seqs:
            return
        queued = {r.rid: r for q in self.waiting.values() for r in q}
        chosen = fair.admit_fairly(views, len(self.free_seqs),
                                   [r.view() for r in self.running.values()],
                                   self.ledger.served, self.cost.estimate.per_prefill_ms) \
            if self.fair_share else self.policy.admit(views, len(self.free_seqs))
        for rid in chosen:
            req = queued[rid]
            self.waiting[req.priority].remove(req)
            req.seq_id = heapq.heappop(self.free_seqs)
            self._changes += 1
            if not req.admitted_ns:  # a parked or preempted one is not queued anew
                req.admitted_ns = time.monotonic_ns()
                self.m.app_queue.child(req.app).observe((req.admitted_ns - req.arrival_ns) / 1e6)
            self.running[req.seq_id] = req
            try:
                self._reuse(req)
                self.speculator.admit(req)
                self.runner.admit(req)
            except Exception as exc:  # noqa: BLE001 - this request's alone
                self.fail(req, exc)

    def _preempt_all(self, seqs: Iterable[int], counter: Counter | None = None) -> bool:
        """Preempts the requests of these sequences (counted); whether there were any."""
        n = 0
        for seq in seqs:
            if counter is not None:
                counter.inc()
            self._preempt(self.running[seq])
            n += 1
        return n > 0

    def _reuse(self, req: Request) -> None:
        """Starts the request's sequence with the cached prefix of what it must prefill that
        saves the most time (uma.sched.reuse); only the rest is prefilled."""
        if self.prefix is None or not req.params.cache_prompt:
            return
        restored = self.prefix.restored_bytes
        n = self.prefix.reuse(req.seq_id, req.tokens, self.cost.estimate,
                              self.stats.prompt_ms_per_token, app=req.app)
        self.m.prefix_lookups.inc()
        if self.prefix.restored_bytes > restored:
            self.m.prefix_restored.inc(self.prefix.restored_bytes - restored)
        if n:
            req.n_prefilled = req.n_past = n
            if req.tokens is req.prompt:  # not a preempted request's own prefill
                req.cached_tokens = n
            self.m.prefix_hits.inc()
            self.m.prefix_tokens.inc(n)
            self.m.app_prefix_hits.child(req.app).inc()
            self.m.app_prefix_tokens.child(req.app).inc(n)

    def _snapshot_seconds(self) -> float:
        return self.prefix.snapshot_seconds if self.prefix is not None else 0.0

    def _keep(self, req: Request, seq: int) -> None:
        """Leaves what the request's sequence `seq` holds to the prefix cache."""
        if self.prefix is None or req.n_past <= 0:
            return
        if req.drafter is not None:  # guesses kept past a token that ended it
            self.ctx.seq_rm(seq, req.n_past, -1)
        decoded = np.concatenate([req.prompt, np.asarray(req.generated, np.int32)])
        self.prefix.keep(seq, decoded[:req.n_past], app=req.app)

    def _may_hold(self) -> bool:
        """Whether the prefix cache may hold this thread for a whole snapshot of an entry that
        must leave at once: only while nothing runs or waits, and then what the ticks so far
        produced is handed on first (a request that had just ended waited behind such a copy
        for its last token, a storm's worst gap: docs/design/prefix-cache.md). Otherwise
        entries leave in slices between ticks (_save)."""
        if self.running or any(self.waiting.values()):
            return False
        self._flush()
        return True

    def _save(self, plan: Plan) -> None:
        """Gives the prefix cache's leaving entries the time this tick left under its budget
        (none where its plan kept no figures), or IDLE_SAVE_MS while nothing runs or waits,
        turn after turn of the compute thread until a request comes in: their snapshots
        go in slices, so a stream waits at most one slice past the time its tick was
        allowed."""
        prefix = self.prefix
        if prefix is None or not prefix.saving:
            return
        idle = self.idle
        if idle:
            budget_ms = IDLE_SAVE_MS
        else:
            allowed = plan.notes.budget_ms if plan.notes is not None else 0.0
            budget_ms = allowed - 1e3 * (time.perf_counter() - self._tick_start)
        if budget_ms > 0:
            self._flush()
            prefix.save(budget_ms, idle)

    @property
    def saving(self) -> bool:
        """Whether the prefix cache has snapshots to take between ticks (the compute thread
        keeps turning for them while nothing else runs)."""
        return self.prefix is not None and self.prefix.saving

    # --- the tick ---------------------------------------------------------------------------

    def step(self) -> bool:
        """Runs one tick (schedule, then tick). Returns False when there was nothing to run."""
        return self.tick(self.schedule())

    def tick(self, order: Plan, away_s: float = 0.0) -> bool:
        """Runs an order from schedule() and updates with what ran. away_s: time the thread
        spent elsewhere since it was made (the background context's grant,
        uma.engine.background), which is not this tick's."""
        self._apart_ms = away_s * 1e3
        if not order.items:
            self._flush()
            self._save(order)
            return False
        self._tick_start += away_s
        order = self.build(order)
        ran = self.runner.run(order, self.running)
        while ran.no_room:  # the same tick again, with room made (or the plan shed)
            ran = self.runner.run(self._room_for(ran), self.running)
        self.update(order, ran)
        self._save(ran.plan)
        return True

    def interrupt_for(self, n_tokens: int) -> bool:
        """A new interactive request with a prompt of n_tokens arrived (any thread): ends the
        tick in flight where it runs prompt chunks alone and would run on for longer than the
        newcomer's prompt takes alone (Runner.interrupt). Returns whether it did."""
        return self.runner.interrupt(self.cost.estimate.prefill_ms(n_tokens, 0))

    def schedule(self, now_ns: int | None = None) -> Plan:
        """Releases what ended, admits, and asks the policy for this tick's order. now_ns:
        the snapshot's time (default: time.monotonic_ns())."""
        self._tick_start = time.perf_counter()
        self._tick_snapshots = self._snapshot_seconds()
        self._reap()
        apart = self.apart()
        self._apart_busy = apart is not None
        if self._steady is not None and self._steady_at == self._changes \
                and not any(self.waiting.values()) and apart is None:
            return self._drafted(self._steady)
        self._admit()
        if not self.running and apart is None:
            return Plan.empty()
        state = SchedulerState(
            now_ns=time.monotonic_ns() if now_ns is None else now_ns,
            sessions=tuple(r.view() for r in self.running.values()),
            n_waiting=sum(len(q) for q in self.waiting.values()),
            n_batch=self.runner.batch.capacity,
            n_seq_max=self.n_running,
            decode_ms_ewma=self.stats.decode_ewma,
            cost=self.cost.estimate,
            tick=self.stats.ticks,
            last_tick_ms=self._measured[0],
            last_tick_tokens=self._measured[1],
            memory=self._memory,
            decode_noise=self.stats.spread.decode,
            prompt_noise=self.stats.spread.prompt,
            alone_p95_ratio=self.stats.spread.alone,
            alone_ratios=self.stats.spread.alone_sorted,
            bmt=self.bmt,
            bmt_budget_gbps=self.bmt_budget_gbps,
            apart=apart,
            last_apart_ms=self._apart_ms,
        )
        plan = self.policy.schedule_tick(state)
        self._steady = plan if self._repeatable(plan) else None
        self._steady_at = self._changes
        return self._drafted(plan)

    def _drafted(self, plan: Plan) -> Plan:
        """The plan with the guesses that pay for its speculating decoders (uma.engine.
        speculator); the same plan where none do."""
        if not self.speculator.speculating:
            return plan
        return self.speculator.draft(plan, self.running, self.cost.estimate,
                                     self.runner.batch.capacity, self._device_rows)

    def _device_rows(self, seq: int) -> int:
        return self.ctx.n_outputs_per_seq if self.runner.on_device[seq] else 0

    def _repeatable(self, plan: Plan) -> bool:
        """Whether the next ticks may run this plan again without asking the policy: it
        decodes every running request, all interactive, and nothing waits. Until the running
        set changes the policy would plan the same (no prompt work to fit, no background to
        owe time to), and its 0.2-0.5 ms a tick is time the device sits idle (a GPU) or does
        not decode (a CPU, whose ticks are serial)."""
        return len(plan.items) == len(self.running) and not any(self.waiting.values()) \
            and all(i.phase is Phase.DECODE for i in plan.items) \
            and all(r.priority is Priority.INTERACTIVE for r in self.running.values())

    def build(self, plan: Plan) -> Plan:
        """The plan without the items of requests released since it was made, and the cost
        model's attention features of its batch."""
        # Layout, not policy: every row in ascending sequence order, prompt chunks among the
        # decode rows. With per-sequence KV (kv_unified=False) llama.cpp splits a batch into
        # micro-batches of consecutive sequence ids taken in batch order, one token each per
        # round, and each micro-batch reads all the weights again: decoders 0-2 and 4-7 with
        # a prompt on 3 listed decode rows first ran as three (0-3, 4-7, the prompt's rest), in
        # sequence order as two. With one KV buffer the order changes nothing.
        items = sorted((i for i in plan.items if i.seq_id in self.running),
                       key=lambda i: i.seq_id)
        # the cost model's attention features for this batch: cache positions read (decode
        # rows' whole caches, prompt chunks' caches before them), prompt tokens' attention
        self._cache_read = self._prompt_attended = 0
        self._background_prompt = False
        solo_kv = 0  # every sequence of the batch as one decode row (see _solo)
        for item in items:
            req = self.running[item.seq_id]
            solo_kv += attended(req.n_past, 1)
            if item.phase is Phase.DECODE:  # a verify item's rows priced as decode rows
                self._cache_read += attended(req.n_past, 1) * item.n_tokens
            else:
                self._cache_read += req.n_past
                self._prompt_attended += attended(req.n_past, item.n_tokens)
                self._background_prompt |= req.priority is Priority.BACKGROUND
        self._solo = (len(items), solo_kv)
        self._ready_rows = sum(1 for r in self.running.values() if r.phase is Phase.DECODE)
        return plan if len(items) == len(plan.items) and all(
            a is b for a, b in zip(items, plan.items, strict=True)) \
            else dataclasses.replace(plan, items=tuple(items))

    def _room_for(self, ran: Ran) -> Plan:
        """After a batch the KV cache had no room for: its failures ended, then a cached
        prefix freed (the prefix cache), else the plan shed as the policy decides. Returns the
        plan to run again."""
        self._end_failed(ran)
        plan = dataclasses.replace(ran.plan, items=self._live(ran.plan.items))
        if plan.n_drafted:  # guesses make room for nobody: they go first
            return self.speculator.undrafted(plan)
        if self.prefix is not None and self.prefix.evict_one():
            return plan
        self.m.kv_full.inc()
        return self._shed(plan)

    def _end_failed(self, ran: Ran) -> None:
        """Ends, each alone, the requests that failed in the tick."""
        for failure in ran.failed:
            req = self.running.get(failure.seq)
            if req is not None:
                self.fail(req, failure.error)

    def _live(self, items: tuple[BatchItem, ...]) -> tuple[BatchItem, ...]:
        return tuple(i for i in items if i.seq_id in self.running)

    def _shed(self, plan: Plan) -> Plan:
        """A smaller plan after 'no KV slot', as the policy decides it."""
        shed = self.policy.shed(plan, [r.view() for r in self.running.values()])
        if shed.preempt is not None:
            self._preempt(self.running[shed.preempt])
        if shed.finish is not None:
            self.release(self.running[shed.finish], "length")
        return dataclasses.replace(shed.plan, items=self._live(shed.plan.items))

    def _preempt(self, req: Request) -> None:
        """Frees the request's KV and requeues it at the head of its class: it will prefill
        its prompt and what it generated so far again, then continue where it stopped."""
        self.m.preempted.inc()
        self._changes += 1
        self._keep(req, req.seq_id)  # its next admission finds its own cells again
        self.runner.forget(req.seq_id)
        self.speculator.forget(req)
        self.ctx.seq_rm(req.seq_id)
        heapq.heappush(self.free_seqs, req.seq_id)
        del self.running[req.seq_id]
        req.tokens = np.concatenate([req.prompt, np.array(req.generated, np.int32)])
        req.seq_id, req.n_prefilled, req.n_past = -1, 0, 0
        self.waiting[req.priority].appendleft(req)

    def update(self, order: Plan, ran: Ran) -> None:
        """Ends the requests that failed on their own, advances every other sequence of the
        batch and hands sampled tokens on. order: the plan handed to the runner; what ran
        is ran.plan, which is what this reads. The two differ when the KV cache had no room
        and the runner ran again with room made or the plan shed (tick's retry): then
        ran.plan, the plan that actually ran, is the one applied."""
        self._end_failed(ran)
        apps = self._apps(ran.plan)
        self.speculator.verified(ran.plan, ran, self.running)
        for item in ran.plan.items:
            req = self.running.get(item.seq_id)
            if req is not None:
                if item.phase is Phase.PREFILL:
                    req.n_past += item.n_tokens
                    req.n_prefilled += item.n_tokens
                else:  # a verify item's kept guesses count as their tokens are accepted
                    req.n_past += 1
        # Before any token is handed on: a client that has seen one sees its KV counted.
        self.m.kv_cells.set(sum(r.n_past for r in self.running.values()))
        self.m.kv_span.set(self.ctx.kv_span)
        now = time.monotonic_ns()
        if ran.logits_ns and len(ran.seqs):  # where this tick's tokens start their way out
            self._outbox.append(Logits(ran.logits_ns))
        alone = not self._background()
        last = -1
        for k, seq in enumerate(ran.seqs.tolist()):
            req = self.running.get(seq)
            if req is not None:
                if seq == last:  # a kept guess: the cell it was verified in is the request's
                    req.n_past += 1
                last = seq
                lp: float | TokenLogprob | None = None
                if ran.logprobs is not None:
                    value = float(ran.logprobs[k])
                    top = None if ran.top is None else ran.top.get(seq)
                    lp = value if top is None else TokenLogprob(value, top)
                try:
                    self._accept(req, int(ran.tokens[k]), lp, now, alone)
                except Exception as exc:  # noqa: BLE001 - this request's alone
                    self.fail(req, exc)
        self.runner.prefetch(self.running)
        self._memory = ran.plan.memory
        self._due = self._report(ran, apps)
        # Now, not when the report is handed on: overlapped, that is during the next decode,
        # and the policy, planning the tick after it, would pair this plan's memory with the
        # tick before's time. It did: on a GPU the background floor paid for a long prompt
        # chunk at the price of the short decode tick before it, and a storm spent more than
        # twice its floor's share on background prompts
        # (docs/lab/2026-11-26-row-steps-and-overlap-feedback.md).
        # an interrupted tick's time is no measure of its plan: the policy learns nothing
        self._measured = (0.0, 0) if ran.interrupted else \
            (self._due.tick_s * 1e3, self._due.n_sampled)
        self.speculator.measured(ran.plan, self._measured[0])
        self.n_ticks += 1
        self.last_plan = ran.plan
        # A first token goes out at once, not with the next decode: time to first token is
        # what a client waits on, and it comes once a request.
        if not self.overlap or not self.running \
                or any(latency[3] for latency in self._latencies):
            self._flush()

    def _background(self) -> bool:
        """Whether background work exists beside the streams: a background request queued or
        running here, or in the background context (which runs between ticks)."""
        return self._apart_busy or bool(self.waiting[Priority.BACKGROUND]) \
            or any(r.priority is Priority.BACKGROUND for r in self.running.values())

    def _accept(self, req: Request, token: int, logprob: float | TokenLogprob | None,
                now: int, alone: bool) -> None:
        # every token has one entry: its time to first token, or its gap after the last (alone:
        # no background work beside it, the scorecard's reference for the latency cap)
        first = req.first_token_ns == 0
        since = req.arrival_ns if first else req.last_token_ns
        self._latencies.append((req.priority, req.app, (now - since) / 1e6, first, alone))
        if first:
            req.first_token_ns = now
        req.last_token_ns = now
        req.n_sampled += 1
        if req.n_sampled == 5:  # the design notes' ttf5_ms (seed 000)
            self._fifth.append((req.priority, (now - req.arrival_ns) / 1e6))
        req.last_token = token
        is_eog = token in self.eog and not req.params.ignore_eos
        if req.matcher is not None and not is_eog:
            self._constrain(req, token)
        self._outbox.append(Token(req, token, logprob, now, is_eog))
        if is_eog:
            self.release(req, "stop")
            return
        req.generated.append(token)
        # The next decode would put this token at position n_past.
        if req.n_sampled >= req.params.max_tokens or req.n_past >= self.n_ctx_seq:
            self.release(req, "length")
        elif req.matcher is not None and req.matcher.is_stopped():
            self.release(req, "stop")  # the grammar is complete: nothing may follow

    @staticmethod
    def _constrain(req: Request, token: int) -> None:
        """Moves the request's grammar past its sampled token; the mask allowed only tokens
        it accepts, so a refusal is an engine fault, and the request's alone."""
        if not req.matcher.consume_token(token):
            raise UmaError(f"the grammar refused token {token}: {req.matcher.get_error()}")

    def _report(self, ran: Ran, apps: dict[str, float]) -> TickReport:
        """What the tick did, measured, for the statistics (TickStats.record)."""
        plan = ran.plan
        n_decode = sum(i.n_tokens for i in plan.items if i.phase is Phase.DECODE)
        # Only while no background request exists at all: ticks of a storm that happen to
        # carry no background work are the ones new interactive prompts crowded it out of.
        alone = n_decode and not any(r.priority is Priority.BACKGROUND
                                     for r in self.running.values()) \
            and not self.waiting[Priority.BACKGROUND]
        # A snapshot taken in the tick (an ended request's KV pushed an entry out of the
        # prefix cache) held it, but is none of the batch's work: the cost model learned one
        # as decode time (its error grew several-fold), and the policy's feedback and the
        # apps' ledger would count it too.
        tick_s = time.perf_counter() - self._tick_start \
            - (self._snapshot_seconds() - self._tick_snapshots)
        # Service only sets apps apart: with one app running and none waiting (the steady
        # state of most machines) there is nothing to charge. An app that joins starts level
        # with the least served one (Ledger.arrive) either way.
        if self.fair_share and (len(apps) > 1 or self.n_waiting):
            self._charge(apps, tick_s * 1e3)
        return TickReport(
            plan=plan, n_prefill=plan.n_tokens - n_decode, n_decode=n_decode,
            decode_s=ran.decode_s, sample_s=ran.sample_s,
            tick_s=tick_s,
            native_s=self.ctx.last_decode_seconds, n_sampled=len(ran.tokens),
            cache_read=self._cache_read, prompt_attended=self._prompt_attended,
            background_prompt=self._background_prompt, solo=self._solo if alone else None,
            queue_depth=self.n_waiting, running=len(self.running), apps=apps,
            n_ready=self._ready_rows,
            bmt_bytes=self.bmt.tick_bytes(plan.n_tokens, self._cache_read) if self.bmt else 0.0,
            n_copy_free=ran.n_copy_free, interrupted=ran.interrupted)

    def _charge(self, apps: dict[str, float], tick_ms: float) -> None:
        """The tick's time to the apps' ledger and to each request's own service (the
        ledger's time-slice follows what requests cost)."""
        self.ledger.charge(apps, tick_ms)
        total = sum(ms for _, ms in self._rows)
        for req, ms in self._rows:
            req.service_ms += tick_ms * (ms / total if total > 0 else 1 / len(self._rows))

    def _apps(self, plan: Plan) -> dict[str, float]:
        """Each app's part of the tick, in the cost model's ms for its rows (its prompt tokens
        and decode rows), by which TickStats shares out the measured time. Taken before the
        tick's results are applied, while every row's request still holds its sequence."""
        est = self.cost.estimate
        parts: dict[str, float] = {}
        rows = self._rows
        rows.clear()
        for item in plan.items:
            req = self.running.get(item.seq_id)
            if req is None:
                continue
            ms = est.per_prefill_ms * item.n_tokens if item.phase is Phase.PREFILL \
                else est.per_decode_ms
            parts[req.app] = parts.get(req.app, 0.0) + ms
            if self.fair_share:
                rows.append((req, ms))
        return parts

    def close(self) -> None:
        self.runner.close()
        self.speculator.close()
