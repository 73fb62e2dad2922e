"""Background prompts in the streams' KV buffer, or in a second context of their own.

    python benches/split_context.py --model 1b --gpu-layers 99 --threads 8 \
        --modes alone,shared:128,split:128,shared-floor:512/8,split-floor:512/8

K streams run request after request (a P-token prompt, then D decoded tokens, staggered so
that one stream's new prompt lands every few ticks) while B background prompts of N tokens
are scored in chunks. The streams' gap is one cycle: their tick, and the background's chunk
either in the same batch (`shared`: one context, one KV buffer, so the streams' attention
spans the background's cells) or as a decode call of its own on a second context over the
same weights (`split`: the streams' buffer holds only theirs, and the chunk pays a call's
fixed cost). `:C` puts a C-token chunk in every cycle, `-floor:C/k` one in every k-th.

No scheduler: the same fixed schedule on both sides, each cycle timed to the device's end,
so what differs is only where the background's cells live. Figures: the streams' gap p50 /
p95 / worst, the p95 of the cycles that carry no chunk (what the background's cells alone
cost the streams), and the background's tokens a second, over the cycles while it runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from uma import _core, synth


@dataclass(frozen=True)
class Mode:
    name: str
    split: bool
    chunk: int  # background tokens a chunk (0: none)
    every: int  # a chunk every this many cycles

    @classmethod
    def parse(cls, text: str) -> Mode:
        kind, _, arg = text.partition(":")
        if kind == "alone":
            return cls(text, False, 0, 1)
        if kind not in ("shared", "split", "shared-floor", "split-floor"):
            raise ValueError(f"unknown mode {text!r}")
        chunk, _, every = arg.partition("/")
        return cls(text, kind.startswith("split"), int(chunk), int(every or 1))


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def run(model: _core.Model, mode: Mode, ns: argparse.Namespace) -> dict[str, float]:
    k, bg_n, n_bg = ns.streams, ns.bg_tokens, ns.background
    per_stream = ns.prompt + ns.decode + 8
    opts = dict(n_batch=2048, n_ubatch=512, n_threads=ns.threads, kv_unified=True,
                flash_attn=ns.flash_attn)
    bg_cells = n_bg * (bg_n + 8)
    if mode.split:
        fg = _core.Context(model, n_ctx=k * per_stream + 256, n_seq_max=k, **opts)
        bg = _core.Context(model, n_ctx=bg_cells + 256, n_seq_max=max(1, n_bg), **opts)
        bg_seq0 = 0
    else:
        fg = _core.Context(model, n_ctx=k * per_stream + bg_cells + 256, n_seq_max=k + n_bg,
                           **opts)
        bg, bg_seq0 = fg, k
    rng = np.random.default_rng(0)
    fg_batch, bg_batch = _core.Batch(4096), _core.Batch(4096)
    life = ns.prompt + ns.decode
    # stream i is at step (cycle + i * stagger) % life of its current request: step 0 is
    # its prompt, steps 1..decode its decoded tokens
    stagger = max(1, life // k)
    npos = [0] * k
    bg_done = [0] * n_bg
    gaps: list[float] = []
    quiet: list[float] = []  # the cycles without a background chunk
    bg_tokens = 0
    t_start = time.perf_counter()
    cycle = 0
    limit = ns.cycles if mode.chunk == 0 else 10 ** 9
    while cycle < limit:
        if mode.chunk and all(d >= bg_n for d in bg_done):
            break
        fg_batch.clear()
        for i in range(k):
            step = (cycle + i * stagger) % life
            if step == 0:
                fg.seq_rm(i)
                npos[i] = 0
                fg_batch.add_sequence(rng.integers(100, 30000, ns.prompt).astype(np.int32),
                                      0, i, logits_last=True)
                npos[i] = ns.prompt
            else:
                fg_batch.add(int(rng.integers(100, 30000)), npos[i], i, True)
                npos[i] += 1
        chunk_seq = -1
        if mode.chunk and cycle % mode.every == 0:
            chunk_seq = next(s for s in range(n_bg) if bg_done[s] < bg_n)
            n = min(mode.chunk, bg_n - bg_done[chunk_seq])
            target = bg_batch if mode.split else fg_batch
            if mode.split:
                bg_batch.clear()
            target.add_sequence(rng.integers(100, 30000, n).astype(np.int32),
                                bg_done[chunk_seq], bg_seq0 + chunk_seq, logits_last=False)
        t0 = time.perf_counter()
        fg.decode(fg_batch)
        if mode.split and chunk_seq >= 0:
            bg.decode(bg_batch)
        fg.synchronize()
        if mode.split:
            bg.synchronize()
        gaps.append(1e3 * (time.perf_counter() - t0))
        if chunk_seq < 0 and cycle >= ns.warmup:
            quiet.append(gaps[-1])
        if chunk_seq >= 0:
            bg_done[chunk_seq] += n
            bg_tokens += n
        cycle += 1
    wall = time.perf_counter() - t_start
    if bg is not fg:
        bg.close()
    fg.close()
    body = gaps[ns.warmup:]
    return {"cycles": len(gaps), "p50": statistics.median(body), "p95": pct(body, 0.95),
            "worst": max(body), "quiet_p95": pct(quiet, 0.95) if quiet else float("nan"),
            "bg_tok_s": bg_tokens / wall if bg_tokens else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m", help="a synth preset or a GGUF path")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=32, help="a stream request's prompt tokens")
    ap.add_argument("--decode", type=int, default=64, help="a stream request's decoded tokens")
    ap.add_argument("--background", type=int, default=2)
    ap.add_argument("--bg-tokens", type=int, default=6000)
    ap.add_argument("--cycles", type=int, default=600, help="cycles of the 'alone' mode")
    ap.add_argument("--warmup", type=int, default=20, help="cycles not counted")
    ap.add_argument("--repeat", type=int, default=3, help="rounds over the modes")
    ap.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--modes", default="alone,shared:128,split:128")
    ns = ap.parse_args()
    modes = [Mode.parse(m) for m in ns.modes.split(",")]
    path = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    model = _core.Model(path, n_gpu_layers=ns.gpu_layers)
    run(model, Mode.parse("alone"), argparse.Namespace(**{**vars(ns), "cycles": 60}))
    print(f"{ns.streams} streams ({ns.prompt}-token prompts, {ns.decode} tokens each), "
          f"{ns.background} background prompts of {ns.bg_tokens} tokens")
    for r in range(ns.repeat):
        for m in modes:
            s = run(model, m, ns)
            print(f"  round {r + 1} {m.name:>18}: gap p50 {s['p50']:6.2f}  p95 {s['p95']:6.2f}"
                  f"  worst {s['worst']:7.2f} ms  p95 without a chunk {s['quiet_p95']:6.2f}"
                  f"  background {s['bg_tok_s']:8.0f} tok/s"
                  f"  ({s['cycles']} cycles)", flush=True)
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
