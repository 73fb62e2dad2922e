"""The scheduling knobs: the table covers the bound policy's fields, and values are checked by
kind and range with the knob named."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from uma.config import EngineConfig
from uma.errors import InvalidRequestError
from uma.knobs import BY_NAME, KNOBS, check_knobs
from uma.sched.bound import BoundPolicy
from uma.sched.knob_defaults import knob_default
from uma.sched.policies import create_policy

# name is the policy's; latency_cap and tick_budget_ms are engine settings of their own
NOT_KNOBS = {"name", "latency_cap", "tick_budget_ms"}
BOUND_FIELDS = {f.name for f in dataclasses.fields(BoundPolicy)}


def test_the_table_covers_every_field_of_the_bound_policy_once():
    names = [k.name for k in KNOBS]
    assert len(names) == len(set(names))
    assert set(names) == BOUND_FIELDS - NOT_KNOBS, \
        "a field of the bound policy without a row in uma.knobs, or a row no policy reads"


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_each_knob_has_a_kind_a_range_holding_its_default_and_a_short_help(knob):
    # the table states kinds (uma.config checks with it, below the policies): each must be
    # its field's type in the bound policy
    assert knob.kind is typing.get_type_hints(BoundPolicy)[knob.name]
    default = knob_default(knob)
    assert type(default) is knob.kind
    assert default == getattr(BoundPolicy(), knob.name)
    assert (knob.range is None) == (knob.kind is bool)  # a switch has no range
    assert knob.range is None or default in knob.range
    assert knob.help and len(knob.help) <= 110 and "\n" not in knob.help


def test_knobs_given_reach_the_policy_the_engine_builds():
    config = EngineConfig(model="m.gguf", latency_cap=1.5,
                          slo={"gap_factor": 3, "ttft_burst_tokens": 0,
                               "background_share": 0.45})
    policy = create_policy("bound", config)
    assert isinstance(policy, BoundPolicy)
    assert policy.gap_factor == 3.0 and type(policy.gap_factor) is float
    assert (policy.ttft_burst_tokens, policy.background_share) == (0, 0.45)
    assert policy.latency_cap == 1.5 and policy.gap_margin == BoundPolicy().gap_margin
    hash(config)  # still frozen and hashable


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_every_knob_given_changes_the_bound_policy(knob):
    default = knob_default(knob)
    if knob.kind is bool:
        value: object = not default
    else:
        value = next(knob.kind(v) for v in (default * 1.5, default / 2, default + 1)
                     if knob.range is not None and v in knob.range
                     and v != default and knob.kind(v) == v)
    policy = create_policy("bound", EngineConfig(model="m.gguf", slo={knob.name: value}))
    assert getattr(policy, knob.name) == value != default


def test_no_knobs_is_the_default_policy():
    assert BoundPolicy.from_config(EngineConfig(model="m.gguf")) == BoundPolicy()


def test_pairs_and_mappings_come_out_the_same_in_table_order():
    pairs = check_knobs([("ttft_burst_tokens", 64), ("max_pause_rate", 0)])
    assert pairs == (("max_pause_rate", 0.0), ("ttft_burst_tokens", 64))
    assert check_knobs({"max_pause_rate": 0, "ttft_burst_tokens": 64}) == pairs
    assert EngineConfig(model="m", slo=pairs) == EngineConfig(model="m", slo=dict(pairs))


@pytest.mark.parametrize(("values", "message"), [
    ({"gap_factor": 0.5}, "gap_factor must be >= 1, not 0.5"),
    ({"idle_budget_ms": 0}, "idle_budget_ms must be > 0, not 0"),
    ({"quantile": 1.0}, "quantile must be in (0, 1), not 1.0"),
    ({"quantile": 0}, "quantile must be in (0, 1), not 0"),
    ({"background_share": 0.91}, "background_share must be in [0, 0.9], not 0.91"),
    ({"background_share": -0.01}, "background_share must be in [0, 0.9], not -0.01"),
    ({"ttft_burst_tokens": 2**20 + 1}, "ttft_burst_tokens must be in [0, 1048576], not 1048577"),
    ({"min_prefill": 0}, "min_prefill must be in [1, 1048576], not 0"),
    ({"min_prefill": 2.0}, "min_prefill must be an integer, not a number"),
    ({"ttft_burst_tokens": True}, "ttft_burst_tokens must be an integer, not a boolean"),
    ({"gap_factor": True}, "gap_factor must be a number, not a boolean"),
    ({"gap_factor": "2"}, "gap_factor must be a number, not a string"),
    ({"gap_factor": math.inf}, "gap_factor must be finite, not inf"),
    ({"tail_margin": math.nan}, "tail_margin must be finite, not nan"),
    ({"gap_facter": 2.0}, "unknown slo knob(s) 'gap_facter'; known: idle_budget_ms, "),
    ({"latency_cap": 2.0}, "unknown slo knob(s) 'latency_cap'"),
    # the older guard's knobs went with it
    ({"pause_factor": 2.0}, "unknown slo knob(s) 'pause_factor'"),
    ({"hold_on_decode_overrun": False}, "unknown slo knob(s) 'hold_on_decode_overrun'"),
    (5, "slo must map knob names to values"),
])
def test_bad_values_are_refused_naming_the_knob(values, message):
    with pytest.raises(InvalidRequestError) as info:
        check_knobs(values)
    assert str(info.value).startswith(message), str(info.value)
    with pytest.raises(InvalidRequestError):
        EngineConfig(model="m.gguf", slo=values)


@pytest.mark.parametrize(("name", "value"), [
    ("background_share", 0.9), ("background_share", 0), ("ttft_burst_tokens", 2**20),
    ("gap_factor", 1), ("quantile", 0.999), ("idle_amortise", 0.0), ("min_prefill", 1),
])
def test_the_bounds_themselves_are_taken_where_the_range_is_closed(name, value):
    assert check_knobs({name: value}) == ((name, BY_NAME[name].kind(value)),)
