"""The scheduling policies' knobs: every policy field a user may set, its kind, its valid
range, what raising it buys and costs, and whether it is a `uma run` flag.

Each knob is a daemon setting of the same name (`background_share` in uma.toml, also in its
`[slo]` table; UMA_BACKGROUND_SHARE; docs/CONFIG.md, "Scheduling policy"), and
EngineConfig.slo holds the ones given, checked by check_knobs. The few a user may need are
also flags (`--background-share`); the rest are for experts, in the file or the environment.

The table is vocabulary, below the policies, so that uma.config checks the knobs without
importing the scheduler (which imports uma.config). What only the policies know, each knob's
default, is read from them by uma.sched.knob_defaults; tests/sched/test_knobs.py fails when a
policy field has no row here, or a row's kind is not its field's. latency_cap and
tick_budget_ms are settings of their own (EngineConfig fields), and `name` is the policy's,
not a knob.
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
         "tick budget in ms while no stream decodes: higher moves background work faster, "
         "delays first tokens", flag=True),
    Knob("gap_ms", Range(0, low_open=True),
         "worst interactive gap in ms (or gap_factor x the p95 alone, if larger): higher "
         "moves background sooner", flag=True),
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
    Knob("pause_factor", FACTOR,
         "longest tick while streams decode, x their p95 alone: higher takes prompts in larger "
         "chunks, stalls longer"),
    Knob("pause_share", SHARE,
         "most of recent ticks background work may push past the p95 line: higher moves it "
         "faster, more late tokens"),
    Knob("min_pause_share", SHARE,
         "pause share kept when the streams' own tail uses up the p95's room: higher moves "
         "background, risks p95"),
    # the pause record is a bit mask this long
    Knob("pause_window", Range(1, 10_000, integers=True),
         "ticks the pause share is counted over: longer lets pauses bunch up (share x window "
         "< 1: no pauses)"),
    Knob("quantile", Range(0, 1, low_open=True, high_open=True),
         "stream gap percentile latency_cap is held at: higher guards more of the tail, leaves "
         "fewer pauses"),
    Knob("tail_margin", SHARE,
         "share of ticks kept free of pauses below 1 - quantile: higher is a safer p95, fewer "
         "background pauses"),
    Knob("hold_ticks", COUNT,
         "ticks without prompt tokens after an overrun: higher lets streams recover longer, "
         "delays prompts"),
    Knob("hold_on_decode_overrun", None,
         "also hold prompts after an overrun of a tick without any: on kept the p95, off moves "
         "prompts sooner"),
    Knob("ramp_steps", POSITIVE_COUNT,
         "ticks to let prompt time back in after a hold: more is gentler on streams, slower "
         "to regain throughput"),
    Knob("overrun_slack", FACTOR,
         "a tick overruns past its budget x this: higher ignores more noise, reacts later to "
         "real overruns"),
    Knob("overrun_slack_ms", Range(0),
         "ms added to the overrun line (noise on short ticks): higher ignores more noise, "
         "reacts later"),
    Knob("interactive_reserve", SHARE,
         "share of prompt time kept for interactive prompts while both wait: higher is faster "
         "TTFT, slower background"),
    Knob("initial_s", POSITIVE_COUNT,
         "background decoders a tick to start (dense model; then climbed): higher is more "
         "throughput, longer ticks"),
    Knob("moe_initial_s", POSITIVE_COUNT,
         "the same for an MoE (each decoder may reach more experts): higher is more "
         "throughput, longer ticks"),
    Knob("burst", POSITIVE_COUNT,
         "ticks a burst keeps its background decoders, to start: higher reads fewer streams, "
         "others wait longer"),
    Knob("max_burst", POSITIVE_COUNT,
         "longest burst the climb may reach: higher allows cheaper ticks, longer waits for "
         "decoders left out"),
    Knob("max_starve_ticks", POSITIVE_COUNT,
         "ticks background work may go without progress before a rescue: lower is surer "
         "progress, more overruns"),
    Knob("rescue_slack", FACTOR,
         "a rescue may stretch a tick to its budget x this: higher moves starving work "
         "further, stalls longer"),
    Knob("min_prefill", POSITIVE_COUNT,
         "the slow start's first (and least) prompt chunk: higher ramps up sooner, risks a "
         "misjudged large chunk"),
    Knob("step_amortise", Range(0),
         "a background chunk must do this x its overhead in work: higher wastes less, moves "
         "prompts more rarely"),
    Knob("climb_window", POSITIVE_COUNT,
         "ticks per hill-climb step of S or k: longer measures throughput surer, adapts "
         "slower"),
    Knob("climb_deadband", SHARE,
         "a window this much slower turns the climb back: higher ignores more noise, turns "
         "back later"),
    Knob("background_share", Range(0, 0.9),
         "least share of time owed to background prompts while streams decode (0: none): "
         "higher is sooner, more pauses", flag=True),
    Knob("ride_share", Range(0, 10),
         "background chunks ride in new prompts' ticks, adding at most this x the tick (0: "
         "off)"),
    Knob("even_rows", None,
         "background tokens that round a tick's rows up to a power of two where that costs "
         "no more (Vulkan: free work)"),
    Knob("floor_growth", FACTOR,
         "a floor chunk grows up to 2x its time where that moves this x the tokens per ms: "
         "lower, fewer longer pauses"),
    Knob("idle_amortise", Range(0),
         "idle ticks stretch until a prompt chunk's work is this x its cache read: higher is "
         "faster prompts, later TTFT"),
    Knob("ttft_burst_tokens", COUNT,
         "interactive prompts this short go in whole while streams decode (0: off): higher "
         "is faster TTFT, longer pauses", flag=True),
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
    ('pause_factor must be >= 1, not 0.5')."""
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
