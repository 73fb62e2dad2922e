"""ΣBMT: the bytes a tick moves through memory, estimated from the model's shape.

On unified-memory machines decode speed is set by memory bandwidth, not arithmetic: every tick
reads the weights once (for an MoE, the experts its tokens are routed to), and every decode
token reads its sequence's whole KV cache. Keeping bytes per tick within bandwidth × tick budget
keeps ticks out of the regime where everyone waits on memory.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

# Bytes per element of each KV cache type (block formats include their scales).
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32,
                 "q5_0": 22 / 32, "q4_1": 20 / 32, "q4_0": 18 / 32}


class ModelShape(Protocol):
    """What BmtModel.of reads of a model (uma._core.Model has it)."""

    def info(self) -> dict[str, Any]: ...

    def meta(self, key: str) -> str | None: ...


@dataclass(frozen=True, slots=True)
class BmtModel:
    dense_bytes: float  # weights every forward pass reads (all of a dense model)
    expert_bytes: float  # bytes of one expert summed over layers (0 for a dense model)
    n_expert: int  # experts per MoE layer (0 for a dense model)
    n_expert_used: int  # experts each token is routed to
    kv_bytes_per_pos: float  # K and V bytes of one position over all layers
    act_bytes_per_token: float  # activations written and read per token and layer, summed

    def tick_bytes(self, n_tokens: int, kv_positions: int) -> float:
        """Bytes one tick moves: weights (only the experts n_tokens can reach), the KV read by
        its decode tokens (kv_positions summed over them) and activations."""
        if n_tokens <= 0:
            return 0.0
        experts = min(self.n_expert, n_tokens * self.n_expert_used) if self.n_expert else 0
        return (self.dense_bytes + experts * self.expert_bytes
                + self.kv_bytes_per_pos * kv_positions + self.act_bytes_per_token * n_tokens)

    @classmethod
    def of(cls, model: ModelShape, kv_type: str = "f16") -> BmtModel:
        """From a loaded uma._core.Model: its info() plus the FFN widths its GGUF records (an
        MoE's expert width is not in info(); guessing it made experts 3x too large)."""
        info = dict(model.info())
        arch = info["architecture"]
        for key in (f"{arch}.expert_feed_forward_length", f"{arch}.feed_forward_length"):
            value = model.meta(key)
            if value and value.isdigit():
                info["n_ff_expert" if "expert" in key else "n_ff"] = int(value)
        return cls.from_model(info, kv_type)

    @classmethod
    def from_model(cls, info: dict[str, Any], kv_type: str = "f16") -> BmtModel:
        """From uma._core.Model.info() (plus the expert FFN width where the GGUF has one)."""
        n_layer, n_embd = info["n_layer"], info["n_embd"]
        bytes_per_param = info["size_bytes"] / max(info["n_params"], 1)
        n_expert, used = info.get("n_expert", 0), info.get("n_expert_used", 0)
        expert_bytes = 0.0
        if n_expert:
            n_ff_exp = info.get("n_ff_expert") or info.get("n_ff") or 4 * n_embd
            expert_bytes = 3 * n_embd * n_ff_exp * n_layer * bytes_per_param
        dense = max(info["size_bytes"] - n_expert * expert_bytes, 0.0)
        n_embd_kv = n_embd // max(info["n_head"], 1) * info["n_head_kv"]
        kv = 2 * n_layer * n_embd_kv * KV_TYPE_BYTES.get(kv_type, 2.0)
        act = 8 * n_layer * n_embd * 4  # a handful of f32 vectors per layer
        return cls(dense, expert_bytes, n_expert, used, kv, act)


@functools.cache
def machine_bandwidth_gbps() -> float:
    """probe_bandwidth_gbps, once a process: the bandwidth is the machine's, not a model's, and
    the probe saturates memory for a second or more: a model loaded beside others that probed
    again stalled their streams for up to 200 ms a tick on a 2-core CPU."""
    return probe_bandwidth_gbps()


def probe_bandwidth_gbps(megabytes: int = 256, repeats: int = 3) -> float:
    """Host memory bandwidth (bytes read + written per second, in GB/s) from a few large copies:
    what a CPU or unified-memory GPU has to share between ticks."""
    src = np.ones(megabytes << 18, dtype=np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9
