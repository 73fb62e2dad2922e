"""A draft model's guesses, verified in the batched tick, on the real core and tiny synthetic
models: the tiny model drafting for itself (its guesses are the answer), and a tiny model of
other weights (its guesses are mostly wrong). The goodput rule is set aside so every stream
drafts every tick: what is checked is drafting and verifying, not whether guesses pay."""

import dataclasses

import numpy as np
import pytest

import uma
from uma import synth
from uma.engine import draft_model
from uma.engine.draft_model import ModelDrafter
from uma.errors import InvalidModelError, InvalidRequestError
from uma.sched import speculation

from ..helpers import assert_same_greedy

PROMPTS = ["Once upon a time, in a land far away, there lived a",
           "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15",
           "def main():\n    return 0"]
N = 24


@pytest.fixture(scope="module")
def other_tiny():
    """The tiny model's shape and vocabulary with other random weights."""
    return synth.cached_model(dataclasses.replace(synth.PRESETS["tiny"], seed=7))


@pytest.fixture(scope="module")
def alone(tiny_path):
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=1) as e:
        return {p: e.generate(p, max_tokens=N, ignore_eos=True, logprobs=True) for p in PROMPTS}


def metric(e, name):
    return sum(e.snapshot()[name].values())


@pytest.fixture
def every_tick(monkeypatch):
    """Every speculating stream drafts up to five guesses every tick."""
    monkeypatch.setattr(speculation, "best_length",
                        lambda survival, proposed, *a: (min(proposed, 5), 1.0, 1.0))


def drafting_engine(tiny_path, draft, device_sampling="off", **config):
    return uma.Engine(tiny_path, n_ctx=2048, n_seq_max=4, draft_model=str(draft),
                      device_sampling=device_sampling, **config)


def cells_match(e):
    """Each running request's draft cells end where the drafter says they do."""
    drafter = e._scheduler.speculator.drafters["draft"]
    for seq, tokens in drafter._cached.values():
        assert drafter.ctx.seq_pos_max(seq) in (len(tokens) - 1, -1)


@pytest.mark.parametrize("device_sampling", ["off", "on"],
                         ids=["host-sampled", "device-sampled"])
def test_drafting_for_itself_gives_the_greedy_answer(tiny_path, alone, every_tick,
                                                     device_sampling):
    with drafting_engine(tiny_path, tiny_path, device_sampling, speculation="off") as e:
        results = [e.submit(p, max_tokens=N, ignore_eos=True, logprobs=True,
                            speculation="draft").result(60) for p in PROMPTS]
        drafted = metric(e, "spec_drafted_tokens_total")
        kept = metric(e, "spec_accepted_tokens_total")
        cells_match(e)
    for p, r in zip(PROMPTS, results, strict=True):
        assert_same_greedy(alone[p].token_ids, r.token_ids, alone[p].logprobs, r.logprobs)
        assert r.usage.completion_tokens == N
    # its own guesses: kept but where the batch's rounding parts a near-tie
    assert drafted > N and kept >= 0.9 * drafted


def test_wrong_guesses_leave_the_answer_exact(tiny_path, other_tiny, alone, every_tick):
    with drafting_engine(tiny_path, other_tiny, speculation="draft") as e:
        handles = [e.submit(p, max_tokens=N, ignore_eos=True, logprobs=True,
                            speculation="off" if i == 3 else None)
                   for i, p in enumerate(PROMPTS * 2)]
        results = [h.result(60) for h in handles]
        drafted = metric(e, "spec_drafted_tokens_total")
        kept = metric(e, "spec_accepted_tokens_total")
        cells_match(e)
        assert e.snapshot()["spec_draft_model_seconds_total"] > 0
    for p, r in zip(PROMPTS * 2, results, strict=True):
        assert_same_greedy(alone[p].token_ids, r.token_ids, alone[p].logprobs, r.logprobs)
    assert drafted > N and kept < drafted


def test_a_long_prompt_is_caught_up_in_parts(tiny_path, alone, every_tick, monkeypatch):
    """A draft that lags by more than a tick's catch-up is fed a part a tick and guesses once
    level: no tick feeds it more than its budget."""
    monkeypatch.setattr(draft_model, "CATCH_UP_SHARE", 1e-9)  # the least: two tokens a tick
    fed = []
    real = ModelDrafter.propose_many

    def counted(self, asks, tick_ms):
        before = {req.seq_id: self.behind(req) for req, _ in asks}
        out = real(self, asks, tick_ms)
        fed.append(sum(before[s] - self.behind(req) for req, _ in asks
                       for s in [req.seq_id] if s not in out))
        return out

    monkeypatch.setattr(ModelDrafter, "propose_many", counted)
    with drafting_engine(tiny_path, tiny_path) as e:
        assert e.config.speculation == "draft"  # what a draft model is for, unless told
        r = e.submit(PROMPTS[0], max_tokens=N, ignore_eos=True, logprobs=True).result(60)
        drafted = metric(e, "spec_drafted_tokens_total")
    p = PROMPTS[0]
    assert_same_greedy(alone[p].token_ids, r.token_ids, alone[p].logprobs, r.logprobs)
    assert fed and max(fed) <= 2  # two tokens a tick while it lagged
    assert drafted > 0  # and it caught up before the answer's end


def test_a_finished_request_leaves_no_draft_cells(tiny_path, every_tick):
    with drafting_engine(tiny_path, tiny_path, speculation="draft") as e:
        e.generate(PROMPTS[1], max_tokens=N, ignore_eos=True)
        drafter = e._scheduler.speculator.drafters["draft"]
        assert metric(e, "spec_drafted_tokens_total") > 0
        assert all(drafter.ctx.seq_pos_max(s) == -1 for s in range(drafter.ctx.n_seq_max))


def test_a_draft_of_another_vocabulary_is_refused(tiny_path):
    other = synth.cached_model("tiny-fim")
    with pytest.raises(InvalidModelError, match="cannot draft for .*vocabulary has"):
        uma.Engine(tiny_path, n_ctx=512, draft_model=str(other))


def test_draft_speculation_needs_a_draft_model(tiny_path):
    with pytest.raises(InvalidRequestError, match="needs a draft model"):
        uma.Engine(tiny_path, n_ctx=512, speculation="draft")
    with uma.Engine(tiny_path, n_ctx=512) as e, \
            pytest.raises(InvalidRequestError, match="this engine has none"):
        e.submit("hi", speculation="draft")


def test_greedy_guesses_do_not_depend_on_the_sampler(tiny_path, every_tick, monkeypatch):
    """The draft's rows are arg-maxed whether its logits come back or not: the same guesses
    (the prompt caught up at once, so that the drafts start at the same token)."""
    monkeypatch.setattr(draft_model, "CATCH_UP_SHARE", 1e9)
    guesses = []
    for device_sampling in ("off", "on"):
        with drafting_engine(tiny_path, tiny_path, device_sampling, speculation="draft") as e:
            drafter = e._scheduler.speculator.drafters["draft"]
            seen = []
            real = drafter.propose_many

            def kept(asks, tick_ms, real=real, seen=seen):
                out = real(asks, tick_ms)
                seen.extend(np.asarray(g).tolist() for g in out.values())
                return out

            drafter.propose_many = kept
            e.generate(PROMPTS[2], max_tokens=12, ignore_eos=True)
            guesses.append(seen)
    assert guesses[0] and guesses[0] == guesses[1]
