"""The figures of the results pages (docs/results) that had none: one a page, drawn from the
result files the page cites or, where no file holds its figures, from the page's own table (the
stamp and the page's caption say which). Each is stamped with the machine, model, date, commit
and command of what it draws (plots.stamp) and written to benches/results/<page>_plot.png.

    python benches/results_plots.py [PAGE...]    # page stems, e.g. fair-share; none: every page
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import plots  # noqa: E402
from report import RESULTS  # noqa: E402

UMA, PEER, OTHER = "tab:blue", "tab:orange", "tab:gray"
# Where a result file records no machine, commit or command, the stamp takes them from the
# page's "Measured" line and says so.
FROM_PAGE = "(no info block in the file: these details from the page)"
CPU2 = "2-core x86_64 CPU, 2 threads"
H100 = "NVIDIA H100 80GB HBM3, 8 CPU threads"
H200 = "NVIDIA H200, 16 CPU cores, 8 threads"
SYNTH_134M = "134M f16, synthetic (uma-synth-134m)"
SYNTH_1B = "1B f16, synthetic, Llama-3.2-1B shape (uma-synth-1b)"


def result(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def grouped_bars(ax, labels: list[str], heights: dict[str, list], runs: dict | None = None,
                 ranges: dict | None = None, colours: dict | None = None) -> list[list[float]]:
    """One group of bars per label, one bar per side (a height of None: no bar). runs[side][i]:
    the group's repeated runs, drawn as dots on the bar so that their spread shows; ranges
    [side][i]: (low, high) drawn as an error bar, where a page gives a range but no runs.
    Returns each bar's x, by side, for annotations."""
    width = 0.8 / len(heights)
    xs_by_side = []
    for k, (side, values) in enumerate(heights.items()):
        xs = [i + (k - (len(heights) - 1) / 2) * width for i in range(len(labels))]
        xs_by_side.append(xs)
        shown = [(x, v) for x, v in zip(xs, values, strict=True) if v is not None]
        ax.bar(*zip(*shown, strict=True), width * 0.92, label=side,
               color=(colours or {}).get(side))
        for x, pts in zip(xs, (runs or {}).get(side, [[]] * len(xs)), strict=True):
            ax.plot([x] * len(pts), pts, "o", ms=3.5, mfc="white", mec="black", mew=0.8)
        for x, v, span in zip(xs, values, (ranges or {}).get(side, [None] * len(xs)),
                              strict=True):
            if span:
                ax.errorbar(x, v, yerr=[[v - span[0]], [span[1] - v]], color="black",
                            capsize=3, lw=0.9)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return xs_by_side


def label_ratios(ax, xs: list[float], tops: list[float], ratios: list[float]) -> None:
    """Writes "0.96x" over each group: the page's ratio, so the figure reads without the table."""
    for x, top, ratio in zip(xs, tops, ratios, strict=True):
        ax.annotate(f"{ratio:.2f}x", (x, top), textcoords="offset points", xytext=(0, 3),
                    ha="center", fontsize=7)


def name_models_under(ax, models: list[str]) -> None:
    """Under the ticks, each model's name once, centred on its run of groups, with a dotted line
    between models: the ticks themselves say the streams."""
    runs = [(m, [i for i, x in enumerate(models) if x == m]) for m in dict.fromkeys(models)]
    for k, (model, where) in enumerate(runs):
        ax.annotate(model, ((where[0] + where[-1]) / 2, 0), xycoords=("data", "axes fraction"),
                    xytext=(0, -24), textcoords="offset points", ha="center", fontsize=8)
        if k:
            ax.axvline(where[0] - 0.5, color="black", lw=0.6, ls=":")


def save(fig, page: str, sources: list[dict]) -> Path:
    plots.stamp(fig, sources)
    out = RESULTS / f"{page}_plot.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def constrained_decoding() -> Path:
    """A JSON schema's cost to 8 streams (tokens/s against plain, by schema and machine), and one
    mask's time in llguidance against llama.cpp's grammar sampler on the same tokens."""
    cases = {"CPU 134M,\nbounded schema": "constrained_cpu_134m_bounded.json",
             "CPU 134M,\nopen schema": "constrained_cpu_134m_open.json",
             "H100 1B,\nbounded schema": "constrained_h100_1b_bounded.json",
             "H100 1B,\nopen schema": "constrained_h100_1b_open.json"}
    sides = {"JSON schema": "json schema", "plain, host sampling": "plain, host sampling"}
    heights: dict[str, list] = {side: [] for side in sides}
    runs: dict[str, list] = {side: [] for side in sides}
    for name in cases.values():
        data = result(name)["runs"]
        plain = statistics.median(r["tokens_per_s"] for r in data["plain"])
        for side, key in sides.items():
            got = [r["tokens_per_s"] / plain for r in data.get(key, [])]
            heights[side].append(statistics.median(got) if got else None)
            runs[side].append(got)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.3), width_ratios=[3, 2])
    grouped_bars(left, list(cases), heights, runs,
                 colours={"JSON schema": UMA, "plain, host sampling": OTHER})
    left.axhline(1.0, color="black", lw=0.8)
    left.axhline(0.9, color="black", lw=0.8, ls="--", label="target 0.9")
    left.set_ylabel("decode tokens/s ÷ plain's median")
    left.set_title("8 streams: tokens/s against plain streams (device sampling on the H100)\n"
                   "bar: median of 3 runs; dots: each run", fontsize=9, loc="left")
    left.set_ylim(0, 1.2)
    left.legend(fontsize=7, loc="upper right", ncol=3)

    masks = {"CPU, 32k vocabulary": result("constrained_cpu_134m.json")["mask_engines"],
             "H100 host, 128k vocabulary":
                 result("constrained_h100_1b_sequential.json")["mask_engines"]}
    engines = {"llguidance (UMA Serve)": "llguidance",
               "llama.cpp grammar sampler": "llama.cpp grammar"}
    p50 = {side: [m[key]["p50_ms"] for m in masks.values()] for side, key in engines.items()}
    p95 = {side: [(m[key]["p50_ms"], m[key]["p95_ms"]) for m in masks.values()]
           for side, key in engines.items()}
    xs = grouped_bars(right, list(masks), p50, ranges=p95,
                      colours={"llguidance (UMA Serve)": UMA, "llama.cpp grammar sampler": PEER})
    for side_xs, values in zip(xs, p50.values(), strict=True):
        for x, v in zip(side_xs, values, strict=True):
            right.annotate(f"{v:.2g} ms", (x, v), textcoords="offset points", xytext=(0, -10),
                           ha="center", fontsize=7, color="white")
    right.set_yscale("log")
    right.set_ylim(bottom=1e-3)
    right.set_ylabel("ms a token, one mask (log)")
    right.set_title("the same JSON grammar and tokens: p50, bar to p95", fontsize=9, loc="left")
    right.legend(fontsize=7, loc="upper left")
    return save(fig, "constrained-decoding", [
        {"data": "benches/results/constrained_cpu_134m_{bounded,open}.json; masks "
                 "constrained_cpu_134m.json", "machine": CPU2, "model": SYNTH_134M,
         "date": "2026-11-25", "commit": "recorded in 12fa69c, 2572993, 02857dd",
         "command": "python benches/constrained.py --model 134m --threads 2 --repeat 3 "
                    "(--schema bounded / open)", "note": FROM_PAGE},
        {"data": "benches/results/constrained_h100_1b_{bounded,open}.json; masks "
                 "constrained_h100_1b_sequential.json", "machine": H100, "model": SYNTH_1B,
         "date": "2026-11-25", "commit": "recorded in 12fa69c, 2572993, 02857dd",
         "command": "PART=grammar bash benches/device/gpu_speed.sh (MODELS=1b)",
         "note": FROM_PAGE}])


def decode_throughput() -> Path:
    """The engine's decode tokens/s against llama-batched-bench's, by model and streams: the
    synthetic 134M and two real quantised models on the CPU, the real models on an H200."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.3), width_ratios=[2, 6, 9])
    sides = {"uma.Engine": UMA, "llama-batched-bench": PEER}
    # The 134M rows: the page's first table; no result file was kept for them.
    grouped_bars(axes[0], ["1", "8"], {"uma.Engine": [132.9, 519.2],
                                            "llama-batched-bench": [138.5, 516.6]},
                      colours=sides)
    label_ratios(axes[0], [0, 1], [138.5, 519.2], [132.9 / 138.5, 519.2 / 516.6])
    axes[0].set_title("CPU, 134M synthetic\n(the page's table)", fontsize=9, loc="left")
    panels = [(axes[1], "CPU, real models: best of 3 runs, dots: each run",
               {"SmolLM2": "decode_real_cpu_smollm2.json",
                "Gemma 3": "decode_real_cpu_gemma3-270m.json"}),
              (axes[2], "H200, real models: best of 3 runs, dots: each run",
               {"SmolLM2, session 1": "decode_real_h200_smollm2.json",
                "SmolLM2, session 2": "decode_real_h200_smollm2_2.json",
                "Gemma 3": "decode_real_h200_gemma3-270m.json"})]
    for ax, title, files in panels:
        rows = [(model, row) for model, name in files.items() for row in result(name)["rows"]]
        grouped_bars(ax, [str(row["streams"]) for _, row in rows],
                          {"uma.Engine": [r["uma_tg_tps"] for _, r in rows],
                           "llama-batched-bench": [r["peer_tg_tps"] for _, r in rows]},
                          {"uma.Engine": [r["uma_runs"] for _, r in rows],
                           "llama-batched-bench": [r["peer_runs"] for _, r in rows]},
                          colours=sides)
        label_ratios(ax, list(range(len(rows))),
                     [max(r["uma_tg_tps"], r["peer_tg_tps"], *r["uma_runs"], *r["peer_runs"])
                      for _, r in rows], [r["ratio"] for _, r in rows])
        ax.set_title(title, fontsize=9, loc="left")
        name_models_under(ax, [model for model, _ in rows])
    for ax in axes:
        ax.set_xlabel("streams", fontsize=8, labelpad=18 if ax is not axes[0] else 4)
        ax.margins(y=0.12)
    axes[0].set_ylabel("decode tokens/s (label: engine ÷ tool)")
    axes[2].legend(fontsize=7, loc="upper left")
    return save(fig, "decode-throughput", [
        {"data": "the page's first table (no result file)", "machine": CPU2,
         "model": SYNTH_134M, "date": "2026-11-22", "commit": "recorded in 6f99ee8",
         "command": "python benches/decode_throughput.py --model 134m --threads 2 "
                    "--streams 1,8 --pp 128 --tg 64"},
        {"data": "benches/results/decode_real_cpu_{smollm2,gemma3-270m}.json", "machine": CPU2,
         "model": "SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M", "date": "2026-11-27",
         "commit": "recorded in e83fe2e", "command": "python benches/decode_throughput.py "
         "--model smollm2 (gemma3-270m) --streams 1,4,8 --prompts-together --repeat 3",
         "note": FROM_PAGE},
        {"data": "benches/results/decode_real_h200_{smollm2,smollm2_2,gemma3-270m}.json",
         "machine": "NVIDIA H200, 8 CPU threads, device sampling",
         "model": "SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M", "date": "2026-11-27",
         "commit": "recorded in e83fe2e",
         "command": "PART=bench bash benches/device/real_models.sh", "note": FROM_PAGE}])


def fair_share() -> Path:
    """App B's first token while app A floods every sequence, with fair share, without it and
    on llama-server, beside B's first token when it asks alone (warm)."""
    sides = {"UMA Serve\n(fair share)": "uma", "UMA Serve\n--no-fair-share": "uma, fair share off",
             "llama-server": "llama-server"}
    kinds = {"B during A's flood": "question_ttft_ms", "B alone, warm": "question_alone_ttft_ms"}
    machines = {"2-core CPU, 134M f16": "app_flood_cpu_134m.json",
                "H100, 1B f16": "app_flood_h100_1b.json"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3), sharey=True)
    for ax, (machine, name) in zip(axes, machines.items(), strict=True):
        runs = result(name)["runs"]
        got = {kind: [[r[key] for r in runs[side]] for side in sides.values()]
               for kind, key in kinds.items()}
        heights = {kind: [statistics.median(x) for x in values] for kind, values in got.items()}
        xs = grouped_bars(ax, list(sides), heights, got,
                          colours={"B during A's flood": "tab:red", "B alone, warm": OTHER})
        for x, v in zip(xs[0], heights["B during A's flood"], strict=True):
            ax.annotate(f"{v:,.0f} ms", (x, v), textcoords="offset points", xytext=(0, 4),
                        ha="center", fontsize=7)
        ax.set_yscale("log")
        ax.margins(y=0.08)
        ax.set_title(f"{machine}: 12 requests of app A, then B's question\nmedian of 3 runs; "
                     "dots: each run", fontsize=9, loc="left")
    axes[0].set_ylabel("B's time to first token, ms (log)")
    axes[0].legend(fontsize=7, loc="upper left")
    return save(fig, "fair-share", [
        {"data": "benches/results/app_flood_cpu_134m.json", "machine": CPU2, "model": SYNTH_134M,
         "date": "2026-11-25", "commit": "code at 0069a4a, recorded in 3ba265d",
         "command": "python benches/app_flood.py --model 134m --threads 2 --repeat 3",
         "note": FROM_PAGE},
        {"data": "benches/results/app_flood_h100_1b.json", "machine": H100, "model": SYNTH_1B,
         "date": "2026-11-25", "commit": "code at 139a047, recorded in 3ba265d",
         "command": "PART=fair bash benches/device/gpu_speed.sh (MODELS=1b)", "note": FROM_PAGE}])


def run_ratios(row: dict) -> tuple[float, float, float]:
    """The engine's median tokens/s over the tool's, and the lowest and highest of the runs'
    ratios, run i of each side paired (the sides alternate, so run i ran beside run i)."""
    paired = [u / p for u, p in zip(row["uma_runs"], row["peer_runs"], strict=True)]
    ratio = statistics.median(row["uma_runs"]) / statistics.median(row["peer_runs"])
    return ratio, min(paired), max(paired)


def gpu_speed() -> Path:
    """In process: uma.Engine ÷ llama-batched-bench on the H100 after each change (1B) and for
    the 8B; served: HTTP/SSE tokens/s against llama-server's at 1, 8 and 32 streams."""
    changes = {"serial,\nhost sampling": "host_sampling",
               "serial,\ndevice sampling": "device_sampling", "overlapped\nticks": "overlap",
               "+ steady plan\nreused": "steady_plan",
               "+ one-pass\narg-max": "one_pass_argmax_auto",
               "same, host\nsampling only": "one_pass_argmax_host"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), width_ratios=[3, 2])
    eight_b = {r["streams"]: r for r in result("gpu_speed_h100_8b_decode.json")["rows"]}
    for k, (streams, colour) in enumerate(((1, "tab:blue"), (8, "tab:green"),
                                           (32, "tab:purple"))):
        points = [run_ratios(next(r for r in result(f"gpu_speed_h100_1b_decode_{f}.json")["rows"]
                                  if r["streams"] == streams)) for f in changes.values()]
        points.append(run_ratios(eight_b[streams]))
        xs = [i + (k - 1) * 0.12 for i in range(len(points))]
        mid = [p[0] for p in points]
        spread = [[m - p[1] for m, p in zip(mid, points, strict=True)],
                  [p[2] - m for m, p in zip(mid, points, strict=True)]]
        left.errorbar(xs[:-1], mid[:-1], [s[:-1] for s in spread], fmt="o-", color=colour,
                      capsize=2, ms=4, label=f"{streams} stream{'s' * (streams > 1)}")
        left.errorbar(xs[-1:], mid[-1:], [s[-1:] for s in spread], fmt="s", mfc="white",
                      color=colour, capsize=2, ms=5)
    left.axvline(len(changes) - 0.5, color="black", lw=0.6, ls=":")
    left.axhline(0.9, color="black", lw=0.8, ls="--", label="target 0.9")
    left.set_xticks(range(len(changes) + 1), [*changes, "8B, final\n(one session)"],
                    fontsize=7)
    left.set_ylabel("uma.Engine ÷ llama-batched-bench\n(median of runs; bar: paired runs)")
    left.set_title("In process, 1B: each column one session after one more change",
                   fontsize=9, loc="left")
    left.grid(axis="y", alpha=0.3)
    left.legend(fontsize=7, loc="lower right")

    served = result("gpu_speed_h100_1b_served_scaling_final.json")
    counts = sorted({r["streams"] for r in served["rows"]})
    tps = {side: [next(r["tokens_per_s"] for r in served["rows"]
                       if r["side"] == side and r["streams"] == n) for n in counts]
           for side in ("uma", "llama-server")}
    grouped_bars(right, [str(n) for n in counts],
                      {"uma run, HTTP/SSE": tps["uma"], "llama-server": tps["llama-server"]},
                      colours={"uma run, HTTP/SSE": UMA, "llama-server": PEER})
    label_ratios(right, list(range(len(counts))), [max(a, b) for a, b in zip(*tps.values(),
                                                                               strict=True)],
                 [a / b for a, b in zip(*tps.values(), strict=True)])
    right.set_xlabel("concurrent streams", fontsize=8)
    right.set_ylabel("tokens/s, one run a step (label: ratio)")
    right.set_title("Served, 1B, final code", fontsize=9, loc="left")
    right.legend(fontsize=7, loc="upper left")
    right.margins(y=0.1)
    return save(fig, "gpu-speed", [
        {"data": "benches/results/gpu_speed_h100_1b_decode_*.json (a file a column), "
                 "gpu_speed_h100_8b_decode.json", "machine": H100,
         "model": SYNTH_1B + "; 8B f16, Llama-3.1-8B shape (uma-synth-8b)",
         "date": "2026-11-25", "commit": "recorded in 786b26e, 1184ebf",
         "command": "PART=engine bash benches/device/gpu_speed.sh (8B: MODELS=8b PROFILE=0 "
                    "SAMPLING=on)", "note": FROM_PAGE},
        {"data": "benches/results/gpu_speed_h100_1b_served_scaling_final.json",
         **plots.provenance(served["info"])}])


def micro_benchmarks() -> Path:
    """Each hot path's median time over the reference workload's, on the two machines the page
    measured: the ratio the CI gate compares, which is not the same on every processor."""
    table = [  # (benchmark, 2-core CPU, AVX-512 VM): the page's table as it reads
        ("batch fill, 512 tokens", "1.6 µs", "2.1 µs"),
        ("sampling 32 rows, 32k vocabulary", "0.40 ms", "0.61 ms"),
        ("tokenizing 4 KB", "0.69 ms", "0.97 ms"),
        ("framing a token event", "2.8 µs", "3.2 µs"),
        ("SLO plan, 1 sequence", "17 µs", "75 µs"),
        ("SLO plan, 64 sequences", "94 µs", "237 µs"),
        ("SLO plan, 256 sequences", "293 µs", "564 µs"),
        ("baseline plan, 1 sequence", "3.7 µs", "8.4 µs"),
        ("baseline plan, 64 sequences", "42 µs", "61 µs"),
        ("baseline plan, 256 sequences", "157 µs", "226 µs"),
        ("8 streams × 64 tokens, tiny model", "86-118 ms", "118 ms"),
    ]
    reference = {"2-core CPU": "147 µs", "AVX-512 VM (2 vCPUs)": "180 µs"}

    def seconds(text: str) -> tuple[float, float, float]:
        """A time as the page writes it: (middle, low, high); a range ("86-118 ms") is the
        page's figure where it gives no median."""
        number, unit = text.split()
        low, _, high = number.partition("-")
        scale = {"µs": 1e-6, "ms": 1e-3}[unit]
        low_s, high_s = float(low) * scale, float(high or low) * scale
        return (low_s + high_s) / 2, low_s, high_s

    fig, ax = plt.subplots(figsize=(10, 5.2))
    height = 0.4
    for k, ((machine, ref), colour) in enumerate(zip(reference.items(), (UMA, "tab:green"),
                                                     strict=True)):
        ys = [i + (k - 0.5) * height for i in range(len(table))]
        yardstick = seconds(ref)[0]
        times = [seconds(row[1 + k]) for row in table]
        ax.barh(ys, [t[0] / yardstick for t in times], height * 0.92, color=colour,
                label=f"{machine}: reference workload {ref}")
        for y, (mid, low, high), row in zip(ys, times, table, strict=True):
            if high > low:
                ax.errorbar(mid / yardstick, y, xerr=[[(mid - low) / yardstick],
                                                      [(high - mid) / yardstick]],
                            color="black", capsize=2, lw=0.8)
            ax.annotate(row[1 + k], (high / yardstick, y), textcoords="offset points",
                        xytext=(3, 0), va="center", fontsize=6.5)
    ax.set_yticks(range(len(table)), [row[0] for row in table], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(right=ax.get_xlim()[1] * 4)  # room for the last labels
    ax.set_xlabel("median time ÷ the reference workload's median (log); label: the median")
    ax.set_title("Hot paths against the yardstick the CI gate divides by (a 2x rise over the "
                 "baseline fails CI)", fontsize=9, loc="left")
    ax.grid(axis="x", alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper right")
    return save(fig, "micro-benchmarks", [
        {"data": "the page's table (pytest-benchmark's JSON is not kept)",
         "machine": "a 2-core CPU; an AVX-512 VM (Xeon, 2 vCPUs)",
         "model": "the tiny synthetic model", "date": "2026-11-22; the VM 2026-11-26",
         "commit": "recorded in 5d6db3f (the VM's column at 7c5329c)",
         "command": "pytest benches --benchmark-only --benchmark-json=bench.json"}])


def overhead() -> Path:
    """One stream's first token and CPU per token over the socket and HTTP/SSE, against
    llama-server's, on the CPU (every run, from the result) and the H100 8B (the page's
    medians)."""
    def cpu_ms(run: dict) -> float:
        return 1e3 * (run["server_cpu_s"] + run["client_cpu_s"]) / run["tokens"]

    sides = {"UMA, Unix socket": "uma socket", "UMA, HTTP/SSE": "uma http/sse",
             "llama-server": "llama-server http/sse"}
    runs = result("overhead_cpu_134m.json")["runs"]
    cpu = {metric: {side: [get(r) for r in runs[key]] for side, key in sides.items()}
           for metric, get in (("ttft", lambda r: r["ttft_ms"]), ("cpu", cpu_ms))}
    h100 = {"ttft": dict(zip(sides, (22.87, 22.85, 20.81), strict=True)),
            "cpu": dict(zip(sides, (5.66, 5.73, 5.41), strict=True))}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    titles = {"ttft": "time to first token", "cpu": "CPU per token (server + client)"}
    for ax, metric in zip(axes, titles, strict=True):
        peer_cpu = statistics.median(cpu[metric]["llama-server"])
        peer_gpu = h100[metric]["llama-server"]
        heights = {side: [100 * (statistics.median(cpu[metric][side]) / peer_cpu - 1),
                          100 * (h100[metric][side] / peer_gpu - 1)] for side in sides}
        dots = {side: [[100 * (v / peer_cpu - 1) for v in cpu[metric][side]], []]
                for side in sides}
        grouped_bars(ax, ["2-core CPU, 134M f16\n(median of 5; dots: each run)",
                          "H100, 8B q8_0\n(the page's medians)"], heights, dots,
                     colours=dict(zip(sides, (UMA, "tab:cyan", PEER), strict=True)))
        ax.axhline(0, color="black", lw=0.8)
        ax.set_title(f"{titles[metric]}, % over llama-server's median", fontsize=9, loc="left")
    axes[0].set_ylabel("% over llama-server (lower is better)")
    axes[0].legend(fontsize=7, loc="upper left")
    return save(fig, "overhead", [
        {"data": "benches/results/overhead_cpu_134m.json", "machine": CPU2,
         "model": SYNTH_134M, "date": "2026-11-22", "commit": "recorded in 5d589c2",
         "command": "python benches/overhead.py", "note": FROM_PAGE},
        {"data": "the page's GPU table (overhead_h100_1b.json is a 1B run, not these)",
         "machine": H100, "model": "8B q8_0, synthetic", "date": "2026-11-22",
         "commit": "recorded in 5d589c2",
         "command": "SCENARIOS=overhead bash benches/device/gpu_pack.sh"}])


def prefix_reuse() -> Path:
    """A chat's time to first token turn by turn (its history growing), UMA Serve against
    llama-server, on the CPU and the H100."""
    machines = {"2-core CPU, 134M f16": "prefix_reuse_cpu_134m.json",
                "H100, 1B f16": "prefix_reuse_h100_1b.json"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (machine, name) in zip(axes, machines.items(), strict=True):
        data = result(name)
        for side, colour in (("uma", UMA), ("llama-server", PEER)):
            turns = range(1, len(data[side]["chat_ttft_ms_median"]) + 1)
            ax.plot(turns, data[side]["chat_ttft_ms_median"], "o-", color=colour,
                    label="UMA Serve" if side == "uma" else side)
            for run in data[side]["chat_ttft_ms"]:
                ax.plot(turns, run, ".", color=colour, alpha=0.45, ms=5)
        ax.set_xlabel("turn (200 new user tokens each; 2 conversations at once)", fontsize=8)
        ax.set_title(f"{machine}: line, median of 3 runs; dots, each run", fontsize=9,
                     loc="left")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("time to first token, ms")
    axes[0].legend(fontsize=7, loc="upper left")
    return save(fig, "prefix-reuse", [
        {"data": "benches/results/prefix_reuse_cpu_134m.json", "machine": CPU2,
         "model": SYNTH_134M, "date": "2026-11-25", "commit": "code at e1374ab",
         "command": "python benches/prefix_reuse.py --model 134m --threads 2 --repeat 3",
         "note": FROM_PAGE},
        {"data": "benches/results/prefix_reuse_h100_1b.json", "machine": H100,
         "model": SYNTH_1B, "date": "2026-11-25", "commit": "code at e1374ab",
         "command": "PART=prefix bash benches/device/gpu_speed.sh", "note": FROM_PAGE}])


def rpc_split() -> Path:
    """Decode tokens/s and first token, local and split over two loopback RPC workers, UMA
    Serve against llama-server (the page's table: median and range of 3 runs)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), width_ratios=[3, 2])
    labels = ["local (2 threads)", "2 RPC workers (loopback)"]
    colours = {"UMA Serve": UMA, "llama-server": PEER}
    tps = {"UMA Serve": [123.7, 103.7], "llama-server": [143.9, 106.0]}
    grouped_bars(left, labels, tps, ranges={"UMA Serve": [(122.7, 133.0), (99.4, 106.1)],
                                                 "llama-server": [(140.0, 148.9),
                                                                  (102.2, 110.6)]},
                      colours=colours)
    label_ratios(left, [0, 1], [148.9, 110.6], [123.7 / 143.9, 103.7 / 106.0])
    left.set_ylabel("decode tokens/s (label: UMA ÷ llama-server)")
    left.set_title("one stream, 128 tokens: median, bar: range of 3 runs", fontsize=9,
                   loc="left")
    left.legend(fontsize=7, loc="lower left")
    left.margins(y=0.1)
    grouped_bars(right, labels, {"UMA Serve": [33.4, 47.0], "llama-server": [27.0, 44.2]},
                 colours=colours)
    right.set_ylabel("time to first token, ms")
    right.set_title("first token: median of 3 runs", fontsize=9, loc="left")
    return save(fig, "rpc-split", [
        {"data": "the page's table (no result file)", "machine": CPU2, "model": SYNTH_134M,
         "date": "2026-11-25", "commit": "recorded in 6d2831e",
         "command": "python benches/rpc_split.py --model 134m --repeat 3"}])


def vulkan() -> Path:
    """On an H100 under Vulkan: the engine's decode against llama-batched-bench's (and one
    stream against llama-bench's), and llama-bench under Vulkan against CUDA."""
    rows = result("decode_h100_1b_vulkan_3.json")["rows"]
    llama_bench = [577.2, 574.5, 574.8]  # one stream, the same session: the page's text
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.3), width_ratios=[3, 1.5])
    grouped_bars(left, [str(r["streams"]) for r in rows],
                 {"uma.Engine": [r["uma_tg_tps"] for r in rows],
                  "llama-batched-bench": [r["peer_tg_tps"] for r in rows],
                  "llama-bench": [statistics.median(llama_bench), None, None]},
                 {"uma.Engine": [r["uma_runs"] for r in rows],
                  "llama-batched-bench": [r["peer_runs"] for r in rows],
                  "llama-bench": [llama_bench, [], []]},
                 colours={"uma.Engine": UMA, "llama-batched-bench": PEER,
                          "llama-bench": "tab:brown"})
    label_ratios(left, list(range(len(rows))),
                 [max(r["peer_runs"] + r["uma_runs"]) for r in rows], [r["ratio"] for r in rows])
    left.set_xlabel("streams", fontsize=8)
    left.set_ylabel("decode tokens/s")
    left.set_title("Vulkan, 1B f16: best of 3 runs; dots: each run\n"
                   "label: engine ÷ llama-batched-bench", fontsize=9, loc="left")
    left.legend(fontsize=7, loc="upper left")
    left.margins(y=0.1)
    # llama-bench alternating Vulkan and CUDA from the same tree, an earlier session (the page's
    # text; no result file).
    backends = {"Vulkan": [569.5, 560.8, 577.9], "CUDA": [711.8, 708.2, 714.3]}
    medians = {b: statistics.median(v) for b, v in backends.items()}
    grouped_bars(right, ["one stream, 256 tokens"], {b: [m] for b, m in medians.items()},
                 {b: [v] for b, v in backends.items()},
                 colours={"Vulkan": "tab:red", "CUDA": "tab:green"})
    label_ratios(right, [0], [max(backends["CUDA"])], [medians["Vulkan"] / medians["CUDA"]])
    right.set_ylabel("tokens/s")
    right.set_title("llama-bench, the same GPU: median; dots:\neach run; label: Vulkan ÷ CUDA",
                    fontsize=9, loc="left")
    right.legend(fontsize=7, loc="lower right")
    right.margins(y=0.1)
    return save(fig, "vulkan", [
        {"data": "benches/results/decode_h100_1b_vulkan_3.json; llama-bench from the page",
         "machine": H100 + " (NVIDIA's Vulkan driver)", "model": SYNTH_1B,
         "date": "2026-11-26", "commit": "code at 7ecc49c-8c4ff54, recorded in 62c9605",
         "command": 'PARTS="profile decode" PROFILE_STREAMS=1,8,32 PROFILE_ARGS="--sampling '
                    'host" bash benches/device/vulkan.sh', "note": FROM_PAGE},
        {"data": "Vulkan against CUDA: the page's text (no result file)", "machine": H100,
         "model": SYNTH_1B, "date": "2026-11-25", "commit": "recorded in 8441b50",
         "command": 'PARTS="decode cuda" bash benches/device/vulkan.sh'}])


def several_models() -> Path:
    """A stream's worst gap while another model loads (× its p95 alone), and three streams' p95
    beside another model's background batch (× alone), before and after, each run a dot."""
    real = "A SmolLM2-135M-Instruct Q4_1, B Gemma 3 270M Q4_K_M"
    load = {side: [result(f"model_load_pause_cpu_smollm2_gemma_{side}_{i}.json")["runs"][0]
                   ["ratio"] for i in (1, 2, 3)] for side in ("before", "after")}
    batch = {side: [result(f"two_models_cpu_smollm2_gemma_{side}_{i}.json")["runs"][0]["ratio"]
                    for i in (1, 2, 3)] for side in ("before", "after")}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, got, target, title in (
            (axes[0], load, 2.0, "A's worst gap while B loads, × A's p95 alone"),
            (axes[1], batch, 1.2, "A's p95 beside B's background batch, × alone")):
        heights = {"": [statistics.median(got[side]) for side in ("before", "after")]}
        xs = grouped_bars(ax, ["before", "after"], heights, {"": [got["before"], got["after"]]},
                          colours={"": UMA})
        label_ratios(ax, xs[0], [max(v) for v in (got["before"], got["after"])],
                     heights[""])
        ax.axhline(target, color="tab:red", ls="--", lw=1, label=f"target {target:g}x")
        ax.axhline(1.0, color="black", lw=0.6)
        ax.set_ylim(0, max(got["before"]) * 1.15)
        ax.set_title(f"{title}\nmedian of 3 runs; dots: each run", fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="upper right")
    return save(fig, "several-models", [
        {"data": "benches/results/model_load_pause_cpu_smollm2_gemma_*.json", "machine": CPU2,
         "model": real, "date": "2026-11-28", "commit": "before 664ecd6, after 3db35b9",
         "command": "python benches/model_load_pause.py --model-a smollm2 --model-b "
                    "gemma3-270m --runs 1", "note": FROM_PAGE},
        {"data": "benches/results/two_models_cpu_smollm2_gemma_*.json", "machine": CPU2,
         "model": real, "date": "2026-11-28", "commit": "before 57c6680, after 664ecd6",
         "command": "python benches/two_models.py --runs 1 --seconds 30"}])


def served_pace() -> Path:
    """Served tokens/s over HTTP and the socket, × the engine in process, at 1, 8 and 32
    streams: before, after, and after with the daemon's switch interval; each run a dot."""
    files = {"before": ("before_1", "before_2"), "after": ("after_1",),
             "after + switch interval": ("switch_1", "switch_2")}
    streams = [1, 8, 32]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, path in zip(axes, ("uma-http", "uma-socket"), strict=True):
        runs: dict[str, list[list[float]]] = {}
        for side, names in files.items():
            rows = [result(f"served_pace_h200_1b_{n}.json")["rows"] for n in names]
            runs[side] = [[r for rs in rows for row in rs if row["streams"] == n
                           for r in row[path]["over_engine"]] for n in streams]
        heights = {side: [statistics.median(v) for v in got] for side, got in runs.items()}
        grouped_bars(ax, [f"{n} stream{'s' if n > 1 else ''}" for n in streams], heights, runs,
                     colours={"before": OTHER, "after": UMA,
                              "after + switch interval": "tab:green"})
        ax.axhline(0.9, color="tab:red", ls="--", lw=1, label="target 0.9x")
        ax.axhline(1.0, color="black", lw=0.6)
        ax.set_ylim(0.6, 1.2)
        ax.set_title(f"{'HTTP (httpx, 4 processes)' if path == 'uma-http' else 'Unix socket'}"
                     f": served tokens/s × uma.Engine's\nmedian; dots: each run", fontsize=9,
                     loc="left")
        ax.legend(fontsize=7, loc="lower left")
    return save(fig, "served-pace", [
        {"data": "benches/results/served_pace_h200_1b_*.json", "machine": H200,
         "model": SYNTH_1B, "date": "2026-11-28", "commit": "before 32669ff, after f65f9f6",
         "command": "python benches/served_pace.py --model 1b --backend cuda --gpu-layers 99 "
                    "--threads 8 --streams 1,8,32 --repeat 3 --tg 512"}])


def speculation() -> Path:
    """One stream's decode tokens/s with guesses over without, by task, UMA Serve's n-gram
    lookup against each of llama-server's model-free drafters (CPU, SmolLM2, real text); and
    what speculation costs where it does not pay (N streams, ngram over off, H200 and CPU)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.4),
                                      gridspec_kw={"width_ratios": [3, 3]})
    cpu = result("speculation_cpu_smollm2.json")
    tasks = list(cpu["summary"]["uma"])
    sides = {"uma ngram": UMA, "llama-server ngram-simple": "tab:olive",
             "llama-server ngram-map-k": PEER, "llama-server ngram-mod": "tab:red"}
    heights = {side: [cpu["summary"][side][t]["x_plain"] for t in tasks] for side in sides}
    runs = {}
    for side in sides:
        base = "uma" if side.startswith("uma") else "llama-server"
        runs[side] = [[row["tok_s"] / statistics.median(r["tok_s"] for r in
                                                         cpu["runs"][base][t])
                       for row in cpu["runs"][side][t]] for t in tasks]
    grouped_bars(left, tasks, heights, runs, colours=sides)
    left.axhline(1.0, color="black", lw=0.6)
    left.set_title("one stream, SmolLM2, 2-core CPU: decode tokens/s with guesses ÷ its "
                   "server without\nmedian; dots: each run", fontsize=9, loc="left")
    left.legend(fontsize=7, loc="upper left")
    loads = {"H200, 1B": result("speculation_load_h200_1b.json"),
             "H200, tiny": result("speculation_load_h200_tiny.json"),
             "CPU, SmolLM2": result("speculation_load_cpu_smollm2.json")}
    labels, ratio_runs = [], []
    for name, got in loads.items():
        for n in sorted({r["streams"] for r in got["rows"]}):
            off = statistics.median(r["tps"] for r in got["rows"]
                                    if r["streams"] == n and r["side"] == "off")
            labels.append(f"{name}\n{n} stream{'s' if n > 1 else ''}")
            ratio_runs.append([r["tps"] / off for r in got["rows"]
                               if r["streams"] == n and r["side"] == "ngram"])
    grouped_bars(right, labels, {"ngram ÷ off": [statistics.median(r) for r in ratio_runs]},
                 {"ngram ÷ off": ratio_runs}, colours={"ngram ÷ off": UMA})
    right.axhline(0.97, color="tab:red", ls="--", lw=1, label="at most 3 % slower")
    right.axhline(1.0, color="black", lw=0.6)
    right.set_ylim(0.0, 2.6)
    right.tick_params(axis="x", labelsize=6)
    right.set_title("N streams of short prompts: tokens/s,\n--speculation ngram ÷ off",
                    fontsize=9, loc="left")
    right.legend(fontsize=7, loc="upper left")
    return save(fig, "speculation", [
        {"data": "benches/results/speculation_cpu_smollm2.json", **plots.provenance(cpu["info"])},
        {"data": "benches/results/speculation_load_*.json",
         "machine": f"{H200}; the 2-core CPU",
         "model": f"{SYNTH_1B}; tiny synthetic (uma-synth-tiny); SmolLM2",
         "date": loads["H200, 1B"]["info"]["when"][:10],
         "command": "python benches/speculation.py --load ..."}])


PAGES = {"constrained-decoding": constrained_decoding, "decode-throughput": decode_throughput,
         "fair-share": fair_share, "gpu-speed": gpu_speed, "micro-benchmarks": micro_benchmarks,
         "overhead": overhead, "prefix-reuse": prefix_reuse, "rpc-split": rpc_split,
         "several-models": several_models, "served-pace": served_pace,
         "speculation": speculation, "vulkan": vulkan}

if __name__ == "__main__":
    unknown = [p for p in sys.argv[1:] if p not in PAGES]
    if unknown:
        sys.exit(f"no figure for {', '.join(unknown)}; pages: {', '.join(PAGES)}")
    for page in sys.argv[1:] or PAGES:
        print(PAGES[page]())
