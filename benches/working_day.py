"""A working day of one machine's apps, compressed to minutes: chats, agents sharing a system
prompt, one-off long prompts, short requests and embeddings, each on its own clock, UMA Serve
(its prefix cache and disk tier as the daemon starts them) against llama-server (its prompt
cache on; embeddings from a second llama-server started with --embeddings, since one started
so serves nothing else), through the same HTTP client and token-id prompts.

    python benches/working_day.py --model 134m --threads 2 --minutes 3 --repeat 3

The day, the same on both sides (seeded): --chats conversations, a turn every --chat-every
seconds (200 new user tokens on the history, a 32-token answer kept in the history as the
server gave it); --agents apps, each sending the shared --system-tokens system prompt and its own
40-token question every --agent-every seconds (8 tokens back); a one-off --long-tokens prompt
every --long-every seconds (16 back); a short 10-token request every --short-every seconds (8
back); --embed-inputs 64-token inputs to /v1/embeddings every --embed-every seconds. Each
clock's first event is staggered; a client whose last request is still running sends its next
when it ends (an app waits for its answer).

Per side and run: each kind's TTFT (embeddings: the whole answer) p50 / p95 and its p50 by
third of the day; the share of prompt tokens the server reported cached (usage
prompt_tokens_details.cached_tokens) and the tokens that saved; the agents' later requests
against the day's first one; chat turns from the third; short requests against the same
request on the fresh server; the servers' resident memory, and UMA's prefix cache in host
memory and on disk. Targets (docs/design/prefix-cache.md, "What is worth keeping"): later
agents <= 0.2x the first, short requests <= 2x fresh, chat turns from the third <=
llama-server's.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import run_info  # noqa: E402
from servers import (  # noqa: E402
    Server,
    add_server_args,
    alternating,
    llama_server,
    memory_kb,
    model_and_server,
    uma_server,
)
from streams import sse_completion  # noqa: E402

USER, REPLY, QUESTION, SHORT, EMBED = 200, 32, 40, 10, 64


@dataclass
class Done:
    """One request as the day saw it."""

    kind: str  # chat | agent | long | short | embed
    client: int  # which conversation, app or clock
    at_s: float  # when it was sent, from the day's start
    ms: float  # TTFT (embeddings: the whole answer)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    turn: int = 0  # a chat's turn, an agent's request number (from 0)


def tokens(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(1000, 20000, n).tolist()


def complete(server: Server, prompt: list[int], max_tokens: int, *, reply: bool = False
             ) -> tuple[float, int, int, list[int]]:
    """TTFT ms, prompt tokens and cached prompt tokens of one streamed completion, and (reply)
    the token ids it answered: UMA's return_tokens, llama-server's log-probability entries
    (its /v1/completions gives ids no other way)."""
    ids = ({"return_tokens": True} if server.socket else {"logprobs": 1}) if reply else {}
    s = sse_completion(server.port, {"prompt": prompt, "max_tokens": max_tokens,
                                     "temperature": 0, "ignore_eos": True, **ids,
                                     **(server.extra or {})})
    if s.completion_tokens != max_tokens:
        raise RuntimeError(f"{server.name}: {s.completion_tokens} of {max_tokens} tokens")
    if reply and len(s.token_ids) != max_tokens:
        raise RuntimeError(f"{server.name}: {len(s.token_ids)} token ids of {max_tokens}")
    return 1e3 * s.ttft_s, s.prompt_tokens, s.cached_tokens, s.token_ids


def embed(port: int, inputs: list[list[int]]) -> float:
    """ms for one /v1/embeddings request of token-id inputs."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", "/v1/embeddings", json.dumps({"input": inputs}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    if resp.status != 200 or len(json.loads(body)["data"]) != len(inputs):
        raise RuntimeError(f"port {port} answered {resp.status}: {body[:300]!r}")
    return 1e3 * (time.perf_counter() - t0)


def run_day(server: Server, embed_port: int, ns: argparse.Namespace, seed: int) -> list[Done]:
    """The day's clients, each in a thread on its own clock; every request's record."""
    done: list[Done] = []
    errors: list[str] = []
    lock = threading.Lock()
    length = 60.0 * ns.minutes
    start = time.perf_counter()

    def record(d: Done) -> None:
        with lock:
            done.append(d)

    def clock(kind: str, client: int, first_s: float, every_s: float,
              send: Callable[[int], Done]) -> None:
        """Calls send(n) at first_s + n * every_s (or as soon as the last ended), until the
        day ends."""
        n = 0
        try:
            while True:
                due = first_s + n * every_s
                if due >= length:
                    return
                wait = due - (time.perf_counter() - start)
                if wait > 0:
                    time.sleep(wait)
                record(send(n))
                n += 1
        except Exception as e:  # noqa: BLE001 - reported after the day, not lost
            errors.append(f"{kind} {client}: {e}")

    def now() -> float:
        return time.perf_counter() - start

    rng = np.random.default_rng(seed)
    system = tokens(rng, ns.system_tokens)
    roles: list[tuple] = []
    for c in range(ns.chats):
        history: list[int] = []
        crng = np.random.default_rng(seed + 100 + c)

        def chat_turn(t: int, history=history, crng=crng, c=c) -> Done:
            user = tokens(crng, USER)
            at = now()
            ms, p, k, answer = complete(server, history + user, REPLY, reply=True)
            history += user + answer  # the reply it got, as a chat app sends it back
            return Done("chat", c, at, ms, p, k, t)

        roles.append(("chat", c, c * ns.chat_every / ns.chats, ns.chat_every, chat_turn))
    for a in range(ns.agents):
        arng = np.random.default_rng(seed + 200 + a)

        def agent(n: int, arng=arng, a=a) -> Done:
            at = now()
            ms, p, k, _ = complete(server, system + tokens(arng, QUESTION), 8)
            return Done("agent", a, at, ms, p, k, n)

        roles.append(("agent", a, 0.5 + a * ns.agent_every / ns.agents, ns.agent_every, agent))
    lrng = np.random.default_rng(seed + 300)

    def one_off(n: int) -> Done:
        at = now()
        ms, p, k, _ = complete(server, tokens(lrng, ns.long_tokens), 16)
        return Done("long", 0, at, ms, p, k, n)

    roles.append(("long", 0, ns.long_every / 3, ns.long_every, one_off))
    srng = np.random.default_rng(seed + 400)

    def short(n: int) -> Done:
        at = now()
        ms, p, k, _ = complete(server, tokens(srng, SHORT), 8)
        return Done("short", 0, at, ms, p, k, n)

    roles.append(("short", 0, ns.short_every / 2, ns.short_every, short))
    erng = np.random.default_rng(seed + 500)

    def embeddings(n: int) -> Done:
        at = now()
        ms = embed(embed_port, [tokens(erng, EMBED) for _ in range(ns.embed_inputs)])
        return Done("embed", 0, at, ms, 0, 0, n)

    if ns.embed_inputs:
        roles.append(("embed", 0, ns.embed_every / 4, ns.embed_every, embeddings))
    threads = [threading.Thread(target=clock, args=role) for role in roles]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise RuntimeError(f"{server.name}: " + "; ".join(errors))
    return sorted(done, key=lambda d: d.at_s)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def summary(done: list[Done], fresh_short_ms: float, minutes: float) -> dict:
    """The day's figures (see the module's docstring)."""
    out: dict = {"requests": len(done), "fresh_short_ms": fresh_short_ms}
    third = 20.0 * minutes
    for kind in ("chat", "agent", "long", "short", "embed"):
        ms = [d.ms for d in done if d.kind == kind]
        if not ms:
            continue
        out[kind] = {"n": len(ms), "p50_ms": pct(ms, 0.5), "p95_ms": pct(ms, 0.95),
                     "p50_by_third_ms": [pct([d.ms for d in done if d.kind == kind
                                              and i * third <= d.at_s < (i + 1) * third], 0.5)
                                         for i in range(3)]}
    gen = [d for d in done if d.kind != "embed"]
    prompt = sum(d.prompt_tokens for d in gen)
    cached = sum(d.cached_tokens for d in gen)
    out["cached_share"] = cached / prompt if prompt else 0.0
    out["prefill_tokens_saved"] = cached
    agents = [d for d in done if d.kind == "agent"]
    if len(agents) > 1:
        out["agent_later_over_first"] = pct([d.ms for d in agents[1:]], 0.5) / agents[0].ms
    later_chat = [d.ms for d in done if d.kind == "chat" and d.turn >= 2]
    out["chat_from_turn_3_p50_ms"] = pct(later_chat, 0.5)
    shorts = [d.ms for d in done if d.kind == "short"]
    if shorts:
        out["short_p50_over_fresh"] = pct(shorts, 0.5) / fresh_short_ms
        out["short_worst_over_fresh"] = max(shorts) / fresh_short_ms
    return out


def uma_cache_bytes(port: int) -> dict[str, float]:
    """UMA's prefix cache in host memory and on disk, and its evictions, from /metrics."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for name in ("prefix_cache_ram_bytes", "prefix_cache_disk_bytes", "prefix_cache_tokens",
                 "prefix_cache_kv_evictions_total", "prefix_cache_ram_evictions_total",
                 "prefix_cache_unsaved_total"):
        m = re.search(rf"^uma_{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
        out[name] = float(m.group(1)) if m else float("nan")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_args(ap)
    ap.add_argument("--minutes", type=float, default=3.0, help="the day's length")
    ap.add_argument("--chats", type=int, default=3)
    ap.add_argument("--chat-every", type=float, default=15.0)
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--agent-every", type=float, default=20.0)
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--long-tokens", type=int, default=2000)
    ap.add_argument("--long-every", type=float, default=45.0)
    ap.add_argument("--short-every", type=float, default=12.0)
    ap.add_argument("--embed-inputs", type=int, default=4, help="0: no embeddings")
    ap.add_argument("--embed-every", type=float, default=10.0)
    ap.add_argument("--parallel", type=int, default=4, help="slots on both sides")
    ap.add_argument("--ctx", type=int, default=32768, help="KV cells on both sides")
    ap.add_argument("--sides", default="uma,llama-server")
    ap.add_argument("--repeat", type=int, default=1, help="runs a side, alternating order")
    ap.add_argument("--disk-dir", default=None,
                    help="UMA's prefix cache files here, kept (default: a temporary folder)")
    ap.add_argument("--out", type=Path, default=None)
    ns = ap.parse_args()
    sides = [s.strip() for s in ns.sides.split(",")]
    if unknown := set(sides) - {"uma", "llama-server"}:
        ap.error(f"--sides: unknown side(s) {', '.join(sorted(unknown))}")
    for name in ("minutes", "chat_every", "agent_every", "long_every", "short_every",
                 "embed_every"):
        if getattr(ns, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    path, tool = model_and_server(ns)
    common = {"threads": ns.threads, "ctx": ns.ctx, "parallel": ns.parallel,
              "gpu_layers": ns.gpu_layers}
    report: dict = {"info": run_info(Path(path)), "model": str(path),
                    "settings": vars(ns) | {"out": str(ns.out)},
                    "runs": {name: [] for name in sides}}
    for r, name in alternating(sides, ns.repeat):
        with ExitStack() as stack:
            if name == "uma":
                folder = ns.disk_dir or stack.enter_context(tempfile.TemporaryDirectory())
                server = stack.enter_context(uma_server(path, env={
                    "UMA_PREFIX_CACHE_DISK_MB": "4096", "UMA_PREFIX_CACHE_DIR": folder},
                    **common))
                embed_port, pids = server.port, [server.pid]
            else:
                server = stack.enter_context(llama_server(
                    tool, path, prompt_cache=True, args=("-kvu",), **common))
                pids = [server.pid]
                embed_port = 0
                if ns.embed_inputs:
                    embedder = stack.enter_context(llama_server(
                        tool, path, threads=ns.threads, ctx=4096, parallel=1,
                        gpu_layers=ns.gpu_layers, args=("--embeddings", "--pooling", "mean")))
                    embed_port = embedder.port
                    pids.append(embedder.pid)
            complete(server, tokens(np.random.default_rng(99), 16), 4)  # warm-up
            fresh, _, _, _ = complete(server, tokens(np.random.default_rng(98), SHORT), 8)
            done = run_day(server, embed_port, ns, seed=1000 * (r + 1))
            row = summary(done, fresh, ns.minutes)
            row["rss_mb"] = sum(memory_kb(p)["rss"] for p in pids) / 1024
            if name == "uma":
                row.update(uma_cache_bytes(server.port))
            row["done"] = [asdict(d) for d in done]
        report["runs"][name].append(row)
        print(f"run {r} {name:13s} " + line(row), flush=True)
    if ns.out:
        ns.out.write_text(json.dumps(report, indent=1))
    return 0


def line(row: dict) -> str:
    parts = [f"{row['requests']} requests"]
    for kind in ("chat", "agent", "long", "short", "embed"):
        if kind in row:
            k = row[kind]
            parts.append(f"{kind} p50 {k['p50_ms']:.0f} p95 {k['p95_ms']:.0f} ms (by third "
                         + "/".join(f"{v:.0f}" for v in k["p50_by_third_ms"]) + ")")
    parts.append(f"cached {100 * row['cached_share']:.0f} % ({row['prefill_tokens_saved']} "
                 "tokens)")
    if "agent_later_over_first" in row:
        parts.append(f"agents later/first {row['agent_later_over_first']:.2f}")
    parts.append(f"chat from turn 3 p50 {row['chat_from_turn_3_p50_ms']:.0f} ms")
    if "short_p50_over_fresh" in row:
        parts.append(f"short/fresh p50 {row['short_p50_over_fresh']:.2f} worst "
                     f"{row['short_worst_over_fresh']:.2f} (fresh {row['fresh_short_ms']:.0f}"
                     " ms)")
    parts.append(f"RSS {row['rss_mb']:.0f} MB")
    if "prefix_cache_ram_bytes" in row:
        parts.append(f"cache host {row['prefix_cache_ram_bytes'] / 2**20:.0f} MB disk "
                     f"{row['prefix_cache_disk_bytes'] / 2**20:.0f} MB")
    return "; ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
