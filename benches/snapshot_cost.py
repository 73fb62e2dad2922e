"""What a prefix-cache snapshot costs: `llama_state_seq_get_data` of one sequence, its cells in
one run (a prompt decoded alone) against its cells interleaved with other streams' (tokens
decoded together, one cell each a step, as a busy server's are).

    python benches/snapshot_cost.py --model 1b --gpu-layers 99 --threads 8

llama.cpp reads a sequence's state a cell run at a time, per layer and per K and V, so the
number of runs, not the bytes, can set the time on a backend where each read waits for the
device. Medians of --repeat reads, in ms, with the bytes and the runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from uma import _core, synth


def snapshot_ms(ctx: _core.Context, seq: int, repeat: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        size = len(ctx.seq_state(seq))
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times), size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m", help="a synth preset or a GGUF path")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--streams", type=int, default=8, help="streams decoding together")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128, help="tokens each stream decodes")
    ap.add_argument("--repeat", type=int, default=5)
    ns = ap.parse_args()
    path = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    model = _core.Model(path, n_gpu_layers=ns.gpu_layers)
    k = ns.streams
    n = ns.prompt + ns.tokens
    ctx = _core.Context(model, n_ctx=(k + 1) * n + 256, n_seq_max=k + 1, n_threads=ns.threads,
                        kv_unified=True)
    rng = np.random.default_rng(0)
    batch = _core.Batch(max(n, k * ns.prompt))
    # one run: sequence k's n tokens in one decode
    batch.add_sequence(rng.integers(100, 30000, n).astype(np.int32), 0, k)
    ctx.decode(batch)
    # interleaved: k prompts, then a token for each stream a step
    batch.clear()
    for s in range(k):
        batch.add_sequence(rng.integers(100, 30000, ns.prompt).astype(np.int32), 0, s)
    ctx.decode(batch)
    rows = np.arange(k, dtype=np.int32)
    for i in range(ns.tokens):
        batch.clear()
        batch.add_rows(rng.integers(100, 30000, k).astype(np.int32),
                       np.full(k, ns.prompt + i, np.int32), rows)
        ctx.decode(batch)
    ctx.synchronize()
    for label, seq, runs in (("one run", k, 1), ("interleaved", 0, 1 + ns.tokens)):
        ms, size = snapshot_ms(ctx, seq, ns.repeat)
        print(f"{label:12s} {n} tokens, {runs:4d} cell runs: {ms:8.2f} ms  {size / 1e6:7.2f} MB"
              f"  {size / 1e3 / ms:8.1f} MB/s", flush=True)
    ctx.close()
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
