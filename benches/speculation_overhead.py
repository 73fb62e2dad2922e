"""What speculation costs a batch where nothing is drafted, split into its parts.

    python benches/speculation_overhead.py --model 1b --gpu-layers 99 --threads 8 --streams 8

N streams of short distinct prompts (random weights: no guess is ever found), 256 tokens each,
in a fresh engine per run, three sides alternated: `off` (no speculation), `ngram` (the
daemon's default set to n-gram lookup) and `bypass` (the same engine as `ngram`, its context
sized for verifies, with the speculator's per-tick work replaced by nothing). ngram against
bypass is the speculator's own work; bypass against off is what the context's verify rows
cost; `wide` (speculation off, the context sized for verifies as ngram's is) against off
is what that sizing alone costs. Also reports the milliseconds the speculator's draft,
measured and verified calls took (wall clock, on the compute thread) per tick.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import uma  # noqa: E402
from decode_throughput import model_path  # noqa: E402
from served_pace import prompts  # noqa: E402
from servers import alternating  # noqa: E402
from uma.engine import speculator  # noqa: E402
from uma.sched import speculation  # noqa: E402
from uma.server import settings  # noqa: E402

CALLS = ("draft", "measured", "verified")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="1b", help="a synth preset, catalogue name or GGUF path")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sides", nargs="+", default=["off", "ngram", "bypass"],
                    choices=["off", "ngram", "bypass", "wide"])
    ap.add_argument("--out", type=Path)
    ns = ap.parse_args()
    model = model_path(ns.model)
    real = {name: getattr(speculator.Speculator, name) for name in CALLS}
    spent: dict[str, float] = {}

    def timed(name: str):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return real[name](*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0
        return call

    def nothing(name: str):
        return (lambda self, plan, *a, **k: plan) if name == "draft" \
            else (lambda self, *a, **k: None)

    rows = []
    sized = uma.Engine._outputs_per_seq
    for run, side in alternating(ns.sides, ns.repeat):
        uma.Engine._outputs_per_seq = staticmethod(  # type: ignore[method-assign]
            (lambda config: 1 + speculation.MAX_DRAFT) if side == "wide" else sized)
        spent.clear()
        for name in CALLS:
            setattr(speculator.Speculator, name,
                    nothing(name) if side == "bypass" else timed(name))
        given = {"model": str(model), "threads": ns.threads, "threads_batch": ns.threads,
                 "parallel": ns.streams, "ctx": max(4096, ns.streams * (64 + ns.max_tokens)),
                 "gpu_layers": ns.gpu_layers,
                 "speculation": "off" if side in ("off", "wide") else "ngram"}
        with uma.Engine.from_config(settings.resolve([given]).engine) as engine:
            engine.generate("warm up", max_tokens=4)
            before = engine.snapshot()["ticks_total"]
            t0 = time.perf_counter()
            handles = [engine.submit(p, max_tokens=ns.max_tokens, ignore_eos=True)
                       for p in prompts(ns.streams)]
            results = [h.result(timeout=3600) for h in handles]
            wall = time.perf_counter() - t0
            ticks = engine.snapshot()["ticks_total"] - before
        tokens = sum(r.usage.completion_tokens for r in results)
        row = {"side": side, "run": run, "tps": tokens / wall, "ticks": ticks,
               "us_per_tick": {k: 1e6 * v / max(ticks, 1) for k, v in spent.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    for name in CALLS:
        setattr(speculator.Speculator, name, real[name])
    uma.Engine._outputs_per_seq = staticmethod(sized)  # type: ignore[method-assign]
    if ns.out:
        ns.out.write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
