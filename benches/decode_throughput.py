"""Decode (and prefill) throughput: uma.Engine against llama.cpp's llama-batched-bench, side by
side.

Both run the same synthetic model file, the same ggml build (benches/llama_tools.py), the same
thread count, prompt length and generation length, alternating engine and peer runs. The peer
decodes random tokens with no sampling at all, so it is the ceiling of what the kernels give;
the engine pays for everything a server does (scheduling, sampling, detokenising, events).

    python benches/decode_throughput.py --model 134m --threads 2 --streams 1,8
    python benches/decode_throughput.py --model 1b --backend cuda --streams 8,32 --gpu-layers 99
    python benches/decode_throughput.py --model smollm2 --streams 1,4,8 --prompts-together

Decode throughput of the engine is measured over the window in which every stream is decoding
(from the last first-token to the first last-token), counting each stream's tokens in it;
prefill throughput as every stream's prompt tokens over the time to the last first token (with
--prompts-together, the prompts go in together as llama-batched-bench's do). --model takes a
synthetic preset, a real model's name (uma.catalog: smollm2, gemma3-270m) or a GGUF path.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import uma  # noqa: E402
from llama_tools import ensure_tools  # noqa: E402
from uma import catalog, synth  # noqa: E402


def peer_speeds(tool: Path, model: Path, pp: int, tg: int, pl: int, threads: int,
                gpu_layers: int, kv_unified: bool, kv_type: str,
                experts: tuple[str, int] | None = None) -> tuple[float, float]:
    """llama-batched-bench's (prefill, decode) tokens/s, from its second pass: it warms up on
    16 tokens only, so its first pass also times the first use of the prompt's batch shape
    (on a GPU that doubled the prefill time of a 128-token prompt)."""
    ctx = pl * (pp + tg) + 64
    cmd = [str(tool), "-m", str(model), "-c", str(ctx), "-b", "2048", "-ub", "512",
           "-npp", str(pp), "-ntg", str(tg), "-npl", f"{pl},{pl}", "-t", str(threads),
           "-ngl", str(gpu_layers), "-kvu" if kv_unified else "-no-kvu",
           "-ctk", kv_type, "-ctv", kv_type,
           "--output-format", "jsonl"]
    if experts:  # an MoE's experts per token, as the engine's n_expert_used sets it
        cmd += ["--override-kv", f"{experts[0]}.expert_used_count=int:{experts[1]}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in out.stdout.splitlines() + out.stderr.splitlines()
            if line.startswith("{")]
    if not rows:
        raise RuntimeError(f"no result from {tool.name}:\n{out.stderr[-2000:]}")
    return float(rows[-1]["speed_pp"]), float(rows[-1]["speed_tg"])


def model_path(spec: str) -> Path:
    """A GGUF path, a catalogue model's name (fetched on first use) or a synthetic preset
    (written on first use)."""
    if Path(spec).exists() or catalog.lookup(spec):
        return Path(catalog.resolve(spec, print))
    return synth.cached_model(spec)


def engine_run(engine: uma.Engine, vocab: int, pp: int, tg: int, pl: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(100, vocab - 100, pp).astype(np.int32) for _ in range(pl)]
    before = engine.snapshot()
    handles = [engine.submit(p, max_tokens=tg, ignore_eos=True) for p in prompts]
    results = [h.result(timeout=3600) for h in handles]
    after = engine.snapshot()
    # Token times are ms after each request's own submit; submits happened within
    # microseconds of each other, so they share one clock here.
    starts = [r.timings.token_ms[0] for r in results]
    ends = [r.timings.token_ms[-1] for r in results]
    lo, hi = max(starts), min(ends)
    n = sum(sum(1 for t in r.timings.token_ms if lo < t <= hi) for r in results)
    tick = after["tick_seconds_total"] - before["tick_seconds_total"]
    dec = after["decode_seconds_total"] - before["decode_seconds_total"]
    smp = after["sample_seconds_total"] - before["sample_seconds_total"]
    ticks = after["ticks_total"] - before["ticks_total"]
    return {
        "tg_speed": n / ((hi - lo) / 1000.0) if hi > lo else float("nan"),
        "pp_speed": pl * pp / (max(starts) / 1000.0),
        "decode_share": dec / tick, "sample_share": smp / tick,
        "overhead_share": (tick - dec - smp) / tick,
        "ms_per_tick": {"decode": 1e3 * dec / ticks, "sample": 1e3 * smp / ticks,
                        "overhead": 1e3 * (tick - dec - smp) / ticks},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m", help="a synth preset name or a GGUF path")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--pp", type=int, default=128, help="prompt tokens per stream")
    ap.add_argument("--tg", type=int, default=64, help="generated tokens per stream")
    ap.add_argument("--repeat", type=int, default=2, help="runs per side, alternating")
    ap.add_argument("--kv-unified", action="store_true",
                    help="one KV buffer for all streams, on both sides (llama-batched-bench's "
                         "default is off)")
    ap.add_argument("--kv-type", default="f16", choices=("f16", "q8_0", "q4_0"),
                    help="the KV cache's type (keys and values), on both sides")
    ap.add_argument("--prompts-together", action="store_true",
                    help="a batch as large as all prompts, so that they go in in one tick and "
                         "the streams decode together, as llama-batched-bench's do after its "
                         "prompt phase (long prompts otherwise finish far apart)")
    ap.add_argument("--device-sampling", default="auto",
                    help="the engine's device_sampling: auto, on or off")
    ap.add_argument("--experts-used", type=int, default=0,
                    help="an MoE's experts per token on both sides (0: the model's own)")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ns = ap.parse_args()

    tools = ensure_tools(ns.backend)
    model = model_path(ns.model)
    rows = []
    for pl in (int(x) for x in ns.streams.split(",")):
        n_batch = max(2048, pl * ns.pp) if ns.prompts_together else 2048
        engine = uma.Engine(model, n_ctx=pl * (ns.pp + ns.tg) + 64, n_seq_max=pl, n_batch=n_batch,
                            n_ubatch=512, n_threads=ns.threads, n_gpu_layers=ns.gpu_layers,
                            kv_unified=ns.kv_unified, device_sampling=ns.device_sampling,
                            type_k=ns.kv_type, type_v=ns.kv_type,
                            n_expert_used=ns.experts_used)
        engine.generate("warm up", max_tokens=4)
        experts = (engine.model.architecture, ns.experts_used) if ns.experts_used else None
        ours, theirs = [], []
        for i in range(ns.repeat):
            ours.append(engine_run(engine, engine.model.n_vocab, ns.pp, ns.tg, pl, seed=i))
            theirs.append(peer_speeds(tools["llama-batched-bench"], model, ns.pp, ns.tg, pl,
                                      ns.threads, ns.gpu_layers, ns.kv_unified, ns.kv_type,
                                      experts))
        engine.close()
        best = max(ours, key=lambda r: r["tg_speed"])
        peer_tg = [tg for _, tg in theirs]
        peer_pp = [pp for pp, _ in theirs]
        row = {
            "streams": pl, "uma_tg_tps": best["tg_speed"], "peer_tg_tps": max(peer_tg),
            "ratio": best["tg_speed"] / max(peer_tg),
            "uma_runs": [r["tg_speed"] for r in ours], "peer_runs": peer_tg,
            "uma_pp_tps": max(r["pp_speed"] for r in ours), "peer_pp_tps": max(peer_pp),
            "pp_ratio": max(r["pp_speed"] for r in ours) / max(peer_pp),
            "uma_pp_runs": [r["pp_speed"] for r in ours], "peer_pp_runs": peer_pp,
            "overhead_share": best["overhead_share"], "sample_share": best["sample_share"],
            "ms_per_tick": best["ms_per_tick"],
        }
        rows.append(row)
        print(f"streams={pl:3d}  uma {row['uma_tg_tps']:8.1f} tok/s  "
              f"llama-batched-bench {row['peer_tg_tps']:8.1f} tok/s  ratio {row['ratio']:.3f}  "
              f"prefill {row['uma_pp_tps']:8.1f} / {row['peer_pp_tps']:8.1f} tok/s "
              f"({row['pp_ratio']:.3f})  "
              f"outside decode+sample {100 * row['overhead_share']:.1f}%  "
              f"per tick {json.dumps({k: round(v, 3) for k, v in row['ms_per_tick'].items()})}",
              flush=True)
    report = {
        "model": str(model), "backend": ns.backend, "threads": ns.threads, "pp": ns.pp,
        "kv_unified": ns.kv_unified, "kv_type": ns.kv_type, "prompts_together": ns.prompts_together,
        "device_sampling": ns.device_sampling, "experts_used": ns.experts_used,
        "tg": ns.tg, "gpu_layers": ns.gpu_layers, "rows": rows,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "median_ratio": statistics.median(r["ratio"] for r in rows),
    }
    if ns.out:
        ns.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
