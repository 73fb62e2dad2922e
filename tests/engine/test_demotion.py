"""Demotion at a token boundary on the real core: an interactive request that finds every
sequence held by background work gets one at the next tick, and the background request set
aside for it resumes with the tokens it would have had undisturbed."""

import pytest

import uma

from ..helpers import assert_same_greedy

JOBS = [f"Job {k}: summarise the harbour's log for the day. " * 3 for k in range(3)]
QUESTION = "What is a lighthouse?"
OPTS = {"max_tokens": 32, "ignore_eos": True, "logprobs": True}
# the jobs run long enough that none ends while the test's thread submits the question, even
# on a loaded machine (a job that ended first gave its sequence to the queued one)
JOB_OPTS = {**OPTS, "max_tokens": 256}


@pytest.fixture(scope="module")
def alone(tiny_path):
    """Each prompt's greedy tokens, undisturbed."""
    with uma.Engine(tiny_path, n_ctx=2048, n_seq_max=2, prefix_cache=0) as e:
        return {p: e.generate(p, **(OPTS if p == QUESTION else JOB_OPTS))
                for p in [*JOBS, QUESTION]}


def finished_ns(r: uma.Result) -> float:
    """When it ended, on the monotonic clock of admitted_ns."""
    t = r.timings
    return t.admitted_ns + (t.total_ms - t.queue_ms) * 1e6


def jobs_then_question(e: uma.Engine):
    """Background jobs hold both sequences (one more queued); then one app's question."""
    jobs = [e.submit(p, priority="background", app="editor", **JOB_OPTS) for p in JOBS]
    for h in jobs[:2]:
        next(iter(h))
    return jobs, e.submit(QUESTION, app="editor", **OPTS)


# prefix_cache 0: the job set aside prefills its prompt and tokens again; 8: the cache keeps
# its cells and it resumes from them
@pytest.mark.parametrize("prefix_cache", [0, 8])
def test_an_interactive_request_takes_a_background_sequence_at_the_next_tick(
        tiny_path, alone, prefix_cache):
    with uma.Engine(tiny_path, n_ctx=2048, n_seq_max=2, prefix_cache=prefix_cache) as e:
        jobs, question = jobs_then_question(e)
        asked = question.result(timeout=60)
        done = [h.result(timeout=60) for h in jobs]
        snap = e.snapshot()
    assert snap["demotions_total"] == 1 and snap["fair_parked_total"] == 0
    # the question ran before the jobs ended: admitted before the queued job, and done
    # before the job set aside
    assert asked.timings.admitted_ns < done[2].timings.admitted_ns
    assert sum(finished_ns(r) > finished_ns(asked) for r in done) >= 2
    for p, r in zip(JOBS, done, strict=True):
        assert_same_greedy(alone[p].token_ids, r.token_ids, alone[p].logprobs, r.logprobs)
    assert_same_greedy(alone[QUESTION].token_ids, asked.token_ids, alone[QUESTION].logprobs,
                       asked.logprobs)


def test_with_preempt_at_token_off_the_question_waits_for_the_jobs(tiny_path):
    with uma.Engine(tiny_path, n_ctx=2048, n_seq_max=2, preempt_at_token=False) as e:
        jobs, question = jobs_then_question(e)
        asked = question.result(timeout=60)
        done = [h.result(timeout=60) for h in jobs]
        snap = e.snapshot()
    assert snap["demotions_total"] == 0
    # both running jobs ended before it had a sequence
    assert asked.timings.admitted_ns > min(finished_ns(r) for r in done[:2])
