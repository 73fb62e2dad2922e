"""Speculative decoding on real text: one stream's decode speed with and without guesses, on
both servers, on tasks whose answer repeats its input (an edited file, a quoted passage).

    python benches/speculation.py --model smollm2 --threads 2 --repeat 3
    python benches/speculation.py --model smollm2 --backend cuda --gpu-layers 99 --threads 8

Sides: `uma run` with --speculation off and ngram (prompt lookup); llama-server without
speculation and with each of its model-free drafters (--spec-type ngram-simple, ngram-map-k,
ngram-mod, at their defaults). Each run starts every side fresh, in alternating order; each
side answers every task once a run, greedy, over HTTP (/v1/completions with the model's chat
template applied here, so both servers decode the same tokens). Decode speed is the answer's
tokens after the first over the time from the first token's arrival to the last's; a side's
text is compared with its non-speculating twin's (greedy answers should agree, apart from
where two tokens are within rounding of each other, which batching alone also moves).
Acceptance: UMA's from its /metrics (spec_drafted/accepted), llama-server's from its timings
(draft_n, draft_n_accepted).

    python benches/speculation.py --load 1,32 --model 1b --backend cuda --gpu-layers 99

    python benches/speculation.py --model smollm2 --draft-self F16 --sides uma "uma draft" \
        llama-server "llama-server draft"

`--draft-self TYPE` measures a draft model: the model given drafts for a higher-precision copy
of itself (llama-quantize --allow-requantize, to TYPE: F16 or Q8_0), which both servers then
serve; sides `uma draft` (--draft-model) and `llama-server draft` (--spec-type draft-simple
--model-draft, its default draft settings) join the others, and every side serves the copy.

`--load` measures what speculation costs where it should not pay: N streams of short
prompts decoding at once, in a fresh engine with --speculation off or ngram (exactly the
daemon's settings for those flags), the sides alternated; tokens/s over
the window in which every stream decodes, and the acceptance. On a synthetic model's random
text guesses are rarely kept, and at many streams a guess costs about a stream's row: the
goodput rule should switch it off (target: at most 3 % slower).
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report  # noqa: E402
from llama_tools import ensure_tools  # noqa: E402
from servers import alternating, llama_server, uma_server  # noqa: E402
from streams import sse_completion  # noqa: E402
from uma import _core, catalog  # noqa: E402

_FILE = '''import math


def area_of_circle(radius):
    """The area of a circle of this radius."""
    return math.pi * radius * radius


def area_of_square(side):
    """The area of a square of this side."""
    return side * side


def perimeter_of_square(side):
    """The perimeter of a square of this side."""
    return 4 * side


def hypotenuse(a, b):
    """The hypotenuse of a right triangle with these legs."""
    return math.sqrt(a * a + b * b)


def mean(values):
    """The arithmetic mean of some numbers."""
    return sum(values) / len(values)
'''

_PASSAGE = ("The lighthouse stood on the northern cliff for two hundred years. Every night its "
            "keeper climbed the one hundred and twelve steps to light the lamp, and every "
            "morning he climbed them again to put it out. Ships passing in the dark counted "
            "its flashes to know where they were: three short and one long meant the cliff, "
            "and the cliff meant turn east.")

TASKS = {
    "rename": "Here is a Python file:\n\n```python\n" + _FILE + "```\n\nRename the function "
              "area_of_circle to circle_area. Output the whole file.",
    "docstrings": "Here is a Python file:\n\n```python\n" + _FILE + "```\n\nChange every "
                  "docstring to start with 'Return'. Output the whole file.",
    "quote": "Quote the following passage exactly, then summarise it in one sentence.\n\n"
             + _PASSAGE,
}

LLAMA_SPEC = ("ngram-simple", "ngram-map-k", "ngram-mod")


def completion(port: int, body: dict) -> dict:
    """One streamed completion: decode speed, text, and the server's draft counts."""
    s = sse_completion(port, body, timeout=600)
    n = s.completion_tokens
    decode_s = s.times[-1] - s.times[0] if len(s.times) > 1 else float("nan")
    return {"text": "".join(s.text), "tokens": n, "ttft_ms": s.ttft_s * 1e3,
            "tok_s": (n - 1) / decode_s if decode_s > 0 else float("nan"),
            "drafted": s.timings.get("draft_n", 0),
            "accepted": s.timings.get("draft_n_accepted", 0)}


def uma_spec_counts(port: int) -> tuple[float, float]:
    """UMA's guesses drafted and accepted so far, from its Prometheus text."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    conn.close()

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^uma_{name}{{[^}}]*}} (\S+)$", body, re.M))

    return total("spec_drafted_tokens_total"), total("spec_accepted_tokens_total")


def higher_precision(quantize: Path, model: Path, kind: str) -> Path:
    """The model requantized to `kind` (its own weights at a higher precision: a target the
    model drafts for), made once in the system's temporary folder."""
    out = Path(tempfile.gettempdir()) / f"{model.stem}.{kind}.gguf"
    if not out.exists():
        part = out.with_suffix(".part")
        subprocess.run([str(quantize), "--allow-requantize", str(model), str(part), kind],
                       check=True, capture_output=True)
        part.rename(out)
    return out


def prompts(model: Path) -> dict[str, str]:
    """Each task as the model's chat template renders it (special tokens as text)."""
    with _core.Model(model, vocab_only=True) as vocab:
        return {name: vocab.apply_chat_template([{"role": "user", "content": task}])
                for name, task in TASKS.items()}


def load(ns: argparse.Namespace) -> None:
    """The --load runs (see the module's text)."""
    import uma
    from decode_throughput import model_path
    from served_pace import prompts as short_prompts
    from served_pace import window
    from uma.server import settings

    model = model_path(ns.model)
    rows = []
    timing = tempfile.mkdtemp()  # each side's engine times the device once
    for n in (int(x) for x in ns.load.split(",")):
        by: dict[str, list[dict]] = {side: [] for side in ns.load_sides}
        for r, side in alternating(list(by), ns.repeat):
            # a fresh engine each run, one at a time: an idle engine's threads beside a busy
            # one's share the CPU's cores
            given = {"model": str(model), "threads": ns.threads, "threads_batch": ns.threads,
                     "parallel": n, "ctx": max(4096, n * (64 + ns.max_tokens) + 256),
                     "gpu_layers": ns.gpu_layers, "speculation": side}
            if side == "draft":
                given["draft_model"] = str(model_path(ns.draft_model))
            conf = settings.resolve([given])
            with uma.Engine.from_config(conf.engine, timing_dir=timing) as engine:
                engine.generate("warm up", max_tokens=4)
                before = engine.snapshot()
                handles = [engine.submit(p, max_tokens=ns.max_tokens, ignore_eos=True)
                           for p in short_prompts(n)]
                results = [h.result(timeout=3600) for h in handles]
                after = engine.snapshot()
                prices = engine._scheduler.speculator.prices
            streams = [{"times": [t / 1e3 for t in res.timings.token_ms],
                        "tokens": res.usage.completion_tokens,
                        "events": len(res.timings.token_ms)} for res in results]
            row = window(streams)
            drafted, accepted = (sum(after[k].values()) - sum(before[k].values())
                                 for k in ("spec_drafted_tokens_total",
                                           "spec_accepted_tokens_total"))
            row.update(streams=n, side=side, run=r, drafted=drafted,
                       acceptance=accepted / drafted if drafted else 0.0,
                       guess_ms=list(prices.per_band) if prices else None,
                       plain_ms=prices.plain_ms(n) if prices else None)
            by[side].append(row)
            rows.append(row)
            print(f"{n:3d} streams run {r} {side:6s} {row['tps']:8.1f} tok/s  drafted "
                  f"{drafted:6.0f}  acceptance {row['acceptance']:.2f}", flush=True)
        off = statistics.median(x["tps"] for x in by["off"])
        for side in by:
            if side != "off":
                on = [x["tps"] / off for x in by[side]]
                print(f"{n:3d} streams: {side}/off {statistics.median(on):.3f} "
                      f"({min(on):.3f}-{max(on):.3f})", flush=True)
    if ns.out:
        ns.out.write_text(json.dumps({"info": report.run_info(
            model, backend=ns.backend, threads=ns.threads, gpu_layers=ns.gpu_layers),
            "rows": rows}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="a catalogue name or a GGUF path")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--sides", nargs="+", help="which sides (default: all)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--draft-self", metavar="TYPE",
                    help="serve the model requantized to TYPE (F16, Q8_0) with the model as "
                    "its draft (see above)")
    ap.add_argument("--load-sides", nargs="+", default=["off", "ngram"],
                    choices=["off", "ngram", "draft"], help="--load's sides (off first)")
    ap.add_argument("--draft-model", help="--load's draft side: the draft model (a catalogue "
                    "name, a synthetic preset or a GGUF path)")
    ap.add_argument("--load", help="stream counts: measure speculation's cost where it should "
                    "not pay (see above)")
    ns = ap.parse_args()
    if "draft" in ns.load_sides and not ns.draft_model:
        ap.error("--load-sides draft needs --draft-model")
    if ns.load:
        return load(ns)
    model = Path(ns.model) if Path(ns.model).exists() \
        else catalog.fetch(catalog.CATALOG[ns.model])
    tools = ensure_tools(ns.backend)
    tool = tools["llama-server"]
    draft = None
    if ns.draft_self:
        draft, model = model, higher_precision(tools["llama-quantize"], model, ns.draft_self)
    texts = prompts(model)
    common = {"threads": ns.threads, "ctx": 4096, "parallel": 1, "gpu_layers": ns.gpu_layers}
    drafting = {} if draft is None else {
        "uma draft": lambda: uma_server(model, args=("--draft-model", str(draft)), **common),
        "llama-server draft": lambda: llama_server(
            tool, model, args=("--spec-type", "draft-simple", "--model-draft", str(draft),
                               "--spec-draft-ngl", str(ns.gpu_layers)), **common),
    }
    sides = {
        "uma": lambda: uma_server(model, args=("--speculation", "off"), **common),
        "uma ngram": lambda: uma_server(model, args=("--speculation", "ngram"), **common),
        "llama-server": lambda: llama_server(tool, model, **common),
        **{f"llama-server {t}": (lambda t=t: llama_server(tool, model, args=("--spec-type", t),
                                                          **common)) for t in LLAMA_SPEC},
        **drafting,
    }
    if ns.sides:
        sides = {k: v for k, v in sides.items() if k in ns.sides}
    runs: dict[str, dict[str, list[dict]]] = {s: {t: [] for t in TASKS} for s in sides}
    for r, side in alternating(list(sides), ns.repeat):
        with sides[side]() as server:
            for task, prompt in texts.items():
                body = {"prompt": prompt, "max_tokens": ns.max_tokens, "temperature": 0,
                        **(server.extra or {})}
                before = uma_spec_counts(server.port) if server.socket else (0.0, 0.0)
                row = completion(server.port, body)
                if server.socket:
                    after = uma_spec_counts(server.port)
                    row["drafted"], row["accepted"] = after[0] - before[0], after[1] - before[1]
                runs[side][task].append(row)
                acc = row["accepted"] / row["drafted"] if row["drafted"] else 0.0
                print(f"run {r} {side:26s} {task:10s} {row['tok_s']:7.1f} tok/s  "
                      f"{row['tokens']:4d} tokens  drafted {row['drafted']:5.0f}  "
                      f"accepted {acc:.2f}", flush=True)
    summary = summarise(runs)
    if ns.out:
        ns.out.write_text(json.dumps({
            "info": report.run_info(model, backend=ns.backend,
                                    threads=ns.threads, gpu_layers=ns.gpu_layers),
            "summary": summary,
            "runs": {s: {t: [{k: v for k, v in row.items() if k != "text"} | {
                "text_chars": len(row["text"])} for row in rows] for t, rows in by.items()}
                for s, by in runs.items()},
            "texts": {s: {t: rows[0]["text"] for t, rows in by.items()} for s, by in runs.items()},
        }, indent=1))


def summarise(runs: dict[str, dict[str, list[dict]]]) -> dict:
    """Each side's median tokens/s per task, its spread, its ratio to the non-speculating
    side of its server, its acceptance, and whether its text equals that side's."""
    out: dict[str, dict] = {}
    for side, by in runs.items():
        base = "uma" if side.startswith("uma") else "llama-server"
        out[side] = {}
        for task, rows in by.items():
            speeds = [row["tok_s"] for row in rows]
            ref = runs.get(base, {}).get(task)
            drafted = sum(row["drafted"] for row in rows)
            cell = {"tok_s": statistics.median(speeds), "min": min(speeds), "max": max(speeds),
                    "acceptance": sum(row["accepted"] for row in rows) / drafted if drafted
                    else 0.0, "drafted_per_token": drafted / max(1, sum(r["tokens"] for r in rows))}
            if ref:
                cell["x_plain"] = cell["tok_s"] / statistics.median(r["tok_s"] for r in ref)
                cell["same_text"] = rows[0]["text"] == ref[0]["text"]
            out[side][task] = cell
            print(f"{side:26s} {task:10s} median {cell['tok_s']:7.1f} tok/s "
                  f"({cell['min']:.1f}-{cell['max']:.1f})  x{cell.get('x_plain', 1):.2f}  "
                  f"acceptance {cell['acceptance']:.2f}  same text {cell.get('same_text')}",
                  flush=True)
    return out


if __name__ == "__main__":
    main()
