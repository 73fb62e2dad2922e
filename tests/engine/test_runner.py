"""The runner on the real core (uma.engine.runner): it runs a plan and changes no request; what goes
wrong comes back as data: a request that fails on its own is a Failure and the others'
tokens are those they sample alone, and a batch the KV cache has no room for is `no_room`,
rolled back, with nothing sampled."""

from __future__ import annotations

import numpy as np
import pytest

from uma import _core
from uma.config import SamplingParams
from uma.engine.runner import Runner
from uma.errors import UmaError
from uma.request import Request
from uma.sched.state import BatchItem, Phase, Plan, Priority


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
