"""What a caller holds for one request: a stream of token events, then a result.

The engine's threads push; the caller consumes from any thread or event loop. A handle is a sync
iterator and an async iterator of `TokenEvent`s (one consumer), `result()` waits for the final
`Result`, and `cancel()` stops the request at the next token boundary.

Consumers waiting in an event loop are woken through one `_LoopWaker` per loop: the engine's
output thread hands a loop every handle that became ready while the loop had not yet run, and
the loop is called once for all of them. With many streams on one loop (the HTTP gateway) that
is one cross-thread call a burst of tokens instead of one a token, and a loop that falls
behind under load is called less often, not more.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from uma.errors import UmaError
from uma.tools import ToolCall

# One step's most probable tokens and their log-probabilities, most probable first
# (SamplingParams.top_logprobs).
TopLogprobs = tuple[tuple[int, float], ...]


class TokenLogprob(NamedTuple):
    """A sampled token's log-probability with its step's most probable tokens."""

    logprob: float
    top: TopLogprobs


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """New output of one request: the tokens sampled since the last event and the text they
    completed. `text` is '' while a character or a possible stop string is still pending."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[TopLogprobs, ...] | None = None  # per token, when asked for


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # of the prompt tokens, reused from the prefix cache

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Timings:
    admitted_ns: int  # monotonic clock when it got a KV sequence (0 if it never did)
    queue_ms: float  # submit -> a KV sequence was free for it
    ttft_ms: float  # submit -> first token (nan if none)
    total_ms: float  # submit -> finished
    token_ms: tuple[float, ...] = ()  # when each token was sampled, ms after submit


@dataclass(frozen=True, slots=True)
class Result:
    """How a request ended. finish_reason: 'stop', 'length', 'cancelled' or 'error'."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    usage: Usage
    timings: Timings
    error: UmaError | None = field(default=None, compare=False)
    logprobs: tuple[float, ...] | None = None  # per token, when the request asked for them
    top_logprobs: tuple[TopLogprobs, ...] | None = None  # per token, likewise
    # With tools (finish_reason 'tool_calls'): the calls the model made, and its text outside
    # them (None: no calls; `text` is all of it)
    tool_calls: tuple[ToolCall, ...] = ()
    content: str | None = None

    @property
    def tokens_per_second(self) -> float:
        gen = self.timings.total_ms - self.timings.ttft_ms
        n = self.usage.completion_tokens - 1
        return n / (gen / 1000.0) if n > 0 and gen > 0 else float("nan")


class RequestHandle:
    """One request's events and result. Thread-safe; iterate it from one consumer."""

    def __init__(self, rid: int, cancel: Callable[[], None]) -> None:
        self.rid = rid
        self._cancel = cancel
        self._lock = threading.Condition(threading.Lock())
        self._events: collections.deque[TokenEvent] = collections.deque()
        self._result: Result | None = None
        self._waiters: list[tuple[_LoopWaker, asyncio.Future]] = []
        self._waker: _LoopWaker | None = None  # its consumer's loop's, once it waited there
        self._listener: Callable[[RequestHandle], None] | None = None
        self._request: object = None  # the engine's Request, for priority changes

    # --- producer side (engine threads) --------------------------------------------------------

    def _push(self, event: TokenEvent | None = None, result: Result | None = None) -> None:
        with self._lock:
            if self._result is not None:
                return
            if event is not None:
                self._events.append(event)
            if result is not None:
                self._result = result
            self._lock.notify_all()
            waiters, self._waiters = self._waiters, []
        for waker, fut in waiters:
            waker.wake(fut)
        if self._listener is not None:
            self._listener(self)

    def listen(self, callback: Callable[[RequestHandle], None]) -> None:
        """Calls callback(handle) on the engine's output thread after every new event and after
        the result; it must be quick and must not block (the daemon wakes its poller there).
        Consume with drain() instead of iterating."""
        with self._lock:
            self._listener = callback
            pending = bool(self._events) or self._result is not None
        if pending:
            callback(self)

    def drain(self) -> tuple[list[TokenEvent], Result | None]:
        """Takes every queued event without waiting, and the result if the request ended."""
        with self._lock:
            events = list(self._events)
            self._events.clear()
            return events, self._result

    # --- consumer side -------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self._result is not None

    def cancel(self) -> None:
        """Stops the request at the next token boundary; it ends with finish_reason
        'cancelled' (unless it finished first)."""
        if self._result is None:
            self._cancel()

    def result(self, timeout: float | None = None) -> Result:
        """Waits for the request to end (events stay available to iterate)."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._result is not None, timeout):
                raise TimeoutError(f"request {self.rid} still running after {timeout} s")
            return self._result

    async def aresult(self) -> Result:
        while True:
            with self._lock:
                if self._result is not None:
                    return self._result
                fut = self._register()
            await fut

    async def take(self) -> list[TokenEvent]:
        """Waits for an event, then takes every event queued: a consumer that fell behind
        catches up in one step. [] once the request ended and every event was taken."""
        while True:
            with self._lock:
                if self._events:
                    events = list(self._events)
                    self._events.clear()
                    return events
                if self._result is not None:
                    return []
                fut = self._register()
            await fut

    def _register(self) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        waker = self._waker
        if waker is None or waker.loop() is not loop:  # looked up once, not at every token
            waker = self._waker = _LoopWaker.of(loop)
        fut = loop.create_future()
        self._waiters.append((waker, fut))
        return fut

    def __iter__(self):
        return self

    def __next__(self) -> TokenEvent:
        with self._lock:
            self._lock.wait_for(lambda: self._events or self._result is not None)
            if self._events:
                return self._events.popleft()
        raise StopIteration

    def __aiter__(self):
        return self

    async def __anext__(self) -> TokenEvent:
        while True:
            with self._lock:
                if self._events:
                    return self._events.popleft()
                if self._result is not None:
                    raise StopAsyncIteration
                fut = self._register()
            await fut


class _LoopWaker:
    """Sets futures of one event loop from other threads, calling the loop once a burst: the
    first future of a burst schedules the call, the rest join it until the loop runs it."""

    _by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaker] = \
        weakref.WeakKeyDictionary()
    _made = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # held weakly: the waker is the value of a weak-keyed map under this very loop, and a
        # strong reference would keep every loop that ever waited alive
        self.loop = weakref.ref(loop)
        self._lock = threading.Lock()
        self._ready: list[asyncio.Future] = []

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _LoopWaker:
        """The loop's waker (called on the loop's own thread)."""
        waker = cls._by_loop.get(loop)
        if waker is None:
            with cls._made:
                waker = cls._by_loop.setdefault(loop, cls(loop))
        return waker

    def wake(self, fut: asyncio.Future) -> None:
        with self._lock:
            self._ready.append(fut)
            if len(self._ready) > 1:
                return  # the call already scheduled sets this one too
        loop = self.loop()
        try:
            if loop is None:
                raise RuntimeError("the loop is gone")
            loop.call_soon_threadsafe(self._run)
        except RuntimeError:  # a closed loop: its consumers are gone, nothing to wake
            with self._lock:
                self._ready.clear()

    def _run(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        for fut in ready:
            if not fut.done():
                fut.set_result(None)
