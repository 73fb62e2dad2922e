"""Each scheduling knob's default: its field's value in the bound policy, so what
`uma config` and docs/guide/configuration.md show is what the policy runs with and cannot drift
from it.

The knobs themselves (names, kinds, ranges, help) are uma.knobs, vocabulary that uma.config
checks EngineConfig.slo with; only their defaults need the policy, so they are read here.
"""

from __future__ import annotations

from uma.knobs import Knob, KnobValue
from uma.sched.bound import BoundPolicy

_BOUND = BoundPolicy()


def knob_default(knob: Knob) -> KnobValue:
    """What the bound policy sets the knob's field to unless told otherwise: what the
    benchmarks were measured with."""
    value: KnobValue = getattr(_BOUND, knob.name)
    return value
