"""The engine's own record of one request, shared by its compute and output threads."""

from __future__ import annotations

from typing import Any

import numpy as np

from uma.app import DEFAULT_APP
from uma.config import SamplingParams
from uma.handle import RequestHandle
from uma.sched.state import Phase, Priority, SessionView, Waiting


class Request:
    """Mutable; the compute thread owns every field except the flags named below."""

    __slots__ = (
        "rid", "handle", "params", "priority", "prompt", "tokens", "generated", "seq_id",
        "n_prefilled", "n_past", "cached_tokens", "n_sampled", "last_token", "arrival_ns",
        "admitted_ns", "first_token_ns", "last_token_ns", "cancelled", "stop_hit", "failure",
        "done", "app", "weight", "latency_cap", "tool_format", "service_ms", "matcher",
        "drafter",
    )

    def __init__(self, rid: int, tokens: np.ndarray, params: SamplingParams,
                 priority: Priority, now_ns: int, app: str = DEFAULT_APP,
                 weight: float = 1.0, latency_cap: float = 0.0) -> None:
        self.rid = rid
        self.app = app  # who sent it, for fair share (uma.sched.fair)
        self.weight = weight
        self.latency_cap = latency_cap  # its app's own (0: the policy's)
        self.tool_format: str | None = None  # with tools: how the model writes calls (uma.tools)
        self.service_ms = 0.0  # tick time it has had (fair share's ledger, measured)
        self.matcher: Any = None  # constrained decoding: its grammar's state (uma.grammar)
        # the drafter it speculates with while running (uma.engine.speculator; None: none)
        self.drafter: str | None = None
        self.handle: RequestHandle | None = None  # set right after, by whoever created it
        self.params = params
        self.priority = priority
        self.prompt = tokens
        self.tokens = tokens  # what to prefill: the prompt (+ generated tokens after preemption)
        self.generated: list[int] = []  # sampled tokens, end-of-generation excluded
        self.seq_id = -1  # KV sequence while running
        self.n_prefilled = 0
        self.n_past = 0  # KV positions held
        self.cached_tokens = 0  # of the prompt, taken from the prefix cache rather than prefilled
        self.n_sampled = 0  # tokens sampled, EOG included
        self.last_token = -1  # the latest sampled token, fed by the next decode step
        self.arrival_ns = now_ns
        self.admitted_ns = 0
        self.first_token_ns = 0
        self.last_token_ns = 0
        self.cancelled = False  # set by any thread: cancel() or a client going away
        self.stop_hit = False  # set by the output thread: a stop string was reached
        # set by the output thread: producing this request's output failed (detokenising, a
        # stop string, the consumer's callback); the compute thread then ends it with this
        self.failure: BaseException | None = None
        self.done = False  # set by the compute thread once the request has been released

    @property
    def n_prompt(self) -> int:
        return len(self.prompt)

    @property
    def phase(self) -> Phase:
        return Phase.PREFILL if self.n_prefilled < len(self.tokens) else Phase.DECODE

    def view(self) -> SessionView:
        return SessionView(
            seq_id=self.seq_id, rid=self.rid, phase=self.phase, priority=self.priority,
            n_prompt=len(self.tokens), n_prefilled=self.n_prefilled, n_generated=self.n_sampled,
            n_past=self.n_past, arrival_ns=self.arrival_ns, first_token_ns=self.first_token_ns,
            last_token_ns=self.last_token_ns, n_cached=self.cached_tokens, app=self.app,
            weight=self.weight, latency_cap=self.latency_cap,
        )

    def waiting(self) -> Waiting:
        return Waiting(self.rid, self.priority, len(self.tokens), self.arrival_ns, self.app,
                       self.weight)
