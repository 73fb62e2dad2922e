"""A tick cost model learned online from measured ticks.

    tick_ms ≈ fixed + per_prefill · prefill_tokens + per_decode · decode_tokens
              + per_kv · (cache positions read) / 1000
              + per_prompt_kv · (KV positions the prompt tokens attend) / 1000
              + Σ row_steps[i] · (the tick's rows > ROW_EDGES[i])
              + ragged[j] · (the tick's rows are ragged, in the j-th span of RAGGED_EDGES)

with per_prompt_kv one price for ticks of up to WIDE_ROWS rows and another past them.

The row steps are what a GPU charges as a batch's rows (prompt tokens and decode rows alike)
pass the sizes where ggml changes kernels: up to eight rows it multiplies by the weights with
matrix-vector kernels, past that with matrix-matrix ones, whose tiles come in size classes (on
Vulkan: small up to 32 rows, medium up to 64, large past that), and CUDA replays a captured
graph only for one row. On a GPU one prompt token beside a few decoders can cost more than their
whole tick, and the next few dozen about as much again (docs/design/scheduling.md); a model that
charged the step for "the tick has prompt tokens" priced eight decoders and two background
decoders (ten rows, past the same kernels' limit) as ten decoders. With the steps in the model,
a policy saving up spare time spends it on one worthwhile chunk instead of paying a step for a
handful of tokens every tick, and it prices a chunk by the rows already in the tick (`rows`):
the step is paid by whichever chunk crosses it. Steps are non-negative; a chunk's price falls as
it grows only where it takes the tick past WIDE_ROWS and the wide tick's attention is cheaper,
or takes a ragged tick to a power of two (both below). On a CPU the steps are small.

A tick whose rows are past 16 and not a power of two is *ragged*, and pays its span's ragged
price besides the steps. On a GPU the matrix kernels run their tiles whole only for some batch
sizes, so a tick's time does not grow with its rows alone: under Vulkan a 64-row tick costs less
than a 40-row one, and a new 32-token prompt beside seven decoders (39 rows) cost the streams
more than 56 background tokens beside eight (64 rows) (benches/chunk_cost.py measures it;
docs/design/scheduling.md, "Ragged ticks", has the figures). Priced, a chunk that takes a ragged
tick to the next power of two can cost nothing or less (step_ms is then negative), and
chunk_tokens counts such sizes. On a CPU the prices are about nothing.

Scoring prompt tokens has two prices because ggml has two ways to do it: the CPU's flash
attention runs its tiled, matrix-multiply path only for a batch of at least 64 query rows and
scores one row at a time below that: deep in a long prompt, one token more that takes a tick
from 63 rows to 64 makes it several times cheaper (docs/lab/2026-11-26-cpu-cliff-at-64-rows.md).
One price for both made a chunk just past the edge dearer than one of a few tokens, so a CPU's
floor chunks stayed a few tokens long where a chunk past the edge would have taken about as
long.

Attention is the term that grows, and it has two parts. Reading the cache is memory-bound and
happens once per sequence a tick: a decode row reads its sequence's K/V, and a prompt chunk
starting at position p reads the p positions before it once, whatever its length (its tokens
share them layer by layer). Computing the scores is per token: a chunk of c tokens attends to
c·p + c(c+1)/2 positions. On a CPU one prompt token added to a few decode rows costs several
times more deep in a prompt than at its start, while each further token of the same chunk adds
a fraction of that (docs/design/scheduling.md): the read dominates a small deep chunk, so the
last chunks of a long prompt are cheap per token only when they are large. A model that priced
prompt attention per token alone underpredicted small deep chunks by half and overpredicted
shallow ones; it had fitted the missing read into the step, which on a CPU is near zero
(docs/lab/2026-11-24-pricing-the-cache-read.md).

The coefficients are a least-squares fit over recent ticks (exponentially weighted, so the model
follows the machine as it warms up, throttles or shares the GPU), anchored to a prior by a ridge
term that never fades and held non-negative. The prior is the device's own: before serving, the
scheduler times a few scratch batches and `calibrate` fits them. The anchor matters: a server
mostly runs ticks that look alike (three decoders, no prompt), which say nothing about how cost
splits between the terms. Recursive least squares with forgetting lets its covariance blow up
along those unexcited directions; under mixed load it drifted until one prompt token was priced
above a whole tick and held every prompt back (docs/lab/2026-11-23-cost-model-fit.md). Residuals
are clipped (Huber-like) so one stalled tick, a page fault or a preempted thread, does not drag
the fit. Policies get a frozen `CostEstimate` to predict a plan's time before running it; the
scheduler feeds back what each tick really took.

The fit learns slowly by design, and a prompt chunk's attention is what it gets most wrong: its
price moves with the depth a chunk runs at and with the kernel path (the CPU's flash attention
below 64 query rows), and the clipped residuals let a tick that ran dozens of times its
prediction move the fit as if it had taken only twice as long. So the estimate carries a
correction on top of the fit, per attention path (narrow, wide): an extra price per 1000 KV
positions prompt tokens attend. A tick with prompt attention that overran its prediction (beyond
the usual error) raises its path's extra at once to what would have predicted it (at most 8x the
path's price in one tick, so that a stall does not price prompts out for long); ticks whose
attention is a fair part of their time and that came in under let it back down slowly, never
below 0. A misprediction of prompt attention up to 8x costs one tick (a larger one a tick per
factor of 8); the next chunk of that kind is priced at what the last one really cost, and grows
back only as ticks prove it.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

# A tick's rows (prompt tokens and decode rows) where ggml may change kernels; the model charges
# a step as a tick's rows pass each (CostEstimate.row_steps_ms).
ROW_EDGES = (1, 8, 16, 32, 64, 128, 256)
# Past this many rows a tick's prompt attention has a price of its own (per_prompt_kv_wide_
# kpos_ms): the CPU's flash attention tiles 64 query rows. It is a row edge, so that a chunk
# size between two edges has one price throughout (a 64-row tick is priced as a narrow one).
WIDE_ROWS = 64
# A tick of more than RAGGED_EDGES[0] rows that is not a power of two is ragged, and pays the
# ragged price of the span of these edges its rows fall in (the last span is unbounded).
RAGGED_EDGES = (16, 32, 64, 128)


def ragged_span(rows: int) -> int:
    """The span of RAGGED_EDGES a ragged tick of `rows` rows falls in; -1 if it is not ragged
    (at most RAGGED_EDGES[0] rows, or a power of two)."""
    if rows <= RAGGED_EDGES[0] or rows & (rows - 1) == 0:
        return -1
    return bisect.bisect_left(RAGGED_EDGES, rows) - 1


def next_even_rows(rows: int) -> int:
    """The fewest rows, at least `rows`, of a tick that is not ragged."""
    return rows if ragged_span(rows) < 0 else 1 << (rows - 1).bit_length()


def row_steps(**at: float) -> tuple[float, ...]:
    """row_steps_ms from steps by edge: `row_steps(r8=1.4)` charges 1.4 ms past eight rows."""
    steps = dict.fromkeys(ROW_EDGES, 0.0)
    for key, ms in at.items():
        edge = int(key.removeprefix("r"))
        if edge not in steps:
            raise ValueError(f"no row edge at {edge}: the edges are {ROW_EDGES}")
        steps[edge] = ms
    return tuple(steps.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class CostEstimate:
    """Coefficients of the cost model at one moment (milliseconds), named when made: their
    order changed once (the row steps replaced a single step)."""

    fixed_ms: float = 2.0
    per_prefill_ms: float = 0.5
    per_decode_ms: float = 1.0
    per_kv_kpos_ms: float = 0.0  # per 1000 cache positions read: each decode
    # row's attended(n_past, 1), each prompt chunk's starting position
    row_steps_ms: tuple[float, ...] = ()  # charged as a tick's rows pass each of ROW_EDGES
    # (missing ones: 0)
    per_prompt_kv_kpos_ms: float = 0.0  # per 1000 KV positions prompt tokens attend
    per_prompt_kv_wide_kpos_ms: float | None = None  # the same in a tick of more than
    # WIDE_ROWS rows (None: the same price)
    ragged_ms: tuple[float, ...] = ()  # what a ragged tick pays, by span of RAGGED_EDGES
    # (missing ones: 0)
    samples: int = 0  # ticks the estimate has learned from
    # the steps' running sums: _passed[i] is what a tick whose rows pass the first i edges
    # pays. Policies price chunks dozens of times a tick; summing the steps each time made
    # planning a tick several times slower.
    _passed: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        steps = self.row_steps_ms[:len(ROW_EDGES)]
        steps += (0.0,) * (len(ROW_EDGES) - len(steps))  # missing ones: 0
        object.__setattr__(self, "_passed", tuple(itertools.accumulate(steps, initial=0.0)))

    def predict(self, prefill_tokens: int, decode_tokens: int, kv_positions: int = 0,
                prompt_kv_positions: int = 0) -> float:
        """A tick's time: kv_positions are the cache positions it reads (see per_kv_kpos_ms),
        prompt_kv_positions what its prompt tokens attend (attended())."""
        return (
            self.fixed_ms
            + self.per_prefill_ms * prefill_tokens
            + self.per_decode_ms * decode_tokens
            + self.per_kv_kpos_ms * kv_positions / 1000.0
            + self.prompt_kv_ms(prefill_tokens + decode_tokens) * prompt_kv_positions / 1000.0
            + self.shape_ms(prefill_tokens + decode_tokens)
        )

    def shape_ms(self, rows: int) -> float:
        """What a tick of `rows` rows pays for its size: the steps it passed (the edges below
        `rows`), and its ragged price."""
        span = ragged_span(rows)
        ragged = self.ragged_ms[span] if 0 <= span < len(self.ragged_ms) else 0.0
        return self._passed[bisect.bisect_left(ROW_EDGES, rows)] + ragged

    def step_ms(self, rows: int, n_tokens: int) -> float:
        """What a chunk of n_tokens changes in what a tick that already has `rows` rows pays
        for its size: the steps it passes, and the ragged price it adds or takes away (a chunk
        that takes a ragged tick to a power of two takes it away: negative)."""
        return self.shape_ms(rows + n_tokens) - self.shape_ms(rows) if n_tokens > 0 else 0.0

    def prefill_ms(self, n_tokens: int, depth: int, rows: int = 0) -> float:
        """What a prompt chunk of n_tokens starting at KV position `depth` adds to a tick that
        already has `rows` rows: its tokens, its read of the cache before it, its attention,
        and the row steps it passes."""
        if n_tokens <= 0:
            return 0.0
        return self.work_ms(n_tokens, depth, rows) + self.per_kv_kpos_ms * depth / 1000.0 \
            + self.step_ms(rows, n_tokens)

    def chunk_overhead_ms(self, depth: int, rows: int = 0, n_tokens: int = 1) -> float:
        """What a prompt chunk of n_tokens at KV position `depth` costs beyond its own work
        (its tokens and their scoring), in a tick that already has `rows` rows: its read of the
        cache before it and the row steps it passes."""
        return self.per_kv_kpos_ms * depth / 1000.0 + self.step_ms(rows, max(n_tokens, 1))

    def chunk_tokens(self, spare_ms: float, depth: int = 0, rows: int = 0) -> int:
        """The most prompt tokens, in a chunk starting at KV position `depth`, that add at most
        spare_ms to a tick that already has `rows` rows. Between two row edges the steps are
        fixed and the rest grows with the chunk (the root of per_prefill·c +
        per_prompt_kv·attended(depth, c)/1000 = what is left), so each span between edges
        gives its own largest chunk, and the largest of those wins. Within a span, a chunk that
        leaves the tick at a power of two pays no ragged price and may fit where the sizes
        below it do not."""
        if math.isinf(spare_ms):
            return 1 << 30  # no limit
        # The steps never fall, so what a span leaves for work only shrinks from one span to
        # the next, and so does its even end (a power of two, no ragged price): past the first
        # span that does not fit whole, none fits, unless a later span's attention is cheaper
        # (a wide tick's).
        best = 0
        cheaper_later = self.prompt_kv_ms(WIDE_ROWS + 1) < self.prompt_kv_ms(rows + 1)
        # A chunk that takes the tick to its span's edge has passed the steps below that edge
        # at no ragged price (the edges are powers of two), and is the span's largest: where
        # it fits, so does the span, with no search (a search in every span made planning a
        # tick about half again as slow).
        base = self.per_kv_kpos_ms * depth / 1000.0 - self.shape_ms(rows)
        for lo, hi, edge_steps in self._spans(rows):
            whole = hi < math.inf and \
                self.work_ms(int(hi), depth, rows) + base + edge_steps <= spare_ms + 1e-9
            fit = int(hi) if whole else self._span_fit(spare_ms, depth, rows, lo, hi)
            if fit >= hi:
                best = int(hi)
                continue
            best = max(best, fit)
            if not cheaper_later or rows + lo > WIDE_ROWS:
                break
        return best

    def _span_fit(self, spare_ms: float, depth: int, rows: int, lo: int, hi: float) -> int:
        """The largest chunk in [lo, hi] (chunk sizes that pass the same row steps) that adds
        at most spare_ms; 0 if none. Its ragged sizes share one price (each pays the span's
        ragged price, or none at 16 rows or fewer) and grow dearer with the chunk; the sizes
        that leave the tick at a power of two are priced on their own."""
        best = 0
        first = lo + 1 if hi > lo and ragged_span(rows + lo) < 0 <= ragged_span(rows + lo + 1) \
            else lo
        left = spare_ms - self.chunk_overhead_ms(depth, rows, first)
        if left > 0:
            n = min(hi, int(self._tokens_of_work(left, depth, rows + first)))
            best = int(n) if n >= first else 0
        even = next_even_rows(rows + max(best, lo - 1) + 1)
        while even - rows <= hi and self.prefill_ms(even - rows, depth, rows) <= spare_ms + 1e-9:
            best = even - rows
            even = next_even_rows(even + 1)
        return best

    def _spans(self, rows: int) -> list[tuple[int, float, float]]:
        """The chunk sizes (from, to) between the row edges a tick with `rows` rows has left,
        each with the steps a tick that reaches its edge has passed: within a span, a chunk
        passes the same steps. The last is unbounded."""
        spans: list[tuple[int, float, float]] = []
        lo = 1
        for k, edge in enumerate(ROW_EDGES):
            if edge - rows >= lo:
                spans.append((lo, edge - rows, self._passed[k]))
                lo = edge - rows + 1
        spans.append((lo, math.inf, self._passed[-1]))
        return spans

    def work_ms(self, n_tokens: int, depth: int, rows: int = 0) -> float:
        """A prompt chunk's own work in a tick that already has `rows` rows: its tokens and
        their scoring (what prefill_ms adds to it is its overhead, chunk_overhead_ms)."""
        return self.per_prefill_ms * n_tokens \
            + self.prompt_kv_ms(rows + n_tokens) * attended(depth, n_tokens) / 1000.0

    def prompt_kv_ms(self, rows: int) -> float:
        """What prompt tokens pay per 1000 KV positions they attend, in a tick of `rows`
        rows."""
        if rows > WIDE_ROWS and self.per_prompt_kv_wide_kpos_ms is not None:
            return self.per_prompt_kv_wide_kpos_ms
        return self.per_prompt_kv_kpos_ms

    def _tokens_of_work(self, work_ms: float, depth: int, rows: int = 0) -> float:
        """c where per_prefill·c + per_prompt_kv·attended(depth, c)/1000 = work_ms, at the
        attention price of a tick of `rows` rows."""
        kv_ms = self.prompt_kv_ms(rows)
        a = kv_ms / 2000.0
        b = max(self.per_prefill_ms, 1e-4) + kv_ms * (depth + 0.5) / 1000.0
        # The positive root of a·c² + b·c = work, in the form that stays exact as a → 0.
        return 2 * work_ms / (b + math.sqrt(b * b + 4 * a * work_ms))

    def max_prefill(self, budget_ms: float, decode_tokens: int, kv_positions: int = 0,
                    depth: int = 0) -> int:
        """The most prompt tokens, in a chunk starting at KV position `depth`, that keep the
        predicted tick (decode_tokens rows besides) within budget_ms."""
        return self.chunk_tokens(budget_ms - self.predict(0, decode_tokens, kv_positions), depth,
                                 decode_tokens)


def attended(n_past: int, n_tokens: int) -> int:
    """KV positions n_tokens new tokens at positions n_past.. attend to (causal: each sees the
    cache and the chunk up to itself)."""
    return n_tokens * n_past + n_tokens * (n_tokens + 1) // 2


class CostModel:
    """Ridge-anchored, exponentially weighted, non-negative least squares over
    (1, prefill, decode, cache positions read/1000, prompt's attended/1000 in a tick of up to
    WIDE_ROWS rows and in a wider one, whether the tick's rows pass each of ROW_EDGES, and
    whether they are ragged in each span of RAGGED_EDGES)."""

    _STEPS = 6  # the first row step's place among the coefficients
    _RAGGED = _STEPS + len(ROW_EDGES)  # the first ragged price's
    _N = _RAGGED + len(RAGGED_EDGES)
    _EYE = np.eye(_N)
    # Features are scaled to similar magnitudes before the ridge sees them: a tick has
    # ~1 fixed cost, tens of prompt tokens, a few decoders, a few thousand attended positions.
    _SCALE = np.array([1.0, 1 / 32, 1.0, 1.0, 1.0, 1.0] + [1.0] * (_N - _STEPS))
    _RIDGE = 0.5  # prior weight, in ticks' worth of evidence per (scaled) coefficient

    def __init__(self, prior: CostEstimate | None = None, forgetting: float = 0.98) -> None:
        prior = prior or CostEstimate()
        steps = (list(prior.row_steps_ms) + [0.0] * len(ROW_EDGES))[:len(ROW_EDGES)]
        ragged = (list(prior.ragged_ms) + [0.0] * len(RAGGED_EDGES))[:len(RAGGED_EDGES)]
        wide = prior.per_prompt_kv_kpos_ms if prior.per_prompt_kv_wide_kpos_ms is None \
            else prior.per_prompt_kv_wide_kpos_ms
        self._prior = np.array([prior.fixed_ms, prior.per_prefill_ms, prior.per_decode_ms,
                                prior.per_kv_kpos_ms, prior.per_prompt_kv_kpos_ms, wide]
                               + steps + ragged) / self._SCALE
        self._a = np.zeros((self._N, self._N))  # Σ w x xᵀ (scaled features)
        self._b = np.zeros(self._N)  # Σ w x y
        self._lambda = forgetting
        self._samples = 0
        self.error_ewma_ms = 0.0  # mean absolute prediction error, smoothed
        # the prompt attention correction, by path [narrow, wide]: ms per 1000 attended KV
        # positions on top of the fit's price (the module's docstring)
        self.attention_extra = [0.0, 0.0]
        self._base = prior  # the fit's own estimate, before the correction
        self._estimate = prior
        self._theta = self._prior.copy()

    def _solve(self, a_data: np.ndarray | None = None, b_data: np.ndarray | None = None,
               ridge: float = _RIDGE) -> np.ndarray:
        """argmin Σ w (y - xθ)² + ridge·|θ - prior|² subject to θ ≥ 0: a small active set
        (a dozen unknowns) that pins negative coefficients at zero and solves the rest again."""
        a_data = self._a if a_data is None else a_data
        b_data = self._b if b_data is None else b_data
        free = np.ones(self._N, bool)
        theta = np.zeros(self._N)
        for _ in range(self._N):
            if free.all():  # nearly always, after every tick: no index arrays to build
                a = a_data + ridge * self._EYE
                rhs = b_data + ridge * self._prior
            else:
                a = a_data[np.ix_(free, free)] + ridge * np.eye(int(free.sum()))
                rhs = b_data[free] + ridge * self._prior[free] \
                    - a_data[np.ix_(free, ~free)] @ theta[~free]
            sol = np.linalg.solve(a, rhs)
            if (sol >= 0).all():
                theta[free] = sol
                return theta
            idx = np.flatnonzero(free)[sol < 0]
            free[idx] = False
            theta[idx] = 0.0
            if not free.any():
                break
        return theta

    def _freeze(self) -> None:
        t = self._theta * self._SCALE
        self._base = CostEstimate(
            fixed_ms=float(t[0]), per_prefill_ms=max(float(t[1]), 1e-4),
            per_decode_ms=float(t[2]), per_kv_kpos_ms=float(t[3]),
            per_prompt_kv_kpos_ms=float(t[4]), per_prompt_kv_wide_kpos_ms=float(t[5]),
            row_steps_ms=tuple(float(v) for v in t[self._STEPS:self._RAGGED]),
            ragged_ms=tuple(float(v) for v in t[self._RAGGED:]), samples=self._samples)
        self._corrected()

    def _corrected(self) -> None:
        """The estimate policies get: the fit's, its prompt attention prices scaled."""
        base = self._base
        narrow, wide = self.attention_extra
        wide_price = base.per_prompt_kv_kpos_ms if base.per_prompt_kv_wide_kpos_ms is None \
            else base.per_prompt_kv_wide_kpos_ms
        self._estimate = base if narrow == wide == 0.0 else dataclasses.replace(
            base, per_prompt_kv_kpos_ms=base.per_prompt_kv_kpos_ms + narrow,
            per_prompt_kv_wide_kpos_ms=wide_price + wide)

    @property
    def estimate(self) -> CostEstimate:
        return self._estimate

    def calibrate(self, ticks: list[tuple[int, int, int, int, float]]) -> None:
        """Makes scratch ticks timed on the device, (prompt tokens, decode rows, cache
        positions read, KV positions the prompt attends, ms), the prior: the fit of them
        alone (the generic prior only breaks ties) is where the model starts and what its
        ridge pulls towards from then on. Along directions later ticks do not vary (every tick
        of a prompt storm carrying one or two prompt tokens) the device's measured costs hold,
        not the generic prior's."""
        x = np.array([self._features(p, d, kv, pkv) for p, d, kv, pkv, _ in ticks])
        y = np.array([ms for *_, ms in ticks])
        self._prior = self._solve(x.T @ x, x.T @ y, ridge=1e-3)
        if not any(pkv and p + d > WIDE_ROWS for p, d, _, pkv, _ in ticks):
            # no wide tick scored prompt tokens (a slow device's short schedule): the fit
            # knows nothing of its price, and the generic prior's would be free
            self._prior[5] = self._prior[4]
        self._theta = self._prior.copy()
        self._freeze()

    def observe(self, prefill_tokens: int, decode_tokens: int, kv_positions: int,
                measured_ms: float, prompt_kv_positions: int = 0) -> float:
        """Learns from one tick (kv_positions: the cache positions it reads;
        prompt_kv_positions: what its prompt tokens attend); returns the prediction error
        (measured - predicted) in ms."""
        shape = (prefill_tokens, decode_tokens, kv_positions, prompt_kv_positions)
        error = measured_ms - self._estimate.predict(*shape)
        overran = error > max(1.0, 2.0 * self.error_ewma_ms)
        self.error_ewma_ms += 0.1 * (abs(error) - self.error_ewma_ms)
        # The fit learns against its own prediction, without the correction. Huber-like: a
        # residual far beyond the usual error moves the fit only so far (a page fault, a
        # preempted thread). A tick with prompt tokens that ran long may say the model is
        # wrong about prompt cost, so it counts up to twice its prediction, not without
        # limit: unclipped stalls of prompt ticks alone had put a step worth several prompt
        # tokens into a CPU fit whose real step is near zero.
        predicted = self._base.predict(*shape)
        bound = max(4.0 * self.error_ewma_ms, 0.5 * predicted, 1.0)
        upper = max(bound, predicted) if prefill_tokens else bound
        y = predicted + min(max(measured_ms - predicted, -bound), upper)
        x = self._features(*shape)
        self._a = self._lambda * self._a + np.outer(x, x)
        self._b = self._lambda * self._b + x * y
        self._samples += 1
        self._theta = self._solve()
        self._freeze()
        if prefill_tokens and prompt_kv_positions:
            self._correct(shape, measured_ms, overran)
        return error

    # A tick's predicted prompt attention must be at least this share of its prediction (and
    # 0.5 ms) for an error under it to be put down to attention: in a shallow chunk it is noise.
    _ATTRIBUTABLE = 0.05
    _EASE = 0.1  # how far a tick that came in under moves the extra back, per tick
    _RAISE_MAX = 8.0  # how far one overrun may multiply a path's attention price

    def _correct(self, shape: tuple[int, int, int, int], measured_ms: float,
                 overran: bool) -> None:
        """Moves the extra attention price of the tick's path (against the fit as it now is)
        towards the one that would have predicted the tick: at once after an overrun beyond
        the usual error, slowly where the tick came in under and its prompt attention is a
        fair share of it."""
        prefill_tokens, decode_tokens, _, prompt_kv_positions = shape
        rows = prefill_tokens + decode_tokens
        path = int(rows > WIDE_ROWS)
        kpos = prompt_kv_positions / 1000.0
        now = self._estimate.predict(*shape)
        error = measured_ms - now
        extra = self.attention_extra[path]
        attributable = self._estimate.prompt_kv_ms(rows) * kpos \
            >= max(0.5, self._ATTRIBUTABLE * now)
        if overran and error > 0 and attributable:
            # at most RAISE_MAX times the path's price a tick (counted at no less than a prompt
            # token's own price): a stalled tick (a page fault, a preempted thread) with few
            # positions attended must not price every later chunk out for long
            price = self._estimate.prompt_kv_ms(rows)
            most = (self._RAISE_MAX - 1) * max(price, self._estimate.per_prefill_ms)
            extra += min(error / kpos, most)
        elif error < 0 and attributable:
            extra = max(0.0, extra + self._EASE * error / kpos)
        else:
            return
        self.attention_extra[path] = extra
        self._corrected()

    def _features(self, prefill_tokens: int, decode_tokens: int, kv_positions: int,
                  prompt_kv_positions: int) -> np.ndarray:
        rows = prefill_tokens + decode_tokens
        wide = rows > WIDE_ROWS
        features: np.ndarray = np.array(
            [1.0, prefill_tokens, decode_tokens, kv_positions / 1000.0,
             0.0 if wide else prompt_kv_positions / 1000.0,
             prompt_kv_positions / 1000.0 if wide else 0.0]
            + [float(rows > edge) for edge in ROW_EDGES]
            + [float(span == ragged_span(rows)) for span in range(len(RAGGED_EDGES))]) \
            * self._SCALE
        return features
