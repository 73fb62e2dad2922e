"""The output stage: token ids in, text events and results out, on its own thread.

The compute thread only decides tokens; detokenising, stop-string matching and waking consumers
run here, overlapping the next decode (which releases the GIL). A stop string found here is
reported back through `Request.stop_hit`; the compute thread then frees the sequence, and any
token it sampled in between is dropped, never shown.

What fails here for one request (detokenising, stop-string matching, the consumer's listener)
ends that request alone: the stage stops its output and sets `Request.failure`, and the compute
thread ends it with that error at its next tick. The other requests' output goes on unchanged.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from uma import tools
from uma.errors import UmaError
from uma.handle import Result, Timings, TokenEvent, TokenLogprob, TopLogprobs, Usage
from uma.metrics import Registry
from uma.request import Request
from uma.text import StopMatcher, TextStream

log = logging.getLogger("uma.output")

class Token(NamedTuple):
    """A sampled token of a request, at t_ns (monotonic). logprob: a float, a TokenLogprob
    with the step's most probable tokens, or None; hidden: an end-of-generation token, kept
    out of the text."""

    req: Request
    token: int
    logprob: float | TokenLogprob | None
    t_ns: int
    hidden: bool = False


class Ended(NamedTuple):
    """A request's end, at t_ns: its finish reason, and its error where it failed."""

    req: Request
    reason: str
    error: UmaError | None
    t_ns: int


class Logits(NamedTuple):
    """A tick's marker, before its tokens: its decode returned at t_ns (perf_counter_ns)."""

    t_ns: int


Event = Token | Ended | Logits
_QUIT = object()  # the stage's thread stops at it


class _Stream:
    __slots__ = ("text", "stops", "parts", "ids", "logprobs", "top", "token_ms", "stopped")

    def __init__(self, model, req: Request) -> None:
        self.text = TextStream(model)
        self.stops = StopMatcher(req.params.stop)
        self.parts: list[str] = []
        self.ids: list[int] = []
        self.logprobs: list[float] | None = [] if req.params.logprobs else None
        self.top: list[TopLogprobs] | None = [] if req.params.top_logprobs else None
        self.token_ms: list[float] = []
        self.stopped = False


class OutputStage:
    """Publishes what the compute thread produced. `publish()` may be called from any thread;
    everything else happens on the stage's thread."""

    def __init__(self, model, on_stop: Callable[[], None],
                 metrics: Registry | None = None) -> None:
        self._model = model
        self._on_stop = on_stop
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[int, _Stream] = {}
        # seed 000's time_logits_to_first_chunk: from a tick's decode returning to the first
        # of its tokens handed to its client (written by this thread alone)
        self._to_first_chunk = (metrics or Registry()).histogram(
            "time_logits_to_first_chunk", "decode returned to its first token handed on, ms")
        self._logits_ns = 0  # the last marker's time, until a token of its tick goes out
        self._thread = threading.Thread(target=self._run, name="uma-output", daemon=True)
        self._thread.start()

    def publish(self, events: list[Event]) -> None:
        """A tick's events at once, in order. One hand-over and one wake-up a tick, however
        many streams."""
        self._queue.put(events)

    def close(self) -> None:
        """Publishes everything queued so far, then stops the thread."""
        self._queue.put(_QUIT)
        self._thread.join()

    def _run(self) -> None:
        while True:
            events = self._queue.get()
            if events is _QUIT:
                return
            for event in events:
                if isinstance(event, Logits):
                    self._logits_ns = event.t_ns
                    continue
                try:
                    if isinstance(event, Token):
                        self._publish_token(*event)
                    else:
                        self._publish_end(*event)
                except Exception as exc:  # noqa: BLE001 - this request's alone
                    self._failed(event.req, isinstance(event, Ended), exc, event.t_ns)

    def _failed(self, req: Request, ended: bool, exc: Exception, t_ns: int) -> None:
        """Ends one request's output after a failure producing it."""
        if req.failure is None:
            log.error("output of request %d failed", req.rid, exc_info=exc)
            req.failure = UmaError(f"internal error producing this request's output: {exc!r}")
        if not ended:
            st = self._streams.get(req.rid)
            if st is not None:
                st.stopped = True  # no more of its tokens are shown
            self._on_stop()
            return
        self._streams.pop(req.rid, None)
        if not req.handle.done:  # the failure came before its result was set
            result = Result(
                text="", token_ids=(), finish_reason="error", usage=Usage(req.n_prompt, 0),
                timings=Timings(req.admitted_ns, math.nan, math.nan,
                                (t_ns - req.arrival_ns) / 1e6),
                error=req.failure)
            try:
                req.handle._push(result=result)
            except Exception:  # noqa: BLE001 - the result is set; its listener failed again
                log.exception("listener of request %d failed", req.rid)

    def _stream(self, req: Request) -> _Stream:
        st = self._streams.get(req.rid)
        if st is None:
            st = self._streams[req.rid] = _Stream(self._model, req)
        return st

    def _publish_token(self, req: Request, token: int, logprob: float | TokenLogprob | None,
                       t_ns: int, hidden: bool) -> None:
        st = self._stream(req)
        if st.stopped:
            return
        st.ids.append(token)
        top = None
        if isinstance(logprob, TokenLogprob):
            logprob, top = logprob
            if st.top is not None:
                st.top.append(top)
        if st.logprobs is not None and logprob is not None:
            st.logprobs.append(logprob)
        st.token_ms.append((t_ns - req.arrival_ns) / 1e6)
        text, hit = st.stops.feed("" if hidden else st.text.push(token))
        if text:
            st.parts.append(text)
        if hit:
            st.stopped = True
            req.stop_hit = True
            self._on_stop()
        lp = None if logprob is None else (logprob,)
        req.handle._push(TokenEvent(text, (token,), lp, None if top is None else (top,)))
        if self._logits_ns:
            self._to_first_chunk.observe((time.perf_counter_ns() - self._logits_ns) / 1e6)
            self._logits_ns = 0

    def _publish_end(self, req: Request, reason: str, error: UmaError | None, t_ns: int) -> None:
        if req.failure is not None:  # its output failed after the compute thread ended it
            reason, error = "error", req.failure
        elif req.stop_hit and reason == "length":
            # The stop string was found here after the compute thread had already reached
            # max_tokens: the text ends at the stop string, so the reason is 'stop'.
            reason = "stop"
        st = self._streams.pop(req.rid, None) or _Stream(self._model, req)
        if not st.stopped:
            tail = st.stops.flush() + st.text.flush()
            if tail:
                st.parts.append(tail)
                req.handle._push(TokenEvent(tail, ()))
        nan = math.nan
        timings = Timings(
            admitted_ns=req.admitted_ns,
            queue_ms=(req.admitted_ns - req.arrival_ns) / 1e6 if req.admitted_ns else nan,
            ttft_ms=(req.first_token_ns - req.arrival_ns) / 1e6 if req.first_token_ns else nan,
            total_ms=(t_ns - req.arrival_ns) / 1e6,
            token_ms=tuple(st.token_ms),
        )
        text = "".join(st.parts)
        content, calls = tools.parse(text, req.tool_format) \
            if req.tool_format is not None and reason in ("stop", "length") else (None, [])
        result = Result(
            text=text, token_ids=tuple(st.ids),
            finish_reason="tool_calls" if calls else reason,
            usage=Usage(req.n_prompt, len(st.ids), req.cached_tokens), timings=timings,
            error=error,
            logprobs=None if st.logprobs is None else tuple(st.logprobs),
            top_logprobs=None if st.top is None else tuple(st.top),
            tool_calls=tuple(calls), content=content if calls else None,
        )
        req.handle._push(result=result)
