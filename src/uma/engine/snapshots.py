"""Host-memory snapshots of prefix-cache entries, taken in slices between ticks.

llama.cpp copies a sequence's KV out (`llama_state_seq_get_data`) one run of cells at a time per
layer, on the thread that decodes, and nothing else may use the context meanwhile. A request
that decoded beside others holds a cell every few, so the copy of one long entry takes many
ticks' time, on a CPU and on a GPU alike (a GPU waits for the device at every run of cells;
docs/design/prefix-cache.md has the figures): a freeze of every stream if it is taken in one
piece while they run. Its cost per token also varies 100x with how scattered the cells are, so
no price set in advance holds.

So an entry leaving the KV cache is copied in slices of positions, each small enough for the
time a tick leaves free: positions [start, end) are shared into a scratch sequence
(`seq_cp`, no copy with one KV buffer), the scratch sequence's state is copied out, and the
slice's cells are freed from the entry's own sequence. Each entry's slices start at
FIRST_SLICE tokens and at most double while the last one's measured time per token says the
next fits: a wrong guess costs one slice, never a stall. A restore reads the slices back in
order, each into the scratch sequence and shared on into the request's.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from uma.errors import UmaError

if TYPE_CHECKING:
    from uma import _core

# The first slice of an entry, in positions: about 10 ms at the dearest copy per token seen
# (scattered cells, a GPU under Vulkan waiting at every run of them: docs/design/prefix-cache.md).
FIRST_SLICE = 8


class Part(NamedTuple):
    """One slice of a snapshot: the state of positions [start, start + n) of its entry."""

    start: int
    data: bytes


@dataclasses.dataclass(eq=False)
class Leaving:
    """An entry on its way out of the KV cache: its cells still in `seq`, copied so far up to
    position `done`."""

    tokens: np.ndarray
    seq: int
    done: int = 0
    parts: list[Part] = dataclasses.field(default_factory=list)
    last_n: int = 0  # the last slice's positions (0: none taken yet)
    ms_per_token: float | None = None  # what the last slice of this entry took

    @property
    def complete(self) -> bool:
        return self.done >= len(self.tokens)


class Worked(NamedTuple):
    """What a call of Snapshots.work ended: entries copied whole, entries given up."""

    finished: list[Leaving]
    dropped: list[Leaving]


class Snapshots:
    """The entries leaving the KV cache of `ctx`, oldest first, and the copies in and out.
    `scratch`: a sequence kept empty for slicing and restoring (None: every snapshot is taken
    and restored whole). Used by the compute thread only."""

    def __init__(self, ctx: _core.Context, scratch: int | None) -> None:
        self.ctx = ctx
        self.scratch = scratch
        self.leaving: collections.deque[Leaving] = collections.deque()
        self.seconds = 0.0  # the time copies out took, in all
        self.tokens_copied = 0
        # the last slice's time per token, of any entry: an entry's first slice is cut to it
        # (how scattered the entry's cells are is not known until a slice of it is timed)
        self.ms_per_token: float | None = None

    def __len__(self) -> int:
        return len(self.leaving)

    def start(self, tokens: np.ndarray, seq: int) -> None:
        """Queues the entry whose cells `seq` holds at positions 0..len(tokens)-1 (slices need
        the scratch sequence)."""
        if self.scratch is None:
            raise UmaError("snapshots in slices need a scratch sequence")
        self.leaving.append(Leaving(np.array(tokens, np.int32), seq))

    def whole(self, tokens: np.ndarray, seq: int) -> tuple[Part, ...]:
        """The entry's state in one copy, now (for a caller that no one waits on)."""
        job = Leaving(np.array(tokens, np.int32), seq)
        self._copy(job, len(job.tokens))
        return tuple(job.parts)

    def work(self, budget_ms: float, worth: Callable[[Leaving], bool] = lambda job: True,
             at_least_one: bool = False) -> Worked:
        """Copies slices of the oldest entries for about budget_ms at most: each slice's size
        is predicted from the last one of its entry, an entry's first from the last of any
        (at most FIRST_SLICE positions either way, and growing by doubling), so a wrong
        prediction overruns by one slice. at_least_one: copy one position even where none is
        predicted to fit (a turn with nothing else to do: an entry whose every cell costs more
        than such a turn still leaves). After each slice an entry that is no longer `worth`
        its copy (its own slices timed) is given up. Returns the entries now complete and
        those given up, whose sequences the caller frees."""
        done = Worked([], [])
        if budget_ms <= 0:
            return done
        deadline = time.perf_counter() + budget_ms / 1e3
        least = int(at_least_one)
        while self.leaving:
            job = self.leaving[0]
            n = max(least, self._slice(job, (deadline - time.perf_counter()) * 1e3))
            if n <= 0:
                break
            self._copy(job, n)
            least = 0
            if job.complete:
                done.finished.append(self.leaving.popleft())
            elif not worth(job):
                done.dropped.append(self.leaving.popleft())
        return done

    def drop_oldest(self) -> Leaving | None:
        """Gives up the oldest leaving entry (its copies so far discarded); the caller frees
        its sequence."""
        return self.leaving.popleft() if self.leaving else None

    def _slice(self, job: Leaving, left_ms: float) -> int:
        """How many positions of `job` to copy next within left_ms (0: none fits)."""
        remaining = len(job.tokens) - job.done
        if left_ms <= 0:
            return 0
        cap = 2 * job.last_n if job.last_n else FIRST_SLICE
        rate = job.ms_per_token if job.ms_per_token is not None else self.ms_per_token
        if rate is not None and rate > 0 and left_ms != float("inf"):
            cap = min(cap, int(left_ms / rate))
        return max(0, min(cap, remaining))

    def _copy(self, job: Leaving, n: int) -> None:
        """Copies positions [job.done, job.done + n) out and frees their cells from job.seq."""
        start, end = job.done, job.done + n
        t0 = time.perf_counter()
        if start == 0 and end == len(job.tokens):
            data = self.ctx.seq_state(job.seq)
        else:
            scratch = self.scratch
            assert scratch is not None  # start() took only what it can slice
            self.ctx.seq_cp(job.seq, scratch, start, end)
            try:
                data = self.ctx.seq_state(scratch)
            finally:
                self.ctx.seq_rm(scratch)
            self.ctx.seq_rm(job.seq, start, end)  # cells no one else shares are free at once
        took = time.perf_counter() - t0
        self.seconds += took
        self.tokens_copied += n
        job.parts.append(Part(start, data))
        job.done, job.last_n = end, n
        job.ms_per_token = self.ms_per_token = 1e3 * took / n

    def restore(self, seq: int, parts: tuple[Part, ...], n: int) -> int:
        """Reads the slices holding positions 0..n-1 back into the empty sequence `seq`;
        returns the bytes read. UmaError (and `seq` left empty) where the KV cache has no
        room for them."""
        needed = [p for p in parts if p.start < n]
        read = 0
        try:
            for i, part in enumerate(needed):
                if i == 0:
                    self.ctx.set_seq_state(seq, part.data)
                else:
                    assert self.scratch is not None  # parts come from slices
                    self.ctx.set_seq_state(self.scratch, part.data)
                    self.ctx.seq_cp(self.scratch, seq, -1, -1)
                    self.ctx.seq_rm(self.scratch)
                read += len(part.data)
        except UmaError:
            self.ctx.seq_rm(seq)
            if self.scratch is not None:
                self.ctx.seq_rm(self.scratch)
            raise
        return read
