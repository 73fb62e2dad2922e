"""The scenario matrix: UMA Serve vs llama-server, side by side in one run.

--phases picks the scenarios, each measured alone and then under background work: mixed (1,
below), churn (2), burst (3), poisson (4), agent (5), chat (6); benches/scenarios.py describes
2-4 and 6. The whole matrix is one command:

    python benches/mixed_load.py --phases mixed,churn,burst,poisson,agent,chat --out matrix

Scenario 1, mixed load (an MoE with --model moe-small):

K interactive streams send 128-token requests back to back (an editor assistant, a terminal),
starting --stagger-s apart (in lockstep, every stream's prompt would be computed in the same
tick and none would ever wait on another's);
1 s in, N background requests with ~3000-token prompts arrive (an agent summarising a file).
Each side is measured twice: the interactive streams alone, then with the storm, which lasts
until every background request has finished. `--phases agent` (or `mixed,agent`) measures an
agent chain instead or as well: short requests one after another, each waiting for the last
answer, alone and while K background requests decode long answers.

Both servers run the same model file from the same ggml build (benches/llama_tools.py) with the
same threads, slots and context, driven by the same HTTP/SSE client (benches/streams.py)
through their OpenAI-compatible /v1/completions; UMA requests carry `priority`, which
llama-server ignores (it has no classes). Reported per side and phase: interactive inter-token
p50/p95/p99, the worst pause, interactive TTFT, background TTFT and decode speed, aggregate
tokens/s, every background request's completion time, and (UMA) the cost model's per-tick
error p50/p90 in the phase. Writes benches/results/<out>.{json,csv}, every token's time in
<out>.timelines.json.xz, and the token-timeline plots.

    python benches/mixed_load.py                          # 134m, 2 threads, 3 streams
    python benches/mixed_load.py --model moe-small --out mixed_load_moe
    python benches/mixed_load.py --phases agent --out agent_chain_cpu_134m
    python benches/mixed_load.py --model 1b --backend cuda --gpu-layers 99 --threads 8 \\
        --streams 8 --background 2 --storm-tokens 6000
"""

from __future__ import annotations

import argparse
import http.client
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import plots  # noqa: E402
import report  # noqa: E402
import scenarios  # noqa: E402
from llama_tools import ensure_tools  # noqa: E402
from servers import Server, llama_server, uma_server  # noqa: E402
from streams import Stream, long_prompt, percentiles, sse_completion  # noqa: E402
from uma import Client, synth  # noqa: E402
from uma.sched.policies import POLICIES  # noqa: E402

ITL_TARGET = 1.2  # interactive p95 under the storm / alone
# the worst interactive gap under the storm: within the larger of these (a fixed floor, since a
# fast device's p95 alone is a few ms and background work must move in some gap)
GAP_FLOOR_MS, GAP_TIMES_P95 = 100.0, 4.0
# background completion / alone: with streams that never stop, and where they come and go
BG_TARGET = {"mixed": 10.0, "agent": 10.0}
BG_TARGET_COMING_AND_GOING = 3.0


class Phase:
    """One measured phase on one server: threads that each run a role, all released at once."""

    def __init__(self, server: Server):
        self.server = server
        self.streams: list[tuple[str, Stream]] = []  # (class, stream)
        self.prompts: dict[int, str] = {}  # id(stream) -> its prompt (background requests)
        self.bg_alone: dict[str, float] = {}  # prompt -> its completion ms alone (this side)
        self.truncated = 0  # requests that ended before max_tokens (a spoiled measurement)
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._roles: list = []

    def request(self, cls: str, label: str, prompt: str, max_tokens: int,
                timeout: float = 300.0) -> Stream:
        s = sse_completion(self.server.port, {
            "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "priority": cls, **(self.server.extra or {})}, label=label, timeout=timeout)
        with self._lock:
            self.streams.append((cls, s))
            if cls == "background":
                self.prompts[id(s)] = prompt
            # ignore_eos: a stream that ended early was cut. Counted from the usage the
            # server reports: a chunk may carry two tokens (bytes completing one character)
            if s.completion_tokens < max_tokens:
                self.truncated += 1
        return s

    def role(self, fn, *args) -> None:
        self._roles.append((fn, args))

    def run(self) -> float:
        start = threading.Barrier(len(self._roles) + 1)

        def body(fn, args):
            start.wait()
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - reported with the results, not lost
                self.errors.append(f"{fn.__name__}{args[:1]}: {e}")

        threads = [threading.Thread(target=body, args=r) for r in self._roles]
        for t in threads:
            t.start()
        start.wait()
        self.t0 = time.perf_counter()
        for t in threads:
            t.join()
        self.t1 = time.perf_counter()
        if self.errors:
            raise RuntimeError(f"{self.server.name}: " + "; ".join(self.errors))
        return self.t1 - self.t0

    def summary(self) -> dict:
        by = {c: [s for k, s in self.streams if k == c] for c in ("interactive", "background")}
        gaps = [g for s in by["interactive"] for g in s.gaps_ms()]
        itl = percentiles(gaps)
        ttft = percentiles([1e3 * s.ttft_s for s in by["interactive"]])
        row = {
            "itl_p50_ms": itl["p50"], "itl_p95_ms": itl["p95"], "itl_p99_ms": itl["p99"],
            "worst_pause_ms": itl["max"],
            "i_ttft_p50_ms": ttft["p50"], "i_ttft_p95_ms": ttft["p95"],
            "i_requests": len(by["interactive"]),
            "i_tokens": sum(len(s.times) for s in by["interactive"]),
            "tokens_per_s": sum(len(s.times) for _, s in self.streams) / (self.t1 - self.t0),
            "seconds": self.t1 - self.t0,
            "truncated": self.truncated,
        }
        if by["background"]:
            bg = by["background"]
            # The requests that arrived while a background prompt prefilled: a server that
            # runs the prompt whole freezes the streams then, so few of theirs arrive in it
            # and its storm TTFT is mostly measured after the prompt; these compare the two
            # servers in the same regime.
            windows = [(b.sent, b.sent + b.ttft_s) for b in bg if b.times]
            during = [1e3 * s.ttft_s for s in by["interactive"]
                      if any(lo <= s.sent < hi for lo, hi in windows)]
            row["i_requests_during_prefill"] = len(during)
            row["i_ttft_during_prefill_p50_ms"] = percentiles(during)["p50"]
            row["bg_ttft_ms"] = max(1e3 * s.ttft_s for s in bg)
            row["bg_prefill_tok_s"] = sum(s.prompt_tokens for s in bg) / max(s.ttft_s for s in bg)
            row["bg_total_ms"] = max(1e3 * (s.times[-1] - s.sent) for s in bg if s.times)
            row["bg_completion_ms"] = [round(1e3 * (s.times[-1] - s.sent), 1) if s.times
                                       else None for s in bg]
            row["bg_decode_tok_s"] = float(np.mean([
                (len(s.times) - 1) / (s.times[-1] - s.times[0]) for s in bg if len(s.times) > 1]))
            # each background request's completion over the same request's alone
            slow = [1e3 * (s.times[-1] - s.sent) / self.bg_alone[self.prompts[id(s)]]
                    for s in bg if s.times and self.prompts.get(id(s)) in self.bg_alone]
            if slow:
                row["bg_slowdown"] = [round(x, 2) for x in slow]
                row["bg_slowdown_max"] = max(slow)
        return row

    def timeline(self) -> list[dict]:
        return [{"class": c, "label": s.label, "sent": s.sent - self.t0,
                 "times": [round(t - self.t0, 5) for t in s.times]} for c, s in self.streams]


def interactive_phase(server: Server, ns, storms: list[str],
                      bg_alone: dict[str, float]) -> Phase:
    """K streams of back-to-back 128-token requests; with storms, they keep going until every
    background request has finished, else until --alone-s after the last stream started (and
    --rounds requests each). Alone, all K must overlap as they do under the storm: with a fixed
    number of rounds, fast GPU requests ended before the last stream began, and a phase of
    three concurrent streams was compared with a storm of eight."""
    phase = Phase(server)
    phase.bg_alone = bg_alone
    storm_done = threading.Event()
    if not storms:
        def clock() -> None:
            time.sleep(ns.stagger_s * (ns.streams - 1) + ns.alone_s)
            storm_done.set()

        phase.role(clock)

    def interactive(i: int) -> None:
        time.sleep(i * ns.stagger_s)  # apps do not start in lockstep
        n = 0
        while n < ns.rounds or not storm_done.is_set():
            phase.request("interactive", f"i{i}",
                          f"Session {i}, turn {n}: summarise the design of a scheduler.",
                          ns.tokens)
            n += 1

    remaining = [len(storms)]

    def background(j: int) -> None:
        time.sleep(ns.arrive_s + 0.25 * j)
        # a scheduler may take minutes to a background first token, but one that sends
        # nothing for 100x the request's time alone has starved it: say so, not wait an hour
        wait_s = max(300.0, 0.1 * bg_alone.get(storms[j], 0.0))
        try:
            phase.request("background", f"bg{j}", storms[j], ns.bg_tokens, timeout=wait_s)
        except TimeoutError:
            raise RuntimeError(f"background request {j} got nothing for {wait_s:.0f} s "
                               "(100x its time alone): starved") from None
        finally:  # failed or not, the storm is over for this request
            with phase._lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    storm_done.set()

    for i in range(ns.streams):
        phase.role(interactive, i)
    for j in range(len(storms)):
        phase.role(background, j)
    phase.run()
    return phase


def agent_phase(server: Server, ns, under_load: bool) -> Phase:
    """An agent chain: --agent-steps short requests one after another (each waits for the
    previous answer), optionally while K background streams decode long answers."""
    phase = Phase(server)
    chain_done = threading.Event()

    def agent() -> None:
        for n in range(ns.agent_steps):
            phase.request("interactive", "agent",
                          f"Step {n}: call the tool with the file list and report back.", 16)
        chain_done.set()

    def decoder(i: int) -> None:
        while not chain_done.is_set():
            phase.request("background", f"d{i}", f"Background job {i}: write a report.", 96)

    phase.role(agent)
    if under_load:
        for i in range(ns.streams):
            phase.role(decoder, i)
    phase.run()
    return phase


def agent_row(phase: Phase) -> dict:
    chain = [s for c, s in phase.streams if s.label == "agent" and s.times]
    steps = [1e3 * (s.times[-1] - s.sent) for s in chain]
    ttft = percentiles([1e3 * s.ttft_s for s in chain])
    return {"agent_chain_ms": sum(steps), "truncated": phase.truncated,
            "agent_step_p50_ms": float(np.median(steps)),
            "i_ttft_p50_ms": ttft["p50"], "i_ttft_p95_ms": ttft["p95"],
            "tokens_per_s": sum(len(s.times) for _, s in phase.streams) / (phase.t1 - phase.t0),
            "seconds": phase.t1 - phase.t0}


def background_alone(server: Server, ns, prompts: list[str]) -> dict[str, float]:
    """Each background prompt's completion (ms, --bg-tokens answered) on the idle server, one
    at a time: the reference the loaded phases' background completions are divided by. What
    runs is a twin of each, as long but different from its first token: a server that caches
    prompts (UMA's prefix cache) would otherwise answer the loaded phase's prompt from what
    this one left (1,000 tokens in 52-71 ms on the CPU)."""
    phase, alone = Phase(server), {}
    for prompt in dict.fromkeys(prompts):
        s = phase.request("background", "alone", f"(alone) {prompt}", ns.bg_tokens,
                          timeout=3600)
        alone[prompt] = 1e3 * (s.times[-1] - s.sent)
    return alone


def measure(server: Server, ns, storms: list[str], rows: list, timelines: dict,
            model: Path, scenario_storms: dict[str, list[str]],
            poisson_arrivals: list[float]) -> None:
    sse_completion(server.port, {"prompt": "warm up", "max_tokens": 8, **(server.extra or {})})
    used = [p for name, ps in scenario_storms.items() if name in ns.phases for p in ps]
    bg_alone = background_alone(server, ns, used)
    if bg_alone:
        rows.append({"side": server.name, "phase": "background alone",
                     "bg_alone_ms": [round(v, 1) for v in bg_alone.values()]})
        print(f"{server.name} | background alone: "
              + ", ".join(f"{v:.0f} ms" for v in bg_alone.values()), flush=True)

    def record(name: str, phase: Phase, row: dict, columns: list) -> None:
        rows.append({"side": server.name, "phase": name, **row})
        timelines[f"{server.name} | {name}"] = phase.timeline()
        shown = {**rows[-1], "side": f"{server.name} | {name}"}
        print(report.table([shown], columns).splitlines()[1], flush=True)

    if "mixed" in ns.phases:
        for name, storm in (("alone", []), ("storm", storms)):
            before = guard_counters(server)
            phase = interactive_phase(server, ns, storm, bg_alone)
            record(name, phase, {**phase.summary(), **guard_row(before, guard_counters(server))},
                   COLUMNS)
            if before:
                r = rows[-1]
                print(f"  guard: {r['ticks']:.0f} ticks, {100 * r['over_budget_share']:.1f} % "
                      f"over budget, {100 * r['pause_share']:.1f} % pauses, cost-model error "
                      f"{r['cost_error_ms']:.1f} ms", flush=True)
    for name in ("churn", "burst", "poisson", "chat"):
        if name not in ns.phases:
            continue
        for label, loaded in (("alone", False), ("+ background", True)):
            before = guard_counters(server)
            phase = Phase(server)
            phase.bg_alone = bg_alone
            prompts = scenario_storms[name] if loaded else []
            if name == "churn":
                scenarios.churn_phase(phase, ns, prompts)
            elif name == "burst":
                scenarios.burst_phase(phase, ns, prompts)
            elif name == "poisson":
                scenarios.poisson_phase(phase, ns, prompts, poisson_arrivals)
            else:
                scenarios.chat_phase(phase, ns, prompts, model)
            record(f"{name} {label}", phase,
                   {**phase.summary(), **guard_row(before, guard_counters(server))}, COLUMNS)
    if "agent" in ns.phases:
        for name, loaded in (("agent alone", False), ("agent + decoders", True)):
            phase = agent_phase(server, ns, loaded)
            record(name, phase, agent_row(phase), AGENT_COLUMNS)


GUARD = ("ticks_total", "ticks_over_budget_total", "cost_model_error_ms", "pause_ticks_total")


def guard_counters(server: Server) -> dict:
    """The UMA daemon's guard figures from its metrics (none for llama-server): how often ticks
    overran their budget (each overrun holds prompts back) tells where a starved background
    prompt's time went; the cost model's per-tick error histogram (from /metrics, whose
    buckets a phase's share is the difference of) says how well the guard could plan."""
    if server.socket is None:
        return {}
    with Client(server.socket) as client:
        snapshot = client.metrics()
    counters = {name: float(snapshot[name]) for name in GUARD}
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    counters["error_buckets"] = {
        float(m.group(1)): float(m.group(2)) for m in re.finditer(
            r'^uma_cost_model_error_pct_bucket\{le="([^"]+)"\} (\S+)$', text, re.M)}
    return counters


def bucket_quantile(buckets: dict[float, float], q: float) -> float:
    """A quantile from cumulative Prometheus buckets (upper bound -> count), interpolated
    within its bucket, as histogram_quantile() does."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return float("nan")
    rank, lo, below = q * total, 0.0, 0.0
    for b in bounds:
        if buckets[b] >= rank:
            if b == float("inf"):
                return lo
            return lo + (b - lo) * (rank - below) / max(buckets[b] - below, 1e-9)
        lo, below = b, buckets[b]
    return lo


def guard_row(before: dict, after: dict) -> dict[str, float]:
    """A phase's ticks, the share of them over budget, and the cost model's error: its mean
    at the phase's end, and the phase's own per-tick p50/p90 (% of the prediction)."""
    if not before:
        return {}
    ticks = after["ticks_total"] - before["ticks_total"]
    over = after["ticks_over_budget_total"] - before["ticks_over_budget_total"]
    delta = {b: n - before["error_buckets"].get(b, 0.0)
             for b, n in after["error_buckets"].items()}
    pauses = after["pause_ticks_total"] - before["pause_ticks_total"]
    return {"ticks": ticks, "over_budget_share": over / max(ticks, 1),
            "pause_share": pauses / max(ticks, 1),
            "cost_error_ms": after["cost_model_error_ms"],
            "cost_error_p50_pct": bucket_quantile(delta, 0.5),
            "cost_error_p90_pct": bucket_quantile(delta, 0.9)}


COLUMNS = [("side", "side / phase", ""), ("itl_p50_ms", "ITL p50", ".1f"),
           ("itl_p95_ms", "p95", ".1f"), ("itl_p99_ms", "p99", ".1f"),
           ("worst_pause_ms", "worst", ".1f"), ("i_ttft_p50_ms", "i TTFT p50", ".1f"),
           ("bg_ttft_ms", "bg TTFT", ".0f"), ("bg_slowdown_max", "bg/alone", ".1f"),
           ("tokens_per_s", "all tok/s", ".1f"), ("cost_error_p90_pct", "err p90 %", ".0f")]
AGENT_COLUMNS = [("side", "side / phase", ""), ("agent_chain_ms", "chain ms", ".0f"),
                 ("agent_step_p50_ms", "step p50", ".1f"), ("i_ttft_p50_ms", "TTFT p50", ".1f"),
                 ("i_ttft_p95_ms", "TTFT p95", ".1f"), ("tokens_per_s", "all tok/s", ".1f")]


PAIRS = [("mixed", "alone", "storm"), ("agent", "agent alone", "agent + decoders")] + [
    (n, f"{n} alone", f"{n} + background") for n in ("churn", "burst", "poisson", "chat")]


def verdicts(rows: list[dict]) -> list[dict]:
    """Each scenario's loaded phase against its alone phase, per side: the p95 and the worst
    pause relative to the p95 alone, TTFT, whether the background work completed and how much
    slower than alone, each against its target."""
    out = []
    for side in dict.fromkeys(r["side"] for r in rows):
        for scenario, alone_name, loaded_name in PAIRS:
            alone = next((r for r in rows if r["side"] == side and r["phase"] == alone_name),
                         None)
            loaded = next((r for r in rows if r["side"] == side and r["phase"] == loaded_name),
                          None)
            if alone is None or loaded is None or "itl_p95_ms" not in alone:
                continue
            p95_ratio = loaded["itl_p95_ms"] / alone["itl_p95_ms"]
            pause_ratio = loaded["worst_pause_ms"] / alone["itl_p95_ms"]
            gap_limit = max(GAP_FLOOR_MS, GAP_TIMES_P95 * alone["itl_p95_ms"])
            bg = loaded.get("bg_slowdown_max")
            bg_target = BG_TARGET.get(scenario, BG_TARGET_COMING_AND_GOING)
            out.append({"side": side, "scenario": scenario, "p95_storm_over_alone": p95_ratio,
                        "worst_pause_over_p95_alone": pause_ratio,
                        "ttft_p50_alone_ms": alone["i_ttft_p50_ms"],
                        "ttft_p50_loaded_ms": loaded["i_ttft_p50_ms"],
                        "p95_met": p95_ratio <= ITL_TARGET,
                        "worst_gap_ms": loaded["worst_pause_ms"], "worst_gap_limit_ms": gap_limit,
                        "pause_met": loaded["worst_pause_ms"] <= gap_limit,
                        "bg_completed": bool(np.isfinite(loaded.get("bg_ttft_ms", np.nan))),
                        "bg_slowdown_max": bg, "bg_target": bg_target,
                        "bg_met": bg is not None and bg <= bg_target})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m", help="a synth preset or a GGUF path")
    ap.add_argument("--backend", default="cpu", help="which llama-server build to compare")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", type=int, default=3, help="interactive streams (K)")
    ap.add_argument("--tokens", type=int, default=128, help="per interactive request")
    ap.add_argument("--rounds", type=int, default=3, help="requests per stream when alone")
    ap.add_argument("--alone-s", type=float, default=4.0,
                    help="alone phase: seconds all streams run together (at least --rounds)")
    ap.add_argument("--stagger-s", type=float, default=0.3,
                    help="stream i starts i × this late, so requests do not start in lockstep")
    ap.add_argument("--background", type=int, default=1, help="background requests (N)")
    ap.add_argument("--storm-tokens", type=int, default=3000, help="background prompt length")
    ap.add_argument("--bg-tokens", type=int, default=64, help="background max_tokens")
    ap.add_argument("--arrive-s", type=float, default=1.0)
    ap.add_argument("--phases", default="mixed", type=lambda v: set(v.split(",")),
                    help="mixed (1), churn (2), burst (3), poisson (4), agent (5), chat (6), "
                         "comma-separated: each alone, then under background work")
    ap.add_argument("--agent-steps", type=int, default=8)
    ap.add_argument("--churn-tokens", type=int, default=32,
                    help="churn and burst: tokens per short interactive request")
    ap.add_argument("--think-s", type=float, default=0.5,
                    help="churn: mean think time between an app's requests")
    ap.add_argument("--burst", type=int, default=8, help="burst: requests arriving together")
    ap.add_argument("--poisson-n", type=int, default=4, help="poisson: background prompts")
    ap.add_argument("--poisson-s", type=float, default=5.0,
                    help="poisson: mean seconds between background arrivals")
    ap.add_argument("--chat-ctx", type=int, default=8192,
                    help="chat: the context it grows to (at most the model's training context: "
                         "llama-server caps a slot there)")
    ap.add_argument("--chat-step", type=int, default=1024, help="chat: tokens added a turn")
    ap.add_argument("--ctx", type=int, default=0, help="KV cells [enough for every slot]")
    ap.add_argument("--sides", default="uma bound,uma baseline,llama-server",
                    help="comma-separated: uma POLICY (bound or baseline) or llama-server")
    ap.add_argument("--kv-unified", action="store_true",
                    help="one KV buffer for all sequences, on both sides (default: one per "
                         "sequence, llama-server's own default with --parallel)")
    ap.add_argument("--uma-args", default="", help="extra `uma run` flags, e.g. --no-kv-unified")
    ap.add_argument("--out", default="mixed_load", help="results name under benches/results")
    ns = ap.parse_args()
    unknown = ns.phases - {"mixed", "agent", "churn", "burst", "poisson", "chat"}
    if unknown:  # before any build or model work
        ap.error(f"--phases: unknown phase(s) {', '.join(sorted(unknown))}")

    sides = ns.sides.split(",")
    known = ["llama-server", *(f"uma {policy}" for policy in POLICIES)]
    wrong = [s for s in sides if s not in known]
    if wrong:  # before any build or model work
        ap.error(f"--sides: unknown side(s) {', '.join(wrong)}; known: {', '.join(known)}")
    tools = ensure_tools(ns.backend) if any(not s.startswith("uma ") for s in sides) else {}
    model = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    # Each scenario's background prompts are its own: one already computed in another phase
    # would be answered from a prompt cache.
    scenario_storms = {
        name: [long_prompt(model, ns.storm_tokens, salt=1000 * k + j)
               for j in range(ns.background)] if name in ns.phases else []
        for k, name in enumerate(("mixed", "churn", "burst", "chat"))}
    storms = scenario_storms["mixed"]
    poisson, arrivals = scenarios.poisson_prompts(model, ns) if "poisson" in ns.phases \
        else ([], [])
    scenario_storms["poisson"] = poisson
    background = max(ns.background, len(poisson))
    slots = max(ns.streams, ns.burst if "burst" in ns.phases else 0) + background
    # llama-server divides its context between slots: give every slot room for the longest
    # prompt (a storm, or the chat's whole conversation).
    longest = max(ns.storm_tokens + ns.bg_tokens,
                  ns.chat_ctx + ns.tokens if "chat" in ns.phases else 0)
    ctx = ns.ctx or slots * (longest + 256)
    common = {"threads": ns.threads, "ctx": ctx, "parallel": slots, "gpu_layers": ns.gpu_layers}
    info = report.run_info(model, backend=ns.backend, streams=ns.streams, tokens=ns.tokens,
                           kv_unified=ns.kv_unified, stagger_s=ns.stagger_s,
                           background=ns.background, storm_tokens=ns.storm_tokens, **common)
    rows: list[dict] = []
    timelines: dict[str, list] = {}
    print(report.table([], COLUMNS if ns.phases - {"agent"} else AGENT_COLUMNS))
    for side in sides:
        if side.startswith("uma "):
            kv = "--kv-unified" if ns.kv_unified else "--no-kv-unified"
            server = uma_server(model, policy=side.split()[1],
                                args=(kv, *ns.uma_args.split()), **common)
        else:
            server = llama_server(tools["llama-server"], model,
                                  args=("-kvu",) if ns.kv_unified else (), **common)
        with server as s:
            measure(s, ns, storms, rows, timelines, model, scenario_storms, arrivals)
    checks = verdicts(rows)
    for v in checks:
        print(f"{v['side']:16s} {v['scenario']:8s} p95 loaded/alone "
              f"{v['p95_storm_over_alone']:.2f}x "
              f"({'met' if v['p95_met'] else 'NOT met'} <= {ITL_TARGET}), worst gap "
              f"{v['worst_gap_ms']:.1f} ms "
              f"({'met' if v['pause_met'] else 'NOT met'} <= {v['worst_gap_limit_ms']:.0f} ms)"
              + (f", background {v['bg_slowdown_max']:.1f}x alone "
                 f"({'met' if v['bg_met'] else 'NOT met'} <= {v['bg_target']:.0f}x)"
                 if v["bg_slowdown_max"] else ""))
    path = report.write(ns.out, info, rows, {"verdicts": checks}, timelines)
    shown = [k for k in timelines if k.endswith(("| storm", "+ decoders", "+ background"))]
    drawn = {"timelines": timelines}  # what was just written, not read back
    png = plots.timelines(path, shown, drawn)
    figures = [plots.scenario(path, k.split(" | ", 1)[1], drawn)
               for k in dict.fromkeys(k for k in shown if k.startswith(rows[0]["side"]))]
    print(f"wrote {path}, {png} and one figure per scenario: "
          + ", ".join(str(f.name) for f in figures if f))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
