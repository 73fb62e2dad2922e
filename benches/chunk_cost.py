"""What a prompt chunk adds to a decode tick: K streams decoding a token each, with and without
a chunk of C prompt tokens of another sequence in the same batch, timed to the device's end.

    python benches/chunk_cost.py --model 1b --gpu-layers 99 --threads 8 --chunks 0,8,16,32,64

This is the price the latency guard's cost model learns (uma.sched.cost); a backend whose
price is not close to linear in C (a fixed cost for any mixed batch, or a cliff at some size)
shows here as a row that a line through the others misses. --history puts that many cells of
an earlier prompt in the KV cache first, as a storm's background prompt does. --prompt-seq puts
the chunk on a sequence among the decoders' (a stream starting its next prompt: decoders on
0..K but that one) and --layout how the batch lists them: in sequence order, as uma.engine.scheduler
does, or decode rows first. With a KV buffer per sequence llama.cpp makes a micro-batch of
consecutive sequence ids only, in batch order, so the layout decides how many there are.
--deep runs the chunk as the history's next tokens (a long prompt's later chunks, at its depth):
on a CPU the attention kernel decides what such a chunk costs (compare --flash-attn on and off).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from uma import _core, synth


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m", help="a synth preset or a GGUF path")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--streams", type=int, default=8, help="decoding streams (K)")
    ap.add_argument("--chunks", default="0,1,4,8,16,24,32,48,64,96,128,256",
                    help="prompt tokens a tick (C), comma-separated")
    ap.add_argument("--history", type=int, default=0, help="cells of a prompt decoded first")
    ap.add_argument("--repeat", type=int, default=9, help="ticks timed a chunk size")
    ap.add_argument("--kv-unified", action="store_true")
    ap.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--prompt-seq", type=int, default=None,
                    help="the chunk's sequence, in [0, K] (default K: after the decoders)")
    ap.add_argument("--layout", choices=("seq", "decode-first"), default="seq")
    ap.add_argument("--deep", action="store_true",
                    help="the chunk continues the history's sequence, at its depth (its "
                         "cells removed after each tick): a long prompt's later chunks")
    ns = ap.parse_args()
    path = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    chunks = [int(c) for c in ns.chunks.split(",")]
    k = ns.streams
    prompt_seq, history_seq = (k if ns.prompt_seq is None else ns.prompt_seq), k + 1
    if not 0 <= prompt_seq <= k:
        ap.error(f"--prompt-seq must be in [0, {k}]")
    if ns.deep and not ns.history:
        ap.error("--deep needs --history (the depth the chunks run at)")
    if ns.deep:
        prompt_seq = history_seq
    room = ns.repeat * (max(chunks) + 1) * len(chunks) * 2 + 64
    per_seq = max(room, ns.history + max(chunks) + 64)
    model = _core.Model(path, n_gpu_layers=ns.gpu_layers)
    ctx = _core.Context(model, n_ctx=(k + 2) * per_seq, n_seq_max=k + 2, n_batch=2048,
                        n_ubatch=512, n_threads=ns.threads, kv_unified=ns.kv_unified,
                        flash_attn=ns.flash_attn)
    rng = np.random.default_rng(0)
    batch = _core.Batch(max(2048, k + max(chunks)))
    if ns.history:
        for start in range(0, ns.history, 2048):
            n = min(2048, ns.history - start)
            batch.clear()
            batch.add_sequence(rng.integers(100, 30000, n).astype(np.int32), start, history_seq)
            ctx.decode(batch)
    # the K decoders' sequences: 0..K but the chunk's (with --deep the chunk is on the
    # history's sequence, K + 1, and the decoders are 0..K-1)
    rows = np.array([s for s in range(k + 1) if s != prompt_seq], dtype=np.int32)[:k]
    pos = 0  # every stream's next position
    prompt_pos = ns.history if ns.deep else 0

    def tick(c: int) -> float:
        nonlocal pos, prompt_pos
        batch.clear()
        tokens = rng.integers(100, 30000, k).astype(np.int32)
        before = rows < prompt_seq if ns.layout == "seq" else np.ones(k, dtype=bool)
        batch.add_rows(tokens[before], np.full(int(before.sum()), pos, np.int32), rows[before])
        if c:
            batch.add_sequence(rng.integers(100, 30000, c).astype(np.int32), prompt_pos,
                               prompt_seq)
        if not before.all():
            batch.add_rows(tokens[~before], np.full(int((~before).sum()), pos, np.int32),
                           rows[~before])
        t0 = time.perf_counter()
        ctx.decode(batch)
        ctx.synchronize()
        dt = 1e3 * (time.perf_counter() - t0)
        pos += 1
        if ns.deep:  # the next chunk runs at the same depth
            ctx.seq_rm(prompt_seq, prompt_pos, -1)
        else:
            prompt_pos += c
        return dt

    for _ in range(3):  # warm up: the first shapes pay pipeline and buffer setup
        for c in chunks:
            tick(c)
    times: dict[int, list[float]] = {c: [] for c in chunks}
    for _ in range(ns.repeat):  # alternating sizes, as a guard's ticks do
        for c in chunks:
            times[c].append(tick(c))
    base = statistics.median(times[chunks[0]])
    print(f"K={k} streams, history {ns.history} cells, kv_unified={ns.kv_unified}, "
          f"flash_attn={ns.flash_attn}, prompt on sequence {prompt_seq}"
          f"{' at the depth of the history' if ns.deep else ''}, layout {ns.layout}")
    for c in chunks:
        med = statistics.median(times[c])
        extra = (med - base) / c if c else 0.0
        print(f"  chunk {c:4d}: tick {med:8.2f} ms (min {min(times[c]):7.2f}, "
              f"max {max(times[c]):7.2f})  over decode-only {med - base:7.2f} ms"
              f"  {extra:6.3f} ms/token", flush=True)
    ctx.close()
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
