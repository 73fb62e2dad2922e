"""A draft model: a small model with the target's vocabulary guesses each stream's next tokens.

The draft model has its own context, a sequence per target sequence, and runs on the compute
thread before the tick's decode: one decode call takes every drafting stream's missing tokens
(what the stream kept since the draft last saw it) and makes each stream's first guess, then
one call per further guess takes every stream still drafting. Its guesses are greedy (the
arg-max row): a deterministic guess verified by sampling the target is exact at any temperature.

What guessing costs is measured here (`price_per_guess`, `catch_up_tokens`) and priced by the
goodput rule with the verify rows (uma.sched.speculation): on a CPU, where a draft model's step
costs half the target's or more, it seldom pays and the rule keeps it off; where the target's
step is much dearer than the draft's it does.

Catching up is bounded: a stream whose draft lags (its prompt, at first) is fed at most as many
tokens a tick as take one of the target's ticks, and guesses only once level, so that a long
prompt never stalls the tick it is caught up in.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from uma.errors import InvalidModelError, UmaError
from uma.request import Request

log = logging.getLogger("uma.engine")

# a catch-up's share of a tick, at most: the draft's missing tokens fed in one tick cost no
# more than the tick they ride with (the stream's gap at most doubles while it catches up)
CATCH_UP_SHARE = 1.0
# how fast the measured step and catch-up prices follow new measurements
RATE = 0.2


class ModelDrafter:
    """Greedy guesses from a draft model's context (see the module's docstring)."""

    name = "draft"
    costly = True  # its guesses take device time: lengths are chosen before drafting

    def __init__(self, ctx: Any, core: ModuleType, *, on_device: bool = False) -> None:
        """ctx: the draft model's context, with a sequence per target sequence it drafts for;
        on_device: its arg-max taken in the decode's graph (a GPU: no logits row crosses)."""
        self.ctx = ctx
        self.batch = core.Batch(ctx.n_batch)
        # rid -> (the sequence the draft holds its tokens in, those tokens)
        self._cached: dict[int, tuple[int, np.ndarray]] = {}
        self.on_device = on_device and all(ctx.set_sampler(s) for s in range(ctx.n_seq_max))
        if not self.on_device:
            for s in range(ctx.n_seq_max):
                ctx.clear_sampler(s)
        # One decode call of one guess a stream, and a caught-up token, ms: timed at the first
        # price asked (on the compute thread), then measured as it drafts.
        self._step_ms: float | None = None
        self.token_ms = 0.0

    @staticmethod
    def check_vocabulary(draft: Any, target: Any) -> None:
        """Refuses a draft model whose tokens are not the target's (InvalidModelError naming
        the first difference): its guesses would be other tokens."""
        def refuse(why: str) -> None:
            raise InvalidModelError(f"the draft model {draft.path} cannot draft for "
                                    f"{target.path}: {why}")
        if draft.n_vocab != target.n_vocab:
            refuse(f"its vocabulary has {draft.n_vocab} tokens, the model's {target.n_vocab}")
        for name in ("bos", "eos", "add_bos"):
            if getattr(draft, name) != getattr(target, name):
                refuse(f"its {name} is {getattr(draft, name)}, the model's "
                       f"{getattr(target, name)}")
        mine, _ = draft.vocab_pieces()
        theirs, _ = target.vocab_pieces()
        for token, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            if a != b:
                refuse(f"token {token} is {a!r} in it and {b!r} in the model")

    @property
    def step_ms(self) -> float:
        if self._step_ms is None:
            self._step_ms = self._timed_step()
            self.token_ms = self._step_ms / 8
        return self._step_ms

    def _timed_step(self) -> float:
        """One guess's decode call, timed on a scratch sequence (after one untimed: the first
        call builds the graph)."""
        ms = 0.0
        for _ in range(2):
            self.batch.clear()
            self.batch.add(0, 0, 0, True)
            t0 = time.perf_counter()
            self.ctx.decode(self.batch)
            self._tokens()
            ms = (time.perf_counter() - t0) * 1e3
            self.ctx.seq_rm(0)
        return max(ms, 1e-3)

    def price_per_guess(self, streams: int) -> float:
        """What one guess of a stream costs in ms, where `streams` streams draft together (each
        of the draft's decode calls makes a guess for each)."""
        return self.step_ms / max(streams, 1)

    def catch_up_tokens(self, tick_ms: float) -> int:
        """The most missing tokens one tick feeds the draft: at least two, one more than a
        tick adds, so that a lagging draft gains on its stream."""
        return max(2, int(CATCH_UP_SHARE * tick_ms / self.token_ms))

    def behind(self, req: Request) -> int:
        """Tokens of the request's the draft has not seen (the last is always among them)."""
        history = _history(req)
        held = self._held(req)
        return len(history) - (0 if held is None else _common(held, history))

    def propose_many(self, asks: Sequence[tuple[Request, int]], tick_ms: float
                     ) -> dict[int, np.ndarray]:
        """Up to k greedy guesses for each (request, k): seq_id -> guesses. A request whose
        draft lags by more than a tick's catch-up is fed part of what it lacks and has no
        guesses this time."""
        t0 = time.perf_counter()
        budget = self.catch_up_tokens(tick_ms)
        self.batch.clear()
        drafting: list[tuple[Request, int, list[int]]] = []
        pos: dict[int, int] = {}
        fed = 0
        for req, k in asks:
            history = _history(req)
            seq = req.seq_id
            held = self._held(req)
            common = 0 if held is None else _common(held, history)
            if held is None or common < len(held):
                self.ctx.seq_rm(seq, common, -1)
            missing = history[common:]
            room = self.batch.capacity - self.batch.n_tokens
            lagging = len(missing) > max(budget - fed, 1) or len(missing) > room
            if lagging:
                part = missing[:max(min(budget - fed, room), 0)]
                if len(part):
                    self.batch.add_sequence(part, common, seq, logits_last=False)
                    fed += len(part)
                self._keep(req, history[:common + len(part)])
                continue
            self.batch.add_sequence(missing, common, seq, logits_last=True)
            fed += len(missing)
            self._keep(req, history)
            drafting.append((req, k, []))
            pos[seq] = len(history)
        guesses: dict[int, np.ndarray] = {}
        try:
            if self.batch.n_tokens:
                self._step(drafting)
                steps = 1
                while any(len(g) < k for _, k, g in drafting):
                    self.batch.clear()
                    for req, k, g in drafting:
                        if len(g) < k:
                            self.batch.add(g[-1], pos[req.seq_id], req.seq_id, True)
                            pos[req.seq_id] += 1
                    t1 = time.perf_counter()
                    self._step([d for d in drafting if len(d[2]) < d[1]])
                    self._step_ms = self.step_ms + RATE * (
                        (time.perf_counter() - t1) * 1e3 - self.step_ms)
                    steps += 1
                if fed > len(drafting):  # the first call's time beyond one step: catching up
                    first = (time.perf_counter() - t0) * 1e3 - (steps - 1) * self.step_ms
                    sample = max(first - self.step_ms, 0.0) / (fed - len(drafting))
                    self.token_ms += RATE * (max(sample, 1e-4) - self.token_ms)
        except UmaError as exc:  # no room, say: no guesses; the draft's cache is made again
            log.warning("the draft model could not guess: %s", exc)
            for req, _, _ in drafting:
                self.forget(req.rid)
            return {}
        for req, _, g in drafting:
            history = self._cached[req.rid][1]
            # the guesses fed back are in the draft's cache now (all but the last)
            self._keep(req, np.concatenate([history, np.asarray(g[:-1], np.int32)]))
            guesses[req.seq_id] = np.asarray(g, np.int32)
        return guesses

    def _step(self, drafting: list[tuple[Request, int, list[int]]]) -> None:
        """One decode call; each drafting stream's row's arg-max appended to its guesses (the
        rows come in batch order, which is `drafting`'s)."""
        self.ctx.decode(self.batch)
        if not drafting:  # only lagging streams' tokens: no row to read
            return
        tokens = self._tokens()
        for (_, _, g), token in zip(drafting, tokens.tolist(), strict=True):
            g.append(token)

    def _tokens(self) -> np.ndarray:
        if self.on_device:
            return np.array(self.ctx.sampled_tokens())
        logits = self.ctx.logits()
        try:
            tokens: np.ndarray = np.argmax(logits, axis=1).astype(np.int32)
            return tokens
        finally:
            del logits  # the next decode refuses to run while a view of its logits lives

    def _held(self, req: Request) -> np.ndarray | None:
        """The request's tokens the draft's cache holds (None: none, or of another sequence)."""
        cached = self._cached.get(req.rid)
        return None if cached is None or cached[0] != req.seq_id else cached[1]

    def _keep(self, req: Request, tokens: np.ndarray) -> None:
        self._cached[req.rid] = (req.seq_id, tokens)

    def forget(self, rid: int) -> None:
        """The request left its sequence: the draft's cells of it go."""
        cached = self._cached.pop(rid, None)
        if cached is not None:
            self.ctx.seq_rm(cached[0], -1, -1)

    def close(self) -> None:
        self.batch.close()
        model = self.ctx.model
        self.ctx.close()
        model.close()


def _history(req: Request) -> np.ndarray:
    """The request's tokens: its prompt, then what it kept (its last token last)."""
    if not req.generated:
        return req.prompt
    return np.concatenate([req.prompt, np.asarray(req.generated, np.int32)])


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
