"""Timing the device before serving: scratch decodes of a few batch shapes, from which the
engine's cost model starts (uma.sched.cost.CostModel.calibrate).

It runs on the compute thread, like every tick; its decodes, like all of them, run on the
process's one decode thread (uma._core.decode_thread), so timing from anywhere leaves no second
OpenMP team behind (one had made every later decode on a CPU a quarter slower).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from uma.errors import UmaError
from uma.sched.cost import RAGGED_EDGES, ROW_EDGES, WIDE_ROWS, attended
from uma.sched.speculation import SETTLE_TICKS

# (prompt tokens, decode rows, cache positions read, KV positions the prompt attends, ms)
Timed = tuple[int, int, int, int, float]
# times each of the changes' two shapes runs after the other
CHANGE_REPEATS = 3


@dataclass(frozen=True, slots=True)
class Timing:
    """A calibration's result: the timed shapes; what a change between two decode shapes
    (one row, several) costs the SETTLE_TICKS ticks after it over the shape's settled ticks;
    and what one more decode row costs a settled tick (None: not timed: a slow device's short
    schedule, or a context of one sequence). The change's cost tells a device that captures
    its compute graph (CUDA) before the first request: learnt while serving, it took a fresh
    daemon's first requests, run the way a CPU runs them (docs/results/speculation.md)."""

    ticks: list[Timed] = field(default_factory=list)
    change_ms: float | None = None
    row_ms: float | None = None


log = logging.getLogger("uma.engine")


def machine_id() -> dict[str, object]:
    """The machine a timing was taken on: its name, CPU and cores."""
    import platform

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"node": platform.node(), "arch": platform.machine(), "cpu": cpu,
            "cores": os.cpu_count()}


def build_id(core: Any) -> list[object]:
    """The compiled core a timing was taken with (its file, as built)."""
    path = getattr(core, "__file__", None)
    if not path:
        return [repr(core)]
    stat = os.stat(path)
    return [path, stat.st_size, stat.st_mtime_ns]


class KeptTiming:
    """A device's timing kept across restarts, one file per everything it depends on (`key`:
    the model file, the context's shape, threads, backends, the build and the machine). The
    daemon keeps it: its timing took 8-9 s of `uma run`'s start on a 2-core CPU
    (docs/results/several-models.md), and the cost model goes on learning from every tick, so
    a kept timing need only be close. Delete the folder to time the device again."""

    def __init__(self, folder: str | os.PathLike[str], key: Mapping[str, object]) -> None:
        self.key = json.loads(json.dumps(key, sort_keys=True, default=str))
        digest = hashlib.sha256(json.dumps(self.key, sort_keys=True).encode()).hexdigest()
        self.path = Path(folder) / f"{digest[:24]}.json"

    def load(self) -> Timing | None:
        """The kept timing; None where there is none (or it is unreadable, for another key, or
        kept before a change's cost was timed)."""
        try:
            data = json.loads(self.path.read_text())
            if data["key"] != self.key:
                return None
            ticks = [(int(a), int(b), int(c), int(d), float(ms))
                     for a, b, c, d, ms in data["ticks"]]
            change_ms, row_ms = (None if data[k] is None else float(data[k])
                                 for k in ("change_ms", "row_ms"))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return Timing(ticks, change_ms, row_ms) if ticks else None

    def save(self, timing: Timing) -> None:
        """Keeps it (written whole, then renamed into place); a folder that cannot be written
        only costs the next start its timing."""
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"key": self.key, "ticks": timing.ticks,
                                       "change_ms": timing.change_ms,
                                       "row_ms": timing.row_ms}))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("the device's timing was not kept in %s: %s", self.path.parent, exc)
            tmp.unlink(missing_ok=True)


class DeviceTiming:
    """The scratch decodes of one calibration, on a context and a batch of the engine's.
    `progress` is (decodes done, planned), readable from any thread."""

    def __init__(self, ctx: Any, batch: Any) -> None:  # uma._core's, or a stand-in's
        self.ctx = ctx
        self.batch = batch
        self.progress = (0, 0)

    # A device this slow at one decode row gets the short calibration: a small CPU running a
    # 1B model is past it, and there the full schedule takes several times the short one's
    # time before the first request is served.
    SLOW_ROW_MS = 30.0

    def run(self, passes: int = 2) -> Timing:
        """Times scratch batches of a few shapes before serving and anchors the cost model
        there: decode rows; one-token, short and long prompt chunks; prompt chunks beside up to
        eight decoders that take the batch into each row class where ggml changes kernels; a
        decode row, one-token and short chunks and a chunk past WIDE_ROWS rows deep into a
        sequence (the CPU's flash attention scores those two ways). From the generic prior
        alone, a GPU never learns what a prompt token costs it (a fiftieth of that prior): when
        every tick of a storm carries one or two prompt tokens, the fit cannot tell them from
        the decoders, blames the decoders, inflates their budget and spends it on two prompt
        tokens a tick (a GPU's background prompt crawled while every interactive tick ran half
        again as long: docs/lab/2026-11-24-calibration.md). Attention needs the deep shapes for
        the same reason: a storm's few deep prompt ticks among its many decode ticks cannot pin
        what a prompt token's attention costs on their own, and the one-token chunks tell a row
        step from a chunk's read of the cache before it. The shapes beside decoders price each
        row step (uma.sched.cost.ROW_EDGES): on a GPU one prompt token beside a few decoders can
        cost more than their whole tick. Then what a change between decode shapes costs, and
        one more decode row (`_time_changes`). Returns the timed shapes; none if the context
        is too small to try or the engine is closing (the generic prior stays)."""
        n_rows = min(4, self.ctx.n_seq_max)
        chunk = max(1, min(64, self.batch.capacity, self.ctx.n_ctx_seq - 1))
        small = min(8, chunk)
        depth = max(0, min(4 * chunk, self.batch.capacity, self.ctx.n_ctx_seq - chunk - 1))
        shallow = [(0, 1), (0, n_rows), (1, 0), (small, 0), (chunk, 0)]
        deep = [(1, 0), (small, 0), (0, 1)]
        wide = WIDE_ROWS + 8
        if wide <= self.batch.capacity and depth + wide < self.ctx.n_ctx_seq:
            deep.append((wide, 0))
        largest = max(1, min(self.batch.capacity, self.ctx.n_ctx_seq - 1))
        mixed = self._mixed_shapes(largest)
        tokens = (np.arange(max(chunk, depth, *(p for p, _ in mixed + deep)), dtype=np.int32)
                  * 7919 + 1) % self.ctx.model.n_vocab
        runs = 3
        many = min(8, self.ctx.n_seq_max, self.batch.capacity)  # rows of the changes' shape

        def planned() -> int:  # the probe's 2, the changes, each shape's runs, deep prefill
            # The shapes beside decoders run once, twice in a row: they are the largest, and
            # each prices one step (on a CPU, run as often as the others, they alone took
            # seconds).
            changes = 2 * CHANGE_REPEATS * runs if many > 1 else 0
            return 2 + changes + passes * runs * (len(shallow) + len(deep)) \
                + 2 * len(mixed) + 1

        self.progress = (0, planned())
        ticks = []
        changes: tuple[float | None, float | None] = (None, None)
        try:
            # On a slow device (a large model on a laptop CPU) the full schedule kept the first
            # request waiting the better part of a minute: there, each shape runs twice in one
            # pass (no graph capture to wait out on a CPU), not so deep. The probe's first
            # decode pays one-off costs, its second does not.
            probe = [self._scratch(tokens[:0], 1, 0) for _ in range(2)]
            if probe[-1] > self.SLOW_ROW_MS:
                passes, runs, many = 1, 2, 1
                chunk = min(chunk, 32)
                depth = min(depth, 2 * chunk)
                shallow[-1] = (chunk, 0)
                deep = [shape for shape in deep if shape[0] <= WIDE_ROWS]
                mixed = self._mixed_shapes(min(largest, 32))
                self.progress = (2, planned())
            if many > 1:  # after the probe's one row: every shape follows another
                changes = self._time_changes(many, runs)
            ticks += self._time_shapes(tokens, shallow, passes, runs)
            ticks += self._time_shapes(tokens, mixed, 1, 2)
            if depth:  # sequence 0 holds `depth` positions while the deep shapes run
                self._scratch(tokens[:depth], 0, 0, keep=True)
                ticks += self._time_shapes(tokens, deep, passes, runs, depth)
        except UmaError:
            return Timing()  # a context too small to try, or the engine closing
        finally:
            self.ctx.seq_rm(0)
            self.progress = (self.progress[1], self.progress[1])
        return Timing(ticks, *changes)

    def _time_changes(self, many: int, runs: int) -> tuple[float | None, float | None]:
        """(what a change between decode shapes costs, what one more decode row costs): one
        row and `many` rows (a verify's shape, on sequences 0..many-1) each run `runs` times
        after the other, CHANGE_REPEATS times; a change is its first SETTLE_TICKS runs over
        its last. On CUDA the first tick of a new shape runs op by op and the second captures
        its graph. Medians of the repeats (the first pays for its shape's first run ever)."""
        changed, row = [], []
        for _ in range(CHANGE_REPEATS):
            settled = {}
            for rows in (many, 1):
                times = [self._scratch(np.zeros(0, np.int32), rows, 0) for _ in range(runs)]
                changed.append(max(sum(times[:SETTLE_TICKS]) - SETTLE_TICKS * times[-1], 0.0))
                settled[rows] = times[-1]
            row.append(max(settled[many] - settled[1], 0.0) / (many - 1))
        return statistics.median(changed), statistics.median(row)

    def _mixed_shapes(self, largest: int) -> list[tuple[int, int]]:
        """(prompt tokens, decode rows) of the shapes beside decoders: up to eight decode rows
        (on sequences 1.., the prompt on 0), with and without one prompt token, prompt chunks
        that take the batch 8 rows into each row class past eight (16, 24, 40, 72, 136 and 264
        rows: ragged past 16, uma.sched.cost.ragged_span) and to the top of each from 32 on
        (32, 64, 128 and 256 rows: powers of two), as far as `largest` prompt tokens and the
        batch allow. The pairs tell a row step from a ragged price: under Vulkan a 64-row
        tick can cost less than a 40-row one (docs/design/scheduling.md, "Ragged ticks")."""
        rows = max(0, min(8, self.ctx.n_seq_max - 1, self.batch.capacity - 1))
        shapes = [(0, rows), (1, rows)] if rows else []
        for edge in (e for e in ROW_EDGES if e >= 8):
            even = (edge,) if edge > RAGGED_EDGES[0] else ()
            for total in (edge + 8, *even):
                n = total - rows
                if 0 < n <= largest and total <= self.batch.capacity:
                    shapes.append((n, rows))
        return shapes

    def _time_shapes(self, tokens: np.ndarray, shapes: list[tuple[int, int]], passes: int,
                     runs: int, depth: int = 0) -> list[Timed]:
        """(prompt tokens, decode rows, cache positions read, prompt's attended, ms) of each shape,
        `passes` times, with sequence 0 `depth` positions deep."""
        ticks = []
        for _ in range(passes):
            for n_prompt, rows in shapes:
                # A shape's first runs pay for what a new shape costs once (allocation, a
                # GPU's graph capture); its last is what steady ticks of it take.
                for _ in range(runs):
                    ms = self._scratch(tokens[:n_prompt], rows, depth)
                read = (attended(depth, 1) + rows - 1 if rows else 0) + (depth if n_prompt else 0)
                ticks.append((n_prompt, rows, read, attended(depth, n_prompt), ms))
        return ticks

    def _scratch(self, prompt: np.ndarray, rows: int, depth: int, keep: bool = False) -> float:
        """One scratch decode: a prompt chunk on sequence 0 from position `depth`, and `rows`
        decode rows (without a prompt, sequence 0's at `depth` and the others' at 0; beside
        one, on sequences 1.. at 0); returns its milliseconds, the device's work included (a
        GPU's decode returns before it is done). What it adds to the cache is removed again
        unless `keep`."""
        batch = self.batch
        batch.clear()
        first = 1 if len(prompt) and rows else 0
        if len(prompt):
            batch.add_sequence(prompt, depth, 0, logits_last=True)
        for seq in range(first, first + rows):
            batch.add(1, depth if seq == 0 else 0, seq, True)
        t0 = time.perf_counter()
        try:
            self.ctx.decode(batch)
            self.ctx.synchronize()
            return (time.perf_counter() - t0) * 1e3
        finally:
            self.progress = (self.progress[0] + 1, self.progress[1])
            if not keep:
                for seq in range(first + max(rows, 1)):
                    self.ctx.seq_rm(seq, depth if seq == 0 else -1)
