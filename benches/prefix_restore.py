"""An idle conversation's KV restored from host memory, against the live KV cache and a cold
prefill: time to first token of its next turn (--history tokens of history, 40 new).

    python benches/prefix_restore.py                         # 134M f16, 2 threads, 1,500
    python benches/prefix_restore.py --model 1b --gpu-layers 99 --threads 8 --history 8000

Three rounds, each on fresh engines: cold (no prefix cache), kv (the history still in the KV
cache), ram (pushed out by another prompt, snapshotted, restored).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

import uma
from uma import synth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m", help="a synth preset or a GGUF path")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--history", type=int, default=1500, help="the conversation's tokens")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ns = ap.parse_args()
    p = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    rng = np.random.default_rng(5)
    history = rng.integers(1000, 20000, ns.history).tolist()
    other = rng.integers(1000, 20000, 300).tolist()
    ctx = 2 * ns.history + 1024
    common = {"n_ctx": ctx, "n_seq_max": 1, "n_threads": ns.threads,
              "n_gpu_layers": ns.gpu_layers}
    rows: dict[str, list[float]] = {"cold": [], "ram": [], "kv": []}
    restored = 0
    for rep in range(3):
        with uma.Engine(p, prefix_cache=0, **common) as cold:
            q = rng.integers(1000, 20000, 40).tolist()
            rows["cold"].append(cold.generate(history + q, max_tokens=1).timings.ttft_ms)
        with uma.Engine(p, prefix_cache=1, prefix_cache_ram_mb=4096, **common) as e:
            e.generate(history, max_tokens=1)
            q = rng.integers(1000, 20000, 40).tolist()
            rows["kv"].append(e.generate(history + q, max_tokens=1).timings.ttft_ms)
            e.generate(other, max_tokens=1)  # pushes the conversation out to host memory
            q = rng.integers(1000, 20000, 40).tolist()
            r = e.generate(history + q, max_tokens=1)
            rows["ram"].append(r.timings.ttft_ms)
            restored = e.snapshot()["prefix_cache_restored_bytes_total"]
        print(rep, {k: round(v[-1], 1) for k, v in rows.items()}, "cached",
              r.usage.cached_tokens, "restored MB", round(restored / 2**20, 1), flush=True)
    summary = {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}
               for k, v in rows.items()}
    print({k: (round(v["median"], 1), round(v["min"], 1), round(v["max"], 1))
           for k, v in summary.items()})
    if ns.out:
        ns.out.write_text(json.dumps({"model": str(p), "history": ns.history,
                                      "restored_bytes": restored, "ttft_ms": summary},
                                     indent=2))


if __name__ == "__main__":
    main()
