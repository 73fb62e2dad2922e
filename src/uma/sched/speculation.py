"""How many draft tokens each stream verifies in a tick: speculation only where it pays.

A stream that speculates puts its drafter's guesses after its last token in the tick's batch
(a verify item: one row each, all with logits) and keeps the guesses the model agrees with, one
more token of its own after them. Its j-th guess counts only if every guess before it was kept:
it adds S_j tokens on average, S_j the chance that the first j guesses are all kept, and costs
what one more row costs the tick. Guessing k tokens pays when the tick then makes more tokens
per ms than without them:

    (E + S_1 + ... + S_k) / (T + rows' price)  >  E / T

for a tick that makes E tokens in T ms. Each stream takes the k that makes the most tokens per
ms (k = 0 where none pays), streams with the surest first guess first, and never past the
tick's time bound (`draft_lengths`). No threshold is tuned: a stream alone on a device whose
rows are nearly free drafts deeply; at 32 busy streams, where a row costs about 1/32 of the
tick, only guesses that are nearly sure pass; a stream whose guesses fail stops drafting. This
is the goodput rule of SmartSpec (the speculation length chosen each step from expected
goodput, zero when it does not pay), with prices measured on the device (`RowPrice`).

Guesses are not kept independently: a lookup that found the passage being quoted is right for
a long run, one that found a common phrase is wrong at once, and how far back the lookup's
match agreed with the stream tells them apart. So `Acceptance` keeps, for each band of that
agreement and each position j of a draft, the chance that guess j is kept once the guesses
before it were, for each stream (its recent verifies) against its drafter's (every stream's):
S_j is their product. A position no draft has reached yet takes the chance of the one before
it, so that a run of kept guesses invites a longer draft next time.
A stream whose chances say no still verifies one guess now and then (`probe_period`), so that a
stream whose text turns repetitive (an answer that starts quoting its input) is found; the
probes' rows are held to PROBE_SHARE of the ticks' time, and to less while a drafter's probes
keep nothing (PROBE_BACKOFF).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# the most guesses one stream verifies in a tick
MAX_DRAFT = 64
# bands of a lookup's agreement (tokens), each with chances of its own
AGREEMENT_BANDS = (2, 4, 8, 16, 32)
# the chances of a steady stream's verifies (ShapeCost), every tick's at its length: one band
# past the lookup's
STEADY_BAND = len(AGREEMENT_BANDS)
# bands of a draft's length, each with a measured price per guess (RowPrice): a verify's rows
# at powers of two, where a device's kernels change (CUDA's vector kernels take up to 8 rows,
# a 9th runs the batch as a matrix product at twice the time on an H200)
GUESS_BANDS = (1, 2, 4, 8, 16, 32)
# the draft lengths of a steady stream (steady_length): its rows at those powers of two
STEADY_LENGTHS = (1, 3, 7, 15, 31, 63)
# ticks after a change of the batch's shape that pay for it (ShapeCost): CUDA runs the first
# tick of a new shape op by op and captures its graph on the second
SETTLE_TICKS = 2

# an estimate's weight in verifies: how many of a stream's own it takes to outweigh its
# drafter's chance at a position
PRIOR_WEIGHT = 1.0
# how much of its evidence a stream keeps per verify (recent guesses count more: a file being
# edited repeats its input in stretches)
KEEP_PER_VERIFY = 0.9
# how fast a drafter's chances follow its verifies (every stream's)
DRAFTER_RATE = 0.1
# the share of the ticks' time that probes (a short draft of a stream whose chances say no) may
# take, and a probe's guesses: enough to learn how a run of kept guesses goes on
PROBE_SHARE = 0.02
PROBE_DRAFT = 4
# a drafter's probes in a row that kept nothing, past which its probe period stops doubling:
# where text never repeats, probes take PROBE_SHARE / 8 of the time after three, not
# PROBE_SHARE of it; a kept guess (any stream's) brings the period back at once
PROBE_BACKOFF = 3
# a drafter's chance at every position before any of its guesses were verified
FIRST_PRIOR = 0.5
# the most ticks of a number of decoders that verify guesses before one runs plain, so that
# what a guess costs is measured against a recent plain tick (RowPrice.stale)
CONTROL_TICKS = 16
# ticks between two checks of whether a stream's guesses could pay, between its verifies (the
# check is most of the speculator's cost on a tick where no one drafts)
QUIET_TICKS = 8


@dataclass(frozen=True, slots=True)
class Candidate:
    """A stream that could speculate this tick."""

    seq_id: int
    proposed: int  # guesses its drafter has (the most it could verify)
    survival: tuple[float, ...]  # S_j: the chance its first j + 1 guesses are all kept
    # what making each guess costs beyond its row (a draft model's step; a lookup's: nothing),
    # and what making any costs once (a draft model's catching up on the stream's last tokens)
    drafting_ms: float = 0.0
    drafting_once_ms: float = 0.0


def best_length(survival: Sequence[float], proposed: int, price: Callable[[int], float],
                tokens: float, ms: float, bound_ms: float, drafting_ms: float = 0.0,
                drafting_once_ms: float = 0.0) -> tuple[int, float, float]:
    """The number of guesses that makes the most tokens per ms in a tick that makes `tokens`
    in `ms` (0 where none beats it), and the tokens and ms it adds. price(k): what each guess
    of a k-guess draft costs the tick (RowPrice.per_guess); drafting_ms: what making each
    costs before it (a draft model's step), drafting_once_ms what making any does."""
    best = (0, 0.0, 0.0)
    rate = tokens / ms
    gained = 0.0
    longest = min(proposed, MAX_DRAFT, len(survival))
    # no guess costs less than the cheapest band's: what bounds the longer drafts' rate
    cheapest = min(price(k) for k in GUESS_BANDS) + drafting_ms
    for k in range(1, longest + 1):
        gained += survival[k - 1]
        spent = k * (price(k) + drafting_ms) + drafting_once_ms
        if ms + spent > bound_ms:
            break
        if (tokens + gained) / (ms + spent) > rate:
            rate = (tokens + gained) / (ms + spent)
            best = (k, gained, spent)
        # survival never grows: if even every longer draft's guesses kept at this one's last
        # chance, at the cheapest price, cannot beat the best rate, none can (random text's
        # chances fall to nothing in a few guesses; asked for 64 every time on a GPU's
        # millisecond tick, this loop was a tenth of it)
        if (tokens + gained + survival[k - 1] * (longest - k)) \
                <= rate * (ms + (k + 1) * cheapest + drafting_once_ms):
            break
    return best


def draft_lengths(candidates: Sequence[Candidate], price: Callable[[int], float],
                  expected_tokens: float, tick_ms: float, bound_ms: float) -> dict[int, int]:
    """Guesses each candidate verifies in a tick that makes expected_tokens tokens in tick_ms,
    within bound_ms (0: no bound beyond the tick's own time). Returns seq_id -> guesses (only
    those > 0)."""
    if not candidates or tick_ms <= 0:
        return {}
    bound = max(bound_ms, tick_ms) if bound_ms > 0 else math.inf
    tokens, ms = expected_tokens, tick_ms
    taken: dict[int, int] = {}
    for c in sorted(candidates, key=lambda c: c.survival[0] if c.survival else 0.0,
                    reverse=True):
        k, gained, spent = best_length(c.survival, c.proposed, price, tokens, ms, bound,
                                       c.drafting_ms, c.drafting_once_ms)
        if k:
            taken[c.seq_id] = k
            tokens += gained
            ms += spent
    return taken


class RowPrice:
    """What guesses cost a tick, measured: a verify tick's time against the same number of
    decoders' plain ticks, per guess, for each band of draft length (GUESS_BANDS: on a CPU a
    guess in a short draft costs about half a decode tick, in a long one the batch runs as a
    matrix product and each costs less). Before any verify, every band has the price of one
    more decode row as the device was timed (uma.engine.calibration). Measured, not modelled:
    the cost model fits ticks of one shape (a few decoders) and cannot tell from them what one
    more row costs."""

    def __init__(self, initial_ms: float) -> None:
        self.initial_ms = initial_ms
        self.per_band = [initial_ms] * len(GUESS_BANDS)
        self.measured = [False] * len(GUESS_BANDS)
        self.plain: dict[int, float] = {}  # decoders -> their plain tick's time, ms
        self.ticks = 0  # ticks observed
        self.plain_at: dict[int, int] = {}  # decoders -> the tick their plain time was last seen
        # k -> per_guess(k), made again after a verify is measured: the goodput rule asks for
        # every draft length of every stream it weighs, on a GPU's millisecond tick
        self._by_length: list[float] | None = None

    def stale(self, decoders: int, period: int = CONTROL_TICKS) -> bool:
        """Whether no plain tick of this many decoders was seen in the last `period` ticks:
        the next of theirs should be one, for the price to be measured against (once every
        stream speculates, no tick would be plain, and a host-bound engine's guesses, priced
        at the device's row, cost twice what they won)."""
        return self.ticks - self.plain_at.get(decoders, -period) >= period

    def per_guess(self, k: int) -> float:
        """A guess's price in a k-guess draft: its band's as measured; a band not measured yet
        takes the nearest measured band's (the device's bare row, the price before any,
        leaves out what a row costs the host: on a GPU's millisecond tick, most of it)."""
        table = self._by_length
        if table is None:
            table = self._by_length = [self._band_price(k) for k in range(MAX_DRAFT + 1)]
        return table[min(k, MAX_DRAFT)]

    def _band_price(self, k: int) -> float:
        b = bisect.bisect_right(GUESS_BANDS, k) - 1
        if self.measured[b] or not any(self.measured):
            return self.per_band[b]
        near = min((abs(i - b), i) for i, m in enumerate(self.measured) if m)[1]
        return self.per_band[near]

    def plain_ms(self, decoders: int) -> float | None:
        return self.plain.get(decoders)

    def observe(self, decoders: int, guesses: int, tick_ms: float) -> None:
        """A tick of `decoders` decode rows (no prompt) that verified `guesses` guesses."""
        self.ticks += 1
        if not guesses:
            self.plain_at[decoders] = self.ticks
            was = self.plain.get(decoders)
            self.plain[decoders] = tick_ms if was is None else was + 0.2 * (tick_ms - was)
            return
        plain = self.plain.get(decoders)
        if plain is None:
            return
        band = bisect.bisect_right(GUESS_BANDS, guesses) - 1
        sample = max((tick_ms - plain) / guesses, 0.01 * plain)
        if not self.measured[band]:  # its first measurement from the nearest one's price
            self.per_band[band] = self._band_price(guesses)
            self.measured[band] = True
        self.per_band[band] += 0.3 * (sample - self.per_band[band])
        self._by_length = None


def steady_length(survival: Sequence[float], room: int, price: Callable[[int], float],
                  tick_ms: float, tokens: float = 1.0) -> int:
    """The draft length a steady stream verifies every tick (0: none pays), of STEADY_LENGTHS
    and at most room: the one that makes the most tokens per ms in a tick that makes `tokens`
    in tick_ms without guesses, (tokens + S_1 + ... + S_k) / (tick + k × price), its survival
    measured over every tick at its length (the ticks where the lookup found fewer guesses,
    filled out, among them). Among 32 streams a guess must be nearly as sure as a row's
    price is a share of the tick."""
    best, rate = 0, tokens / tick_ms
    for k in STEADY_LENGTHS:
        if k > min(room, len(survival)):
            break
        r = (tokens + sum(survival[:k])) / (tick_ms + k * price(k))
        if r > rate:
            best, rate = k, r
    return best


def steady_reach(longest: int) -> int:
    """The longest steady length a stream may choose having verified steady drafts of at most
    `longest` guesses: the next of STEADY_LENGTHS. A length never verified is judged on chances
    carried over from shorter drafts (where a stream keeps its 7th guess it usually keeps its
    8th, but a filler past the lookup's run is seldom kept) and rows priced from other bands:
    on an H200 a stream jumped from 7 guesses to 63 on that optimism, each such tick 11 ms
    against 2.6, and lost half its speed. Climbing one length at a time, each step measured
    before the next, bounds what the optimism costs."""
    return next((k for k in STEADY_LENGTHS if k > longest), STEADY_LENGTHS[-1])


class ShapeCost:
    """What a change of a decode tick's shape (its rows) costs, timed before serving (`timed`)
    and measured while serving: the ticks just after a change (SETTLE_TICKS of them) against
    the same shape's settled ticks. A backend that
    captures its compute graph pays it: on an H200 CUDA runs the first tick of a new shape op
    by op and captures it on the second, 3.7 ms over two ticks whose settled time is 1.3 ms
    each, so a stream alternating plain ticks and verifies of a few guesses ran no faster
    than without guesses (docs/results/speculation.md). A CPU pays little. Where a change
    costs more than a plain tick (dear), a speculating stream keeps one draft length
    (steady_length) and fills out a short lookup, rather than letting each tick's rows follow
    what the lookup found."""

    def __init__(self) -> None:
        self.settled_ms: dict[int, float] = {}  # rows -> a settled tick's time
        self.change_ms = 0.0  # what a change costs its settling ticks, over settled ones
        self.changes = 0  # changes measured
        self._rows = 0  # the last tick's rows (0: unknown: the tick before held a prompt)
        self._since = 0  # ticks of this shape since it changed
        self._excess: float | None = 0.0  # this change's cost so far (None: no reference)

    @property
    def settled(self) -> bool:
        """Whether the last tick's shape had settled (its time is its shape's own)."""
        return self._since >= SETTLE_TICKS

    def dear(self, plain_ms: float) -> bool:
        return self.change_ms > plain_ms

    def timed(self, change_ms: float) -> None:
        """Starts from a change's cost as the device was timed before serving: a change
        measured while serving needs a shape settled, then changed, and a stream whose rows
        follow its lookup tick by tick seldom settles one."""
        self.change_ms = max(change_ms, 0.0)
        self.changes = 1

    def observe(self, rows: int, tick_ms: float) -> None:
        """A decode tick of `rows` rows (no prompt) took tick_ms."""
        if rows != self._rows:
            self._rows, self._since, self._excess = rows, 0, 0.0
        else:
            self._since += 1
        if self._since < SETTLE_TICKS:
            ref = self.settled_ms.get(rows)
            if ref is None or self._excess is None:
                self._excess = None
            else:
                self._excess += tick_ms - ref
                if self._since == SETTLE_TICKS - 1:  # the first measured is taken whole
                    weight = 0.3 if self.changes else 1.0
                    self.change_ms += weight * (max(self._excess, 0.0) - self.change_ms)
                    self.changes += 1
            return
        was = self.settled_ms.get(rows)
        self.settled_ms[rows] = tick_ms if was is None else was + 0.2 * (tick_ms - was)

    def broken(self) -> None:
        """A tick with a prompt: the next decode tick starts a new shape."""
        self._rows = 0


def probe_period(streams: int, probe_ms: float, tick_ms: float) -> int:
    """Ticks between one stream's probes, so that `streams` streams each probing at a price of
    probe_ms that often take PROBE_SHARE of the ticks' time: a lone stream on a CPU whose probe
    costs twice its tick, every 100 ticks; 32 streams whose probes cost 1/8 of the tick each,
    every 200."""
    if tick_ms <= 0:
        return 1 << 30
    return max(1, math.ceil(streams * probe_ms / (PROBE_SHARE * tick_ms)))


def band(agreement: int) -> int:
    """The band of AGREEMENT_BANDS a lookup's agreement falls in."""
    return max(0, bisect.bisect_right(AGREEMENT_BANDS, agreement) - 1)


class Acceptance:
    """The chance, at each position of a draft, that the guess there is kept once the guesses
    before it were: a stream's own (by request id) against its drafter's, for each band of
    the lookup's agreement."""

    def __init__(self) -> None:
        # (rid, band) -> (kept, tried) at each position, decayed
        self._own: dict[tuple[int, int], tuple[list[float], list[float]]] = {}
        # (drafter, band) -> chance at each position; None: no draft has reached it
        self._drafter: dict[tuple[str, int], list[float | None]] = {}
        # survival() is asked every tick and changes only with a verify: computed once per
        # change of its drafter's band (its version), (rid or drafter, band) -> (version,
        # survival)
        self._version: dict[tuple[str, int], int] = {}
        self._survival: dict[tuple[int | str, int], tuple[int, tuple[float, ...]]] = {}

    def _prior(self, drafter: str, band: int) -> list[float | None]:
        got = self._drafter.get((drafter, band))
        if got is None:
            got = self._drafter[drafter, band] = [FIRST_PRIOR] + [None] * (MAX_DRAFT - 1)
        return got

    def survival(self, rid: int, drafter: str, band: int) -> tuple[float, ...]:
        """S_j for j = 1..MAX_DRAFT: the chance that the stream's first j guesses are all kept,
        for a lookup whose agreement falls in `band`."""
        version = self._version.get((drafter, band), 0)
        own = self._own.get((rid, band))
        # a stream with no verify of its own has its drafter's chances: one tuple for all of
        # them, so that what is decided from it can be decided once a tick (Speculator)
        key = (rid, band) if own is not None else (drafter, band)
        cached = self._survival.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        prior = self._prior(drafter, band)
        out, s, chance = [], 1.0, FIRST_PRIOR
        for j in range(MAX_DRAFT):
            known = prior[j]
            if known is not None:
                chance = known
            if own is not None:
                kept, tried = own[0][j], own[1][j]
                chance = (kept + PRIOR_WEIGHT * chance) / (tried + PRIOR_WEIGHT)
            s *= chance
            out.append(s)
        survival = tuple(out)
        self._survival[key] = (version, survival)
        return survival

    def record(self, rid: int, drafter: str, band: int, drafted: int, accepted: int) -> None:
        """A verify of `drafted` guesses kept the first `accepted`: positions before it were
        tried and kept, the one after them tried and refused, the rest never tried."""
        own = self._own.get((rid, band))
        if own is None:
            own = self._own[rid, band] = ([0.0] * MAX_DRAFT, [0.0] * MAX_DRAFT)
        kept, tried = own
        prior = self._prior(drafter, band)
        self._version[drafter, band] = self._version.get((drafter, band), 0) + 1
        last = FIRST_PRIOR
        for j in range(min(drafted, accepted + 1, MAX_DRAFT)):
            hit = 1.0 if j < accepted else 0.0
            kept[j] = kept[j] * KEEP_PER_VERIFY + hit
            tried[j] = tried[j] * KEEP_PER_VERIFY + 1.0
            was = prior[j]
            last = (last if was is None else was) + DRAFTER_RATE * (
                hit - (last if was is None else was))
            prior[j] = last

    def forget(self, rid: int) -> None:
        for b in range(STEADY_BAND + 1):
            self._own.pop((rid, b), None)
            self._survival.pop((rid, b), None)
