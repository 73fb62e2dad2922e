"""What other sequences' cells cost a decode tick in one KV buffer: by their number, or by the
highest cell in use.

    python benches/kv_span.py --model 134m --threads 2 --repeat 3

Three streams' sequences hold --depth cells each, placed first (the lowest cells); then
--copies sequences of --long-tokens cells each are placed above them, one prompt prefilled
once and read back into each sequence in turn (restores, in the same order every time, so
that each copy sits in the same cells). A tick of the three streams' decode rows is timed
(median of --ticks) with no copy held, with every copy held, with only the highest copy held
(its cells few, the span up to it long: the cells below it free), and with only the lowest.
llama.cpp's attention runs each row over every cell up to the highest in use
(llama_kv_cache::get_n_kv), so the highest copy alone should cost what all of them do. The
cases are alternated, forwards then backwards, --repeat times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_throughput import model_path  # noqa: E402
from uma import _core  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m", help="a synth preset or a GGUF path")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--depth", type=int, default=100, help="each stream's cells")
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--long-tokens", type=int, default=3000)
    ap.add_argument("--ticks", type=int, default=25)
    ap.add_argument("--repeat", type=int, default=3)
    ns = ap.parse_args()
    streams = 3
    n_ctx = streams * ns.depth + ns.copies * ns.long_tokens + 512
    model = _core.Model(str(model_path(ns.model)), n_gpu_layers=ns.gpu_layers)
    ctx = _core.Context(model, n_ctx=n_ctx, n_batch=512, n_seq_max=streams + ns.copies,
                        n_threads=ns.threads, n_threads_batch=ns.threads)
    batch = _core.Batch(512)
    rng = np.random.default_rng(0)
    for seq in range(streams):
        batch.clear()
        batch.add_sequence(rng.integers(100, 30000, ns.depth).astype(np.int32), 0, seq,
                           logits_last=True)
        ctx.decode(batch)
    long = rng.integers(100, 30000, ns.long_tokens).astype(np.int32)
    first = streams
    for start in range(0, ns.long_tokens, 512):
        batch.clear()
        batch.add_sequence(long[start:start + 512], start, first, logits_last=True)
        ctx.decode(batch)
    state = ctx.seq_state(first)
    copies = list(range(first, first + ns.copies))

    def tick() -> float:
        batch.clear()
        for seq in range(streams):
            batch.add(7, ns.depth, seq, True)
        t0 = time.perf_counter()
        ctx.decode(batch)
        ctx.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        for seq in range(streams):
            ctx.seq_rm(seq, ns.depth, -1)
        return ms

    def hold(kept: list[int]) -> None:
        for seq in copies:
            ctx.seq_rm(seq)
        for seq in copies:
            ctx.set_seq_state(seq, state)
        for seq in copies:
            if seq not in kept:
                ctx.seq_rm(seq)

    held = ns.copies * ns.long_tokens
    cases = {
        "no copy": [],
        f"all {ns.copies} ({held} cells)": copies,
        f"the highest ({ns.long_tokens} cells, span {held})": copies[-1:],
        f"the lowest ({ns.long_tokens} cells, span {ns.long_tokens})": copies[:1],
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(ns.repeat):
        order = list(cases.items())
        for name, kept in order if r % 2 == 0 else order[::-1]:
            hold(kept)
            times[name].append(statistics.median(tick() for _ in range(ns.ticks)))
    base = statistics.median(times["no copy"])
    print(f"{'held beside three streams':44s} {'tick ms':>8s}  spread        × none")
    for name, ms in times.items():
        mid = statistics.median(ms)
        print(f"{name:44s} {mid:8.1f}  ({min(ms):.1f}-{max(ms):.1f})  {mid / base:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
