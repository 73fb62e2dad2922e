"""Where a decode tick's time goes: the bare core loop against the engine, decode-only ticks.

    python benches/profile_tick.py --model 1b --streams 32 --gpu-layers 99 --threads 8

The core loop is what uma._core alone achieves (decode + native greedy sampling, no Python
scheduling); the engine figures come from its executor's per-tick trace, decode-only ticks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import uma
from uma import _core, synth


def core_loop(model: _core.Model, streams: int, pp: int, tg: int, threads: int,
              sample: bool, kv_unified: bool) -> float:
    ctx = _core.Context(model, n_ctx=streams * (pp + tg) + 64, n_batch=2048, n_ubatch=512,
                        n_seq_max=streams, n_threads=threads, kv_unified=kv_unified)
    batch = _core.Batch(2048)
    rng = np.random.default_rng(0)
    for s in range(streams):  # prompts in batches of at most n_batch tokens
        if batch.n_tokens + pp > batch.capacity:
            ctx.decode(batch)
            batch.clear()
        batch.add_sequence(rng.integers(100, 30000, pp).astype(np.int32), 0, s)
    ctx.decode(batch)
    sampler = _core.Sampler(streams, model.n_vocab)
    rows = np.arange(streams, dtype=np.int32)
    t0 = time.perf_counter()
    for i in range(tg):
        batch.clear()
        batch.add_rows(rng.integers(100, 30000, streams).astype(np.int32),
                       np.full(streams, pp + i, np.int32), rows)
        ctx.decode(batch)
        if sample:
            sampler.sample(ctx, rows, ctx.output_seqs)
        else:
            ctx.logits()  # waits for the GPU and the logits copy, like the peer's sync
    dt = time.perf_counter() - t0
    sampler.close()
    ctx.close()
    return streams * tg / dt


def engine_ticks(path: Path, streams: int, pp: int, tg: int, threads: int, gpu_layers: int,
                 kv_unified: bool) -> dict:
    engine = uma.Engine(path, n_ctx=streams * (pp + tg) + 64, n_seq_max=streams, n_batch=2048,
                        n_ubatch=512, n_threads=threads, n_gpu_layers=gpu_layers,
                        kv_unified=kv_unified)
    engine.generate("warm up", max_tokens=4)
    engine._executor.trace = trace = []
    rng = np.random.default_rng(1)
    handles = [engine.submit(rng.integers(100, 30000, pp).astype(np.int32), max_tokens=tg,
                             ignore_eos=True) for _ in range(streams)]
    for h in handles:
        h.result()
    engine.close()
    full = [t for t in trace if t[0] == 0 and t[1] == streams]
    med = lambda i: 1e3 * statistics.median(t[i] for t in full)  # noqa: E731
    return {"ticks": len(trace), "decode_only_full": len(full), "decode_ms": med(2),
            "sample_ms": med(3), "tick_ms": med(4),
            "other_ms": med(4) - med(2) - med(3), "tok_s": streams / (med(4) / 1e3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--pp", type=int, default=128)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--kv-unified", action="store_true")
    ns = ap.parse_args()
    path = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    model = _core.Model(path, n_gpu_layers=ns.gpu_layers)
    args = (model, ns.streams, ns.pp, ns.tg, ns.threads)
    print(f"core loop, no sampling:   {core_loop(*args, False, ns.kv_unified):9.1f} tok/s")
    print(f"core loop, greedy native: {core_loop(*args, True, ns.kv_unified):9.1f} tok/s")
    model.close()
    ticks = engine_ticks(path, ns.streams, ns.pp, ns.tg, ns.threads, ns.gpu_layers,
                         ns.kv_unified)
    print("engine, decode-only ticks: " + ", ".join(
        f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in ticks.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
