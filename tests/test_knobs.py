"""The scheduling knobs: the table covers the policies, and values are checked by kind and
range with the knob named."""

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
from uma.sched.slo import SloPolicy

# name is the policy's; latency_cap and tick_budget_ms are engine settings of their own
NOT_KNOBS = {"name", "latency_cap", "tick_budget_ms"}


def test_the_table_covers_every_policy_field_once():
    fields = ({f.name for f in dataclasses.fields(SloPolicy)}
              | {f.name for f in dataclasses.fields(BoundPolicy)}) - NOT_KNOBS
    names = [k.name for k in KNOBS]
    assert len(names) == len(set(names))
    assert set(names) == fields, "a policy field without a row in uma.knobs (or back)"


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_each_knob_has_a_kind_a_range_holding_its_default_and_a_short_help(knob):
    # the table states kinds (uma.config checks with it, below the policies): each must be
    # its field's type in the policy that has it
    policy = BoundPolicy if knob.name in {f.name for f in dataclasses.fields(BoundPolicy)} \
        else SloPolicy
    assert knob.kind is typing.get_type_hints(policy)[knob.name]
    default = knob_default(knob)
    assert type(default) is knob.kind
    assert (knob.range is None) == (knob.kind is bool)  # a switch has no range
    assert knob.range is None or default in knob.range
    assert knob.help and len(knob.help) <= 110 and "\n" not in knob.help


def test_knobs_given_reach_the_policy_the_engine_builds():
    config = EngineConfig(model="m.gguf", latency_cap=1.5,
                          slo={"pause_factor": 2, "hold_on_decode_overrun": False,
                               "ttft_burst_tokens": 0, "background_share": 0.3})
    policy = create_policy("slo", config)
    assert isinstance(policy, SloPolicy)
    assert policy.pause_factor == 2.0 and type(policy.pause_factor) is float
    assert policy.hold_on_decode_overrun is False
    assert (policy.ttft_burst_tokens, policy.background_share) == (0, 0.3)
    assert policy.latency_cap == 1.5 and policy.pause_share == SloPolicy.pause_share
    hash(config)  # still frozen and hashable


def test_no_knobs_is_the_default_policy():
    assert SloPolicy.from_config(EngineConfig(model="m.gguf")) == SloPolicy()


def test_pairs_and_mappings_come_out_the_same_in_table_order():
    pairs = check_knobs([("ttft_burst_tokens", 64), ("pause_share", 0)])
    assert pairs == (("pause_share", 0.0), ("ttft_burst_tokens", 64))
    assert check_knobs({"pause_share": 0, "ttft_burst_tokens": 64}) == pairs
    assert EngineConfig(model="m", slo=pairs) == EngineConfig(model="m", slo=dict(pairs))


@pytest.mark.parametrize(("values", "message"), [
    ({"pause_factor": 0.5}, "pause_factor must be >= 1, not 0.5"),
    ({"idle_budget_ms": 0}, "idle_budget_ms must be > 0, not 0"),
    ({"quantile": 1.0}, "quantile must be in (0, 1), not 1.0"),
    ({"quantile": 0}, "quantile must be in (0, 1), not 0"),
    ({"background_share": 0.91}, "background_share must be in [0, 0.9], not 0.91"),
    ({"background_share": -0.01}, "background_share must be in [0, 0.9], not -0.01"),
    ({"ttft_burst_tokens": 2**20 + 1}, "ttft_burst_tokens must be in [0, 1048576], not 1048577"),
    ({"pause_window": 0}, "pause_window must be in [1, 10000], not 0"),
    ({"pause_window": 2.0}, "pause_window must be an integer, not a number"),
    ({"hold_ticks": True}, "hold_ticks must be an integer, not a boolean"),
    ({"pause_factor": True}, "pause_factor must be a number, not a boolean"),
    ({"pause_factor": "2"}, "pause_factor must be a number, not a string"),
    ({"pause_factor": math.inf}, "pause_factor must be finite, not inf"),
    ({"climb_deadband": math.nan}, "climb_deadband must be finite, not nan"),
    ({"hold_on_decode_overrun": 1}, "hold_on_decode_overrun must be true or false, not 1"),
    ({"pause_facter": 2.0}, "unknown slo knob(s) 'pause_facter'; known: idle_budget_ms, "),
    ({"latency_cap": 2.0}, "unknown slo knob(s) 'latency_cap'"),
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
    ("pause_factor", 1), ("quantile", 0.999), ("step_amortise", 0.0), ("pause_window", 1),
])
def test_the_bounds_themselves_are_taken_where_the_range_is_closed(name, value):
    assert check_knobs({name: value}) == ((name, BY_NAME[name].kind(value)),)
