"""Scenario 3: long-context KV sweep, UMA Serve vs llama-server.

One stream decodes --tokens tokens after a prompt of `depth` tokens, for each depth (2k..32k,
what fits) and each KV cache type (f16, q8_0, q4_0), on both servers (restarted per KV type,
same model, threads and context; the sides alternate order every depth). A decode token reads
the weights once and its sequence's whole KV cache, so bytes per token (ΣBMT, uma.sched.bmt)
grow with depth and shrink with the KV type; if decode is bandwidth-bound, tokens/s times bytes
per token (the bandwidth achieved) stays about constant across the sweep: throughput tracks
bytes. Reported per side, KV type and depth: decode tokens/s, prefill tokens/s, bytes per token,
the bandwidth achieved and its fraction of the machine's (large-copy probe).

    python benches/kv_sweep.py                                    # 134m, 2 threads, 2k..16k
    python benches/kv_sweep.py --depths 2048,8192,32768           # longer (32k prefill: minutes)
    python benches/kv_sweep.py --model 1b --backend cuda --gpu-layers 99 --threads 8 \\
        --depths 2048,4096,8192,16384,32768
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import plots  # noqa: E402
import report  # noqa: E402
from decode_scaling import device_bandwidth_gbps  # noqa: E402
from llama_tools import ensure_tools  # noqa: E402
from servers import add_server_args, llama_server, uma_server  # noqa: E402
from streams import long_prompt, sse_completion  # noqa: E402
from uma import _core, synth  # noqa: E402
from uma.sched.bmt import KV_TYPE_BYTES, BmtModel  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_args(ap)
    ap.add_argument("--depths", default="2048,4096,8192,16384")
    ap.add_argument("--kv-types", default="f16,q8_0,q4_0")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default="kv_sweep")
    ns = ap.parse_args()

    depths = sorted(int(x) for x in ns.depths.split(","))
    kv_types = ns.kv_types.split(",")
    unknown = [t for t in kv_types if t not in KV_TYPE_BYTES]
    if unknown:
        ap.error(f"unknown KV type(s) {', '.join(unknown)}; known: {', '.join(KV_TYPE_BYTES)}")
    tools = ensure_tools(ns.backend)
    ctx = max(depths) + ns.tokens + 64
    if Path(ns.model).exists():
        model = Path(ns.model)
    else:  # llama-server caps a slot's context at the model's training context: raise it
        spec = synth.PRESETS[ns.model]
        model = synth.cached_model(dataclasses.replace(
            spec, n_ctx_train=max(spec.n_ctx_train, ctx)))
    with _core.Model(model, n_gpu_layers=0) as m:
        bmts = {kv: BmtModel.of(m, kv) for kv in KV_TYPE_BYTES}
    gbps = device_bandwidth_gbps(ns.gpu_layers != 0)
    common = {"threads": ns.threads, "parallel": 1, "gpu_layers": ns.gpu_layers,
              "ctx": ctx}
    meta = report.run_info(model, backend=ns.backend, tokens=ns.tokens, bandwidth_gbps=gbps,
                           **common)
    prompts = {(d, salt): long_prompt(model, d, salt) for d in depths for salt in (0, 1)}
    rows: list[dict] = []
    for kv in kv_types:
        bmt = bmts[kv]
        # A quantised V cache needs flash attention: on for both sides.
        with uma_server(model, args=("--kv-type", kv, "--flash-attn", "on"), **common) as uma, \
                llama_server(tools["llama-server"], model,
                             args=("-ctk", kv, "-ctv", kv, "-fa", "on"), **common) as peer:
            sides = [uma, peer]
            for server in sides:  # warm-up
                sse_completion(server.port, {"prompt": "warm up", "max_tokens": 4,
                                             **(server.extra or {})})
            for k, depth in enumerate(depths):
                for j, server in enumerate(sides[k % 2:] + sides[:k % 2]):
                    # A different prompt per side, so no prefix cache can help either.
                    s = sse_completion(server.port, {
                        "prompt": prompts[depth, j], "max_tokens": ns.tokens, "temperature": 0,
                        "ignore_eos": True, **(server.extra or {})}, timeout=3600)
                    side = "uma" if server.socket else "llama-server"
                    row = {"side": side, "kv_type": kv, "depth": depth, "series": f"{side} {kv}"}
                    if len(s.times) < 2:
                        row["failed"] = f"{len(s.times)} tokens"
                        rows.append(row)
                        continue
                    decode_s = (s.times[-1] - s.times[0]) / (len(s.times) - 1)
                    # the average decode token attends the prompt and half the generation
                    per_token = bmt.tick_bytes(1, s.prompt_tokens + ns.tokens // 2)
                    row.update({
                        "prompt_tokens": s.prompt_tokens,
                        "tokens_per_s": 1 / decode_s,
                        "prefill_tokens_per_s": s.prompt_tokens / s.ttft_s,
                        "mb_per_token": per_token / 1e6,
                        "achieved_gbps": per_token / decode_s / 1e9,
                    })
                    if gbps:
                        row["roofline_fraction"] = row["achieved_gbps"] / gbps
                    rows.append(row)
                    print(report.table(rows[-1:], COLUMNS).splitlines()[1], flush=True)
    report.add_ratios(rows, ("kv_type", "depth"))
    path = report.publish(ns.out, meta, rows, COLUMNS)
    png = plots.lines(path, "depth", [("tokens_per_s", "decode tokens/s"),
                                      ("mb_per_token", "bytes per token (MB, ΣBMT)"),
                                      ("achieved_gbps", "bandwidth achieved (GB/s)")],
                      by="series", suffix="plot", xlabel="context depth (tokens)", log_x=True)
    print(f"bandwidth {gbps and round(gbps, 1)} GB/s; wrote {path} and {png}")
    return 0


COLUMNS = [("side", "side", ""), ("kv_type", "KV", ""), ("depth", "depth", "d"),
           ("tokens_per_s", "tok/s", ".1f"), ("prefill_tokens_per_s", "prefill/s", ".0f"),
           ("mb_per_token", "MB/tok", ".0f"), ("achieved_gbps", "GB/s", ".1f"),
           ("roofline_fraction", "of peak", ".2f"), ("vs_llama_server", "vs peer", ".2f")]


if __name__ == "__main__":
    raise SystemExit(main())
