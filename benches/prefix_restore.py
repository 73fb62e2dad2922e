"""An idle conversation's KV restored from host memory, against the live KV cache and a cold
prefill: time to first token of its next turn (1,500 tokens of history, 40 new).

    python benches/prefix_restore.py

Three rounds, each on fresh engines: cold (no prefix cache), kv (the history still in the KV
cache), ram (pushed out by another prompt, snapshotted, restored). 134M f16, 2 threads.
"""

from __future__ import annotations

import statistics

import numpy as np

import uma
from uma import synth


def main() -> None:
    p = synth.cached_model("134m")
    rng = np.random.default_rng(5)
    history = rng.integers(1000, 20000, 1500).tolist()
    other = rng.integers(1000, 20000, 300).tolist()
    rows = {"cold": [], "ram": [], "kv": []}
    for rep in range(3):
        with uma.Engine(p, n_ctx=8192, n_seq_max=1, n_threads=2, prefix_cache=0) as cold:
            q = rng.integers(1000, 20000, 40).tolist()
            rows["cold"].append(cold.generate(history + q, max_tokens=1).timings.ttft_ms)
        with uma.Engine(p, n_ctx=8192, n_seq_max=1, n_threads=2, prefix_cache=1,
                        prefix_cache_ram_mb=1024) as e:
            e.generate(history, max_tokens=1)
            q = rng.integers(1000, 20000, 40).tolist()
            rows["kv"].append(e.generate(history + q, max_tokens=1).timings.ttft_ms)
            e.generate(other, max_tokens=1)  # pushes the conversation out to host memory
            q = rng.integers(1000, 20000, 40).tolist()
            r = e.generate(history + q, max_tokens=1)
            rows["ram"].append(r.timings.ttft_ms)
            snap = e.snapshot()
        print(rep, {k: round(v[-1]) for k, v in rows.items()}, "cached", r.usage.cached_tokens,
              "restored MB", round(snap["prefix_cache_restored_bytes_total"] / 2**20, 1))
    print({k: (round(statistics.median(v)), round(min(v)), round(max(v))) for k, v in rows.items()})


if __name__ == "__main__":
    main()
