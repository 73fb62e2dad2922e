"""One app's flood against another app's question: UMA Serve (fair share on, and off) against
llama-server, through the same HTTP/SSE client.

    python benches/app_flood.py --model 134m --threads 2 --repeat 3
    python benches/app_flood.py --model 1b --backend cuda --gpu-layers 99 --threads 8

App A (`user` "batch") starts --flood streaming requests of --flood-tokens tokens at once (a
batch job, an agent fanning out); --delay-s later app B (`user` "editor") asks one
--question-tokens question. Every server has 4 slots. Reported per side: the first request's
TTFT after start, B's TTFT alone (the same question again, warm, on an idle server), B's TTFT
and tokens/s during the flood, and A's aggregate tokens/s
(all of A's tokens over the time from its first request to its last token). Each side runs on a
fresh server, --repeat times, in alternating order. llama-server has no notion of apps: it
serves first come, first served. With --anonymous no request names its app and B asks from a
process of its own, as two unconfigured apps on one machine would: UMA Serve then tells them
apart by their processes. With --background A's requests are background work (UMA Serve's
`priority` field; llama-server has no such notion): with --flood 4 every sequence holds one
when B asks, and B's first token waits for a background request to be set aside at a token
boundary (docs/design/scheduling.md, "Demotion at a token boundary"; the side "uma, fair share off"
shows it alone, without fair share parking for B's app). With --prompt-words N each of A's
requests is a long prompt (N words after its job number), and with --same-app B asks as app A:
a short question behind long prompts that came first, which no app distinction can help.

    python benches/app_flood.py --model 134m --threads 2 --flood 3 --flood-tokens 16 \
        --prompt-words 1000 --same-app --repeat 3
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from servers import (  # noqa: E402
    Server,
    add_fair_sides_arg,
    add_server_args,
    fair_sides,
    medians,
    run_sides,
)
from streams import Stream, sse_completion  # noqa: E402
from uma import synth  # noqa: E402

SLOTS = 4


def ask(server: Server, user: str | None, prompt: str, tokens: int,
        elsewhere: bool = False, background: bool = False) -> Stream | types.SimpleNamespace:
    """One streamed completion; user None names no app; elsewhere: sent from a process of
    its own (its ttft_s and token times come back); background: UMA Serve's priority."""
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            **({} if user is None else {"user": user}), **(server.extra or {}),
            **({"priority": "background"} if background and server.socket is not None
               else {})}
    if elsewhere:
        code = (f"import json, sys; sys.path.insert(0, {str(HERE)!r}); "
                f"from streams import sse_completion; "
                f"s = sse_completion({server.port}, {body!r}, label='b'); "
                f"print(json.dumps({{'ttft_s': s.ttft_s, 'times': s.times, "
                f"'completion_tokens': s.completion_tokens}}))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=600, check=True)
        s = types.SimpleNamespace(**json.loads(done.stdout.splitlines()[-1]))
    else:
        s = sse_completion(server.port, body, label=user or "anonymous")
    if s.completion_tokens != tokens:
        raise RuntimeError(f"{server.name}: {s.completion_tokens} of {tokens} tokens")
    return s


def flood(server: Server, ns: argparse.Namespace) -> dict:
    a, b = (None, None) if ns.anonymous else ("batch", "batch" if ns.same_app else "editor")
    words = "word " * ns.prompt_words if ns.prompt_words else \
        "summarise the day's harbour log. " * 4
    question = functools.partial(ask, server, b, "What is a lighthouse? Say it briefly.",
                                 ns.question_tokens, elsewhere=ns.anonymous)
    first = question()
    alone = question()
    streams: list[Stream | None] = [None] * ns.flood
    start = time.perf_counter()

    def job(k: int) -> None:
        streams[k] = ask(server, a, f"Job {k}: {words}", ns.flood_tokens,
                         background=ns.background)

    threads = [threading.Thread(target=job, args=(k,)) for k in range(ns.flood)]
    for th in threads:
        th.start()
    time.sleep(ns.delay_s)  # the question's arrival time, a workload parameter
    asked = question()
    for th in threads:
        th.join()
    done = [s for s in streams if s is not None]
    end = max(s.times[-1] for s in done)
    decode_s = asked.times[-1] - asked.times[0]
    return {"first_request_ttft_ms": 1e3 * first.ttft_s,
            "question_alone_ttft_ms": 1e3 * alone.ttft_s,
            "question_ttft_ms": 1e3 * asked.ttft_s,
            "question_tps": (len(asked.times) - 1) / decode_s if decode_s > 0 else 0.0,
            "flood_tps": sum(len(s.times) for s in done) / (end - start)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_args(ap)
    ap.add_argument("--flood", type=int, default=12, help="app A's requests")
    ap.add_argument("--flood-tokens", type=int, default=256)
    ap.add_argument("--question-tokens", type=int, default=64)
    ap.add_argument("--delay-s", type=float, default=0.5, help="B's question after A's flood")
    add_fair_sides_arg(ap)
    ap.add_argument("--repeat", type=int, default=1, help="runs a side, alternating order")
    ap.add_argument("--anonymous", action="store_true",
                    help="no request names its app; B asks from a process of its own")
    ap.add_argument("--background", action="store_true",
                    help="app A's requests are background work")
    ap.add_argument("--prompt-words", type=int, default=0,
                    help="each of A's requests a prompt of this many words, a token each "
                    "(0: a short one)")
    ap.add_argument("--same-app", action="store_true", help="B asks as app A")
    ap.add_argument("--out", type=Path, default=None)
    ns = ap.parse_args()
    if ns.prompt_words < 0:
        ap.error("--prompt-words must be at least 0")
    path = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    runs = run_sides(fair_sides(ns, path, SLOTS), ns.repeat, lambda server: flood(server, ns))
    report: dict = {"model": str(path), "threads": ns.threads, "flood": ns.flood,
                    "flood_tokens": ns.flood_tokens, "question_tokens": ns.question_tokens,
                    "delay_s": ns.delay_s, "anonymous": ns.anonymous, "background": ns.background,
                    "prompt_words": ns.prompt_words, "same_app": ns.same_app,
                    "runs": runs}
    for name, med in medians(runs).items():
        report[f"{name} median"] = med
    if ns.out:
        ns.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
