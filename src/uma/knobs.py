"""The scheduling policy's knobs: every field of the bound policy a user may set, its kind,
its valid range, what raising it buys and costs, and whether it is a `uma run` flag.

Each knob is a daemon setting of the same name (`background_share` in uma.toml, also in its
`[slo]` table; UMA_BACKGROUND_SHARE; docs/guide/configuration.md, "Scheduling policy"), and
EngineConfig.slo holds the ones given, checked by check_knobs. The few a user may need are
also flags (`--background-share`); the rest are for experts, in the file or the environment.

The table is vocabulary, below the policies, so that uma.config checks the knobs without
importing the scheduler (which imports uma.config). What only the policy knows, each knob's
default, is read from it by uma.sched.knob_defaults; tests/test_knobs.py fails when a field of
the bound policy has no row here, a row names no field of it, or a row's kind is not its
field's. latency_cap and tick_budget_ms are settings of their own (EngineConfig fields), and
`name` is the policy's, not a knob. The baseline policy reads tick_ms alone; the background
context (uma.engine.background) is granted its time by the bound policy, under the same knobs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from uma import checks
from uma.errors import InvalidRequestError

KnobValue = float | int | bool

# Counts of ticks, tokens or decoders: far past any useful value, and small enough that the
# policy's arithmetic on them stays cheap.
MAX_COUNT = 1 << 20


@dataclass(frozen=True)
class Range:
    """Numbers from low to high; an open end leaves its bound out. A range of integers holds
    whole numbers only (counts of ticks, tokens or decoders), and makes its knob an int."""

    low: float
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    integers: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        """As an error message puts it: '>= 1', '> 0', 'in [0, 0.9]', 'in (0, 1)'."""
        if self.high == math.inf:
            return f"{'>' if self.low_open else '>='} {_show(self.low)}"
        return (f"in {'(' if self.low_open else '['}{_show(self.low)}, {_show(self.high)}"
                f"{')' if self.high_open else ']'}")


@dataclass(frozen=True)
class Knob:
    name: str  # the policy field, and the setting's name
    range: Range | None  # the values allowed (None: a switch)
    help: str  # what it does, and what raising it buys and costs (one line)
    flag: bool = False  # also a `uma run` flag (the few a user may need)

    @property
    def kind(self) -> type:
        """int, float or bool: the field's type in its policy (a switch is a bool, a range of
        integers an int)."""
        if self.range is None:
            return bool
        return int if self.range.integers else float


COUNT = Range(0, MAX_COUNT, integers=True)
POSITIVE_COUNT = Range(1, MAX_COUNT, integers=True)
SHARE = Range(0, 1)
FACTOR = Range(1)  # times something, never less than it

KNOBS: tuple[Knob, ...] = (
    Knob("idle_budget_ms", Range(0, low_open=True),
         "tick ms while no stream decodes", flag=True),
    Knob("gap_ms", Range(0, low_open=True),
         "longest stream gap in ms (or gap_factor x their p95 alone)", flag=True),
    Knob("gap_factor", FACTOR,
         "worst interactive gap, x the streams' p95 alone (or gap_ms): higher moves "
         "background sooner, longer stalls"),
    Knob("gap_margin", FACTOR,
         "pauses are planned to the worst gap / this at least: higher is safer against "
         "mispredictions, shorter pauses"),
    Knob("max_pause_rate", SHARE,
         "most ticks that may run past the p95 line: higher moves background faster, risks "
         "the p95"),
    Knob("min_pause_rate", SHARE,
         "pause rate kept when the streams' own tail uses up the p95's room: higher moves "
         "background, risks p95"),
    Knob("quantile", Range(0, 1, low_open=True, high_open=True),
         "stream gap percentile latency_cap is held at: higher guards more of the tail, leaves "
         "fewer pauses"),
    Knob("tail_margin", SHARE,
         "share of ticks kept free of pauses below 1 - quantile: higher is a safer p95, fewer "
         "background pauses"),
    Knob("min_prefill", POSITIVE_COUNT,
         "the slow start's first background prompt chunk: higher ramps up sooner, risks a "
         "misjudged large chunk"),
    Knob("background_share", Range(0, 0.9),
         "least share of the streams' time owed to background work "
         "(0: none)", flag=True),
    Knob("idle_amortise", Range(0),
         "idle ticks stretch until a prompt chunk's work is this x its cache read: higher is "
         "faster prompts, later TTFT"),
    Knob("ttft_burst_tokens", COUNT,
         "interactive prompts this short go in whole while streams decode (0: off): higher "
         "is faster TTFT, longer pauses"),
    Knob("ttft_stretch", Range(1),
         "longer interactive prompts' first token within this x their time in whole: lower "
         "is sooner, longer ticks"),
)
BY_NAME = {k.name: k for k in KNOBS}


def check_knobs(
        values: Mapping[str, object] | Iterable[tuple[str, object]],
) -> tuple[tuple[str, KnobValue], ...]:
    """The knobs given, as (name, value) pairs in the table's order, each checked: a known
    name, a value of its kind (true or false for a switch, an integer for a count, a finite
    number for the rest) within its range. Raises InvalidRequestError naming the first bad one
    ('gap_factor must be >= 1, not 0.5')."""
    try:
        given = dict(values)
    except (TypeError, ValueError):
        raise InvalidRequestError(
            "slo must map knob names to values, or be (name, value) pairs") from None
    unknown = sorted(repr(name) for name in given if name not in BY_NAME)
    if unknown:
        raise InvalidRequestError(f"unknown slo knob(s) {', '.join(unknown)}; known: "
                                  f"{', '.join(BY_NAME)}")
    return tuple((k.name, _checked(k, given[k.name])) for k in KNOBS if k.name in given)


def _checked(knob: Knob, value: object) -> KnobValue:
    if knob.kind is bool:
        if not isinstance(value, bool):
            raise InvalidRequestError(f"{knob.name} must be true or false, not {value!r}")
        return value
    # bool is an int to Python, never to a user: uma.checks refuses it
    number = (checks.integer(knob.name, value) if knob.kind is int
              else checks.number(knob.name, value))
    if knob.range is not None and number not in knob.range:
        raise InvalidRequestError(f"{knob.name} must be {knob.range}, not {value}")
    return number


def _show(bound: float) -> str:
    return str(int(bound)) if bound == int(bound) else repr(bound)
