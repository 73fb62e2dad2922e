"""Speculation tick by tick: one stream's plain ticks and verify ticks, timed in process.

    python benches/speculation_ticks.py --model smollm2 --modes off,ngram,fixed7
    python benches/speculation_ticks.py --model smollm2 --gpu-layers 99 --threads 8

Each mode answers two real-text tasks of benches/speculation.py (rename, quote) greedy, 300
tokens, in a fresh engine, and reports the answer's speed and every decode tick's time by
kind: a verify of k guesses (`k=K`), or a plain tick by how many ticks have passed since the
last verify (`plain+0` just after one, `plain+4` four or more), so that what a change of the
batch's shape costs shows beside what a guess costs.

Modes: `off`; `ngram` (the goodput rule as the daemon runs it); `fixedK`: every tick verifies
K guesses whatever the rule would choose, the lookup's filled out with its last guess (or the
stream's last token): what a batch of one shape makes, the rule set aside. Run with
GGML_CUDA_DISABLE_GRAPHS=1 in the environment to see a CUDA device without its graphs.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import uma  # noqa: E402
from decode_throughput import model_path  # noqa: E402
from speculation import TASKS  # noqa: E402
from uma import _core  # noqa: E402
from uma.engine import speculator  # noqa: E402
from uma.sched.state import Phase  # noqa: E402

RULE = speculator.Speculator.draft  # the goodput rule's draft


def fixed_drafts(k: int) -> None:
    """Makes every speculating stream verify k guesses a tick (0: the rule decides)."""
    rule = RULE

    def draft(self, plan, running, cost, capacity, device_rows):  # type: ignore[no-untyped-def]
        if not k:
            return rule(self, plan, running, cost, capacity, device_rows)
        items = []
        for item in plan.items:
            req = running.get(item.seq_id)
            if item.phase is Phase.DECODE and req is not None and req.drafter is not None:
                found, _ = self.drafters["ngram"].propose(req, k)
                guesses = [int(t) for t in found[:k]]
                last = guesses[-1] if guesses else req.generated[-1] if req.generated \
                    else int(req.prompt[-1])
                item = dataclasses.replace(item, n_tokens=1 + k,
                                           draft=tuple(guesses) + (last,) * (k - len(guesses)))
            items.append(item)
        return dataclasses.replace(plan, items=tuple(items))

    speculator.Speculator.draft = draft  # type: ignore[method-assign]


def by_kind(trace: list) -> dict[str, dict[str, float]]:
    """Decode ticks (no prompt) by kind: their count and mean times, ms."""
    kinds = collections.defaultdict(list)
    since = 99
    for n_prefill, _, decode_s, sample_s, tick_s, _, plan in trace:
        if n_prefill:
            continue
        k = plan.n_drafted
        kinds[f"k={k}" if k else f"plain+{min(since, 4)}"].append((decode_s, sample_s, tick_s))
        since = 0 if k else since + 1
    return {kind: {"n": len(t), "decode_ms": 1e3 * sum(x[0] for x in t) / len(t),
                   "sample_ms": 1e3 * sum(x[1] for x in t) / len(t),
                   "tick_ms": 1e3 * sum(x[2] for x in t) / len(t)}
            for kind, t in sorted(kinds.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="a catalogue name or a GGUF path")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default="off,ngram,fixed7",
                    help="comma-separated: off, ngram, fixedK (K guesses every tick)")
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--out", type=Path)
    ns = ap.parse_args()
    model = str(model_path(ns.model))
    with _core.Model(model, vocab_only=True) as vocab:
        prompts = {t: vocab.apply_chat_template([{"role": "user", "content": TASKS[t]}])
                   for t in ("rename", "quote")}
    rows = []
    for task, prompt in prompts.items():
        for mode in ns.modes.split(","):
            fixed_drafts(int(mode[5:]) if mode.startswith("fixed") else 0)
            with uma.Engine(model, n_gpu_layers=ns.gpu_layers, n_threads=ns.threads,
                            n_threads_batch=ns.threads, n_seq_max=4,
                            speculation="off" if mode == "off" else "ngram") as engine:
                engine.generate("warm up", max_tokens=8)
                engine._scheduler.trace = trace = []
                t0 = time.perf_counter()
                r = engine.generate(prompt, max_tokens=ns.max_tokens, temperature=0)
                wall = time.perf_counter() - t0
                engine._scheduler.trace = None
            kinds = by_kind(trace)
            n = r.usage.completion_tokens
            print(f"{task} {mode}: {n} tokens in {wall:.3f} s ({n / wall:.0f} tok/s), "
                  f"{len(trace)} ticks", flush=True)
            for kind, s in kinds.items():
                print(f"  {kind:8s} n={s['n']:4d} tick {s['tick_ms']:.3f} decode "
                      f"{s['decode_ms']:.3f} sample {s['sample_ms']:.3f} ms", flush=True)
            rows.append({"task": task, "mode": mode, "tokens": n, "wall_s": wall,
                         "ticks": len(trace), "text": r.text, "by": kinds})
    if ns.out:
        ns.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
