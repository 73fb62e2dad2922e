"""Constrained decoding: what a JSON schema costs the streams, and the two grammar engines.

    python benches/constrained.py --model 134m --threads 2 --repeat 3
    python benches/constrained.py --model 1b --gpu-layers 99 --threads 8 --repeat 3

1. Throughput: --streams requests of --tokens tokens each (sampled, temperature 1), plain
   against held to a JSON schema (an array of strings, so that every request writes its
   --tokens tokens; --schema: strings of at most 16 characters, or open), in process, a
   fresh engine per run, alternating. Constrained rows are
   sampled on the host; on a GPU, "plain, host sampling" shows what that alone costs.
   Reported: decode tokens/s over the window in which every stream decodes, and the
   engine's p95 tick time.
2. Grammar engines: the token masks llguidance builds (what uma.grammar uses) against
   llama.cpp's own grammar sampler (uma._core.llama_grammar_steps), on the same token
   sequences of the same GBNF JSON grammar (llama.cpp's grammars/json.gbnf): time per token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import uma  # noqa: E402
from servers import alternating  # noqa: E402
from uma import _core, synth  # noqa: E402
from uma.grammar import Constraint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
JSON_GBNF = ROOT / "third_party" / "llama.cpp" / "grammars" / "json.gbnf"
# At least 100 strings: no request can end its array within --tokens, so both sides write
# the same number of tokens. "bounded" strings are llguidance's harder case: near the end of
# a string no token slice applies and a mask walks the whole vocabulary (0.4 ms a mask at
# the median on the H100's host, 2.5 ms at p95); "open" strings are what most schemas hold.
SCHEMAS = {
    "bounded": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 100},
    "open": {"type": "array", "items": {"type": "string"}, "minItems": 100},
}


SIDES = {  # name: (held to the schema, where plain rows are sampled)
    "plain": (False, "auto"),
    "plain, host sampling": (False, "off"),  # as constrained rows are, always
    "json schema": (True, "auto"),
}


def throughput(path: Path, ns: argparse.Namespace, side: str, seed: int) -> dict:
    constrained, sampling = SIDES[side]
    fmt = {"type": "json_schema", "json_schema": {"schema": SCHEMAS[ns.schema]}} \
        if constrained else None
    with uma.Engine(path, n_ctx=ns.streams * (ns.tokens + 64) + 256, n_seq_max=ns.streams,
                    n_threads=ns.threads, n_gpu_layers=ns.gpu_layers,
                    device_sampling=sampling) as engine:
        engine.generate("warm up", max_tokens=4, response_format=fmt)
        handles = [engine.submit(f"Item list {k}:", max_tokens=ns.tokens, temperature=1.0,
                                 seed=seed * 100 + k, ignore_eos=True, response_format=fmt)
                   for k in range(ns.streams)]
        results = [h.result(timeout=3600) for h in handles]
        tick = engine.snapshot()["tick_ms"]
    if any(r.finish_reason != "length" for r in results):  # an error, or an early end
        raise RuntimeError(f"not every request wrote {ns.tokens} tokens: "
                           f"{[r.finish_reason for r in results]}")
    starts = [r.timings.token_ms[0] for r in results]
    ends = [r.timings.token_ms[-1] for r in results]
    lo, hi = max(starts), min(ends)
    tokens = sum(sum(1 for t in r.timings.token_ms if lo <= t <= hi) for r in results)
    return {"tokens_per_s": 1e3 * tokens / (hi - lo), "tick_p95_ms": tick["p95"],
            "tick_p50_ms": tick["p50"],
            "tokens": float(sum(r.usage.completion_tokens for r in results))}


def engines(path: Path, ns: argparse.Namespace) -> dict:
    """Per-token mask time of llguidance and of llama.cpp's grammar sampler."""
    grammar = JSON_GBNF.read_text()
    with uma.Engine(path, n_ctx=2048, n_seq_max=4, n_threads=ns.threads,
                    n_gpu_layers=ns.gpu_layers) as engine:
        runs = [engine.generate("JSON:", max_tokens=ns.tokens, temperature=1.0, seed=s,
                                grammar=grammar) for s in range(4)]
        grammars = engine.grammars
        ll, cpp = [], []
        words = (engine.model.n_vocab + 31) // 32
        mask = np.empty((1, words), np.int32)
        logits = np.zeros(engine.model.n_vocab, np.float32)
        for r in runs:
            matcher = grammars.matcher(Constraint("gbnf", grammar))
            for token in r.token_ids:
                t0 = time.perf_counter()
                grammars.fill_masks([matcher], mask)
                ll.append(time.perf_counter() - t0)
                matcher.consume_token(token)
            times, _ = _core.llama_grammar_steps(engine.model, grammar, r.token_ids, logits)
            cpp.extend(times.tolist())
    return {name: {"p50_ms": 1e3 * float(np.median(v)), "p95_ms": 1e3 * float(np.percentile(
        v, 95)), "max_ms": 1e3 * max(v), "tokens": len(v)}
        for name, v in (("llguidance", ll), ("llama.cpp grammar", cpp))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m", help="a synth preset or a GGUF path")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3, help="runs a side, alternating order")
    ap.add_argument("--sides", nargs="+", default=["plain", "json schema"], choices=SIDES,
                    help="plain (device sampling where it is on), plain with host sampling, "
                         "json schema")
    ap.add_argument("--schema", choices=SCHEMAS, default="bounded",
                    help="the strings' schema: bounded (maxLength 16) or open")
    ap.add_argument("--masks", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the two grammar engines")
    ap.add_argument("--out", type=Path, default=None)
    ns = ap.parse_args()
    path = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    runs: dict[str, list[dict]] = {name: [] for name in SIDES if name in ns.sides}
    for r, name in alternating(list(runs), ns.repeat):
        runs[name].append(throughput(path, ns, name, r))
        print(f"run {r} {name:20s} " + "  ".join(f"{k} {v:.4g}" for k, v in
                                                  runs[name][-1].items()), flush=True)
    med = {name: {k: statistics.median(row[k] for row in rows) for k in rows[0]}
           for name, rows in runs.items()}
    ratio = med["json schema"]["tokens_per_s"] / med["plain"]["tokens_per_s"]
    for name, row in med.items():
        print(f"{name:20s} median: " + "  ".join(f"{k} {v:.4g}" for k, v in row.items()))
    print(f"json schema / plain tokens/s: {ratio:.3f}")
    masks = engines(path, ns) if ns.masks else {}
    for name, row in masks.items():
        print(f"{name:18s} per token: " + "  ".join(f"{k} {v:.4g}" for k, v in row.items()))
    if ns.out:
        ns.out.write_text(json.dumps({"model": str(path), "args": {
            k: str(v) for k, v in vars(ns).items()}, "runs": runs, "medians": med,
            "ratio": ratio, "mask_engines": masks}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
