"""Where a storm's ticks go: the mixed-load scenario in process, with the scheduler's trace.

    python benches/storm_trace.py --model 1b --gpu-layers 99 --threads 8 --streams 8 \
        --background 2 --storm-tokens 6000 --variant default: --variant short:gap_ms=50

K interactive streams run alone, then while background prompts arrive, on one engine; each
variant sets BoundPolicy fields for both phases. Per variant it prints the streams' inter-token
p50/p95/worst in both phases, the background TTFT, and the storm's ticks by kind (decode only,
with background prompt tokens, with interactive prompt tokens): how many, measured and predicted
milliseconds, the budget the policy set and the prompt tokens taken. That is what tells a cost
model that mispredicts from a guard that lets too much through. The mixed-load bench
(mixed_load.py) is the side-by-side figure; this is the diagnosis behind it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

import uma
from uma import synth
from uma.sched.bound import BoundPolicy
from uma.sched.cost import RAGGED_EDGES, ROW_EDGES
from uma.sched.state import Phase, PlanNotes, Priority


def parse_variant(text: str, fields: dict[str, dataclasses.Field]) -> tuple[str, dict]:
    """'name:field=value,field=value' → (name, {field: value}) for BoundPolicy fields."""
    name, _, spec = text.partition(":")
    knobs = {}
    for pair in filter(None, spec.split(",")):
        key, _, value = pair.partition("=")
        if key not in fields:
            raise SystemExit(f"--variant {text!r}: BoundPolicy has no field {key!r}")
        kind = type(getattr(BoundPolicy(), key))
        if kind is bool:  # bool("0") is True
            if value.lower() not in ("0", "1", "true", "false"):
                raise SystemExit(f"--variant {text!r}: {key} takes 0/1 or true/false")
            knobs[key] = value.lower() in ("1", "true")
        else:
            knobs[key] = kind(value)
    return name or "default", knobs


def parse_settings(pairs: list[str]) -> dict:
    """['key=value', ...] → EngineConfig keyword arguments, numbers as numbers."""
    out: dict = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--engine {pair!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def stream_loop(engine: uma.Engine, seed: int, tokens: int, stop: threading.Event,
                itls: list[float]) -> None:
    """One interactive stream: short prompts one after another until `stop`; appends every
    inter-token gap (ms) to itls."""
    rng = np.random.default_rng(seed)
    while not stop.is_set():
        prompt = rng.integers(100, 30000, 32).astype(np.int32)
        result = engine.generate(prompt, max_tokens=tokens, ignore_eos=True)
        itls.extend(np.diff(result.timings.token_ms).tolist())


def run_phase(engine: uma.Engine, ns: argparse.Namespace, storm: bool) -> dict:
    stop = threading.Event()
    itls: list[float] = []
    threads = [threading.Thread(target=stream_loop, args=(engine, i, ns.tokens, stop, itls))
               for i in range(ns.streams)]
    for t in threads:  # staggered, so the streams' prompts do not all land in one tick
        t.start()
        time.sleep(ns.stagger_s)
    out: dict = {}
    trace = engine._scheduler.trace
    if not storm:  # all K streams together, as under the storm
        start = len(trace)
        time.sleep(ns.alone_s)
        stop.set()
    lane = engine._lane
    if storm:
        time.sleep(ns.arrive_s)
        start = len(trace)
        if lane is not None:
            lane.trace = []
        rng = np.random.default_rng(99)
        bg = [engine.submit(rng.integers(100, 30000, ns.storm_tokens).astype(np.int32),
                            max_tokens=ns.bg_tokens, ignore_eos=True, priority="background")
              for _ in range(ns.background)]
        results = [h.result() for h in bg]
        out["bg_ttft_ms"] = max(r.timings.ttft_ms for r in results)
        stop.set()
        if lane is not None:
            out["slices"] = slice_summary(lane.trace)
            lane.trace = None
    out["ticks"] = tick_kinds(trace[start:])
    if ns.ticks:  # every tick of the phase, as rows of Tick's fields
        out["tick_rows"] = [list(t) for t in trace[start:]]
    if len(trace) > start:
        out["guard"] = guard_summary(trace[start:])
    for t in threads:
        t.join()
    out.update(itl_p50_ms=pct(itls, 50), itl_p95_ms=pct(itls, 95), worst_ms=max(itls),
               tokens=len(itls))
    return out


class Tick(NamedTuple):
    """One tick of the trace, as numbers and its kind."""

    kind: str  # what its prompt tokens were: see CompactTrace.append
    prompt_tokens: int
    decoders: int
    ms: float  # the whole tick
    decode_ms: float  # llama_decode's own time (GIL released)
    call_ms: float  # the decode call as the scheduler times it (on a GPU: once queued)
    sample_ms: float  # sampling, with the wait for the device's logits
    predicted_ms: float
    budget_ms: float
    overruns: int  # the policy's count so far
    line_ms: float
    target_ms: float
    price: float  # the policy's memory after planning it: background chunks' measured price
    cap: int  # ... and the slow start's cap on their tokens


class CompactTrace(list):
    """The scheduler's trace, each tick kept as a Tick: keeping every Plan of a storm (tens of
    thousands) made Python's cyclic GC walk them all, and its pauses (over 150 ms) showed up
    as the longest ticks of the very run that measured them."""

    def append(self, tick: tuple) -> None:
        n_prefill, n_decode, call_s, sample_s, tick_s, native_s, plan = tick
        notes = plan.notes or PlanNotes()
        prompts = {Priority.BACKGROUND if i.seq_id in notes.background else Priority.INTERACTIVE
                   for i in plan.items if i.phase is Phase.PREFILL}
        kind = ("both prompts" if len(prompts) == 2 else "background prompt"
                if Priority.BACKGROUND in prompts else "interactive prompt" if prompts
                else "decode only")
        mem = plan.memory
        super().append(Tick(kind, n_prefill, n_decode, tick_s * 1e3, native_s * 1e3,
                            call_s * 1e3, sample_s * 1e3,
                            notes.predicted_ms, notes.budget_ms, notes.overruns,
                            notes.line_ms, notes.target_ms, getattr(mem, "price", 1.0),
                            getattr(mem, "cap", 0)))


KINDS = ("decode only", "background prompt", "interactive prompt", "both prompts")


def tick_kinds(trace: list[Tick]) -> dict[str, dict]:
    """A phase's ticks grouped by what they carried."""
    out = {}
    for kind in KINDS:
        ticks = [t for t in trace if t.kind == kind]
        if not ticks:
            continue
        longest = max(ticks, key=lambda t: t.ms)
        out[kind] = {
            "n": len(ticks),
            "tick_p50_ms": pct([t.ms for t in ticks], 50),
            "tick_p95_ms": pct([t.ms for t in ticks], 95),
            "tick_max_ms": longest.ms,
            # llama_decode's own time in the longest tick: a long tick whose decode call did
            # not run long lost its time in Python around it.
            "max_tick_decode_ms": longest.decode_ms,
            "predicted_p50_ms": pct([t.predicted_ms for t in ticks], 50),
            "budget_p50_ms": pct([t.budget_ms for t in ticks], 50),
            "prompt_tokens_p50": pct([t.prompt_tokens for t in ticks], 50),
            "decoders_p50": pct([t.decoders for t in ticks], 50),
        }
    return out


def slice_summary(trace: list) -> dict:
    """The background context's slices (uma.engine.background) while streams ran: how many of each
    kind, their budget against what the background's ticks took, and what the streams' tick
    beside them was predicted to take."""
    kinds: dict[str, list] = {"ride": [], "pause": [], "none, prompt tick": [],
                              "none, decode tick": [], "idle": []}
    for view, cut, spent_ms, prompt in trace:
        if cut.ms > 0:
            kind = cut.kind
        else:
            kind = "none, prompt tick" if view.prompt_next else "none, decode tick"
        kinds[kind].append((cut.ms, spent_ms, view.tick_ms, view.min_ms, view.alone_p95_ms,
                            prompt))
    out = {}
    for kind, rows in kinds.items():
        if not rows:
            continue
        budget, spent, tick, least, p95, prompt = (list(col) for col in zip(*rows, strict=True))
        out[kind] = {"n": len(rows), "budget_p50_ms": pct(budget, 50),
                     "spent_p50_ms": pct(spent, 50), "spent_p95_ms": pct(spent, 95),
                     "streams_tick_p50_ms": pct(tick, 50), "least_p50_ms": pct(least, 50),
                     "alone_p95_ms": pct(p95, 50), "prompt_tokens_p50": pct(prompt, 50),
                     "prompt_tokens": sum(prompt)}
    return out


def guard_summary(trace: list[Tick]) -> dict:
    """How often a phase's ticks overran, and what share of its tick time carried background
    prompt tokens: where a starved background prompt's time went."""
    total_ms = sum(t.ms for t in trace) or 1.0
    return {
        "overruns": trace[-1].overruns - trace[0].overruns,
        "background_time_share": sum(t.ms for t in trace
                                     if t.kind in ("background prompt", "both prompts"))
        / total_ms,
        "prompt_tokens": sum(t.prompt_tokens for t in trace),
        "line_p50_ms": pct([t.line_ms for t in trace], 50),
        "target_p50_ms": pct([t.target_ms for t in trace], 50),
        "price_p50": pct([t.price for t in trace], 50),
    }


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m", help="a synth preset or a GGUF path")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--streams", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--alone-s", type=float, default=3.0,
                    help="seconds all streams run together before the storm's phase")
    ap.add_argument("--stagger-s", type=float, default=0.3)
    ap.add_argument("--arrive-s", type=float, default=1.0)
    ap.add_argument("--background", type=int, default=1)
    ap.add_argument("--storm-tokens", type=int, default=3000)
    ap.add_argument("--bg-tokens", type=int, default=16)
    ap.add_argument("--variant", action="append", default=[],
                    help="name:field=value,... BoundPolicy fields for one run (repeatable)")
    ap.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE",
                    help="an EngineConfig setting for the engine (repeatable), e.g. "
                         "prefix_cache_ram_mb=0")
    ap.add_argument("--out", default="", help="also write the figures to this JSON file")
    ap.add_argument("--ticks", action="store_true",
                    help="with --out, every tick of both phases too (Tick's fields)")
    ns = ap.parse_args()
    settings = parse_settings(ns.engine)
    fields = {f.name: f for f in dataclasses.fields(BoundPolicy)}
    variants = [parse_variant(v, fields) for v in ns.variant or ["default:"]]
    path = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    n_seq = ns.streams + ns.background
    engine = uma.Engine(path, n_ctx=n_seq * (ns.storm_tokens + 256), n_seq_max=n_seq,
                        n_threads=ns.threads, n_gpu_layers=ns.gpu_layers,
                        **{"kv_unified": True, "policy": "bound", **settings})
    engine.generate("warm up", max_tokens=4)
    scheduler = engine._scheduler
    base = scheduler.policy
    figures = {}
    try:
        for name, knobs in variants:
            scheduler.policy = dataclasses.replace(base, **knobs)
            scheduler._memory = None
            scheduler.trace = CompactTrace()
            alone = run_phase(engine, ns, storm=False)
            storm = run_phase(engine, ns, storm=True)
            figures[name] = {"knobs": knobs, "alone": alone, "storm": storm,
                             "cost": dataclasses.asdict(scheduler.cost.estimate)}
            report(name, knobs, alone, storm, scheduler.cost.estimate)
    finally:
        engine.close()
    if ns.out:
        Path(ns.out).write_text(json.dumps(figures, indent=1, default=str))
    return 0


def report(name: str, knobs: dict, alone: dict, storm: dict, cost) -> None:
    ratio = storm["itl_p95_ms"] / alone["itl_p95_ms"]
    print(f"== {name} {knobs}")
    print(f"  ITL p50/p95/worst ms: alone {alone['itl_p50_ms']:.2f}/{alone['itl_p95_ms']:.2f}/"
          f"{alone['worst_ms']:.1f}  storm {storm['itl_p50_ms']:.2f}/{storm['itl_p95_ms']:.2f}/"
          f"{storm['worst_ms']:.1f}  p95 ratio {ratio:.2f}  bg TTFT {storm['bg_ttft_ms']:.0f} ms")
    for name, phase in (("alone", alone), ("storm", storm)):
        print(f"  {name} ticks:")
        print_phase(phase)
    print(f"  cost: fixed {cost.fixed_ms:.3f}  per prompt token {cost.per_prefill_ms:.4f}  "
          f"per decoder {cost.per_decode_ms:.4f}  per 1k kv {cost.per_kv_kpos_ms:.4f} (decode) "
          f"{cost.per_prompt_kv_kpos_ms:.4f} (prompt) "
          f"{cost.prompt_kv_ms(1 << 20):.4f} (prompt, wide)  "
          "steps past " + " ".join(f"{edge}:{ms:.2f}" for edge, ms in
                                   zip(ROW_EDGES, cost.row_steps_ms, strict=False))
          + "  ragged past " + " ".join(f"{edge}:{ms:.2f}" for edge, ms in
                                      zip(RAGGED_EDGES, cost.ragged_ms, strict=False)),
          flush=True)


def print_phase(phase: dict) -> None:
    if "guard" in phase:
        g = phase["guard"]
        print(f"    guard: {g['overruns']} overruns, ticks with background prompt tokens "
              f"{100 * g['background_time_share']:.1f} % of the time, {g['prompt_tokens']} "
              f"prompt tokens; line p50 {g['line_p50_ms']:.2f} "
              f"ms, p95 target p50 {g['target_p50_ms']:.2f} ms, price p50 {g['price_p50']:.2f}")
    for kind, t in phase.get("slices", {}).items():
        print(f"    slice {kind:18s} n {t['n']:5d}  budget {t['budget_p50_ms']:6.2f}  took "
              f"p50/p95 {t['spent_p50_ms']:6.2f}/{t['spent_p95_ms']:6.2f}  streams' tick "
              f"{t['streams_tick_p50_ms']:6.2f}  least tick {t['least_p50_ms']:6.2f}  p95 alone "
              f"{t['alone_p95_ms']:6.2f}  prompt tokens p50 {t['prompt_tokens_p50']:5.0f}, "
              f"{t['prompt_tokens']} in all")
    for kind, t in phase["ticks"].items():
        print(f"    {kind:18s} n {t['n']:5d}  tick p50/p95/max {t['tick_p50_ms']:6.2f}/"
              f"{t['tick_p95_ms']:6.2f}/{t['tick_max_ms']:6.1f} (its decode call "
              f"{t['max_tick_decode_ms']:5.1f})  predicted {t['predicted_p50_ms']:6.2f}  budget "
              f"{t['budget_p50_ms']:6.2f}  prompt tokens {t['prompt_tokens_p50']:5.0f}  "
              f"decoders {t['decoders_p50']:3.0f}")


if __name__ == "__main__":
    sys.exit(main())
