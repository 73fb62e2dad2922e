"""What ticks measured, and what follows from it: the cost model learns from each tick, the
tick spreads (how far ticks stray past their prediction) and the load follow them, and the
metrics record them. The scheduler reports (TickReport); nothing here touches the context.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

from uma.metrics import Counter, Histogram, LoadMeter, Registry
from uma.priority import Priority
from uma.sched.cost import CostModel
from uma.sched.state import Plan


@dataclass(frozen=True, slots=True)
class TickReport:
    """One tick as it ran (times in seconds)."""

    plan: Plan  # as executed, after any shedding
    n_prefill: int  # prompt tokens decoded
    n_decode: int  # decode rows
    decode_s: float  # in llama_decode, the GIL reacquired
    sample_s: float
    tick_s: float  # the whole tick, Python included: what streams wait for
    native_s: float  # llama_decode's own time
    n_sampled: int  # tokens sampled
    cache_read: int  # the cost model's features: cache positions read,
    prompt_attended: int  # and what the prompt tokens attend
    background_prompt: bool  # background prompt tokens were in the batch
    # (rows, attention) of every sequence of the batch as a decode row, while no background
    # request exists (what the streams' ticks alone are measured against); None otherwise
    solo: tuple[int, int] | None
    queue_depth: int  # requests waiting for a sequence
    running: int  # requests holding one
    apps: dict[str, float] = field(default_factory=dict)  # each app's rows, in predicted ms
    n_ready: int = 0  # decode rows ready: running requests past their prompt at the tick
    bmt_bytes: float = 0.0  # bytes the batch as run moved through memory (uma.sched.bmt)
    n_copy_free: int = 0  # tokens sampled with no logits row copied (Ran.n_copy_free)
    interrupted: bool = False  # a newcomer ended it early (Ran.interrupted): no measure


class TickMetrics:
    """The scheduler's instruments, created once."""

    def __init__(self, reg: Registry) -> None:
        self.ticks = reg.counter("ticks_total", "decode calls")
        self.prefill_tokens = reg.counter("tokens_prefilled_total", "prompt tokens decoded")
        self.generated_tokens = reg.counter("tokens_generated_total", "tokens sampled")
        self.decode_ms_last = reg.gauge("decode_ms_last", "llama_decode time of the last tick")
        self.decode_ms_ewma = reg.gauge("decode_ms_ewma", "smoothed llama_decode time per tick")
        self.tick_ms = reg.histogram("tick_ms", "whole tick time")
        self.decode_ms = reg.histogram("tick_decode_ms", "llama_decode time per tick")
        self.sample_ms = reg.histogram("tick_sample_ms", "sampling time per tick")
        self.overhead_ms = reg.histogram("tick_overhead_ms", "Python time per tick")
        self.decode_time = reg.counter("decode_seconds_total", "time in llama_decode")
        self.sample_time = reg.counter("sample_seconds_total", "time sampling")
        self.tick_time = reg.counter("tick_seconds_total", "time in ticks")
        self.tokens_decode = reg.gauge("tokens_per_tick_decode", "decode tokens in the last tick")
        self.tokens_prefill = reg.gauge("tokens_per_tick_prefill", "prompt tokens in the last tick")
        self.batch_tokens = reg.histogram("batch_tokens", "tokens per tick",
                                          (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048))
        self.queue_depth = reg.gauge("queue_depth", "requests waiting for a KV sequence")
        self.running = reg.gauge("requests_running", "requests holding a KV sequence")
        self.kv_cells = reg.gauge("kv_cells_used", "KV positions held by running requests")
        self.kv_span = reg.gauge("kv_span_cells", "KV cells each tick's attention runs over: "
                                 "up to the highest in use, whoever holds it (-1: unknown)")
        self.cost_error = reg.gauge("cost_model_error_ms", "mean |measured - predicted| tick ms")
        self.cost_error_pct = reg.histogram(
            "cost_model_error_pct", "|measured - predicted| / predicted per tick, %",
            (1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 200, 500))
        self.served = reg.gauge("served_decoders", "decoding sequences served in the last tick")
        self.parked = reg.gauge("parked_sessions", "decoding sequences left out of the last tick")
        self.bmt_last = reg.gauge("bmt_estimate_last", "bytes the last tick moved (estimate)")
        self.bmt_budget = reg.gauge("bmt_budget_gbps", "memory bandwidth budget, GB/s (0: off)")
        self.tick_budget = reg.gauge("tick_budget_ms", "the last tick's time budget")
        self.over_budget = reg.counter("ticks_over_budget_total", "ticks longer than budget")
        self.pauses = reg.counter("pause_ticks_total",
                                  "ticks planned past the latency line for background work")
        self.apart_ms = reg.counter("background_granted_ms_total",
                                    "time granted to the background context before ticks, ms")
        self.interrupts = reg.counter("background_interrupts_total",
                                      "background grants a newcomer ended mid-decode")
        self.kv_full = reg.counter("kv_full_total", "decodes that found no KV slot")
        self.preempted = reg.counter("preemptions_total", "requests sent back to the queue")
        self.fair_parked = reg.counter("fair_parked_total",
                                       "of those, parked for an app waiting below its share")
        self.demoted = reg.counter("demotions_total",
                                   "of those, background requests set aside for interactive ones")
        self.prefix_lookups = reg.counter("prefix_cache_lookups_total",
                                          "admissions that looked for a cached prefix")
        self.prefix_hits = reg.counter("prefix_cache_hits_total",
                                       "admissions that reused a cached prefix")
        self.prefix_tokens = reg.counter("prefix_cache_reused_tokens_total",
                                         "prompt tokens reused instead of prefilled")
        self.prefix_cached = reg.gauge("prefix_cache_tokens",
                                       "tokens the prefix cache holds (cells shared included)")
        self.prefix_ram = reg.gauge("prefix_cache_ram_bytes",
                                    "host memory the prefix cache's snapshots take")
        self.prefix_disk = reg.gauge("prefix_cache_disk_bytes",
                                     "disk the prefix cache's snapshot files take")
        self.prefix_loaded = reg.gauge("prefix_cache_disk_loaded",
                                       "snapshots read back from disk at start")
        self.prefix_restored = reg.counter("prefix_cache_restored_bytes_total",
                                           "snapshot bytes read back into the KV cache")
        self.prefix_evicted = {
            "kv": reg.counter("prefix_cache_kv_evictions_total",
                              "cached entries that left the KV cache for room"),
            "ram": reg.counter("prefix_cache_ram_evictions_total",
                               "host-memory snapshots dropped for the RAM budget")}
        self.prefix_unsaved = reg.counter(
            "prefix_cache_unsaved_total",
            "entries that left the KV cache without a snapshot: they had to leave at once "
            "while other requests ran")
        # per app (uma.sched.fair): what each got, for fair share to be seen
        self.app_requests = reg.family("app_requests_total", "requests ended", "app", Counter)
        self.app_tokens = reg.family("app_tokens_total", "tokens generated by ended requests",
                                     "app", Counter)
        self.app_service = reg.family("app_service_ms_total",
                                      "tick time spent on the app's rows (ms)", "app", Counter)
        self.app_queue = reg.family("app_queue_ms", "submit to a KV sequence, ms", "app",
                                    Histogram)
        self.app_ttft = reg.family("app_ttft_ms", "time to first token, ms", "app", Histogram)
        self.app_itl = reg.family("app_inter_token_ms", "inter-token gap, ms", "app", Histogram)
        self.app_prefix_hits = reg.family("app_prefix_cache_hits_total",
                                          "admissions that reused a cached prefix", "app",
                                          Counter)
        self.app_prefix_tokens = reg.family("app_prefix_cache_reused_tokens_total",
                                            "prompt tokens reused from the prefix cache", "app",
                                            Counter)
        self.finished = {r: reg.counter(f"requests_{r}_total", f"requests ended: {r}")
                         for r in ("stop", "length", "cancelled", "error")}
        self.ttft = {p: reg.histogram(f"ttft_ms_{p.value}", f"time to first token, {p.value}")
                     for p in Priority}
        self.itl = {p: reg.histogram(f"inter_token_ms_{p.value}", f"inter-token gap, {p.value}")
                    for p in Priority}
        # the scorecard's (uma.scorecard, docs/design/metrics.md "Scorecard")
        self.itl_alone = reg.histogram(
            "inter_token_ms_alone",
            "interactive inter-token gap while no background request exists")
        self.ttf5 = {p: reg.histogram(f"ttf5_ms_{p.value}", f"submit to fifth token, {p.value}")
                     for p in Priority}
        self.decode_rows = reg.counter("decode_rows_total", "decode rows run")
        self.decode_ready = reg.counter("decode_rows_ready_total",
                                        "decode rows ready at the ticks that ran")
        self.bmt_bytes = reg.counter("bmt_bytes_total",
                                     "bytes the ticks moved through memory (estimate)")
        self.copy_free = reg.counter("tokens_copy_free_total",
                                     "tokens sampled with no logits row copied out of the graph")
        self.sampling_ms_last = reg.gauge("sampling_ms_last",
                                          "sampling time of the last tick that sampled, ms")
        self.overlap_active = reg.gauge(
            "overlap_active", "1: the last tick's output went out while the next decode ran")


class TickSpread:
    """How far measured ticks stray above the cost model's mean, as p95 ratios over recent
    ticks. `decode`: ticks of decode rows only, against their prediction (jitter: thread
    wake-ups, a GPU's graph re-captures). `prompt`: ticks with background prompt tokens, against
    theirs (the same jitter, plus the cost model's error on prompt chunks; the ticks the policy
    plans up to its line). `alone`: ticks while no background request exists,
    against the model's time for their sequences as decode rows alone (a stream starting a
    new prompt counted as the row it will be): what interactive streams see without background
    work (jitter and their own new prompts), the reference the latency cap is relative to."""

    EVERY = 16  # samples between recomputations: a percentile per tick is hot-path waste

    def __init__(self, size: int = 256) -> None:
        self._decode: collections.deque[float] = collections.deque(maxlen=size)
        self._prompt: collections.deque[float] = collections.deque(maxlen=size)
        self._alone: collections.deque[float] = collections.deque(maxlen=size)
        self._added = {"decode": 0, "prompt": 0, "alone": 0}
        self.decode = 1.0
        self.prompt = 1.0
        self.alone = 0.0  # 0: not seen yet
        self.alone_sorted: tuple[float, ...] = ()  # the alone ratios, sorted (policies' tails)

    def add(self, measured_ms: float, predicted_ms: float, solo_ms: float | None,
            decode_only: bool, background_prompt: bool = False) -> None:
        if decode_only:
            self._push("decode", self._decode, measured_ms / max(predicted_ms, 1e-3))
        if background_prompt:
            self._push("prompt", self._prompt, measured_ms / max(predicted_ms, 1e-3))
        if solo_ms is not None:
            self._push("alone", self._alone, measured_ms / max(solo_ms, 1e-3))

    def _push(self, name: str, values: collections.deque[float], value: float) -> None:
        values.append(value)
        self._added[name] += 1
        if len(values) >= 2 * self.EVERY and self._added[name] % self.EVERY == 0:
            ordered = sorted(values)
            setattr(self, name, max(1.0, p95(ordered)))
            if name == "alone":
                self.alone_sorted = tuple(ordered)


def p95(ordered: list[float]) -> float:
    """The 95th percentile of sorted values, interpolated between the two nearest (numpy's
    default). Not numpy.percentile: its first call in a process loads enough to take tens of
    milliseconds, a stall in a tick of a fresh daemon's first stream; a sort of 256 floats
    takes microseconds."""
    pos = 0.95 * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (pos - lo) * (ordered[hi] - ordered[lo])


# Prompt tokens in a tick past which its time is mostly theirs (on a GPU, past the weights'
# read), so that its time per token is what a prefill of many more would cost a token.
LARGE_CHUNK = 256


class TickStats:
    """The statistics of the ticks so far, and the instruments that export them."""

    def __init__(self, reg: Registry, cost: CostModel) -> None:
        self.m = TickMetrics(reg)
        self.cost = cost
        self.spread = TickSpread()
        self.load = LoadMeter()  # the compute thread's busy share (uma status)
        self.ticks = 0
        self.decode_ewma = 0.0  # smoothed llama_decode ms
        # what a prompt token has cost in ticks of LARGE_CHUNK tokens or more (smoothed; 0
        # before one): the prefix cache's floor under the cost model when pricing a prefill
        self.prompt_ms_per_token = 0.0
        self.trace: list[tuple[Any, ...]] | None = None  # see Scheduler.trace

    def record(self, t: TickReport) -> None:
        plan, m = t.plan, self.m
        decode_ms, tick_ms = t.decode_s * 1e3, t.tick_s * 1e3
        self.ticks += 1
        if plan.items and not t.interrupted:
            est = self.cost.estimate
            solo = est.predict(0, *t.solo) if t.solo is not None else None
            predicted = est.predict(t.n_prefill, t.n_decode, t.cache_read, t.prompt_attended)
            self.spread.add(tick_ms, predicted, solo, decode_only=t.n_prefill == 0,
                            background_prompt=t.background_prompt)
            # Before the model learns from this tick: how well it predicted it.
            m.cost_error_pct.observe(100.0 * abs(tick_ms - predicted) / max(predicted, 1e-3))
            self.cost.observe(t.n_prefill, t.n_decode, t.cache_read, tick_ms,
                              t.prompt_attended)
        self.decode_ewma = decode_ms if self.decode_ewma == 0 else \
            0.9 * self.decode_ewma + 0.1 * decode_ms
        if t.n_prefill >= LARGE_CHUNK:
            per = tick_ms / t.n_prefill
            self.prompt_ms_per_token = per if self.prompt_ms_per_token == 0 else \
                0.7 * self.prompt_ms_per_token + 0.3 * per
        m.ticks.inc()
        parts = sum(t.apps.values())
        for app, part in t.apps.items():  # the measured tick shared out as predicted (evenly
            # where the cost model prices every row at nothing, as it may learn to)
            share = part / parts if parts > 0 else 1 / len(t.apps)
            m.app_service.child(app).inc(tick_ms * share)
        m.prefill_tokens.inc(t.n_prefill)
        m.decode_ms_last.set(decode_ms)
        m.decode_ms_ewma.set(self.decode_ewma)
        m.tick_ms.observe(tick_ms)
        m.decode_ms.observe(decode_ms)
        m.sample_ms.observe(t.sample_s * 1e3)
        m.overhead_ms.observe((t.tick_s - t.decode_s - t.sample_s) * 1e3)
        m.decode_rows.inc(t.n_decode)
        m.decode_ready.inc(t.n_ready)
        m.bmt_bytes.inc(t.bmt_bytes)
        m.copy_free.inc(t.n_copy_free)
        if t.n_sampled:
            m.sampling_ms_last.set(t.sample_s * 1e3)
        m.decode_time.inc(t.decode_s)
        m.sample_time.inc(t.sample_s)
        m.tick_time.inc(t.tick_s)
        self.load.add(t.tick_s, time.monotonic())
        m.tokens_decode.set(t.n_decode)
        m.tokens_prefill.set(t.n_prefill)
        m.batch_tokens.observe(plan.n_tokens)
        m.queue_depth.set(t.queue_depth)
        m.running.set(t.running)
        m.cost_error.set(self.cost.error_ewma_ms)
        notes = plan.notes
        if notes is not None:
            m.served.set(notes.served_decoders)
            m.parked.set(notes.parked)
            m.bmt_last.set(notes.bmt_bytes)
            m.tick_budget.set(notes.budget_ms)
            if notes.budget_ms and tick_ms > notes.budget_ms:
                m.over_budget.inc()
            if notes.paused:
                m.pauses.inc()
            if notes.apart_ms:
                m.apart_ms.inc(notes.apart_ms)
        if self.trace is not None:
            self.trace.append((t.n_prefill, t.n_decode, t.decode_s, t.sample_s, t.tick_s,
                               t.native_s, plan))
