"""CI's performance gate: fails when a hot path got 2x slower than the committed baseline.

Wall-clock times on a shared 2-core CI machine swing by tens of percent between runs and by
more between machines, so raw times are never compared. Each benchmark's fastest round (the
least disturbed by other work on the machine) is divided by that of
test_reference_calibration, a fixed Python + numpy workload timed in the same run; the
machine's speed cancels, and the ratio is compared against benches/baseline.json with a
factor-of-2 margin, wide enough for noise and narrow enough for a real regression.

One reference cannot cancel every processor: a CI machine whose numpy is fast and whose
Python is not reads every Python path slower by the same factor. So each ratio is judged
against the run's typical one (the median over all benchmarks, when above 1): a path fails
when it is 2x slower than the rest of the suite moved, and a suite-wide shift reads as the
machine, not as a regression.

    pytest benches --benchmark-only --benchmark-json=bench.json
    python benches/regress.py bench.json              # exit 1 on a 2x regression
    python benches/regress.py bench.json --update     # record a new baseline (commit it)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

BASELINE = Path(__file__).resolve().parent / "baseline.json"
REFERENCE = "test_reference_calibration"
LIMIT = 2.0


def relative_medians(report: dict) -> dict[str, float]:
    """Each benchmark's fastest round over the reference's, from pytest-benchmark JSON."""
    medians = {b["name"]: b["stats"]["min"] for b in report.get("benchmarks", [])}
    if REFERENCE not in medians:
        raise SystemExit(f"regress: no {REFERENCE} in the report; run every benchmark")
    ref = medians.pop(REFERENCE)
    return {name: m / ref for name, m in sorted(medians.items())}


def machine_shift(ratios: dict[str, float]) -> float:
    """The slowdown every path shares this run: the median ratio (the lower of two middle
    ones), never below 1 (a faster machine does not make the gate stricter)."""
    return max(1.0, statistics.median_low(ratios.values())) if ratios else 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path, help="pytest-benchmark --benchmark-json output")
    ap.add_argument("--update", action="store_true", help="write the baseline from this run")
    ap.add_argument("--baseline", type=Path, default=BASELINE)
    ns = ap.parse_args(argv)
    try:
        current = relative_medians(json.loads(ns.report.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"regress: cannot read {ns.report}: {exc}", file=sys.stderr)
        return 2
    if ns.update:
        ns.baseline.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
        print(f"regress: wrote {len(current)} baselines to {ns.baseline}")
        return 0
    baseline = json.loads(ns.baseline.read_text())
    ratios = {name: now / baseline[name] for name, now in current.items() if name in baseline}
    shift = machine_shift(ratios)
    failed = []
    print(f"{'benchmark':52s} {'baseline':>9s} {'now':>9s} {'ratio':>6s}")
    for name, now in current.items():
        base = baseline.get(name)
        if base is None:
            print(f"{name:52s} {'(new)':>9s} {now:9.3g}")
            continue
        ratio = ratios[name]
        mark = "  REGRESSED" if ratio / shift >= LIMIT else ""
        print(f"{name:52s} {base:9.3g} {now:9.3g} {ratio:6.2f}{mark}")
        if ratio / shift >= LIMIT:
            failed.append(name)
    print(f"regress: the suite as a whole at {shift:.2f}x its baseline (the machine's share)")
    missing = sorted(set(baseline) - set(current))
    if missing:
        print(f"regress: not run this time: {', '.join(missing)}")
    if failed:
        print(f"regress: {len(failed)} hot path(s) {LIMIT:g}x slower than the suite: "
              f"{', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"regress: every hot path within {LIMIT:g}x of its baseline")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
