"""The runner: runs one tick's batch on one llama.cpp context, and decides nothing.

    ran = runner.run(plan, running)   # fill the batch, decode (GIL released), sample

It owns what running needs: the context, the batch, the native sampler, the grammar masks and
where each sequence's rows are sampled (on the device or on the host). The requests are the
scheduler's (uma.engine.scheduler): the runner reads them and changes none. What goes wrong comes
back as data in `Ran`: a request that fails on its own (while batched, decoded or sampled) is
a `Failure`, and a batch the KV cache has no room for is `no_room`, rolled back, for the
scheduler to make room (its prefix cache, then the policy's shedding) and plan again.

A decode call is shared, so a failed one is retried in halves, with the cache rolled back in
between, until the requests whose tokens fail on their own are found (a fault of the context
itself fails each request it touches with that honest error).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from uma.errors import DecodeAbortedError, NoKVSlotError, UmaError
from uma.grammar import TickMasks
from uma.handle import TopLogprobs
from uma.request import Request
from uma.sched.state import BatchItem, Phase, Plan

if TYPE_CHECKING:
    from uma import _core
    from uma.grammar import Grammars

log = logging.getLogger("uma.runner")

_NONE = np.empty(0, np.int32)  # no rows sampled (read only: shared by every such Ran)
_NONE.flags.writeable = False


@dataclass(frozen=True, slots=True)
class Failure:
    """A request that failed on its own in a tick; the others went on."""

    seq: int
    error: BaseException


@dataclass(frozen=True, slots=True)
class Ran:
    """What one tick did: the plan as run (without failed requests' items), its samples, the
    requests that failed, and whether the KV cache had no room for the batch (then nothing
    ran: the plan is the one that did not fit)."""

    plan: Plan
    decode_s: float
    sample_s: float = 0.0
    seqs: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    tokens: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    logprobs: np.ndarray | None = None
    # sequence -> its step's most probable tokens, for the requests that asked (top_logprobs)
    top: dict[int, TopLogprobs] | None = None
    failed: tuple[Failure, ...] = ()
    no_room: bool = False
    # time.perf_counter_ns() when the decode that sampled returned (0: none sampled): the
    # start of its tokens' way out (metric time_logits_to_first_chunk)
    logits_ns: int = 0
    # tokens sampled with no logits row copied out of the compute graph: llama.cpp copies
    # none only where every row of the decode is sampled on the device (needs_raw_logits in
    # llama-context.cpp); the host sampler reads llama.cpp's buffer in place, after its copy
    n_copy_free: int = 0
    # sequence -> guesses of its draft kept, for the plan's verify items (BatchItem.draft):
    # its tokens in `tokens` are the kept guesses and one token after them
    accepted: dict[int, int] | None = None
    # a newcomer ended the decode early (Runner.interrupt): the plan holds the prompt tokens
    # the cache kept, and its time is no measure of the plan's work
    interrupted: bool = False


class Runner:
    """Runs batches on `ctx`. Used by one thread (the compute thread)."""

    def __init__(self, ctx: _core.Context, core: ModuleType, device_sampling: bool = False,
                 grammars: Grammars | None = None, settle: bool = False,
                 newcomer_waiting: Callable[[], bool] | None = None) -> None:
        """core: the module whose Batch and Sampler go with ctx (uma._core, or a stand-in).
        device_sampling: sample on the device the rows of requests whose options it can
        compute (Context.set_sampler); the host sampler takes the others. grammars: the token
        masks of constrained requests (uma.grammar; needed once a request has a matcher).
        settle: every decode is waited for on the device before run returns.
        newcomer_waiting: whether a request came in that the tick being run was not planned
        with (the engine's inbox; None: always taken to have): a note taken after the
        newcomer was already taken in is spent without holding anything back."""
        self.ctx = ctx
        self.model = ctx.model
        self.batch = core.Batch(ctx.n_batch)
        self.sampler = core.Sampler(ctx.n_seq_max, self.model.n_vocab)
        self.device_sampling = device_sampling
        self.settle = settle
        self.on_device = np.zeros(ctx.n_seq_max, dtype=bool)  # by sequence: sampled there
        self.tick_masks = None if grammars is None else TickMasks(grammars, self.model.n_vocab)
        self._constrained: set[int] = set()  # sequences of requests with a grammar
        self._top_wanted: set[int] = set()  # sequences of requests with top_logprobs
        # the last decode's masks: the row in _mask_buf of each constrained sequence
        self._mask_of: dict[int, int] = {}
        self._mask_buf = np.empty((0, 0), np.int32)
        # called while the device decodes (a GPU's decode returns once queued): the
        # scheduler hands the last tick's output on there when it overlaps ticks
        self.during: Callable[[], None] = lambda: None
        self._running: Mapping[int, Request] = {}
        self._failed: list[Failure] = []
        # A decode of prompt chunks alone, in flight, that a newcomer may end (interrupt):
        # when it may end, and whether one asked. The lock keeps the abort flag from outliving
        # the decode it was meant for.
        self._lock = threading.Lock()
        self._interruptible_until = 0.0  # time.perf_counter() it is predicted to end; 0: none
        self._interrupted = False
        # a newcomer's prompt time (ms) noted while no decode could be ended, for the next
        # prompt-only decode to yield to (inf: none)
        self._pending_ms = math.inf
        self.newcomer_waiting: Callable[[], bool] = newcomer_waiting or (lambda: True)

    # --- sequences ---------------------------------------------------------------------------

    def admit(self, req: Request) -> None:
        """Prepares the request's sequence: its sampler options, the prompt its penalties
        count, and where its rows are sampled. Raises what the request's options fail with."""
        seq = req.seq_id
        self.sampler.configure(seq, **req.params.sampler_options())
        if req.params.repeat_penalty != 1 or req.params.frequency_penalty \
                or req.params.presence_penalty:
            self.sampler.accept(seq, req.tokens)
        self._route(req)

    def _route(self, req: Request) -> None:
        """Picks where the request's rows are sampled. A sequence keeps its device chain
        after its request ends, and the next request with the same options reuses it: a
        changed chain costs the next decode a re-plan of its compute graph."""
        seq = req.seq_id
        self.on_device[seq] = False
        if req.matcher is not None:
            self._constrained.add(seq)
        if req.params.top_logprobs:
            self._top_wanted.add(seq)
        # a speculating request's verify rows are all sampled where its rows are: on the
        # device only where the context lets a device sampler have that many rows
        if self.device_sampling and req.params.device_capable and req.matcher is None \
                and (req.drafter is None or self.ctx.n_outputs_per_seq > 1):
            self.on_device[seq] = self.ctx.set_sampler(seq, **req.params.device_options())
        else:
            self.ctx.clear_sampler(seq)

    def forget(self, seq: int) -> None:
        """The sequence's request has left it (ended or preempted)."""
        self._constrained.discard(seq)
        self._top_wanted.discard(seq)

    def prefetch(self, running: Mapping[int, Request]) -> None:
        """Starts the next tick's masks of the constrained requests (uma.grammar)."""
        if self.tick_masks is not None and self._constrained:
            self.tick_masks.prefetch([r for s in self._constrained
                                      if (r := running[s]).matcher is not None])

    # --- the tick ----------------------------------------------------------------------------

    def run(self, plan: Plan, running: Mapping[int, Request]) -> Ran:
        """Fills the batch with the plan's items (of the requests in `running`, by sequence),
        decodes it and samples its logits rows."""
        self._running, self._failed = running, []
        try:
            return self._run(plan)
        finally:
            self._running = {}

    def _run(self, plan: Plan) -> Ran:
        t0 = time.perf_counter()
        plan = self._built(plan)
        if not plan.items:
            return self._ran(plan, time.perf_counter() - t0)
        prompts_only = all(i.phase is Phase.PREFILL for i in plan.items)
        try:
            if prompts_only:  # a plan with no prediction may be ended by any newcomer
                with self._lock:
                    until = math.inf if plan.notes is None \
                        else t0 + plan.notes.predicted_ms / 1e3
                    pending, self._pending_ms = self._pending_ms, math.inf
                    if until - time.perf_counter() > pending / 1e3 \
                            and self.newcomer_waiting():
                        # a newcomer came while this tick was planned: it is planned first
                        return self._ran(dataclasses.replace(plan, items=()),
                                         time.perf_counter() - t0, interrupted=True)
                    self._interruptible_until = until
            else:  # a stream's tick: bounded by the policy, and planned with any newcomer next
                self._pending_ms = math.inf
            try:
                n_out = self.ctx.decode(self.batch)
            finally:  # only a prompt-only decode was interruptible: no lock for the others
                interrupted = prompts_only and self._end_interruptible()
            # While the device works: the token masks of constrained rows, then the
            # scheduler's hand-off of the last tick's output.
            self._fill_masks(self.ctx.output_seqs)
            self.during()
        except NoKVSlotError:
            self._roll_back(plan.items)
            return self._ran(plan, time.perf_counter() - t0, no_room=True)
        except DecodeAbortedError:
            if interrupted:  # a newcomer's: what the cache kept of the chunks counts
                return self._ran(self._kept(plan), time.perf_counter() - t0, interrupted=True)
            # The engine is shutting down (Context.abort): nothing ran, nobody is to blame.
            self._roll_back(plan.items)
            return self._ran(Plan.empty(), time.perf_counter() - t0)
        except UmaError as exc:
            return self._isolate(plan, exc, t0)
        if self.settle:
            self.ctx.synchronize()
        t1_ns = time.perf_counter_ns()
        t1 = t1_ns * 1e-9
        if n_out == 0:  # only prompt chunks that do not end their prompt
            return self._ran(plan, t1 - t0)
        out = self.ctx.output_seqs
        top = self._top_logprobs(out)
        seqs, tokens, logprobs = self._sample(out)
        copy_free = len(tokens) if self.on_device[out].all() else 0
        return self._ran(plan, t1 - t0, time.perf_counter() - t1, seqs, tokens, logprobs, top,
                         logits_ns=t1_ns, n_copy_free=copy_free)

    def interrupt(self, newcomer_ms: float) -> bool:
        """Ends the decode in flight where it holds prompt chunks alone (no stream's token
        waits on it) and is predicted to run on for longer than newcomer_ms, the time a new
        interactive request's prompt takes alone: the newcomer then waits for the next graph
        node, not for the whole tick (a 2,000-token prompt's takes seconds on a CPU).
        llama.cpp keeps the micro-batches the decode finished, so at most one micro-batch of
        work is done again. Between decodes (a tick being planned: its prompt restored from the
        prefix cache, say) the newcomer is noted, and the next prompt-only decode predicted to
        run longer than its prompt does not start: the tick is planned again, with it. Called
        from any thread; returns whether it ended a decode."""
        with self._lock:
            if not self._interruptible_until:
                self._pending_ms = min(self._pending_ms, newcomer_ms)
                return False
            if self._interrupted \
                    or self._interruptible_until - time.perf_counter() <= newcomer_ms / 1e3:
                return False
            self._interrupted = True
            self.ctx.abort()
            return True

    def _end_interruptible(self) -> bool:
        """The decode is over: no newcomer may end it now. Whether one did (the abort flag
        is cleared either way, so that it ends no later decode)."""
        with self._lock:
            self._interruptible_until = 0.0
            interrupted, self._interrupted = self._interrupted, False
            if interrupted:
                self.ctx.abort(False)
            return interrupted

    def _kept(self, plan: Plan) -> Plan:
        """The plan's prompt chunks as far as an interrupted decode left them in the cache
        (its finished micro-batches). A chunk that ended its prompt gives its last token back,
        so that the tick that runs it again samples the first token."""
        items = []
        for item in plan.items:
            req = self._running.get(item.seq_id)
            if req is None:
                continue
            held = self.ctx.seq_pos_max(item.seq_id) + 1 - req.n_past
            kept = max(0, min(item.n_tokens - (1 if item.logits else 0), held))
            self.ctx.seq_rm(item.seq_id, req.n_past + kept)
            if kept:
                items.append(BatchItem(item.seq_id, Phase.PREFILL, kept, logits=False))
        return dataclasses.replace(plan, items=tuple(items))

    def _ran(self, plan: Plan, decode_s: float, sample_s: float = 0.0,
             seqs: np.ndarray | None = None, tokens: np.ndarray | None = None,
             logprobs: np.ndarray | None = None, top: dict[int, TopLogprobs] | None = None,
             no_room: bool = False, logits_ns: int = 0, n_copy_free: int = 0,
             interrupted: bool = False) -> Ran:
        """The tick's Ran: the plan without the items of requests that failed in it, its
        verify items' rejected guesses taken out."""
        accepted = None
        if seqs is not None and tokens is not None and plan.n_drafted:
            seqs, tokens, logprobs, accepted = self._verify(plan, seqs, tokens, logprobs)
        if self._failed:
            plan = dataclasses.replace(plan, items=self._live(plan.items))
        return Ran(plan, decode_s, sample_s, _NONE if seqs is None else seqs,
                   _NONE if tokens is None else tokens, logprobs, top, tuple(self._failed),
                   no_room, logits_ns, n_copy_free, accepted, interrupted)

    def _verify(self, plan: Plan, seqs: np.ndarray, tokens: np.ndarray,
                logprobs: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, dict[int, int]]:
        """Keeps of each verify item's rows the tokens up to and including the first that
        differs from its guess (a kept guess is the token the model picked there, so every
        kept token is one it would have picked one tick at a time: with a deterministic guess,
        sampling the row and comparing is the rejection rule of speculative sampling). The
        cache cells of the rejected guesses are removed. Returns the rows kept and, by
        sequence, the guesses kept."""
        drafts = {i.seq_id: i.draft for i in plan.items if i.draft}
        keep = np.ones(len(seqs), bool)
        accepted: dict[int, int] = {}
        listed = seqs.tolist()
        row = 0
        while row < len(listed):
            seq = listed[row]
            end = row + 1
            while end < len(listed) and listed[end] == seq:
                end += 1
            draft = drafts.get(seq)
            if draft is not None:
                got = tokens[row:end].tolist()
                m = 0
                while m < len(draft) and m + 1 < len(got) and got[m] == draft[m]:
                    m += 1
                keep[row + m + 1:end] = False
                accepted[seq] = m
                req = self._running.get(seq)
                if req is not None and m < len(draft):
                    self.ctx.seq_rm(seq, req.n_past + m + 1, -1)
            row = end
        if keep.all():
            return seqs, tokens, logprobs, accepted
        return seqs[keep], tokens[keep], None if logprobs is None else logprobs[keep], accepted

    def _fail(self, seq: int, exc: BaseException) -> None:
        if all(f.seq != seq for f in self._failed):
            self._failed.append(Failure(seq, exc))

    def _live(self, items: tuple[BatchItem, ...]) -> tuple[BatchItem, ...]:
        failed = {f.seq for f in self._failed}
        return tuple(i for i in items if i.seq_id not in failed and i.seq_id in self._running)

    def _built(self, plan: Plan) -> Plan:
        """Fills the batch with the plan's items; the plan as built (without the items of
        requests that failed to go in)."""
        items = self._fill(plan.items)
        return plan if len(items) == len(plan.items) \
            else dataclasses.replace(plan, items=tuple(items))

    def _fill(self, items: tuple[BatchItem, ...]) -> list[BatchItem]:
        """Puts items in the batch, in order; an item whose request fails to go in fails that
        request alone. Returns the items that went in."""
        batch = self.batch
        batch.clear()
        added = []
        for item in self._live(tuple(items)):
            req = self._running[item.seq_id]
            try:
                if item.draft:  # the last token and the guesses after it, each sampled
                    n = 1 + len(item.draft)
                    batch.add_rows(np.array((req.last_token, *item.draft), np.int32),
                                   np.arange(req.n_past, req.n_past + n, dtype=np.int32),
                                   np.full(n, item.seq_id, np.int32))
                elif item.phase is Phase.DECODE:
                    batch.add(req.last_token, req.n_past, item.seq_id, True)
                else:
                    start = req.n_prefilled
                    batch.add_sequence(req.tokens[start:start + item.n_tokens], start,
                                       item.seq_id, logits_last=item.logits)
            except Exception as exc:  # noqa: BLE001 - this request's alone
                self._fail(item.seq_id, exc)
                # Again without it: a failed add may have left part of its tokens behind.
                return self._fill(self._live(tuple(items)))
            added.append(item)
        return added

    def _roll_back(self, items: tuple[BatchItem, ...]) -> None:
        """Removes from the cache what a failed decode of items may have kept (its first
        micro-batches): each sequence is left where the tick found it."""
        for item in items:
            req = self._running.get(item.seq_id)
            if req is not None:
                self.ctx.seq_rm(item.seq_id, req.n_past)

    def _top_logprobs(self, seqs: np.ndarray) -> dict[int, TopLogprobs] | None:
        """The most probable tokens of the rows whose requests asked for them (the model's own
        distribution, as their sampled token's log-probability)."""
        if not self._top_wanted:
            return None
        rows = [(row, s) for row, s in enumerate(seqs.tolist()) if s in self._top_wanted]
        if not rows:
            return None
        want = [self._running[s].params.top_logprobs for _, s in rows]
        ids, lps = self.sampler.top_logprobs(self.ctx, [row for row, _ in rows], max(want))
        return {s: tuple(zip(ids[i, :n].tolist(), lps[i, :n].tolist(), strict=True))
                for i, ((_, s), n) in enumerate(zip(rows, want, strict=True))}

    def _sample(self, seqs: np.ndarray, logprobs: bool | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Samples every logits row of the last decode: (sequence ids, tokens, log-probs).
        If the batched call fails, each row is sampled on its own and only the rows that
        fail alone fail their requests."""
        device = self.on_device[seqs]
        if device.any():
            return self._sample_device(seqs, device, logprobs)
        if logprobs is None:
            logprobs = any(self._running[s].params.logprobs for s in seqs.tolist())
        rows = np.arange(len(seqs), dtype=np.int32)
        return self._sample_host(seqs, rows, logprobs)

    def _sample_device(self, seqs: np.ndarray, device: np.ndarray, logprobs: bool | None
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Reads the device's tokens and samples the other rows on the host. Device rows have
        no log-probs (their requests did not ask; NaN where another row's did)."""
        tokens = self.ctx.sampled_tokens()
        missing = device & (tokens < 0)
        if missing.any():  # the backend could not run a chain after all: host from now on
            log.warning("the device sampler returned no token for %d rows; sampling on the "
                        "host from now on", int(missing.sum()))
            self.device_sampling = False
            for seq in seqs[missing].tolist():
                self._fail(seq, UmaError(
                    "the device's sampler returned no token for this request"))
        host = ~device
        if logprobs is None:
            logprobs = any(self._running[s].params.logprobs for s in seqs[host].tolist())
        lps = np.full(len(seqs), np.nan, np.float32) if logprobs else None
        keep = device & ~missing
        if host.any():
            h_seqs, h_tokens, h_lps = self._sample_host(
                seqs[host], np.flatnonzero(host).astype(np.int32), logprobs)
            kept = np.isin(seqs, h_seqs) & host
            keep |= kept
            tokens[kept] = h_tokens
            if lps is not None and h_lps is not None:
                lps[kept] = h_lps
        return seqs[keep], tokens[keep], None if lps is None else lps[keep]

    def _fill_masks(self, seqs: np.ndarray) -> None:
        """The next-token masks of the decode's constrained rows (uma.grammar), built as soon
        as the decode is launched: on a GPU while it runs."""
        self._mask_of.clear()
        if self.tick_masks is None:
            return
        rows = [s for s in seqs.tolist() if s in self._constrained]
        self._mask_of.update((s, k) for k, s in enumerate(rows))
        if rows:
            self._mask_buf = self.tick_masks.fill([self._running[s] for s in rows])
        else:
            self.tick_masks.wait()  # nothing of it is wanted

    def _masks(self, seqs: np.ndarray) -> dict[str, np.ndarray]:
        """The masks of these rows as Sampler.sample takes them; none when no row has one."""
        if not self._mask_of:
            return {}
        index = np.array([self._mask_of.get(s, -1) for s in seqs.tolist()], np.int32)
        return {"masks": self._mask_buf.view(np.uint32), "mask_index": index}

    def _sample_host(self, seqs: np.ndarray, rows: np.ndarray, logprobs: bool
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Samples logits rows `rows` (whose sequences are `seqs`) on the host."""
        try:
            sampled = self.sampler.sample(self.ctx, rows, seqs, logprobs=logprobs,
                                          **self._masks(seqs))
        except Exception:  # noqa: BLE001 - narrowed down row by row below
            keep, tokens, lps = [], [], []
            for row, seq in zip(rows.tolist(), seqs.tolist(), strict=True):
                try:
                    token, lp = self.sampler.sample(self.ctx, [row], [seq], logprobs=True,
                                                    **self._masks(np.array([seq])))
                except Exception as exc:  # noqa: BLE001 - this request's alone
                    self._fail(seq, exc)
                    continue
                keep.append(seq)
                tokens.append(token[0])
                lps.append(lp[0])
            return (np.array(keep, np.int32), np.array(tokens, np.int32),
                    np.array(lps, np.float32) if logprobs else None)
        return (seqs, *sampled) if logprobs else (seqs, sampled, None)

    def _isolate(self, plan: Plan, exc: UmaError, t0: float) -> Ran:
        """After a failed decode: finds the requests that fail on their own. The plan's
        sequences are rolled back to where the tick found them (a failed decode may have kept
        its first micro-batches), then each half of the plan is decoded and sampled alone,
        halving again where a half fails; a lone item that fails is that request's failure.
        At most 2n - 1 decodes for n items, only after a failure."""
        parts: list[tuple[tuple[BatchItem, ...], np.ndarray, np.ndarray, np.ndarray]] = []
        top: dict[int, TopLogprobs] = {}
        todo = [(plan.items, exc)]
        while todo:
            items, error = todo.pop()
            self._roll_back(items)
            items = self._live(items)
            if not items:
                continue
            if len(items) == 1:
                log.warning("request %d failed its decode: %s",
                            self._running[items[0].seq_id].rid, error)
                self._fail(items[0].seq_id, error)
                continue
            half = len(items) // 2
            for part in (items[half:], items[:half]):  # popped in batch order
                part = tuple(self._fill(part))
                try:
                    n_out = self.ctx.decode(self.batch) if part else 0
                except DecodeAbortedError:
                    self._roll_back(part)  # shutting down: left as it was
                    continue
                except UmaError as sub:
                    todo.append((part, sub))
                    continue
                if n_out:
                    self._fill_masks(self.ctx.output_seqs)
                    top.update(self._top_logprobs(self.ctx.output_seqs) or {})
                    seqs, tokens, lps = self._sample(self.ctx.output_seqs, logprobs=True)
                    assert lps is not None  # asked for
                    parts.append((part, seqs, tokens, lps))
                elif part:
                    parts.append((part, np.empty(0, np.int32), np.empty(0, np.int32),
                                  np.empty(0, np.float32)))
        decode_s = time.perf_counter() - t0
        if not parts:
            return self._ran(Plan.empty(), decode_s)
        return self._ran(
            dataclasses.replace(plan, items=tuple(i for part in parts for i in part[0])),
            decode_s, 0.0, np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]), np.concatenate([p[3] for p in parts]),
            top or None)

    def close(self) -> None:
        if self.tick_masks is not None:
            self.tick_masks.close()
        self.sampler.close()
        self.batch.close()
