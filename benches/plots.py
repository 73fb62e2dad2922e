"""PNG plots from the JSON the scenarios write (matplotlib, headless). Each function takes the
JSON path and writes PNGs beside it, so a plot can be redrawn from a result without re-running
it: python benches/plots.py benches/results/NAME.json"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import report  # noqa: E402

COLOURS = {"interactive": "tab:blue", "background": "tab:red"}


def provenance(info: dict) -> dict:
    """A result's info block (report.run_info) as the fields `stamp` writes."""
    machine = info.get("gpu") or f"{info.get('cpu', '?')}, {info.get('cpus', '?')} CPUs"
    return {"machine": f"{machine}, {info['threads']} threads" if "threads" in info else machine,
            "model": info.get("model", "?"), "date": str(info.get("when", "?"))[:10],
            "commit": info.get("commit", "?"), "command": info.get("command", "?")}


def stamp(fig, sources: list[dict]) -> None:
    """Writes along the foot of the figure one line per result it draws (data, machine, model,
    date, commit, command), so that the PNG on its own says where its figures came from. It
    lays the axes out above the lines (tight_layout): call it last, before saving."""
    fields = ("data", "machine", "model", "date", "commit", "command")
    width = int(fig.get_figwidth() * 72 / 4.0)  # characters a line holds at 6.5 pt
    lines: list[str] = []
    for src in sources:
        parts = [f"{k} {src[k]}" for k in fields if k in src] + [src.get("note", "")]
        lines += textwrap.wrap(" · ".join(p for p in parts if p), width,
                               subsequent_indent="    ")
    height = (0.12 * len(lines) + 0.08) / fig.get_figheight()  # 0.12 inch a line
    fig.tight_layout(rect=(0, height, 1, 1))
    fig.text(0.005, 0.005, "\n".join(lines), fontsize=6.5, va="bottom", ha="left",
             color="0.3")


def _finish(fig, path: Path, data: dict) -> None:
    """Lays the figure out, stamped with the result's provenance where it records one."""
    if "info" in data:
        stamp(fig, [{"data": Path(path).name, **provenance(data["info"])}])
    else:
        fig.tight_layout()


def timelines(path: Path, keys: list[str], data: dict | None = None) -> Path:
    """Per-stream token timelines, one panel per side: time on x, stream on y, one dot per
    token. A freeze shows as a gap in every interactive row at once. `data`: the result
    already in hand (else read from path)."""
    data = data or report.load(path)
    # Each panel keeps its own time axis: a server that finishes the storm in 4 s and one that
    # takes 80 s would otherwise hide each other's detail.
    fig, axes = plt.subplots(len(keys), 1, figsize=(11, 1.2 + 1.4 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        streams = data["timelines"][key]
        labels = sorted({s["label"] for s in streams}, key=lambda x: (x.startswith("bg"), x))
        for s in streams:
            y = labels.index(s["label"])
            ax.plot(s["times"], [y] * len(s["times"]), "|", ms=7,
                    color=COLOURS.get(s["class"], "k"))
            if s["class"] == "background" and s["times"]:  # the prompt being computed
                ax.axvspan(s["sent"], s["times"][0], color="tab:red", alpha=0.08)
        ax.set_yticks(range(len(labels)), labels)
        ax.set_ylim(-0.7, len(labels) - 0.3)
        ax.set_title(key.replace(" | ", ": "), fontsize=10, loc="left")
        ax.set_xlabel("seconds since the phase began (one mark per token; shaded: the "
                      "background prompt being computed)", fontsize=8)
    _finish(fig, path, data)
    out = Path(path).with_name(Path(path).stem + "_timeline.png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def lines(path: Path, x: str, ys: list[tuple[str, str]], by: str, suffix: str,
          xlabel: str, log_x: bool = False) -> Path:
    """One panel per (y key, y label), one line per value of `by` across the rows."""
    data = report.load(path)
    rows = data["rows"]
    fig, axes = plt.subplots(1, len(ys), figsize=(5.2 * len(ys), 3.8), squeeze=False)
    for ax, (key, label) in zip(axes[0], ys, strict=True):
        for side in dict.fromkeys(r[by] for r in rows):
            pts = sorted((r[x], r[key]) for r in rows if r[by] == side and key in r)
            if pts:
                ax.plot(*zip(*pts, strict=True), "o-", label=side)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        if log_x:
            ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _finish(fig, path, data)
    out = Path(path).with_name(Path(path).stem + f"_{suffix}.png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def scenario(path: Path, phase: str, data: dict | None = None) -> Path | None:
    """One figure for one loaded phase of the matrix, a column per side: on top, every
    interactive inter-token gap at the time it ended (log scale: a 20 ms gap and a 2 s freeze
    on one axis); under it, the background requests, a bar from when each was sent to its
    first token (its prompt being computed) and a mark per token it decoded. Each side keeps
    its own time axis. `data`: the result already in hand (else read from path)."""
    data = data or report.load(path)
    keys = [k for k in data["timelines"] if k.split(" | ", 1)[1] == phase]
    if not keys:
        return None
    fig, axes = plt.subplots(2, len(keys), figsize=(6 * len(keys), 5.2), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1.4]})
    for col, key in enumerate(keys):
        streams = data["timelines"][key]
        top, bottom = axes[0, col], axes[1, col]
        for s in streams:
            t = s["times"]
            if s["class"] == "interactive" and len(t) > 1:
                top.plot(t[1:], [1e3 * (b - a) for a, b in zip(t, t[1:], strict=False)], ".",
                         ms=2, color=COLOURS["interactive"], alpha=0.6)
        top.set_yscale("log")
        top.set_ylabel("interactive gap, ms")
        top.set_title(key.split(" | ")[0], fontsize=10, loc="left")
        top.grid(alpha=0.3, which="both")
        back = [s for s in streams if s["class"] == "background"]
        for y, s in enumerate(back):
            end = s["times"][0] if s["times"] else s["sent"]
            bottom.barh(y, end - s["sent"], left=s["sent"], height=0.5, color="tab:red",
                        alpha=0.25)
            bottom.plot(s["times"], [y] * len(s["times"]), "|", ms=6, color="tab:red")
        bottom.set_yticks(range(len(back)), [s["label"] for s in back])
        bottom.set_xlabel("seconds since the phase began (bar: prompt computed; marks: "
                          "tokens)", fontsize=8)
        bottom.sharex(top)
    fig.suptitle(phase, fontsize=11)
    _finish(fig, path, data)
    out = Path(path).with_name(Path(path).stem + "_" + phase.replace(" + ", "_").replace(
        " ", "_") + ".png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


if __name__ == "__main__":
    result = Path(sys.argv[1])
    whole = report.load(result)  # one read: the timelines are decompressed once
    phases = {k.split(" | ", 1)[1] for k in whole.get("timelines", {})}
    for name in sorted(phases):
        if name.endswith(("storm", "+ background", "+ decoders")):
            print(scenario(result, name, whole))
