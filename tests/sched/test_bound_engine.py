"""The bound policy on the real core: plan membership under a prompt storm, end to end."""

import uma
from uma.sched.state import Phase

from ..helpers import assert_same_greedy


def test_interactive_streams_are_served_every_tick_while_a_long_prompt_prefills(tiny_path):
    opts = {"ignore_eos": True, "logprobs": True}
    with uma.Engine(tiny_path, n_ctx=4096, n_seq_max=4, policy="bound") as e:
        alone = [e.generate(p, max_tokens=40, **opts) for p in ("first stream", "second one")]
        e._scheduler.trace = trace = []
        streams = [e.submit(p, max_tokens=40, **opts) for p in ("first stream", "second one")]
        for s in streams:  # both are decoding once each has a token
            next(iter(s))
        inter_seqs = set(e._scheduler.running)  # only the two streams hold sequences now
        storm = e.submit(" ".join(f"w{i}" for i in range(700)), max_tokens=4,
                         priority="background")
        results = [s.result(timeout=120) for s in streams]
        assert storm.result(timeout=120).finish_reason == "length"
    assert len(inter_seqs) == 2
    # From the tick after the streams' last prompt chunk (a first token reaches its handle
    # before the scheduler records the tick that sampled it).
    start = 1 + max(k for k, (*_, plan) in enumerate(trace) if any(
        i.phase is Phase.PREFILL and i.seq_id in inter_seqs for i in plan.items))
    # While the streams run, every tick that prefills the storm also serves both of them.
    during = [plan for *_, plan in trace[start:]
              if inter_seqs <= {i.seq_id for i in plan.items}
              or any(i.phase is Phase.PREFILL for i in plan.items)]
    storm_ticks = [p for p in during if any(i.phase is Phase.PREFILL for i in p.items)]
    assert storm_ticks
    last_stream_tick = max(k for k, p in enumerate(during)
                           if inter_seqs & {i.seq_id for i in p.items})
    for plan in during[:last_stream_tick]:
        if any(i.phase is Phase.PREFILL for i in plan.items):
            assert inter_seqs <= {i.seq_id for i in plan.items if i.phase is Phase.DECODE}
    for a, r in zip(alone, results, strict=True):
        assert_same_greedy(a.token_ids, r.token_ids, a.logprobs, r.logprobs)


def test_a_short_interactive_prompt_goes_in_whole_beside_streams_and_a_long_prompt(tiny_path):
    # TTFT first: with two streams decoding and a background prompt prefilling, a new short
    # interactive prompt is computed in one tick, and no background chunk goes before it.
    with uma.Engine(tiny_path, n_ctx=4096, n_seq_max=4, policy="bound") as e:
        streams = [e.submit(p, max_tokens=60, ignore_eos=True) for p in ("first", "second")]
        for s in streams:
            next(iter(s))
        storm = e.submit(" ".join(f"w{i}" for i in range(400)), max_tokens=2,
                         priority="background")
        e._scheduler.trace = trace = []
        newcomer = e.submit("a short question about the weather", max_tokens=2)
        n_prompt = len(e._tokens("a short question about the weather"))
        assert newcomer.result(timeout=120).finish_reason in ("length", "stop")
        newcomer_seq = next(i.seq_id for *_, plan in trace for i in plan.items
                            if i.phase is Phase.PREFILL and i.n_tokens == n_prompt
                            and i.logits)
        for s in streams:
            s.cancel()
        storm.result(timeout=120)
    chunks = [(k, i) for k, (*_, plan) in enumerate(trace) for i in plan.items
              if i.seq_id == newcomer_seq and i.phase is Phase.PREFILL]
    assert len(chunks) == 1 and chunks[0][1].n_tokens == n_prompt
    # beside both streams' rows; a background chunk may share the tick, after the newcomer's
    # prompt in the policy's order (tests/sched/test_bound.py), though the batch lays rows out
    # by sequence id (Scheduler.build)
    plan = trace[chunks[0][0]][-1]
    decoding = {i.seq_id for i in plan.items if i.phase is Phase.DECODE}
    assert len(decoding - {newcomer_seq}) >= 2
