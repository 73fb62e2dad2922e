"""uma.engine.background: background requests in a second context on the same weights (the real
core, a tiny synthetic model)."""

import pytest

import uma
from uma.config import EngineConfig
from uma.errors import InvalidRequestError

from ..helpers import assert_same_greedy

PROMPTS = [("Once upon a time", "background"), ("The quick brown fox", "interactive"),
           ("1 2 3 4 5 6 7 8", "background"), ("def main():", "interactive")]


def _run(engine):
    handles = [engine.submit(p, max_tokens=12, ignore_eos=True, logprobs=True, priority=c)
               for p, c in PROMPTS]
    return [h.result(timeout=60) for h in handles]


def _prompt_tokens(engine, cls):
    return sum(len(engine.tokenize(p)) for p, c in PROMPTS if c == cls)


def test_background_requests_run_in_their_own_context_with_the_same_output(tiny_path):
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=4, prefix_cache=0) as e:
        shared = _run(e)
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=4, prefix_cache=0, background_ctx=512,
                    background_seqs=2) as e:
        e.wait_ready()
        lane, streams = e._lane.scheduler, e._scheduler
        lane.trace, streams.trace = [], []
        apart = _run(e)
        # every background prompt token went through the background context, and only those
        assert sum(t[0] for t in lane.trace) == _prompt_tokens(e, "background")
        assert sum(t[0] for t in streams.trace) == _prompt_tokens(e, "interactive")
        snap = e.snapshot()
        assert snap["background_kv_cells_total"] == 512
        assert snap["background_requests_running"] == 0 and snap["background_kv_cells_used"] == 0
        assert snap["requests_length_total"] == 4  # the counters are both contexts'
        status = e.status()["background"]
        assert status["slots"] == 2 and status["kv_cells"] == {"used": 0, "total": 512}
    for a, b in zip(shared, apart, strict=True):
        assert_same_greedy(a.token_ids, b.token_ids, a.logprobs, b.logprobs)


def test_a_grant_runs_background_ticks_while_it_lasts(tiny_path):
    # No stream: the streams' policy grants the lane the idle tick, here 2 s so that several
    # 16-token chunks of the tiny model (about a millisecond each alone, tens on a loaded
    # machine) fit in one grant, and the prompt runs through several ticks of one grant.
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=2, n_batch=16, background_ctx=512,
                    background_seqs=1, slo={"idle_budget_ms": 2000}) as e:
        e.wait_ready()
        e._lane.trace = []
        bg = e.submit(list(range(10, 210)), max_tokens=4, ignore_eos=True,
                      priority="background")
        assert bg.result(timeout=60).usage.completion_tokens == 4
    # read once the engine has closed: the last grant is traced when it ends, which may be
    # after its request's last token was handed on
    grants = e._lane.trace
    assert all(granted >= 1000 for granted, _, _ in grants)  # the idle tick, less its own
    assert sum(prompt for *_, prompt in grants) == 200
    assert max(prompt for *_, prompt in grants) > 16  # more than one tick's chunk


def test_an_idle_grant_ends_at_the_next_background_tick_once_work_arrives(tiny_path):
    # As test_a_grant_runs_background_ticks_while_it_lasts, with the engine told that a
    # request is always arriving: each idle grant then runs one 16-token tick, so a new
    # interactive request waits for one background tick, not for the whole grant.
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=2, n_batch=16, background_ctx=512,
                    background_seqs=1, slo={"idle_budget_ms": 2000}) as e:
        e.wait_ready()
        e._arrived = lambda: True
        e._lane.trace = []
        bg = e.submit(list(range(10, 210)), max_tokens=4, ignore_eos=True,
                      priority="background")
        assert bg.result(timeout=60).usage.completion_tokens == 4
    prompts = [prompt for *_, prompt in e._lane.trace]  # once closed, as above
    assert sum(prompts) == 200 and max(prompts) == 16


def test_the_lane_shows_the_streams_policy_its_work(tiny_path):
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=2, background_ctx=256,
                    background_seqs=1) as e:
        e.wait_ready()
        assert e._lane.view() is None  # nothing to grant time to
        blocker = e.submit("busy", max_tokens=100_000, ignore_eos=True, priority="background")
        next(iter(blocker))
        view = e._lane.view()  # one decoder: a call moves it, whatever the chunk
        assert view is not None and 0 < view.one_ms == view.least_ms and view.read_ms == 0
        blocker.cancel()
        blocker.result(timeout=60)


@pytest.mark.parametrize("fields, message", [
    ({"background_ctx": -1}, "background_ctx must be in"),
    ({"background_seqs": 0}, "background_seqs must be in"),
    ({"background_ctx": 2, "background_seqs": 4}, "at least one position"),
])
def test_bad_background_settings_are_refused(fields, message):
    with pytest.raises(InvalidRequestError, match=message):
        EngineConfig(model="m.gguf", **fields)


def test_the_baseline_policy_grants_the_background_context_its_tick(tiny_path):
    # the unguarded reference policy gives the lane its tick budget before every tick, streams
    # or none: background requests there finish beside a stream, and alone
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=2, background_ctx=256, background_seqs=1,
                    policy="baseline") as e:
        stream = e.submit("a stream", max_tokens=32, ignore_eos=True)
        bg = e.submit("background work", max_tokens=8, ignore_eos=True, priority="background")
        assert bg.result(timeout=60).usage.completion_tokens == 8
        assert stream.result(timeout=60).usage.completion_tokens == 32
        alone = e.submit("more background", max_tokens=4, ignore_eos=True,
                         priority="background")
        assert alone.result(timeout=60).usage.completion_tokens == 4


def test_a_newcomer_interrupts_a_grant_and_the_work_is_done_again(tiny_path):
    prompt = list(range(10, 210))
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=2, n_batch=64, background_ctx=512,
                    background_seqs=1, prefix_cache=0) as e:
        undisturbed = e.generate(prompt, max_tokens=8, ignore_eos=True, logprobs=True,
                                 priority="background")
        lane = e._lane
        lane.interrupt()  # between grants: nothing to end
        assert lane.interrupts.value == 0
        step, calls = lane.scheduler.step, []

        def newcomer_mid_decode():
            # The first three background ticks each find an interactive request arriving
            # as their decode starts: it is aborted, rolled back, and the grant ends.
            calls.append(len(calls))
            if len(calls) <= 3:
                lane.interrupt()
            return step()

        lane.scheduler.step = newcomer_mid_decode
        lane.trace = []
        again = e.generate(prompt, max_tokens=8, ignore_eos=True, logprobs=True,
                           priority="background")
        assert lane.interrupts.value == 3 and len(calls) > 3
        assert e.snapshot()["background_interrupts_total"] == 3
    # each interrupted grant ran nothing (its decode aborted and rolled back); the prompt
    # went through whole afterwards (the trace read once closed, as above)
    prompts = [prompt for *_, prompt in lane.trace]
    assert prompts[:3] == [0, 0, 0] and sum(prompts) == 200
    assert_same_greedy(undisturbed.token_ids, again.token_ids, undisturbed.logprobs,
                       again.logprobs)
