"""Each scheduling knob's default: its field's value in the policy that has it (the bound
policy first, then the older SLO guard), so what `uma run --help` and `uma config` show is
what the policies run with and cannot drift from them.

The knobs themselves (names, kinds, ranges, help) are uma.knobs, vocabulary that uma.config
checks EngineConfig.slo with; only their defaults need the policies, so they are read here.
"""

from __future__ import annotations

from uma.knobs import Knob, KnobValue
from uma.sched.bound import BoundPolicy
from uma.sched.slo import SloPolicy

_BOUND, _SLO = BoundPolicy(), SloPolicy()
_BOUND_FIELDS = frozenset(_BOUND.__dataclass_fields__)


def knob_default(knob: Knob) -> KnobValue:
    """What the policy that has the knob's field sets it to unless told otherwise: what the
    benchmarks were measured with."""
    policy = _BOUND if knob.name in _BOUND_FIELDS else _SLO
    value: KnobValue = getattr(policy, knob.name)
    return value
