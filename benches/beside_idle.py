"""One model's decode speed alone, with a second model loaded beside it and idle, and after
the second is closed: two Engines in one process, as the daemon's model host keeps them.

    python benches/beside_idle.py --model-a smollm2 --model-b tiny --threads 2 --out F.json

Each phase generates --repeat answers of --tokens tokens on model A, greedy, end of generation
ignored; decode speed is an answer's tokens after the first over the time from the first to
the last. Model B answers one short request when loaded (it has decoded, as a served model
has) and then idles.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report  # noqa: E402
import uma  # noqa: E402
from decode_throughput import model_path  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper."


def speed(engine: uma.Engine, tokens: int) -> float:
    r = engine.generate(PROMPT, max_tokens=tokens, ignore_eos=True)
    t = r.timings.token_ms
    return 1e3 * (len(t) - 1) / (t[-1] - t[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-a", default="smollm2")
    ap.add_argument("--model-b", default="tiny")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ns = ap.parse_args()
    a_path, b_path = model_path(ns.model_a), model_path(ns.model_b)
    conf = {"n_ctx": 2048, "n_seq_max": 2, "n_threads": ns.threads}
    phases: dict[str, list[float]] = {}
    with uma.Engine(a_path, **conf) as a:
        a.wait_ready()
        speed(a, ns.tokens)  # warm
        phases["alone"] = [speed(a, ns.tokens) for _ in range(ns.repeat)]
        with uma.Engine(b_path, **conf) as b:
            b.wait_ready()
            b.generate("hi", max_tokens=4)
            phases["beside idle B"] = [speed(a, ns.tokens) for _ in range(ns.repeat)]
        phases["after B closed"] = [speed(a, ns.tokens) for _ in range(ns.repeat)]
    for name, v in phases.items():
        print(f"{name:15s} {statistics.median(v):7.1f} tok/s ({min(v):.1f}-{max(v):.1f})")
    if ns.out:
        ns.out.write_text(json.dumps({"info": report.run_info(a_path, threads=ns.threads),
                                      "model_b": b_path.name, "phases": phases}, indent=1))


if __name__ == "__main__":
    main()
