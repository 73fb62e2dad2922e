"""A lone interactive request's first token while a background request runs in the background
context (EngineConfig.background_ctx), against the same request with no background work.

    python benches/lane_ttft.py --model 134m --requests 20 --repeat 3

One interactive request at a time (a 100-word prompt, 40 tokens), each sent when the last
ended, while one background request (a 1,000-token prompt) decodes throughout; the same
requests with nothing in the background are the reference. In process, so the figures are the
engine's: what the lane's slices add to a new request's wait. The sides alternate, `--repeat`
runs each. Random weights: the text is gibberish, the timing is what real weights cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import uma
from uma import synth

RESULTS = Path(__file__).resolve().parent / "results"


def first_tokens_ms(engine: uma.Engine, n: int) -> list[float]:
    """The time to the first token of n requests sent one after another, in ms."""
    ttft = []
    for i in range(n):
        t0 = time.perf_counter()
        handle = engine.submit(f"request {i}: " + "word " * 100, max_tokens=40, ignore_eos=True)
        tokens = iter(handle)
        next(tokens)
        ttft.append((time.perf_counter() - t0) * 1e3)
        for _ in tokens:
            pass
    return ttft


def run(model: Path, ns: argparse.Namespace, background: bool) -> dict[str, float]:
    with uma.Engine(model, n_ctx=4096, n_seq_max=4, n_threads=ns.threads,
                    n_gpu_layers=ns.gpu_layers, background_ctx=ns.background_ctx,
                    background_seqs=1) as engine:
        engine.wait_ready()
        bg = None
        if background:
            bg = engine.submit(list(range(100, 1100)), max_tokens=1_000_000, ignore_eos=True,
                               priority="background")
            next(iter(bg))  # its prompt is in: it decodes from here on
        ttft = first_tokens_ms(engine, ns.requests)
        if bg is not None:
            bg.cancel()
    q = statistics.quantiles(ttft, n=20)
    return {"p50_ms": statistics.median(ttft), "p95_ms": q[18], "max_ms": max(ttft)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m", help="a synthetic preset or a GGUF path")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=-1, help="-1: all, where a GPU is")
    ap.add_argument("--background-ctx", type=int, default=2304)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", help="write the runs to benches/results/OUT.json")
    ns = ap.parse_args(argv)
    if ns.requests < 2 or ns.repeat < 1:
        ap.error("--requests must be at least 2 and --repeat at least 1")
    model = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    runs: list[dict[str, object]] = []
    for i in range(ns.repeat):
        order = (True, False) if i % 2 == 0 else (False, True)
        for background in order:
            row = {"background": background, **run(model, ns, background)}
            runs.append(row)
            side = "background running" if background else "no background"
            print(f"{side:20s} TTFT p50 {row['p50_ms']:6.0f}  p95 {row['p95_ms']:6.0f}  "
                  f"max {row['max_ms']:6.0f} ms", flush=True)
    if ns.out:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{ns.out}.json").write_text(json.dumps(
            {"info": vars(ns), "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
