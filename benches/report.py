"""Where every scenario's results go: benches/results/<name>.json (the run, its rows and
verdicts), <name>.timelines.json.xz (every token's time, where a scenario records them),
<name>.csv (the table, one row per side and phase) and, from benches/plots.py, <name>*.png.
Each file records the machine, model, commit and exact command line. `load` reads a result
back whole."""

from __future__ import annotations

import csv
import json
import lzma
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benches" / "results"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_info(model: Path, **settings) -> dict:
    """What a reader needs to reproduce a result."""
    return {
        "command": "python " + " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "commit": _commit(), "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu": _cpu_name(), "cpus": os.cpu_count(), "gpu": _gpu_name(),
        "model": model.name, "model_bytes": model.stat().st_size,
        "loadavg_before": os.getloadavg(), **settings,
    }


def write(name: str, info: dict, rows: list[dict], extra: dict | None = None,
          timelines: dict | None = None, out_dir: Path = RESULTS) -> Path:
    """Writes <name>.json (info, rows, extra), <name>.csv (rows) and, given timelines,
    <name>.timelines.json.xz; returns the JSON path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    doc = {"info": {**info, "loadavg_after": os.getloadavg()}, "rows": rows, **(extra or {})}
    if timelines is not None:
        # Every token's time is three quarters of a mixed-load result (a 3,000-token CPU storm:
        # 2.6 MB of 3.4) and compresses ~8x; the results travel with the tree to the GPU
        # machine, whose copy is bounded.
        raw = out_dir / f"{name}.timelines.json.xz"
        with lzma.open(raw, "wt") as f:
            json.dump(timelines, f, separators=(",", ":"))
        doc["timelines_file"] = raw.name
    # Compact: raw samples one per line made a 3,000-token mixed-load result 4.3 MB (the CSV
    # is the readable table).
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with open(out_dir / f"{name}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v)
                             for k, v in row.items()})
    return path


def load(path: Path | str) -> dict:
    """A result as `write` left it, with its timelines (if it has any) read back in."""
    path = Path(path)
    data = json.loads(path.read_text())
    if "timelines_file" in data:
        with lzma.open(path.with_name(data["timelines_file"]), "rt") as f:
            data["timelines"] = json.load(f)
    return data


def publish(name: str, info: dict, rows: list[dict], columns: list[tuple[str, str, str]],
            extra: dict | None = None) -> Path:
    """Prints the whole table and writes the result files; returns the JSON path."""
    print(table(rows, columns))
    return write(name, info, rows, extra)


def add_ratios(rows: list[dict], match: tuple[str, ...], value: str = "tokens_per_s",
               ours: str = "uma", peer: str = "llama-server",
               out: str = "vs_llama_server") -> None:
    """Sets rows[out] = our value / the peer's, on each of our rows, against the peer's row
    with the same `match` fields (where both have the value)."""
    for r in rows:
        if r.get("side") != ours or value not in r:
            continue
        p = next((p for p in rows if p.get("side") == peer
                  and all(p.get(k) == r.get(k) for k in match)), None)
        if p is not None and value in p:
            r[out] = r[value] / p[value]


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """A fixed-width text table; columns are (key, header, format)."""
    widths = [max(len(h), 10) for _, h, _ in columns]
    lines = ["  ".join(h.rjust(w) if i else h.ljust(w + 14)
                       for i, ((_, h, _), w) in enumerate(zip(columns, widths, strict=True)))]
    for row in rows:
        cells = []
        for i, ((key, _, fmt), w) in enumerate(zip(columns, widths, strict=True)):
            value = row.get(key, "")
            text = format(value, fmt) if isinstance(value, (int, float)) else str(value)
            cells.append(text.rjust(w) if i else text.ljust(w + 14))
        lines.append("  ".join(cells))
    return "\n".join(lines)
