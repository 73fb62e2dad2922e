"""The SLO policy on synthetic snapshots and a simulated executor with a known cost."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uma.sched.bmt import BmtModel
from uma.sched.cost import CostEstimate, row_steps
from uma.sched.policy import ttft_chunk_ms
from uma.sched.slo import SloMemory, SloPolicy
from uma.sched.state import Phase, Plan, Priority, SchedulerState, SessionView

# A CPU-like machine: a decode step of n sequences costs 10 + 1·n ms, a prompt token 0.5 ms.
COST = CostEstimate(fixed_ms=10.0, per_prefill_ms=0.5, per_decode_ms=1.0, per_kv_kpos_ms=0.0)
INT, BG = Priority.INTERACTIVE, Priority.BACKGROUND


def session(seq, priority, phase, *, prompt=20, prefilled=None, generated=1, n_past=None):
    prefilled = prompt if phase is Phase.DECODE else (prefilled or 0)
    return SessionView(seq_id=seq, rid=seq, phase=phase, priority=priority, n_prompt=prompt,
                       n_prefilled=prefilled, n_generated=generated,
                       n_past=n_past if n_past is not None else prefilled, arrival_ns=seq,
                       first_token_ns=0, last_token_ns=0)


def advanced(s: SessionView, item) -> SessionView:
    """The session after a tick ran its batch item: a prompt chunk, or a decoded token."""
    if item.phase is Phase.PREFILL:
        done = s.n_prefilled + item.n_tokens
        return dataclasses.replace(s, n_prefilled=done, n_past=done,
                                   phase=Phase.DECODE if done >= s.n_prompt else Phase.PREFILL)
    return dataclasses.replace(s, n_past=s.n_past + 1, n_generated=s.n_generated + 1)


def state(sessions, *, tick=0, memory=None, last_ms=0.0, bmt=None, gbps=0.0, n_batch=512):
    return SchedulerState(now_ns=0, sessions=tuple(sessions), n_waiting=0, n_batch=n_batch,
                          n_seq_max=64, decode_ms_ewma=0.0, cost=COST, tick=tick,
                          last_tick_ms=last_ms, last_tick_tokens=0, memory=memory, bmt=bmt,
                          bmt_budget_gbps=gbps)


def simulate(policy, sessions, ticks, cost=COST):
    """Runs plans against the known cost; returns the plans and the simulated tick times."""
    sessions = list(sessions)
    memory, last_ms, plans, times = None, 0.0, [], []
    for t in range(ticks):
        plan = policy.schedule_tick(state(sessions, tick=t, memory=memory, last_ms=last_ms))
        decode = sum(1 for i in plan.items if i.phase is Phase.DECODE)
        prefill = plan.n_tokens - decode
        last_ms = cost.predict(prefill, decode)
        plans.append(plan)
        times.append(last_ms)
        memory = plan.memory
        by_seq = {i.seq_id: i for i in plan.items}
        for k, s in enumerate(sessions):  # advance what the plan ran
            item = by_seq.get(s.seq_id)
            if item and item.phase is Phase.PREFILL:
                done = s.n_prefilled + item.n_tokens
                phase = Phase.DECODE if done >= s.n_prompt else Phase.PREFILL
                sessions[k] = dataclasses.replace(s, n_prefilled=done, n_past=done, phase=phase)
            elif item:
                sessions[k] = dataclasses.replace(s, n_past=s.n_past + 1,
                                                  n_generated=s.n_generated + 1)
    return plans, times


def decoders(plan: Plan, priority_of) -> set[int]:
    return {i.seq_id for i in plan.items if i.phase is Phase.DECODE}


def test_interactive_decoders_are_served_every_tick_under_a_prompt_storm():
    inter = [session(i, INT, Phase.DECODE) for i in range(3)]
    storm = [session(10, BG, Phase.PREFILL, prompt=3000)]
    plans, times = simulate(SloPolicy(), inter + storm, 60)
    solo = COST.predict(0, 3)
    for plan, ms in zip(plans, times, strict=True):
        assert {0, 1, 2} <= decoders(plan, None)
        assert ms <= 1.2 * solo + 1e-9 or plan.notes.guard_active is False
    assert max(times) <= 1.2 * solo + COST.per_prefill_ms * 16  # at worst a rescue chunk
    # ... and the background prompt still progresses.
    assert sum(i.n_tokens for p in plans for i in p.items if i.seq_id == 10) > 100


def test_prefill_fits_the_predicted_budget():
    inter = [session(0, INT, Phase.DECODE)]
    back = [session(5, BG, Phase.PREFILL, prompt=5000)]
    plan = SloPolicy().schedule_tick(state(inter + back))
    n_prefill = sum(i.n_tokens for i in plan.items if i.phase is Phase.PREFILL)
    assert COST.predict(n_prefill, 1) <= 1.2 * COST.predict(0, 1) + 1e-9
    assert plan.notes.budget_ms == 1.2 * COST.predict(0, 1)


def test_an_overrun_holds_prompts_back_then_lets_them_in_gradually():
    policy = SloPolicy(hold_ticks=3, ramp_steps=2)
    sessions = [session(0, INT, Phase.DECODE), session(5, BG, Phase.PREFILL, prompt=5000)]
    first = policy.schedule_tick(state(sessions))
    budget = first.notes.budget_ms
    memory, prefill = first.memory, []
    for t, last in enumerate([budget * 3] + [budget] * 6):
        plan = policy.schedule_tick(state(sessions, tick=t + 1, memory=memory, last_ms=last))
        memory = plan.memory
        prefill.append(sum(i.n_tokens for i in plan.items if i.phase is Phase.PREFILL))
    full = sum(i.n_tokens for i in first.items if i.phase is Phase.PREFILL)
    assert prefill[:4] == [0, 0, 0, 0]  # the overrun tick's plan and H=3 more
    assert 0 < prefill[4] < full and prefill[5] == full


def test_a_decode_only_overrun_holds_prompts_only_if_the_policy_says_so():
    # A tick that carried no prompt tokens and still overran is the host's noise: holding
    # prompts back cannot prevent the next one, and wipes the time saved for a pause.
    sessions = [session(0, INT, Phase.DECODE), session(5, BG, Phase.PREFILL, prompt=5000)]
    budget = SloPolicy().schedule_tick(state(sessions)).notes.budget_ms
    after = SloMemory(s=8, budget_ms=budget, last_prefill=0, chunk_cap=16, credit_ms=4.0)
    held, kept = (SloPolicy(hold_on_decode_overrun=h).schedule_tick(
        state(sessions, tick=1, memory=after, last_ms=3 * budget)) for h in (True, False))
    assert held.memory.hold and not any(i.seq_id == 5 for i in held.items)
    assert not kept.memory.hold and any(i.seq_id == 5 for i in kept.items)
    assert held.memory.overruns == kept.memory.overruns == 1  # counted either way


def test_prompt_chunks_grow_only_as_fast_as_ticks_prove_them():
    # The policy believes a prompt token costs 0.02 ms; it really costs 0.5 ms. Trusting the
    # model, the first idle tick would take all 512 batch slots: a 266 ms tick.
    believed = dataclasses.replace(COST, per_prefill_ms=0.02)
    policy = SloPolicy(idle_budget_ms=50.0)
    sessions = [session(5, BG, Phase.PREFILL, prompt=20000)]
    memory, last_ms, chunks, times = None, 0.0, [], []
    for t in range(12):
        plan = policy.schedule_tick(dataclasses.replace(
            state(sessions, tick=t, memory=memory, last_ms=last_ms), cost=believed))
        n = plan.n_tokens
        last_ms = COST.predict(n, 0)
        memory = plan.memory
        chunks.append(n)
        times.append(last_ms)
        sessions = [dataclasses.replace(sessions[0], n_prefilled=sessions[0].n_prefilled + n,
                                        n_past=sessions[0].n_past + n)]
    assert chunks[:4] == [16, 32, 64, 128]  # doubling while the ticks hold their budget
    assert chunks[4] == 64  # 128 tokens overran the 50 ms idle budget: halved
    assert max(times) <= 2 * policy.idle_budget_ms


def test_background_decoders_are_capped_and_rotated_fairly():
    back = [session(i, BG, Phase.DECODE) for i in range(10)]
    policy = SloPolicy(initial_s=4, burst=1, climb_window=10**9)
    served = [decoders(policy.schedule_tick(state(back, tick=t)), None) for t in range(10)]
    assert all(len(s) == 4 for s in served)
    counts = [sum(i in s for s in served) for i in range(10)]
    assert max(counts) - min(counts) <= 1


def test_bursts_keep_a_background_decoder_for_k_ticks():
    back = [session(i, BG, Phase.DECODE) for i in range(6)]
    policy = SloPolicy(initial_s=2, burst=3, climb_window=10**9)
    served = [decoders(policy.schedule_tick(state(back, tick=t)), None) for t in range(6)]
    assert served[0] == served[1] == served[2] != served[3] == served[4] == served[5]


def climb(policy, sessions, rate_of, ticks):
    """Runs the policy with each tick taking 10 ms and yielding rate_of(s, k, tick) × 1000
    tokens (a relative rate); returns the (S, k) of every plan."""
    memory, out = None, []
    for t in range(ticks):
        snap = dataclasses.replace(state(sessions, tick=t, memory=memory, last_ms=10.0),
                                   last_tick_tokens=round(1000 * rate_of(*out[-1], t))
                                   if out else 0)
        plan = policy.schedule_tick(snap)
        memory = plan.memory
        out.append((memory.s, memory.k))
    return out


def test_k_climbs_to_longer_bursts_when_they_raise_throughput():
    back = [session(i, BG, Phase.DECODE) for i in range(4)]
    policy = SloPolicy(initial_s=4)
    steps = climb(policy, back, lambda s, k, t: 1 + 0.1 * k, 16 * 40)
    assert steps[0][1] == policy.burst and steps[-1][1] == policy.max_burst


def test_k_stays_put_while_interactive_streams_decode():
    mixed = [session(0, INT, Phase.DECODE)] + [session(i, BG, Phase.DECODE) for i in (1, 2)]
    steps = climb(SloPolicy(), mixed, lambda s, k, t: 1 + 0.1 * k, 16 * 20)
    assert {k for _, k in steps} == {SloPolicy().burst}


def test_noise_within_the_deadband_does_not_turn_a_climb_around():
    back = [session(i, BG, Phase.DECODE) for i in range(16)]

    def noisy(s, k, t):  # no real optimum: ±1 %, turning every three windows
        return 1.0 + (0.01 if (t // 48) % 2 else -0.01)

    s_steps = [s for s, _ in climb(SloPolicy(initial_s=4), back, noisy, 16 * 24)]
    assert s_steps == sorted(s_steps) and s_steps[-1] > 4  # one way, up to its bound
    loose = [s for s, _ in climb(SloPolicy(initial_s=4, climb_deadband=0.0), back, noisy,
                                 16 * 24)]
    assert loose != sorted(loose)  # without it, every worse window reverses the climb


def test_a_new_interactive_request_starts_at_the_next_tick():
    busy = [session(i, BG, Phase.DECODE) for i in range(4)]
    busy.append(session(9, BG, Phase.PREFILL, prompt=3000))
    newcomer = session(20, INT, Phase.PREFILL, prompt=12)
    plan = SloPolicy().schedule_tick(state([*busy, newcomer]))
    first = next(i for i in plan.items if i.phase is Phase.PREFILL)
    assert first.seq_id == 20 and first.n_tokens == 12 and first.logits


def test_interactive_prompts_progress_even_while_held():
    sessions = [session(0, INT, Phase.DECODE), session(1, INT, Phase.PREFILL, prompt=1000)]
    held = state(sessions, memory=SloMemory(s=8, hold=5, ramp=0.0))
    # the newcomer may stretch the decoder's tick to pause_factor × its solo time...
    policy = SloPolicy(ttft_stretch=1e6)  # (a stretch so long it never decides)
    plan = policy.schedule_tick(held)
    solo = COST.predict(0, 1)
    floor = int((policy.pause_factor * solo - solo) / COST.per_prefill_ms)
    assert [(i.seq_id, i.n_tokens) for i in plan.items if i.phase is Phase.PREFILL] == \
        [(1, floor)]
    # ... or further, where its first token would come later than the stretch allows
    plan = SloPolicy().schedule_tick(held)
    assert [i.n_tokens for i in plan.items if i.phase is Phase.PREFILL][0] > floor


def test_the_stretch_chunk_finishes_the_prompt_in_the_time_left():
    # In chunks of c ms, each paying the overhead, a prompt of `work` ms takes
    # work / (c - overhead) ticks of beside + c: at c = ttft_chunk_ms exactly the time left.
    for work, overhead, beside, left in [(390, 10, 18, 627), (100, 0, 30, 160),
                                         (1000, 25, 5, 2060)]:
        c = ttft_chunk_ms(work, overhead, beside, left)
        assert overhead < c < work + overhead
        assert work / (c - overhead) * (beside + c) == pytest.approx(left)
    assert ttft_chunk_ms(100, 5, 0, 500) == math.inf  # nothing beside it: in whole
    assert ttft_chunk_ms(100, 5, 10, 115) == math.inf  # due: in whole


def test_the_bandwidth_guard_trims_prompt_chunks():
    bmt = BmtModel(dense_bytes=100e6, expert_bytes=0, n_expert=0, n_expert_used=0,
                   kv_bytes_per_pos=0, act_bytes_per_token=1e6)
    sessions = [session(0, INT, Phase.DECODE), session(5, BG, Phase.PREFILL, prompt=5000)]
    policy = SloPolicy(tick_budget_ms=40.0)  # time alone allows (40 - 11) / 0.5 = 58 tokens
    proven = SloMemory(chunk_cap=512)  # past the slow start
    loose = policy.schedule_tick(state(sessions, memory=proven))
    # 40 ms × 3 GB/s = 120 MB: the weights and 20 tokens' activations
    tight = policy.schedule_tick(state(sessions, memory=proven, bmt=bmt, gbps=3.0))
    n = [sum(i.n_tokens for i in p.items if i.phase is Phase.PREFILL) for p in (loose, tight)]
    assert n == [58, 19]


def test_moe_starts_from_a_lower_s():
    moe = BmtModel(1e6, 1e6, 8, 2, 0, 0)
    back = [session(i, BG, Phase.DECODE) for i in range(8)]
    plan = SloPolicy().schedule_tick(state(back, bmt=moe))
    assert plan.notes.s == SloPolicy().moe_initial_s
    assert moe.tick_bytes(1, 0) < moe.tick_bytes(4, 0) == moe.tick_bytes(100, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([INT, BG]), st.sampled_from(list(Phase)),
                          st.integers(1, 400)), min_size=1, max_size=12))
def test_nothing_starves_and_interactive_decoders_are_always_served(spec):
    sessions = [session(i, p, ph, prompt=n) for i, (p, ph, n) in enumerate(spec)]
    policy = SloPolicy(max_starve_ticks=8)
    plans, _ = simulate(policy, sessions, 40)
    inter_dec = {s.seq_id for s in sessions if s.priority is INT and s.phase is Phase.DECODE}
    for plan in plans:
        assert inter_dec <= decoders(plan, None)
        assert plan.n_tokens <= 512
    # Background work as a whole progresses at least once every max_starve_ticks + 1 ticks.
    background = {s.seq_id for s in sessions if s.priority is BG}
    if background:
        moved = [any(i.seq_id in background for i in p.items) for p in plans]
        assert all(any(moved[t:t + 9]) for t in range(len(moved) - 8))


# A GPU-like device: leaving the decode graph for any prompt token costs more than a tick's
# spare time, so background prompts can only go in on saved time, in ticks past the budget.
GPU = CostEstimate(fixed_ms=2.5, per_prefill_ms=0.04, per_decode_ms=0.05,
                   row_steps_ms=row_steps(r8=1.4))
# The pause mechanics on their own: the background floor (tested below) pays background work
# in pauses of its own, longer than pause_factor allows the saved time.
NO_FLOOR = SloPolicy(background_share=0.0)


def gpu_storm(policy, cost, ticks, alone=()):
    """Eight interactive decoders and a long background prompt on a simulated GPU, with
    `alone` the streams' measured tick ratios without background work: the background tokens
    each tick took, and whether the tick went past its budget."""
    sessions = [session(i, INT, Phase.DECODE) for i in range(8)]
    sessions.append(session(10, BG, Phase.PREFILL, prompt=100000))
    memory, last_ms, over, chunks = None, 0.0, [], []
    for t in range(ticks):
        plan = policy.schedule_tick(dataclasses.replace(
            state(sessions, tick=t, memory=memory, last_ms=last_ms), cost=cost,
            alone_ratios=tuple(sorted(alone)), alone_p95_ratio=1.0 if alone else 0.0))
        memory = plan.memory
        n = sum(i.n_tokens for i in plan.items if i.seq_id == 10)
        last_ms = cost.predict(n, 8)
        over.append(last_ms > plan.notes.budget_ms + 1e-9)
        assert last_ms <= policy.pause_factor * cost.predict(0, 8) + 1e-9
        chunks.append(n)
        done = sessions[-1].n_prefilled + n
        sessions[-1] = dataclasses.replace(sessions[-1], n_prefilled=done, n_past=done)
    return chunks, over


def test_ticks_past_the_budget_stay_rare_and_the_background_prompt_still_moves():
    chunks, over = gpu_storm(NO_FLOOR, GPU, 1000)
    # 4 in 100 on saved time, and at most one starvation rescue
    assert all(sum(over[t:t + 100]) <= 5 for t in range(900))
    assert sum(chunks) > 500


def test_pauses_take_only_the_share_of_ticks_the_streams_own_tail_leaves():
    # Alone, 3 % of the streams' ticks already run past latency_cap × their p95: of the 5 %
    # the p95 allows, 1.5 % is left for pauses (less the margin), one tick in a hundred.
    tail = [1.0] * 194 + [2.0] * 6
    _, over = gpu_storm(NO_FLOOR, GPU, 1000, alone=tail)
    assert all(sum(over[t:t + 100]) <= 2 for t in range(900))  # one, and a rescue
    _, free = gpu_storm(NO_FLOOR, GPU, 1000, alone=[1.0] * 200)
    assert max(sum(free[t:t + 100]) for t in range(900)) >= 4  # no tail: the full 4 %


def test_only_ticks_past_the_line_the_p95_is_judged_at_use_the_pause_share():
    cost = dataclasses.replace(GPU, row_steps_ms=row_steps(r8=0.3))
    sessions = [session(i, INT, Phase.DECODE) for i in range(8)]
    sessions.append(session(10, BG, Phase.PREFILL, prompt=100000))
    solo = cost.predict(0, 8)
    line = 1.2 * solo * 1.5  # latency_cap × the streams' p95 alone (1.5x solo)

    def tick(credit_ms, jitter=1.0, alone=1.5):
        plan = SloPolicy().schedule_tick(dataclasses.replace(
            state(sessions, memory=SloMemory(s=8, credit_ms=credit_ms, chunk_cap=512)),
            cost=cost, alone_p95_ratio=alone, decode_noise=jitter))
        return plan.notes.predicted_ms, plan.memory.over_mask & 1

    predicted, counted = tick(1.5)
    assert 1.2 * solo < predicted < line and not counted  # past the budget, not the line
    predicted, counted = tick(50.0)
    assert 1.2 * solo < predicted <= line and not counted  # saved time goes under it first
    # With the line at the budget, nothing worth the step fits under it: a pause, counted.
    predicted, counted = tick(50.0, alone=1.0)
    assert predicted > 1.2 * solo and counted
    # measured ticks' spread lowers the line: saved time goes under that
    predicted, counted = tick(50.0, jitter=1.25)
    assert line / 1.25 - 0.1 < predicted <= line / 1.25 and not counted


def test_background_chunks_that_would_be_mostly_step_wait_for_saved_time():
    # The step fits the spare time, but the few tokens that fit with it would not amortise it.
    cost = dataclasses.replace(GPU, row_steps_ms=row_steps(r8=0.3))
    chunks, _ = gpu_storm(NO_FLOOR, cost, 400)
    taken = sorted(n for n in chunks if n)
    median = taken[len(taken) // 2] if taken else 0
    assert taken and cost.prefill_ms(median, 0, 8) - cost.chunk_overhead_ms(0, 8, median) >= 0.3
    assert len(taken) < 0.1 * len(chunks)
    # without the rule, nearly every tick pays the step for a handful of tokens
    loose, _ = gpu_storm(dataclasses.replace(NO_FLOOR, step_amortise=0.0), cost, 400)
    assert sum(1 for n in loose if 0 < n < 8) > 0.5 * len(loose)


def test_measured_decode_jitter_widens_the_pause():
    sessions = [session(i, INT, Phase.DECODE) for i in range(8)]
    sessions.append(session(10, BG, Phase.PREFILL, prompt=100000))
    saved = SloMemory(s=8, credit_ms=100.0, chunk_cap=512)
    chunks = []
    for noise in (1.0, 1.5):
        plan = SloPolicy().schedule_tick(dataclasses.replace(
            state(sessions, memory=saved), cost=GPU, decode_noise=noise))
        chunks.append(sum(i.n_tokens for i in plan.items if i.seq_id == 10))
    solo = GPU.predict(0, 8)
    assert chunks == [GPU.chunk_tokens(1.8 * solo - solo),
                      GPU.chunk_tokens(1.8 * 1.5 * solo - solo)]


def test_background_rides_along_in_a_tick_a_new_interactive_prompt_stretches():
    decoding = [session(i, INT, Phase.DECODE) for i in range(8)]
    storm = session(10, BG, Phase.PREFILL, prompt=100000)
    newcomer = session(11, INT, Phase.PREFILL, prompt=12)
    busy = SloMemory(s=8, credit_ms=100.0, chunk_cap=512, over_mask=(1 << 100) - 1)

    def storm_tokens(sessions):
        plan = SloPolicy().schedule_tick(dataclasses.replace(
            state(sessions, memory=busy), cost=GPU))
        return sum(i.n_tokens for i in plan.items if i.seq_id == 10), plan.memory.over_mask & 1

    assert storm_tokens(decoding + [storm]) == (0, 0)  # too many recent ticks past budget
    tokens, counted = storm_tokens(decoding + [storm, newcomer])
    assert tokens > 0 and not counted  # riding along costs the pause share nothing


# A CPU-like device: one prompt token deep into a long prompt costs more than a tick's spare
# time beside three decoders (900 positions in, 8.7 ms against 3.8).
CPU = CostEstimate(fixed_ms=7.5, per_prefill_ms=1.0, per_decode_ms=3.6, per_kv_kpos_ms=6.0,
                   per_prompt_kv_kpos_ms=2.6)


def test_saved_time_is_spent_under_the_p95_line_when_pauses_are_used_up():
    # No pauses and no rescues: before saved time could be spent under the line, a prompt whose
    # next token costs more than a tick's spare never moved at all.
    policy = SloPolicy(pause_share=0.0, min_pause_share=0.0, max_starve_ticks=10**9)
    sessions = [session(i, INT, Phase.DECODE, n_past=40) for i in range(3)]
    back = session(10, BG, Phase.PREFILL, prompt=100000, prefilled=900)
    solo = CPU.predict(0, 3, 3 * 41)  # each row reads its 40 positions and itself
    line = 1.2 * solo * 1.5  # latency_cap × the streams' p95 alone, 1.5x their solo time
    memory, prompt_ms = None, 0.0
    for t in range(400):
        plan = policy.schedule_tick(dataclasses.replace(
            state(sessions + [back], tick=t, memory=memory), cost=CPU, alone_p95_ratio=1.5))
        memory = plan.memory
        n = sum(i.n_tokens for i in plan.items if i.seq_id == 10)
        assert plan.notes.predicted_ms <= line + 1e-9 and not memory.over_mask
        prompt_ms += CPU.prefill_ms(n, back.n_past)
        back = dataclasses.replace(back, n_prefilled=back.n_prefilled + n,
                                   n_past=back.n_past + n)
    # what the budget leaves a tick, every tick, less the credit still saved
    spare = 1.2 * solo - solo
    assert prompt_ms >= 400 * spare - line




def test_a_starving_prompt_deep_in_its_cache_gets_a_chunk_that_amortises_the_read():
    # 2,000 positions in, reading the cache costs 20 ms: more than any pause leaves here, so
    # nothing but the rescue moves the prompt, and a one-token rescue would pay the read whole.
    cpu = dataclasses.replace(CPU, per_kv_kpos_ms=10.0, per_prompt_kv_kpos_ms=1.0,
                              per_prefill_ms=2.0)
    sessions = [session(i, INT, Phase.DECODE, n_past=40) for i in range(3)]
    back = session(10, BG, Phase.PREFILL, prompt=100000, prefilled=2000)
    starving = SloMemory(s=8, starve=SloPolicy().max_starve_ticks, chunk_cap=512)
    plan = SloPolicy().schedule_tick(dataclasses.replace(
        state(sessions + [back], memory=starving), cost=cpu, alone_p95_ratio=1.2))
    n = sum(i.n_tokens for i in plan.items if i.seq_id == 10)
    overhead = cpu.chunk_overhead_ms(2000)
    assert cpu.prefill_ms(n, 2000) - overhead >= overhead  # work at least its overhead
    assert cpu.prefill_ms(n - 1, 2000) - overhead < overhead  # and no more than that takes


def test_background_prompt_ticks_that_stray_further_are_planned_further_under_the_line():
    sessions = [session(i, INT, Phase.DECODE, n_past=40) for i in range(3)]
    sessions.append(session(10, BG, Phase.PREFILL, prompt=100000, prefilled=100))
    saved = SloMemory(s=8, credit_ms=100.0, chunk_cap=512, over_mask=(1 << 100) - 1)
    target = 1.2 * 1.5 * CPU.predict(0, 3, 3 * 41)  # latency_cap × p95 alone × solo
    predicted = []
    for noise in (1.0, 1.3):
        plan = SloPolicy().schedule_tick(dataclasses.replace(
            state(sessions, memory=saved), cost=CPU, alone_p95_ratio=1.5, prompt_noise=noise))
        predicted.append(plan.notes.predicted_ms)
    # each up to its line, one more token (under 5 ms here) would cross it
    assert target - 5 < predicted[0] <= target
    assert target / 1.3 - 5 < predicted[1] <= target / 1.3


def test_lone_background_work_moves_whatever_a_mispriced_model_predicts():
    """A cost model that learned a 191 ms step on an overloaded CPU priced every tick past the
    idle budget: a lone background prompt or decoder was never planned, no tick ran to
    correct the model, and the compute thread spun on empty plans. With nothing else in the
    tick there is no one to protect: they go in."""
    inflated = dataclasses.replace(COST, fixed_ms=191.0)
    policy = SloPolicy()
    for phase in (Phase.PREFILL, Phase.DECODE):
        lone = session(0, BG, phase, prompt=4)
        snapshot = dataclasses.replace(state([lone]), cost=inflated)
        plan = policy.schedule_tick(snapshot)
        assert [i.seq_id for i in plan.items] == [0], phase
