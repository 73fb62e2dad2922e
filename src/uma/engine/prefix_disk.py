"""The prefix cache's disk tier: snapshots that outlive the daemon.

Snapshots (uma.engine.snapshots) are written to files under the user's cache directory when
they leave host memory having been reused, and, as the engine closes, those host memory holds
and the live entries still in the KV cache; a daemon that starts again reads the newest back
into host memory, so a chat's next turn or an app's shared system prompt is restored instead
of prefilled after a restart, as it was before it.

The bytes are llama.cpp's sequence state (`llama_state_seq_get_data`), whose layout depends on
the model, the KV cache's types and the llama.cpp build: files live in a folder named by a key
of all three, and each file repeats the key and a checksum of what it holds. A file that is
foreign (another key), truncated or corrupt is skipped with a warning and never loaded. The
folder is kept within its byte budget, oldest files first. Files are written on a thread of
their own, so no tick waits on the disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

from uma.config import cache_root
from uma.engine.snapshots import Part

log = logging.getLogger("uma.engine")

MAGIC = b"UMAKV\x00\x01\x00"  # a snapshot file, format 1
SUFFIX = ".kv"


class Saved(NamedTuple):
    """A snapshot read back from disk."""

    tokens: np.ndarray
    parts: tuple[Part, ...]
    path: Path


def state_key(*, model: str, type_k: str, type_v: str, flash_attn: str, llama_commit: str
              ) -> str:
    """What a snapshot's bytes depend on, as a short hex key: the model file (path, size and
    modification time), the KV cache's types and layout, and the llama.cpp build."""
    st = os.stat(model)
    ident = json.dumps({"model": os.path.realpath(model), "size": st.st_size,
                        "mtime_ns": st.st_mtime_ns, "type_k": type_k, "type_v": type_v,
                        "flash_attn": flash_attn, "llama": llama_commit}, sort_keys=True)
    return hashlib.sha256(ident.encode()).hexdigest()[:24]


def default_dir() -> Path:
    """$UMA_CACHE_DIR/prefix, else $XDG_CACHE_HOME/uma-serve/prefix or
    ~/.cache/uma-serve/prefix (beside the models, uma.synth.models_cache_dir)."""
    return cache_root() / "prefix"


class DiskTier:
    """Snapshot files in `root`/`key`, at most `budget` bytes in all."""

    def __init__(self, root: Path, key: str, budget: int) -> None:
        self.dir = Path(root) / key
        self.key = key
        self.budget = budget
        self.dir.mkdir(parents=True, exist_ok=True)
        self.written = 0  # snapshot files written, in all
        self.skipped = 0  # files found unreadable, foreign or corrupt
        self.loaded = 0  # snapshots read back
        self.bytes = sum(_size(p) or 0 for p in self._files(newest_first=False))
        self._queue: queue.Queue[tuple[np.ndarray, tuple[Part, ...]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._writer, name="uma-prefix-disk",
                                        daemon=True)
        self._thread.start()

    def path_of(self, tokens: np.ndarray) -> Path:
        """One file per token sequence: the same prompt saved twice is one file."""
        digest = hashlib.sha256(np.ascontiguousarray(tokens, np.int32).tobytes())
        return self.dir / f"{digest.hexdigest()[:32]}{SUFFIX}"

    def write(self, tokens: np.ndarray, parts: tuple[Part, ...]) -> None:
        """Queues a snapshot for its file (written by the tier's thread)."""
        self._queue.put((np.array(tokens, np.int32), parts))

    def flush(self) -> None:
        """Waits until every queued snapshot is on disk."""
        self._queue.join()

    def close(self) -> None:
        """Writes what is queued, then stops the writer. Idempotent."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def read(self, limit: int) -> Iterator[Saved]:
        """The snapshots on disk, newest first, while their bytes stay within `limit`;
        unreadable, foreign and corrupt files are skipped with a warning."""
        total = 0
        for path in self._files(newest_first=True):
            size = _size(path)
            if size is None or total + size > limit:
                continue
            saved = self._load(path)
            if saved is not None:
                total += size
                self.loaded += 1
                yield saved

    # the writer thread -----------------------------------------------------------------

    def _writer(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._write(*job)
            except OSError as exc:  # a full disk, a folder removed: the cache goes on in RAM
                log.warning("prefix cache: could not write a snapshot to %s: %s", self.dir, exc)
            finally:
                self._queue.task_done()

    def _write(self, tokens: np.ndarray, parts: tuple[Part, ...]) -> None:
        path = self.path_of(tokens)
        if path.exists():  # the same prompt's state, written before: only its age changes
            os.utime(path)
            return
        body = [tokens.astype("<i4").tobytes(), *(p.data for p in parts)]
        digest = hashlib.sha256()
        for chunk in body:
            digest.update(chunk)
        header = json.dumps({"key": self.key, "n_tokens": len(tokens),
                             "parts": [[p.start, len(p.data)] for p in parts],
                             "sha256": digest.hexdigest()}).encode()
        size = len(MAGIC) + 4 + len(header) + sum(len(c) for c in body)
        if size > self.budget:
            return
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<I", len(header)) + header)
            for chunk in body:
                f.write(chunk)
        os.replace(tmp, path)  # whole or not at all: a crash leaves no half file
        self.written += 1
        self._trim(keep=path)

    def _trim(self, keep: Path) -> None:
        """Removes the oldest files until the folder is within its budget."""
        files = self._files(newest_first=False)
        total = sum(_size(p) or 0 for p in files)
        for path in files:
            if total <= self.budget:
                break
            if path == keep:
                continue
            total -= _size(path) or 0
            with contextlib.suppress(OSError):
                path.unlink()
        self.bytes = total

    # reading ---------------------------------------------------------------------------

    def _files(self, *, newest_first: bool) -> list[Path]:
        stamped = []
        for path in self.dir.glob(f"*{SUFFIX}"):
            with contextlib.suppress(OSError):
                stamped.append((path.stat().st_mtime_ns, path))
        stamped.sort(reverse=newest_first)
        return [p for _, p in stamped]

    def _load(self, path: Path) -> Saved | None:
        try:
            return self._parse(path, path.read_bytes())
        except (OSError, ValueError) as exc:
            self.skipped += 1
            log.warning("prefix cache: skipped %s: %s", path, exc)
            return None

    def _parse(self, path: Path, data: bytes) -> Saved:
        if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
            raise ValueError("not a UMA Serve snapshot file")
        off = len(MAGIC)
        (n,) = struct.unpack_from("<I", data, off)
        off += 4
        try:
            header = json.loads(data[off:off + n])
            key, n_tokens = header["key"], int(header["n_tokens"])
            spans = [(int(a), int(b)) for a, b in header["parts"]]
            digest = str(header["sha256"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"unreadable header ({exc})") from None
        if key != self.key:
            raise ValueError("saved by another model, KV type or llama.cpp build")
        off += n
        body = memoryview(data)[off:]
        if len(body) != 4 * n_tokens + sum(b for _, b in spans) or n_tokens <= 0 \
                or any(b < 0 for _, b in spans):
            raise ValueError("truncated, or not as long as its header says")
        if hashlib.sha256(body).hexdigest() != digest:
            raise ValueError("its contents do not match their checksum")
        tokens = np.frombuffer(body[:4 * n_tokens], "<i4").astype(np.int32)
        parts, at = [], 4 * n_tokens
        for start, nbytes in spans:
            parts.append(Part(start, bytes(body[at:at + nbytes])))
            at += nbytes
        return Saved(tokens, tuple(parts), path)


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None
