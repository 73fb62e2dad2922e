"""A tick cost model learned online from measured ticks.

    tick_ms ≈ fixed + per_prefill · prefill_tokens + per_decode · decode_tokens
              + per_kv · (cache positions read) / 1000
              + per_prompt_kv · (KV positions the prompt tokens attend) / 1000
              + prefill_step · (1 if the tick has prompt tokens)

The step is what a GPU charges for leaving the matrix-vector kernels of a small decode batch:
adding the first prompt tokens to eight decoders costs far more than adding the next hundred.
With it in the model, a policy saving up spare time spends it on one worthwhile chunk instead
of paying the step for a handful of tokens every tick. On a CPU it is small: one prompt
token at position 0 costs about what one more decode row does.

Attention is the term that grows, and it has two parts. Reading the cache is memory-bound and
happens once per sequence a tick: a decode row reads its sequence's K/V, and a prompt chunk
starting at position p reads the p positions before it once, whatever its length (its tokens
share them layer by layer). Computing the scores is per token: a chunk of c tokens attends to
c·p + c(c+1)/2 positions. On the 134M CPU model one prompt token added to three decode rows
costs 2 ms at position 0, 8 ms at 600 and 17 ms at 1,500, while each further token of the same
chunk adds ~2.6 ms at 600: the read dominates a small deep chunk, so the last chunks of a long
prompt are cheap per token only when they are large. A model that priced prompt attention per
token alone underpredicted small deep chunks by half and overpredicted shallow ones; it had
fitted the missing read into the step (4.6-6.5 ms on that CPU).

The coefficients are a least-squares fit over recent ticks (exponentially weighted, so the
model follows the machine as it warms up, throttles or shares the GPU), anchored to a prior by
a ridge term that never fades and held non-negative. The prior is the device's own: before
serving, the executor times a few scratch batches and `calibrate` fits them. The anchor
matters: a server mostly runs ticks that look alike (three decoders, no prompt), which say
nothing about how cost splits between the terms. Recursive least squares with forgetting lets
its covariance blow up along those unexcited directions; on the mixed-load benchmark it
drifted to 283 ms per prompt token and held every prompt back. Residuals are clipped
(Huber-like) so one stalled tick, a page fault or a preempted thread, does not drag the fit.
Policies get a frozen `CostEstimate` to predict a plan's time before running it; the executor
feeds back what each tick really took.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class CostEstimate:
    """Coefficients of the cost model at one moment (milliseconds)."""

    fixed_ms: float = 2.0
    per_prefill_ms: float = 0.5
    per_decode_ms: float = 1.0
    per_kv_kpos_ms: float = 0.0  # per 1000 cache positions read: each decode
    # row's attended(n_past, 1), each prompt chunk's starting position
    prefill_step_ms: float = 0.0  # once per tick that has any prompt tokens
    per_prompt_kv_kpos_ms: float = 0.0  # per 1000 KV positions prompt tokens attend
    samples: int = 0  # ticks the estimate has learned from

    def predict(self, prefill_tokens: int, decode_tokens: int, kv_positions: int = 0,
                prompt_kv_positions: int = 0) -> float:
        """A tick's time: kv_positions are the cache positions it reads (see per_kv_kpos_ms),
        prompt_kv_positions what its prompt tokens attend (attended())."""
        return (
            self.fixed_ms
            + self.per_prefill_ms * prefill_tokens
            + self.per_decode_ms * decode_tokens
            + self.per_kv_kpos_ms * kv_positions / 1000.0
            + self.per_prompt_kv_kpos_ms * prompt_kv_positions / 1000.0
            + (self.prefill_step_ms if prefill_tokens > 0 else 0.0)
        )

    def prefill_ms(self, n_tokens: int, depth: int, first: bool = True) -> float:
        """What a prompt chunk of n_tokens starting at KV position `depth` adds to a tick:
        its tokens, its read of the cache before it, its attention, and the step when it is
        the tick's first prompt chunk."""
        if n_tokens <= 0:
            return 0.0
        return (self.per_prefill_ms * n_tokens + self.per_kv_kpos_ms * depth / 1000.0
                + self.per_prompt_kv_kpos_ms * attended(depth, n_tokens) / 1000.0
                + (self.prefill_step_ms if first else 0.0))

    def chunk_overhead_ms(self, depth: int, first: bool = True) -> float:
        """What a prompt chunk at KV position `depth` costs whatever its length: its read of
        the cache before it, and the step when it is the tick's first prompt chunk."""
        return self.per_kv_kpos_ms * depth / 1000.0 + (self.prefill_step_ms if first else 0.0)

    def chunk_tokens(self, spare_ms: float, depth: int = 0, first: bool = True) -> int:
        """The most prompt tokens, in a chunk starting at KV position `depth`, that add at most
        spare_ms: the root of per_prefill·c + per_prompt_kv·attended(depth, c)/1000 = spare_ms,
        after the chunk's read of the cache and the step if this is the tick's first prompt
        chunk."""
        if not math.isinf(spare_ms):
            spare_ms -= self.chunk_overhead_ms(depth, first)
        if spare_ms <= 0:
            return 0
        if math.isinf(spare_ms):
            return 1 << 30  # no limit
        return int(self._tokens_of_work(spare_ms, depth))

    def amortising_tokens(self, depth: int, first: bool = True, factor: float = 1.0) -> int:
        """The fewest prompt tokens, in a chunk starting at KV position `depth`, whose own work
        (tokens and their scoring) is at least factor × the chunk's overhead (at least 1)."""
        work = factor * self.chunk_overhead_ms(depth, first)
        return max(1, math.ceil(self._tokens_of_work(work, depth) - 1e-9)) if work > 0 else 1

    def _tokens_of_work(self, work_ms: float, depth: int) -> float:
        """c where per_prefill·c + per_prompt_kv·attended(depth, c)/1000 = work_ms."""
        a = self.per_prompt_kv_kpos_ms / 2000.0
        b = max(self.per_prefill_ms, 1e-4) + self.per_prompt_kv_kpos_ms * (depth + 0.5) / 1000.0
        # The positive root of a·c² + b·c = work, in the form that stays exact as a → 0.
        return 2 * work_ms / (b + math.sqrt(b * b + 4 * a * work_ms))

    def max_prefill(self, budget_ms: float, decode_tokens: int, kv_positions: int = 0,
                    depth: int = 0) -> int:
        """The most prompt tokens, in a chunk starting at KV position `depth`, that keep the
        predicted tick within budget_ms."""
        return self.chunk_tokens(budget_ms - self.predict(0, decode_tokens, kv_positions), depth)


def attended(n_past: int, n_tokens: int) -> int:
    """KV positions n_tokens new tokens at positions n_past.. attend to (causal: each sees the
    cache and the chunk up to itself)."""
    return n_tokens * n_past + n_tokens * (n_tokens + 1) // 2


class CostModel:
    """Ridge-anchored, exponentially weighted, non-negative least squares over
    (1, prefill, decode, cache positions read/1000, has prefill, prompt's attended/1000)."""

    _N = 6
    # Features are scaled to similar magnitudes before the ridge sees them: a tick has
    # ~1 fixed cost, tens of prompt tokens, a few decoders, a few thousand attended positions.
    _SCALE = np.array([1.0, 1 / 32, 1.0, 1.0, 1.0, 1.0])
    _RIDGE = 0.5  # prior weight, in ticks' worth of evidence per (scaled) coefficient

    def __init__(self, prior: CostEstimate | None = None, forgetting: float = 0.98) -> None:
        prior = prior or CostEstimate()
        self._prior = np.array([prior.fixed_ms, prior.per_prefill_ms, prior.per_decode_ms,
                                prior.per_kv_kpos_ms, prior.prefill_step_ms,
                                prior.per_prompt_kv_kpos_ms]) / self._SCALE
        self._a = np.zeros((self._N, self._N))  # Σ w x xᵀ (scaled features)
        self._b = np.zeros(self._N)  # Σ w x y
        self._lambda = forgetting
        self._samples = 0
        self.error_ewma_ms = 0.0  # mean absolute prediction error, smoothed
        self._estimate = prior
        self._theta = self._prior.copy()

    def _solve(self, a_data: np.ndarray | None = None, b_data: np.ndarray | None = None,
               ridge: float = _RIDGE) -> np.ndarray:
        """argmin Σ w (y - xθ)² + ridge·|θ - prior|² subject to θ ≥ 0: a small active set
        (six unknowns) that pins negative coefficients at zero and solves the rest again."""
        a_data = self._a if a_data is None else a_data
        b_data = self._b if b_data is None else b_data
        free = np.ones(self._N, bool)
        theta = np.zeros(self._N)
        for _ in range(self._N):
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

    def _freeze(self) -> CostEstimate:
        t = self._theta * self._SCALE
        return CostEstimate(fixed_ms=float(t[0]), per_prefill_ms=max(float(t[1]), 1e-4),
                            per_decode_ms=float(t[2]), per_kv_kpos_ms=float(t[3]),
                            prefill_step_ms=float(t[4]), per_prompt_kv_kpos_ms=float(t[5]),
                            samples=self._samples)

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
        self._theta = self._prior.copy()
        self._estimate = self._freeze()

    def observe(self, prefill_tokens: int, decode_tokens: int, kv_positions: int,
                measured_ms: float, prompt_kv_positions: int = 0) -> float:
        """Learns from one tick (kv_positions: the cache positions it reads;
        prompt_kv_positions: what its prompt tokens attend); returns the prediction error
        (measured - predicted) in ms."""
        predicted = self._estimate.predict(prefill_tokens, decode_tokens, kv_positions,
                                           prompt_kv_positions)
        error = measured_ms - predicted
        self.error_ewma_ms += 0.1 * (abs(error) - self.error_ewma_ms)
        # Huber-like: a residual far beyond the usual error moves the fit only so far (a page
        # fault, a preempted thread). A tick with prompt tokens that ran long may say the
        # model is wrong about prompt cost, so it counts up to twice its prediction, not
        # without limit: unclipped stalls of prompt ticks alone had put a 5 ms step into a CPU
        # fit whose prompt tokens cost 1 ms and whose real step is near zero.
        bound = max(4.0 * self.error_ewma_ms, 0.5 * predicted, 1.0)
        upper = max(bound, predicted) if prefill_tokens else bound
        y = predicted + min(max(error, -bound), upper)
        x = self._features(prefill_tokens, decode_tokens, kv_positions, prompt_kv_positions)
        self._a = self._lambda * self._a + np.outer(x, x)
        self._b = self._lambda * self._b + x * y
        self._samples += 1
        self._theta = self._solve()
        self._estimate = self._freeze()
        return error

    def _features(self, prefill_tokens: int, decode_tokens: int, kv_positions: int,
                  prompt_kv_positions: int) -> np.ndarray:
        features: np.ndarray = np.array(
            [1.0, prefill_tokens, decode_tokens, kv_positions / 1000.0,
             1.0 if prefill_tokens else 0.0, prompt_kv_positions / 1000.0]) * self._SCALE
        return features
