"""The SLO policy's steps one by one (uma.sched.slo): each is a pure function of the snapshot
and the records of the steps before it, so each is checked on its own inputs."""

from __future__ import annotations

import dataclasses
import math

import pytest

from uma.sched import slo
from uma.sched.bmt import BmtModel
from uma.sched.cost import WIDE_ROWS, CostEstimate, row_steps
from uma.sched.slo import SloMemory, SloPolicy
from uma.sched.state import Phase

from .test_slo import BG, COST, INT, session, state

P = SloPolicy()


def run_to(step: str, sessions, **kw):
    """The records up to `step`, on a snapshot of sessions."""
    st = state(sessions, **kw)
    d = slo.lanes(P, st)
    b = slo.latency_budget(P, st, d)
    dec = slo.qos_decoders(P, st, d, b)
    a = slo.prompt_allowance(P, st, d, b, dec)
    cap = slo.bmt_guard(P, st, d, b, dec, a)
    return {"state": st, "lanes": d, "budget": b, "decoders": dec, "allowance": a,
            "cap": cap}[step] if step != "all" else (st, d, b, dec, a, cap)


def floored(policy, st):
    """The lanes, the allowance and the prompt chunks up to the background floor's."""
    d = slo.lanes(policy, st)
    b = slo.latency_budget(policy, st, d)
    dec = slo.qos_decoders(policy, st, d, b)
    a = slo.prompt_allowance(policy, st, d, b, dec)
    first = slo.first_tokens(policy, st, d, a)
    return d, a, slo.background_floor(policy, st, d, a, first, slo.prompt_chunks(
        policy, st, d, a, slo.bmt_guard(policy, st, d, b, dec, a), first))


def test_lanes_sort_sessions_by_class_and_phase_and_start_the_memory():
    sessions = [session(0, INT, Phase.DECODE), session(1, INT, Phase.PREFILL),
                session(2, BG, Phase.DECODE), session(3, BG, Phase.PREFILL)]
    d = run_to("lanes", sessions)
    assert [s.seq_id for s in d.inter_dec] == [0] and [s.seq_id for s in d.back_dec] == [2]
    assert d.back_ids == {2, 3} and d.mem.s == P.initial_s and d.mem.chunk_cap == P.min_prefill
    moe = BmtModel(1e8, 1e7, 8, 2, 1e4, 1e4)
    assert run_to("lanes", sessions, bmt=moe).mem.s == P.moe_initial_s


def test_the_budget_is_the_cap_over_the_streams_alone_or_the_idle_one():
    streams = [session(i, INT, Phase.DECODE) for i in range(3)]
    b = run_to("budget", streams)
    assert b.solo_ms == COST.predict(0, 3) and b.budget_ms == 1.2 * b.solo_ms
    assert run_to("budget", [session(5, BG, Phase.DECODE)]).budget_ms == P.idle_budget_ms
    fixed = slo.latency_budget(dataclasses.replace(P, tick_budget_ms=50.0), state(streams),
                               slo.lanes(P, state(streams)))
    assert fixed.budget_ms == 50.0


def test_the_tick_is_held_to_the_lowest_cap_of_the_apps_decoding_in_it():
    editor = dataclasses.replace(session(0, INT, Phase.DECODE), app="editor", latency_cap=1.1)
    chat = dataclasses.replace(session(1, INT, Phase.DECODE), app="chat", latency_cap=1.3)
    other = session(2, INT, Phase.DECODE)  # no cap of its own: the policy's 1.2
    solo = COST.predict(0, 2)
    assert run_to("budget", [chat, other]).budget_ms == 1.2 * solo
    assert run_to("budget", [chat, dataclasses.replace(other, latency_cap=1.25)]
                  ).budget_ms == 1.25 * solo
    assert run_to("budget", [editor, chat]).budget_ms == 1.1 * solo
    # an app's cap counts only while its stream decodes: its prompt alone sets nothing
    starting = dataclasses.replace(editor, phase=Phase.PREFILL, n_prefilled=0)
    assert run_to("lanes", [starting, chat]).cap == 1.3
    # and the p95 target the prompt allowance plans against follows the same cap
    a = run_to("allowance", [editor, chat])
    assert a.target_ms == 1.1 * COST.predict(0, 2)


def test_streams_always_decode_and_background_decoders_park_past_the_budget():
    sessions = [session(0, INT, Phase.DECODE)] + [session(i, BG, Phase.DECODE)
                                                  for i in range(1, 4)]
    dec = run_to("decoders", sessions)
    # 1.2 x (10 + 1) ms: two background rows fit (13 ms), a third would not (14 ms)
    assert [s.seq_id for s in dec.served] == [0, 1, 2]
    plan = P.schedule_tick(state(sessions))
    assert plan.notes.parked == 1 and plan.notes.parked_seqs == {3}
    starving = SloMemory(s=8, k=2, chunk_cap=16, starve=P.max_starve_ticks)
    dec = run_to("decoders", sessions, memory=starving)
    assert len(dec.served) == 4  # starving background work is not parked
    idle = run_to("decoders", [session(i, BG, Phase.DECODE) for i in range(4)])
    assert idle.k == P.burst and len(idle.served) == 4


def test_the_prompt_allowance_is_held_after_an_overrun_and_open_without_streams():
    streams = [session(0, INT, Phase.DECODE), session(9, BG, Phase.PREFILL, prompt=3000)]
    a = run_to("allowance", streams)
    assert math.isclose(a.spare_ms, 1.2 * 11.0 - 11.0)  # the budget less the decoders
    held = run_to("allowance", streams, memory=SloMemory(s=8, k=2, chunk_cap=16, hold=2))
    assert held.spare_ms == 0.0 and held.under_ms == held.pause_to_ms == 0.0
    alone = run_to("allowance", [session(9, BG, Phase.PREFILL, prompt=3000)])
    assert alone.floor_ms == math.inf and alone.spare_ms == P.idle_budget_ms - alone.decode_ms
    assert alone.target_ms == 0.0


def test_the_bandwidth_guard_caps_the_prompt_tokens():
    sessions = [session(0, INT, Phase.DECODE), session(9, BG, Phase.PREFILL, prompt=3000)]
    bmt = BmtModel(dense_bytes=1e8, expert_bytes=0.0, n_expert=0, n_expert_used=0,
                   kv_bytes_per_pos=0.0, act_bytes_per_token=1e6)
    open_cap = run_to("cap", sessions, memory=SloMemory(s=8, k=2, chunk_cap=512))
    tight = run_to("cap", sessions, memory=SloMemory(s=8, k=2, chunk_cap=512), bmt=bmt,
                   gbps=10.0)
    assert open_cap == 511 and 0 < tight < open_cap  # 512 rows less the decoder


def test_a_new_interactive_prompt_gets_a_chunk_even_while_prompts_are_held():
    sessions = [session(0, INT, Phase.DECODE), session(1, INT, Phase.PREFILL, prompt=40)]
    st, d, b, dec, a, cap = run_to("all", sessions,
                                   memory=SloMemory(s=8, k=2, chunk_cap=16, hold=3))
    first = slo.first_tokens(P, st, d, a)
    assert [(i.seq_id, i.n_tokens) for i in first.items] == [(1, 40)] and first.ms > 0


def test_background_rides_in_a_first_token_tick_only_where_asked_and_owed():
    sessions = [session(0, INT, Phase.DECODE), session(1, INT, Phase.PREFILL, prompt=40),
                session(2, BG, Phase.PREFILL, prompt=3000)]
    rides = dataclasses.replace(P, ride_share=0.5)

    def steps(policy, owed_ms):
        st, d, b, dec, a, cap = run_to("all", sessions,
                                       memory=SloMemory(s=8, k=2, chunk_cap=16, owed_ms=owed_ms))
        first = slo.first_tokens(policy, st, d, a)
        chunks = slo.prompt_chunks(policy, st, d, a, cap, first)
        return a, chunks, slo.ride_along(policy, st, d, a, first, chunks)

    a, before, rode = steps(rides, owed_ms=100.0)
    assert before.back_ms == 0  # the prompt steps gave the background prompt nothing
    # after the first tokens, adding at most ride_share of the tick
    assert [(i.seq_id, i.n_tokens) for i in rode.prefill] == [(1, 40), (2, 31)]
    assert 0 < rode.back_ms == rode.prefill_ms - before.prefill_ms \
        <= 0.5 * (a.decode_ms + before.prefill_ms)
    # no more than what the floor is owed
    assert steps(rides, owed_ms=5.0)[2].back_ms <= 5.0
    # off by default, and nothing rides where nothing is owed
    assert steps(P, owed_ms=100.0)[2] == before
    assert steps(rides, owed_ms=0.0)[2] == before


def test_with_rides_a_floor_chunk_of_its_own_waits_for_two_chunks_owed():
    streams = [session(i, INT, Phase.DECODE) for i in range(3)]
    back = session(9, BG, Phase.PREFILL, prompt=3000)
    rides = dataclasses.replace(P, ride_share=0.5)

    def floor(policy, owed_ms):  # held after an overrun: only the floor moves prompts
        st, d, b, dec, a, cap = run_to("all", [*streams, back], memory=SloMemory(
            s=8, k=2, chunk_cap=16, hold=3, owed_ms=owed_ms))
        first = slo.first_tokens(policy, st, d, a)
        c = slo.background_floor(policy, st, d, a, first,
                                 slo.prompt_chunks(policy, st, d, a, cap, first))
        return c.floor_ms, [i.seq_id for i in c.prefill]

    chunk_ms, _ = floor(P, 0.0)
    assert floor(P, 1.01 * chunk_ms)[1] == [9]
    assert floor(rides, 1.01 * chunk_ms)[1] == []  # waits for a new prompt's tick to ride
    assert floor(rides, 2 * chunk_ms)[1] == [9]  # until the debt reaches its cap


def test_a_floor_chunk_grows_past_the_wide_edge_where_wide_ticks_score_cheaper():
    # ggml's CPU flash attention, roughly: fewer than 64 rows score prompt tokens one query row
    # at a time, ten times the tiled path's price past them.
    narrow = CostEstimate(fixed_ms=14.0, per_prefill_ms=0.5, per_decode_ms=1.6,
                          per_kv_kpos_ms=2.0, per_prompt_kv_kpos_ms=6.0)
    wide = dataclasses.replace(narrow, per_prompt_kv_wide_kpos_ms=0.6)
    streams = [session(i, INT, Phase.DECODE) for i in range(3)]
    back = session(9, BG, Phase.PREFILL, prompt=3000, prefilled=1500)

    def floor(cost, owed_ms):  # held after an overrun: only the floor moves prompts
        st = dataclasses.replace(state([*streams, back], memory=SloMemory(
            s=8, k=2, chunk_cap=16, hold=3, owed_ms=owed_ms)), cost=cost)
        c = floored(P, st)[2]
        return c.floor_ms, [i.n_tokens for i in c.prefill if i.seq_id == 9], c.prefill_ms

    chunk_ms, _, _ = floor(narrow, 0.0)
    _, small, _ = floor(narrow, 2 * chunk_ms)
    assert 0 < small[0] < WIDE_ROWS - 3  # one price: what the chunk's time buys, narrow
    # the wide price: the chunk grows past the edge, and waits until its own time is owed
    assert floor(wide, 1.01 * chunk_ms)[1] == []
    _, grown, grown_ms = floor(wide, 2 * chunk_ms)
    assert grown[0] > WIDE_ROWS - 3 and grown[0] >= 2 * small[0]
    assert chunk_ms < grown_ms <= 2 * chunk_ms + 1e-9


# Vulkan on an H100, roughly (uma.sched.cost): past eight rows the matrix kernels cost a step,
# and a tick whose rows are not a power of two pays a ragged price on top.
EVEN = CostEstimate(fixed_ms=4.0, per_prefill_ms=0.05, per_decode_ms=0.1,
                    row_steps_ms=row_steps(r8=9.0, r32=5.0, r64=15.0),
                    ragged_ms=(4.0, 6.0, 20.0, 8.0))


def test_a_ragged_tick_takes_the_background_tokens_that_even_it_out_where_that_costs_nothing():
    streams = [session(i, INT, Phase.DECODE) for i in range(7)]
    new = session(7, INT, Phase.PREFILL, prompt=32)  # 7 decoders + 32 prompt tokens: 39 rows

    def planned(cost, back_prompt=3000, policy=P):
        sessions = [*streams, new, session(9, BG, Phase.PREFILL, prompt=back_prompt)]
        st = dataclasses.replace(state(sessions, memory=SloMemory(s=8, k=2, chunk_cap=16)),
                                 cost=cost)
        d, a, c = floored(policy, st)
        return c, slo.even_out(policy, st, d, a, c)

    before, even = planned(EVEN)
    assert [(i.seq_id, i.n_tokens) for i in before.prefill] == [(7, 32)]
    # 25 background tokens take the tick to 64 rows: predicted shorter than the 39 alone
    assert [(i.seq_id, i.n_tokens) for i in even.prefill] == [(7, 32), (9, 25)]
    assert even.prefill_ms < before.prefill_ms
    assert even.back_ms == 0.0  # the floor counts it as free, not as less than nothing
    # where a ragged tick costs nothing more (a CPU), or with the knob off, nothing changes
    flat = planned(dataclasses.replace(EVEN, ragged_ms=()))
    assert flat[1] == flat[0] and [i.seq_id for i in flat[0].prefill] == [7]
    assert planned(EVEN, policy=dataclasses.replace(P, even_rows=False))[1] == before
    # a background prompt too short to fill the rows is passed over
    assert planned(EVEN, back_prompt=20)[1] == planned(EVEN, back_prompt=20)[0]


def test_a_floor_chunk_grows_where_twice_its_time_moves_floor_growth_times_the_tokens_per_ms():
    back = session(9, BG, Phase.PREFILL, prompt=6000, prefilled=0)
    st = dataclasses.replace(state([back]), cost=EVEN)
    # beside eight decoders 21 ms buys 56 tokens (64 rows, 16.8 ms); twice that buys 248 (256
    # rows, 41.4 ms: the steps past 8, 32 and 64 rows paid once), 1.8x the tokens per ms
    assert slo.grown_floor_chunk(P, st, back, 8, 21.0) == (248, pytest.approx(41.4))
    assert slo.grown_floor_chunk(dataclasses.replace(P, floor_growth=2.0), st, back, 8, 21.0) \
        == (56, 21.0)
    # a prompt with fewer tokens left than the grown chunk grows only as far as it goes
    short = dataclasses.replace(back, n_prompt=100)
    assert slo.grown_floor_chunk(P, st, short, 8, 21.0) == (56, 21.0)
