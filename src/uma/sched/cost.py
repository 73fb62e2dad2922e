"""A tick cost model learned online from measured ticks.

    tick_ms ≈ fixed + per_prefill · prefill_tokens + per_decode · decode_tokens
              + per_kv · (KV positions attended by the decode tokens) / 1000

fitted by recursive least squares with forgetting, so it follows the machine as it warms up,
throttles or shares the GPU. Policies get a frozen `CostEstimate` to predict a plan's time
before running it; the executor feeds back what each tick really took.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class CostEstimate:
    """Coefficients of the cost model at one moment (milliseconds)."""

    fixed_ms: float = 2.0
    per_prefill_ms: float = 0.5
    per_decode_ms: float = 1.0
    per_kv_kpos_ms: float = 0.0  # per 1000 KV positions attended by decode tokens
    samples: int = 0  # ticks the estimate has learned from

    def predict(self, prefill_tokens: int, decode_tokens: int, kv_positions: int = 0) -> float:
        return (
            self.fixed_ms
            + self.per_prefill_ms * prefill_tokens
            + self.per_decode_ms * decode_tokens
            + self.per_kv_kpos_ms * kv_positions / 1000.0
        )

    def max_prefill(self, budget_ms: float, decode_tokens: int, kv_positions: int = 0) -> int:
        """The most prefill tokens that keep the predicted tick within budget_ms."""
        spare = budget_ms - self.predict(0, decode_tokens, kv_positions)
        if spare <= 0:
            return 0
        return int(spare / max(self.per_prefill_ms, 1e-4))


class CostModel:
    """Recursive least squares over (1, prefill, decode, kv/1000) with forgetting factor."""

    def __init__(self, prior: CostEstimate | None = None, forgetting: float = 0.97) -> None:
        prior = prior or CostEstimate()
        self._theta = np.array(
            [prior.fixed_ms, prior.per_prefill_ms, prior.per_decode_ms, prior.per_kv_kpos_ms]
        )
        self._p = np.eye(4) * 100.0  # weak prior: the first few ticks dominate it
        self._lambda = forgetting
        self._samples = 0
        self.error_ewma_ms = 0.0  # mean absolute prediction error, smoothed
        self._estimate = self._freeze()

    def _freeze(self) -> CostEstimate:
        # Negative coefficients fit noise, not cost; clamp them for prediction.
        t = np.maximum(self._theta, [0.0, 1e-4, 0.0, 0.0])
        return CostEstimate(float(t[0]), float(t[1]), float(t[2]), float(t[3]), self._samples)

    @property
    def estimate(self) -> CostEstimate:
        return self._estimate

    def observe(self, prefill_tokens: int, decode_tokens: int, kv_positions: int,
                measured_ms: float) -> float:
        """Learns from one tick; returns the prediction error (measured - predicted) in ms."""
        x = np.array([1.0, prefill_tokens, decode_tokens, kv_positions / 1000.0])
        error = measured_ms - self._estimate.predict(prefill_tokens, decode_tokens, kv_positions)
        px = self._p @ x
        gain = px / (self._lambda + x @ px)
        self._theta = self._theta + gain * (measured_ms - x @ self._theta)
        self._p = (self._p - np.outer(gain, px)) / self._lambda
        # Keep P bounded when a feature stays constant (e.g. no prefill for a long while).
        np.clip(self._p, -1e6, 1e6, out=self._p)
        self._samples += 1
        self.error_ewma_ms += 0.1 * (abs(error) - self.error_ewma_ms)
        self._estimate = self._freeze()
        return error
