"""Where a mixed-load run's interactive gaps fall, from the timelines mixed_load.py keeps.

The p95 target counts how many gaps pass a line (1.2x the streams' p95 alone), not by how
much, so this prints, for each phase, the share of gaps past that line split by what they
were: a gap with another interactive request's first token in it (the streams' own prompt
tick: a new prompt beside the others' decode) or any other (decode ticks, and whatever ran
between two: a background slice, a pause). Also interactive tokens/s while background work
ran, and the share of gaps in bands of milliseconds. The split is approximate: with the
overlapped scheduler a prompt tick's first token can be published at the end of the next tick,
so some prompt ticks count among the others and some decode ticks among the prompt ticks'.

    python benches/mixed_load.py ... --out NAME   # keeps NAME.timelines.json.xz beside NAME.json
    python benches/gap_bands.py benches/results/NAME.json
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import lzma
from pathlib import Path

import numpy as np

BANDS_MS = (0, 6, 8, 10, 12, 14, 17, 20, 30, 50, np.inf)
SLACK_S = 0.002  # a first token this close after a gap's end came from the same tick


def classed_gaps(requests: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Every interactive gap in ms, and whether another request's first token fell in it."""
    inter = [r for r in requests if r["class"] == "interactive" and len(r["times"]) > 1]
    firsts = sorted(r["times"][0] for r in inter)
    gaps, prompt = [], []
    for r in inter:
        for a, b in itertools.pairwise(r["times"]):
            i = bisect.bisect_right(firsts, a + SLACK_S / 4)
            gaps.append((b - a) * 1e3)
            prompt.append(i < len(firsts) and firsts[i] <= b + SLACK_S)
    return np.array(gaps), np.array(prompt, dtype=bool)


def interactive_rate(requests: list[dict]) -> tuple[float, float]:
    """Interactive tokens/s from the first request sent to the last background token (or the
    last interactive one, with no background), and that span in seconds."""
    inter = [r for r in requests if r["class"] == "interactive" and r["times"]]
    other = [r for r in requests if r["class"] != "interactive" and r["times"]]
    start = min(r["sent"] for r in inter)
    end = max(r["times"][-1] for r in (other or inter))
    n = sum(sum(1 for t in r["times"] if t <= end) for r in inter)
    return n / (end - start), end - start


def report(path: Path) -> None:
    result = json.loads(path.read_text())
    with lzma.open(path.parent / result["timelines_file"]) as f:
        phases = json.load(f)
    alone = next(v for k, v in phases.items() if k.endswith("| alone"))
    line = 1.2 * float(np.percentile(classed_gaps(alone)[0], 95))
    print(f"{path.name}: line {line:.1f} ms (1.2x the p95 alone)")
    for name, requests in phases.items():
        gaps, prompt = classed_gaps(requests)
        past = gaps > line
        rate, span = interactive_rate(requests)
        print(f"  {name:20s} gaps {len(gaps):6d}  p50 {np.percentile(gaps, 50):5.1f}  p95 "
              f"{np.percentile(gaps, 95):5.1f}  past the line {100 * past.mean():4.1f} % "
              f"(prompt ticks' {100 * (past & prompt).mean():4.1f}, others' "
              f"{100 * (past & ~prompt).mean():4.1f})  prompt ticks' gaps "
              f"{100 * prompt.mean():4.1f} %  interactive {rate:6.0f} tok/s over {span:5.1f} s")
        for label, mask in (("prompt ticks", prompt), ("others", ~prompt)):
            counts, _ = np.histogram(gaps[mask], bins=BANDS_MS)
            bands = "  ".join(f"{lo:g}-{hi:g}: {100 * c / len(gaps):4.1f}"
                              for lo, hi, c in zip(BANDS_MS, BANDS_MS[1:], counts, strict=False))
            print(f"    {label:12s} % of gaps by ms  {bands}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="mixed_load.py result JSON files")
    for path in ap.parse_args().results:
        report(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
