"""The SLO policy's decisions over recorded traces: every plan (batch items, the memory it
hands on, its notes) equals the recorded one.

The traces are simulated ticks over mixed workloads (interactive and background decoders and
prompts arriving and finishing, CPU- and GPU-like cost models, noise, ΣBMT guards, an MoE),
each state fed the previous plan's memory and a measured time, as the executor would. They pin
down behaviour while the policy's code is reshaped; a change that means to alter decisions
regenerates them (UMA_REGENERATE_GOLDEN=1) and says so in its commit.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import random
from pathlib import Path

import pytest

from uma.sched.bmt import BmtModel
from uma.sched.cost import CostEstimate, row_steps
from uma.sched.slo import SloMemory, SloPolicy
from uma.sched.state import Phase, Plan, Priority, SchedulerState, SessionView

from .test_slo import advanced

GOLDEN = Path(__file__).with_name("data") / "slo_golden.json"

COSTS = {
    "cpu": CostEstimate(fixed_ms=5.8, per_prefill_ms=0.92, per_decode_ms=1.8, per_kv_kpos_ms=2.0,
                        row_steps_ms=row_steps(r1=0.3, r16=1.2), per_prompt_kv_kpos_ms=2.0),
    "gpu": CostEstimate(fixed_ms=6.0, per_prefill_ms=0.01, per_decode_ms=0.05,
                        per_kv_kpos_ms=0.02, row_steps_ms=row_steps(r8=0.45, r32=2.0, r64=1.0),
                        per_prompt_kv_kpos_ms=0.01),
}
BMT = BmtModel(dense_bytes=2.5e8, expert_bytes=0.0, n_expert=0, n_expert_used=0,
               kv_bytes_per_pos=36864.0, act_bytes_per_token=1e5)
MOE = dataclasses.replace(BMT, expert_bytes=3e7, n_expert=8, n_expert_used=2)
SCENARIOS = [  # name, cost, seed, ticks, policy options, bmt, bandwidth
    ("cpu-storm", "cpu", 1, 300, {}, None, 0.0),
    ("gpu-storm", "gpu", 2, 300, {}, None, 0.0),
    ("cpu-mixed-bmt", "cpu", 3, 250, {}, BMT, 20.0),
    ("moe", "cpu", 4, 200, {}, MOE, 0.0),
    ("fixed-budget", "cpu", 5, 200, {"tick_budget_ms": 25.0}, None, 0.0),
]


def _trace(cost_name, seed, ticks, options, bmt, gbps):
    """(state, plan) of each simulated tick."""
    rng = random.Random(seed)
    cost = COSTS[cost_name]
    policy = SloPolicy(**options)
    # A steady start: streams and background decoders already running, a long prompt queued.
    sessions = [SessionView(
        seq_id=i, rid=i, phase=Phase.DECODE if i < 6 else Phase.PREFILL,
        priority=Priority.INTERACTIVE if i < 3 else Priority.BACKGROUND,
        n_prompt=2000 if i == 6 else 32, n_prefilled=0 if i == 6 else 32, n_generated=1,
        n_past=0 if i == 6 else 32, arrival_ns=0, first_token_ns=0, last_token_ns=0)
        for i in range(7)]
    next_id = len(sessions)
    memory, last_ms, last_tokens = None, 0.0, 0
    out = []
    for tick in range(ticks):
        while len(sessions) < 8 and rng.random() < 0.08:  # arrivals
            prio = Priority.INTERACTIVE if rng.random() < 0.6 else Priority.BACKGROUND
            prompt = rng.choice([8, 40, 200, 1500] if prio is Priority.INTERACTIVE
                                else [64, 600, 3000])
            sessions.append(SessionView(
                seq_id=next_id % 16, rid=next_id, phase=Phase.PREFILL, priority=prio,
                n_prompt=prompt, n_prefilled=0, n_generated=0, n_past=0, arrival_ns=tick,
                first_token_ns=0, last_token_ns=0))
            next_id += 1
        state = SchedulerState(
            now_ns=tick * 1_000_000, sessions=tuple(sessions), n_waiting=0, n_batch=512,
            n_seq_max=16, decode_ms_ewma=last_ms, cost=cost, tick=tick, last_tick_ms=last_ms,
            last_tick_tokens=last_tokens, memory=memory,
            decode_noise=1.0 + 0.1 * rng.random(), prompt_noise=1.0 + 0.3 * rng.random(),
            alone_p95_ratio=1.0 + 0.2 * rng.random() if tick > 20 else 0.0,
            alone_ratios=tuple(sorted(1.0 + 0.4 * rng.random() for _ in range(32)))
            if tick > 20 else (), bmt=bmt, bmt_budget_gbps=gbps)
        plan = policy.schedule_tick(state)
        out.append((state, plan))
        by_seq = {s.seq_id: s for s in sessions}
        n_prefill = sum(i.n_tokens for i in plan.items if i.phase is Phase.PREFILL)
        n_decode = sum(1 for i in plan.items if i.phase is Phase.DECODE)
        last_ms = cost.predict(n_prefill, n_decode) * (0.9 + 0.5 * rng.random() ** 3)
        last_tokens = sum(1 for i in plan.items if i.logits)
        memory = plan.memory
        for item in plan.items:
            by_seq[item.seq_id] = advanced(by_seq[item.seq_id], item)
        sessions = [by_seq[s.seq_id] for s in sessions
                    if not (by_seq[s.seq_id].n_generated >= 64 and rng.random() < 0.3)]
    return out


def _plain(value):
    """A JSON-ready copy: dataclasses as dicts, enums as their values."""
    if hasattr(value, "_asdict"):  # a NamedTuple record
        return {k: _plain(v) for k, v in value._asdict().items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, frozenset):
        return sorted(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _record(plan: Plan) -> dict:
    return {"items": _plain(plan.items), "token_budget": plan.token_budget,
            "notes": _plain(plan.notes), "memory": _plain(plan.memory)}


def _traces() -> dict[str, list[dict]]:
    return {name: [_record(plan) for _, plan in _trace(cost, seed, ticks, options, bmt, gbps)]
            for name, cost, seed, ticks, options, bmt, gbps in SCENARIOS}


if os.environ.get("UMA_REGENERATE_GOLDEN"):
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(_traces(), separators=(",", ":")))


@pytest.mark.parametrize("scenario", [s[0] for s in SCENARIOS])
def test_the_policy_decides_what_it_decided_when_recorded(scenario):
    recorded = json.loads(GOLDEN.read_text())[scenario]
    name, cost, seed, ticks, options, bmt, gbps = next(s for s in SCENARIOS if s[0] == scenario)
    now = [_record(plan) for _, plan in _trace(cost, seed, ticks, options, bmt, gbps)]
    assert len(now) == len(recorded)
    for tick, (got, want) in enumerate(zip(now, recorded, strict=True)):
        # The notes recorded then; figures added since are not in the recording.
        got["notes"] = {k: v for k, v in got["notes"].items() if k in want["notes"]}
        assert json.loads(json.dumps(got)) == want, f"{scenario}: tick {tick} differs"


def test_the_traces_exercise_the_policys_branches():
    plans = [p for s in SCENARIOS for _, p in _trace(*s[1:])]
    notes = [p.notes for p in plans]
    assert any(n.guard_active for n in notes)  # a hold after an overrun
    assert any(n.parked for n in notes)  # background decoders parked
    assert any(p.memory.starve >= SloPolicy().max_starve_ticks for p in plans)  # a rescue
    assert len({p.memory.s for p in plans}) > 1  # the hill-climb moved S
    assert any(n.credit_ms > 0 for n in notes)  # saved time


def test_memory_round_trips():
    assert SloMemory(**_plain(SloMemory(s=3, credit_ms=1.5))) == SloMemory(s=3, credit_ms=1.5)
