"""Two models serving at once on one daemon: interactive streams on model A while a batch of
background jobs runs on model B.

`uma run A` with B in its model directory. Phase "alone": `--streams` clients stream from A
(requests of `--tokens` tokens back to back, 5 s warm-up dropped). Phase "beside": the same,
while `--jobs` background requests on B (prompts of `--prompt-tokens` tokens, 64 tokens out
each, sent again as each ends) run. Reported per run: A's inter-token p95 in each phase and
their ratio (the scheduler's target: within 1.2x), A's worst gap, and B's jobs done.

    python benches/two_models.py --model-a smollm2 --model-b gemma3-270m --runs 3 --out F.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_cycles import daemon, model_path  # noqa: E402
from streams import long_prompt  # noqa: E402
from uma.client import Client  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Tell me about the history of the printing press."


def phase(sock: str, streams: int, tokens: int, seconds: float, warm_s: float,
          background: tuple[str, int] | None) -> dict:
    """A's gaps (after warm_s) over `seconds`, with B's background jobs where given."""
    stop = threading.Event()
    gaps: list[list[float]] = [[] for _ in range(streams)]
    began = time.perf_counter()
    jobs = [0]

    def stream(i: int) -> None:
        with Client(sock) as c:
            while not stop.is_set():
                last = None
                for _ in c.submit(PROMPT, max_tokens=tokens, ignore_eos=True):
                    now = time.perf_counter()
                    if last is not None and now - began > warm_s:
                        gaps[i].append((now - last) * 1e3)
                    last = now

    def job(prompt: str, n: int) -> None:
        with Client(sock) as c:
            while not stop.is_set():
                c.generate(prompt, model="b", max_tokens=64, ignore_eos=True,
                           priority="background")
                jobs[0] += 1

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(streams)]
    if background is not None:
        prompt, n = background
        threads += [threading.Thread(target=job, args=(prompt, n)) for _ in range(n)]
    for t in threads:
        t.start()
    time.sleep(seconds)  # the phase's length: the clock is what is measured here
    stop.set()
    for t in threads:
        t.join(300)
    every = np.concatenate([np.asarray(g) for g in gaps])
    return {"p50_ms": float(np.percentile(every, 50)), "p95_ms": float(np.percentile(every, 95)),
            "worst_ms": float(every.max()), "gaps": int(every.size), "jobs_done": jobs[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-a", default="smollm2")
    ap.add_argument("--model-b", default="gemma3-270m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out")
    ns = ap.parse_args()
    a, b = model_path(ns.model_a), model_path(ns.model_b)
    prompt = long_prompt(b, ns.prompt_tokens)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    result: dict = {"info": {"model_a": str(a), "model_b": str(b), "threads": ns.threads,
                             "streams": ns.streams, "jobs": ns.jobs,
                             "prompt_tokens": ns.prompt_tokens,
                             "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                             "date": time.strftime("%Y-%m-%d"), "commit": commit,
                             "command": " ".join(sys.argv)}, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(ns.runs):
            with daemon(a, b, ns.threads, Path(tmp)) as d, Client(d.socket) as c:
                c.load("b", keep_alive=-1)
                order = ("alone", "beside") if i % 2 == 0 else ("beside", "alone")
                run = {}
                for name in order:
                    run[name] = phase(d.socket, ns.streams, ns.tokens, ns.seconds, 5.0,
                                      (prompt, ns.jobs) if name == "beside" else None)
                run["ratio"] = run["beside"]["p95_ms"] / run["alone"]["p95_ms"]
            result["runs"].append(run)
            print(f"run {i + 1}: A's p95 {run['alone']['p95_ms']:.1f} ms alone, "
                  f"{run['beside']['p95_ms']:.1f} ms beside B's batch ({run['ratio']:.2f}x; "
                  f"target 1.2x), worst {run['beside']['worst_ms']:.0f} ms; B's jobs done "
                  f"{run['beside']['jobs_done']}", flush=True)
    if ns.out:
        Path(ns.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
