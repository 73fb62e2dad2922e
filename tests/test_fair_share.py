"""Fair share between apps on the real core: an app arriving during another's flood gets a
sequence at the next tick, the request parked for it resumes with the same tokens, and a
parked request can be cancelled."""

import pytest

import uma

from .helpers import assert_same_greedy

FLOOD = [f"Job {k}: summarise the harbour's log for the day. " * 3 for k in range(4)]
QUESTION = "What is a lighthouse?"
OPTS = {"max_tokens": 32, "ignore_eos": True, "logprobs": True}


@pytest.fixture(scope="module")
def alone(tiny_path):
    """Each prompt's greedy tokens, undisturbed."""
    with uma.Engine(tiny_path, n_ctx=2048, n_seq_max=2, prefix_cache=0) as e:
        return {p: e.generate(p, **OPTS) for p in [*FLOOD, QUESTION]}


def same(expected, got):
    assert_same_greedy(expected.token_ids, got.token_ids, expected.logprobs, got.logprobs)


def flood_then_question(e: uma.Engine):
    flood = [e.submit(p, app="batch", **OPTS) for p in FLOOD]
    for h in flood[:2]:  # both sequences are the flood's
        next(iter(h))
    question = e.submit(QUESTION, app="editor", **OPTS)
    return flood, question


@pytest.mark.parametrize("fair_share", [True, False])
def test_an_app_arriving_during_a_flood_does_not_wait_behind_it(tiny_path, alone, fair_share):
    with uma.Engine(tiny_path, n_ctx=2048, n_seq_max=2, fair_share=fair_share) as e:
        flood, question = flood_then_question(e)
        asked = question.result(timeout=60)
        done = [h.result(timeout=60) for h in flood]
        snap = e.snapshot()
    # every request, the parked one too, has its undisturbed tokens
    for p, r in zip(FLOOD, done, strict=True):
        same(alone[p], r)
    same(alone[QUESTION], asked)
    # the per-app metrics add up: requests, tokens, and the tick time shared out
    assert snap["app_requests_total"] == {"batch": 4, "editor": 1}
    assert snap["app_tokens_total"] == {"batch": 4 * 32, "editor": 32}
    assert {app: h["count"] for app, h in snap["app_ttft_ms"].items()} == {"batch": 4, "editor": 1}
    service = snap["app_service_ms_total"]
    assert set(service) == {"batch", "editor"} and service["batch"] > service["editor"] > 0
    assert sum(service.values()) == pytest.approx(1e3 * snap["tick_seconds_total"], rel=1e-6)
    queued = [r.timings.admitted_ns for r in done[2:]]
    if fair_share:  # the question got a sequence before the flood's queued requests
        assert asked.timings.admitted_ns < min(queued)
        assert snap["fair_parked_total"] >= 1
    else:  # first come, first served: it waited for them
        assert asked.timings.admitted_ns > min(queued)
        assert snap["fair_parked_total"] == 0


def test_a_parked_request_can_be_cancelled(tiny_path):
    with uma.Engine(tiny_path, n_ctx=2048, n_seq_max=2) as e:
        flood, question = flood_then_question(e)
        next(iter(question))  # admitted: one of the flood's two was parked for it
        assert e.snapshot()["fair_parked_total"] == 1
        for h in flood:
            h.cancel()
        # the parked one (the flood's newest running) and the queued ones end cancelled
        assert all(h.result(timeout=60).finish_reason == "cancelled" for h in flood[1:])
        assert question.result(timeout=60).finish_reason == "length"
        ex = e._scheduler
        assert not ex.running and not any(ex.waiting.values())
        assert sorted(ex.free_seqs) == [0, 1]  # every sequence back
        again = e.generate(QUESTION, app="editor", max_tokens=4)
    assert again.finish_reason == "length"


def ended_ns(r: uma.Result) -> float:
    t = r.timings
    return t.admitted_ns - t.queue_ms * 1e6 + t.total_ms * 1e6


def test_apps_outnumbering_the_sequences_take_turns_with_their_own_tokens(tiny_path):
    long, short = {"max_tokens": 96, "ignore_eos": True}, {"max_tokens": 12, "ignore_eos": True}
    with uma.Engine(tiny_path, n_ctx=2048, n_seq_max=1, prefix_cache=0) as e:
        want_long, want_short = e.generate(FLOOD[0], **long), e.generate(QUESTION, **short)
    # one sequence, two apps, a tiny quantum: they swap every few ticks
    with uma.Engine(tiny_path, n_ctx=2048, n_seq_max=1, fair_quantum_ms=0.01) as e:
        a = e.submit(FLOOD[0], app="batch", **long)
        next(iter(a))
        b = e.submit(QUESTION, app="editor", **short)
        got_short, got_long = b.result(timeout=60), a.result(timeout=60)
        snap = e.snapshot()
    assert got_long.token_ids == want_long.token_ids
    assert got_short.token_ids == want_short.token_ids
    # b did not wait for a's 96 tokens: it got the sequence in turn and ended first
    assert ended_ns(got_short) < ended_ns(got_long)
    assert snap["fair_parked_total"] >= 1


def test_an_apps_weight_and_latency_cap_come_from_the_settings(tiny_path):
    with uma.Engine(tiny_path, n_ctx=512, n_seq_max=1, app_weights="editor=3",
                    app_latency_caps={"editor": 1.1}) as e:
        editor = e.submit(QUESTION, app="editor", max_tokens=1)._request
        other = e.submit(QUESTION, app="chat", max_tokens=1, weight=0.5)._request
        assert (editor.weight, editor.latency_cap) == (3.0, 1.1)
        assert (other.weight, other.latency_cap) == (0.5, 0.0)  # 0: the policy's own cap
        assert editor.view().latency_cap == 1.1
