"""Streams' decode beside the cells a prefix cache keeps, in one KV buffer.

    python benches/kept_cells.py --model 134m --threads 2 --long 4 --repeat 3

In a fresh engine per run (12 sequences, one KV buffer of --ctx cells), --long finished
requests of --long-tokens random prompt tokens each, then three streams of 64 tokens from
32-token prompts, with the prefix cache on (the default: the finished prompts' cells stay in
the KV cache for a request that starts the same way) and off, alternated. With one KV buffer
llama.cpp's attention reads every cell up to the highest one in use, each sequence's masked
out but read: kept cells that no stream shares still lengthen every stream's tick. Reports
the streams' inter-token gap p50 and the decode time per tick.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import uma  # noqa: E402
from decode_throughput import model_path  # noqa: E402
from servers import alternating  # noqa: E402


def run(model: Path, ns: argparse.Namespace, cache: int) -> dict:
    rng = np.random.default_rng(0)
    with uma.Engine(model, n_ctx=ns.ctx, n_seq_max=12, n_threads=ns.threads,
                    n_threads_batch=ns.threads, prefix_cache=cache) as engine:
        engine.wait_ready()
        for _ in range(ns.long):
            engine.generate(rng.integers(100, 30000, ns.long_tokens).astype(np.int32),
                            max_tokens=2)
        handles = [engine.submit(rng.integers(100, 30000, 32).astype(np.int32),
                                 max_tokens=64, ignore_eos=True) for _ in range(3)]
        results = [h.result(timeout=600) for h in handles]
        decode = engine.snapshot()["tick_decode_ms"]["p50"]
    gaps = [b - a for r in results
            for a, b in zip(r.timings.token_ms, r.timings.token_ms[1:], strict=False)]
    return {"prefix_cache": cache, "itl_p50_ms": statistics.median(gaps),
            "decode_p50_ms": decode}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m", help="a synth preset or a GGUF path")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=53760, help="KV cells (the scenario matrix's)")
    ap.add_argument("--long", type=int, default=4, help="finished long requests")
    ap.add_argument("--long-tokens", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ns = ap.parse_args()
    model = model_path(ns.model)
    rows = []
    for r, side in alternating(["kept", "none"], ns.repeat):
        row = {"run": r, "side": side, **run(model, ns, 8 if side == "kept" else 0)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    for side in ("kept", "none"):
        gaps = [x["itl_p50_ms"] for x in rows if x["side"] == side]
        print(f"{side}: inter-token p50 {statistics.median(gaps):.1f} ms "
              f"({min(gaps):.1f}-{max(gaps):.1f})")
    if ns.out:
        from report import run_info
        ns.out.write_text(json.dumps({"info": run_info(model, threads=ns.threads),
                                      "args": vars(ns) | {"out": str(ns.out)},
                                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
