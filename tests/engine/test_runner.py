"""The runner on the real core (uma.engine.runner): it runs a plan and changes no request; what goes
wrong comes back as data: a request that fails on its own is a Failure and the others'
tokens are those they sample alone, and a batch the KV cache has no room for is `no_room`,
rolled back, with nothing sampled."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from uma import _core
from uma.config import SamplingParams
from uma.engine.runner import Runner
from uma.errors import DecodeAbortedError, UmaError
from uma.request import Request
from uma.sched.state import BatchItem, Phase, Plan, PlanNotes, Priority


def request(rid: int, seq: int, tokens) -> Request:
    req = Request(rid, np.asarray(tokens, np.int32), SamplingParams(temperature=0.0),
                  Priority.INTERACTIVE, 0)
    req.seq_id = seq
    return req


def prompt_plan(*reqs: Request) -> Plan:
    return Plan(items=tuple(BatchItem(r.seq_id, Phase.PREFILL, len(r.tokens), logits=True)
                            for r in reqs))


@pytest.fixture
def runner(model):
    ctx = _core.Context(model, n_ctx=256, n_seq_max=3)
    runner = Runner(ctx, _core)
    yield runner
    runner.close()
    ctx.close()


def sample_alone(runner: Runner, req: Request) -> int:
    runner.admit(req)
    ran = runner.run(prompt_plan(req), {req.seq_id: req})
    runner.ctx.seq_rm(req.seq_id)
    return int(ran.tokens[0])


def test_a_request_that_fails_is_reported_and_the_others_sample_as_alone(runner, model):
    good = request(1, 0, [1, 300, 400, 500])
    alone = sample_alone(runner, good)
    bad = request(2, 1, [1, 300, model.n_vocab + 5])  # a token past the vocabulary
    runner.admit(good)
    runner.admit(bad)
    running = {0: good, 1: bad}
    ran = runner.run(prompt_plan(good, bad), running)
    assert [f.seq for f in ran.failed] == [1] and isinstance(ran.failed[0].error, UmaError)
    assert [i.seq_id for i in ran.plan.items] == [0] and not ran.no_room
    assert ran.seqs.tolist() == [0] and ran.tokens.tolist() == [alone]
    # requests are the scheduler's: nothing of theirs changed
    assert good.n_past == good.n_prefilled == 0 and running == {0: good, 1: bad}
    assert runner.ctx.seq_pos_max(0) == 3 and runner.ctx.seq_pos_max(1) == -1


def test_a_batch_with_no_room_in_the_kv_cache_is_rolled_back_and_reported(runner):
    held = request(1, 0, list(range(1, 201)))
    runner.admit(held)
    assert not runner.run(prompt_plan(held), {0: held}).no_room
    held.n_past = held.n_prefilled = 200
    big = request(2, 1, list(range(1, 101)))  # 200 + 100 cells in a 256-cell cache
    runner.admit(big)
    ran = runner.run(prompt_plan(big), {0: held, 1: big})
    assert ran.no_room and not ran.failed and len(ran.tokens) == 0
    assert runner.ctx.seq_pos_max(1) == -1  # rolled back: what ran of it is gone
    assert runner.ctx.seq_pos_max(0) == 199  # the other sequence untouched


class Interrupting:
    """The runner's context for one decode, which a newcomer interrupts (Runner.interrupt)
    as it starts; the runner has its own context back after it. keep=None: the real decode
    then ends at its first graph node (llama.cpp keeps nothing); keep=n: it runs whole and the
    cache is cut back to each sequence's first n positions of the batch, what llama.cpp leaves
    after an abort in a later micro-batch."""

    def __init__(self, runner: Runner, keep: int | None = None) -> None:
        self._ctx, self._runner, self._keep = runner.ctx, runner, keep
        self.interrupted: list[bool] = []

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def decode(self, batch):
        self._runner.ctx = self._ctx
        self.interrupted.append(self._runner.interrupt(0.0))
        if self._keep is None or not self.interrupted[-1]:
            return self._ctx.decode(batch)
        self._ctx.abort(False)
        starts = {seq: self._ctx.seq_pos_max(seq) + 1 for seq in range(self._ctx.n_seq_max)}
        self._ctx.decode(batch)
        for seq, start in starts.items():
            if self._ctx.seq_pos_max(seq) >= start:
                self._ctx.seq_rm(seq, start + self._keep)
        raise DecodeAbortedError("decode aborted")


@pytest.fixture
def small_steps(model):
    ctx = _core.Context(model, n_ctx=256, n_batch=128, n_ubatch=16, n_seq_max=2)
    runner = Runner(ctx, _core)
    yield runner
    runner.close()
    ctx.close()


def test_a_newcomer_ends_a_prompt_tick_and_nothing_of_it_is_kept(small_steps):
    req = request(1, 0, list(range(1, 65)))
    alone = sample_alone(small_steps, req)
    real = small_steps.ctx
    small_steps.ctx = interrupting = Interrupting(small_steps)
    small_steps.admit(req)
    ran = small_steps.run(prompt_plan(req), {0: req})
    assert interrupting.interrupted == [True]
    assert ran.interrupted and ran.plan.items == () and len(ran.tokens) == 0
    assert real.seq_pos_max(0) == -1
    # the abort flag did not outlive the decode: the tick runs again
    again = small_steps.run(prompt_plan(req), {0: req})
    assert not again.interrupted and again.tokens.tolist() == [alone]


def test_a_newcomer_between_ticks_holds_back_the_next_long_prompt_tick(small_steps):
    """A newcomer that comes while the tick is planned (its prompt restored from the prefix
    cache, say) finds no decode to end: the next prompt-only decode predicted to run longer
    than its prompt does not start, so that the tick is planned again with it."""
    req = request(1, 0, list(range(1, 65)))
    alone = sample_alone(small_steps, req)
    small_steps.admit(req)
    assert not small_steps.interrupt(5.0)  # between ticks: noted
    long_tick = dataclasses.replace(prompt_plan(req), notes=PlanNotes(predicted_ms=500.0))
    ran = small_steps.run(long_tick, {0: req})
    assert ran.interrupted and ran.plan.items == () and len(ran.tokens) == 0
    assert small_steps.ctx.seq_pos_max(0) == -1
    # the note is spent: the tick runs when planned again
    assert small_steps.run(long_tick, {0: req}).tokens.tolist() == [alone]
    small_steps.ctx.seq_rm(0)
    # a tick predicted shorter than the newcomer's prompt runs
    assert not small_steps.interrupt(1000.0)
    assert not small_steps.run(long_tick, {0: req}).interrupted


def test_a_note_from_a_newcomer_already_taken_in_holds_nothing_back(small_steps,
                                                                     monkeypatch):
    """The note of a request the tick was planned with (its submit came just before the
    plan took it in) is spent without a re-plan: the decode runs at once."""
    req = request(1, 0, list(range(1, 65)))
    alone = sample_alone(small_steps, req)
    small_steps.admit(req)
    monkeypatch.setattr(small_steps, "newcomer_waiting", lambda: False)
    assert not small_steps.interrupt(5.0)
    long_tick = dataclasses.replace(prompt_plan(req), notes=PlanNotes(predicted_ms=500.0))
    ran = small_steps.run(long_tick, {0: req})
    assert not ran.interrupted and ran.tokens.tolist() == [alone]
    assert small_steps._pending_ms == math.inf  # spent


@pytest.mark.parametrize("keep", [16, 64])
def test_an_interrupted_tick_keeps_the_micro_batches_that_ran(small_steps, keep):
    req = request(1, 0, list(range(1, 65)))
    alone = sample_alone(small_steps, req)
    real = small_steps.ctx
    small_steps.ctx = Interrupting(small_steps, keep=keep)
    small_steps.admit(req)
    ran = small_steps.run(prompt_plan(req), {0: req})
    # what the cache kept counts; a chunk kept whole gives back the token to sample from
    kept = min(keep, 63)
    assert ran.interrupted and len(ran.tokens) == 0
    assert [(i.seq_id, i.n_tokens, i.logits) for i in ran.plan.items] == [(0, kept, False)]
    assert real.seq_pos_max(0) == kept - 1
    req.n_past = req.n_prefilled = kept
    rest = Plan(items=(BatchItem(0, Phase.PREFILL, 64 - kept, logits=True),))
    assert small_steps.run(rest, {0: req}).tokens.tolist() == [alone]


def test_a_tick_with_a_decode_row_is_not_interrupted(small_steps):
    streaming = request(1, 0, [1, 300, 400])
    small_steps.admit(streaming)
    small_steps.run(prompt_plan(streaming), {0: streaming})
    streaming.n_past = streaming.n_prefilled = 3
    streaming.last_token = 500
    newcomer = request(2, 1, list(range(1, 65)))
    small_steps.admit(newcomer)
    small_steps.ctx = interrupting = Interrupting(small_steps)
    plan = Plan(items=(BatchItem(0, Phase.DECODE, 1, logits=True),
                       BatchItem(1, Phase.PREFILL, 64, logits=True)))
    ran = small_steps.run(plan, {0: streaming, 1: newcomer})
    assert interrupting.interrupted == [False]
    assert not ran.interrupted and sorted(ran.seqs.tolist()) == [0, 1]
