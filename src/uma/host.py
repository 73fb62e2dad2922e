"""The models one daemon serves: an engine per loaded model, by name, loaded on demand and
unloaded when idle past its keep-alive or pushed out (least recently used first) when a new
load would pass the cap on loaded models or their memory. A model with requests queued or
running is never unloaded under them: a load that finds no idle model to push out is
refused, naming the models that hold the room.

Loads run one at a time on the caller's thread (the HTTP gateway's worker threads, a socket
request's loader), never on an engine's compute thread: other models' streams keep decoding
while the weights are read. Callers of the same model wait for the one load.

What a model costs in memory is what its engine reports once loaded (weights and KV cache);
before it loads, its file's size stands in for it.

One host serves both doors of a daemon (the Unix socket and the HTTP gateway): `uma ps` and
`/api/ps` show the same models, and a model loaded for one is there for the other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from types import EllipsisType
from typing import Protocol

from uma import catalog, heap
from uma.errors import ModelBusyError, ModelLoadError, ModelNotFoundError, ModelsFullError
from uma.model_dir import ModelFile

log = logging.getLogger("uma.host")

# A model loaded on demand stays this long after its last request (Ollama's default).
KEEP_ALIVE_S = 300.0

# A load's progress, 0..1; returning False cancels it (uma.Engine.from_config's `progress`).
Progress = Callable[[float], bool]


class Served(Protocol):
    """What the host needs of an engine (uma.Engine)."""

    def status(self) -> dict[str, object]: ...

    def requests_in_flight(self) -> int: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class Loaded:
    """A model the host holds loaded."""

    name: str
    engine: Served
    file: ModelFile
    used_at: float  # the last request's arrival or end (the host's clock)
    keep_alive_s: float | None  # idle time before it is unloaded (None: until unloaded)
    holds: int = 0  # callers between asking for it and submitting (not yet counted as busy)
    aliases: frozenset[str] = frozenset()  # other names a request may give it (answers_to)

    def __post_init__(self) -> None:
        path = self.file.path
        self.aliases = frozenset({self.name, path.stem, path.name, *catalog.names_of(path)})

    def answers_to(self, name: str) -> bool:
        """Whether a request's model names this one: its listing name, its file's name (with
        or without .gguf) or a catalogue name, each with or without Ollama's tag `:latest`."""
        return name.removesuffix(":latest") in self.aliases

    def requests(self) -> int:
        """Requests queued or running in it, in either context, and callers about to submit."""
        return self.engine.requests_in_flight() + self.holds

    def describe(self, now: float) -> dict[str, object]:
        """What `uma ps` and the socket's models event show of it (now: the host's clock)."""
        busy = self.requests()
        idle = 0.0 if busy else max(0.0, now - self.used_at)
        alive = self.keep_alive_s
        return {"name": self.name, "path": str(self.file.path), "size": self.file.size,
                "memory_bytes": self.memory_bytes(), "requests": busy,
                "idle_s": round(idle, 1), "keep_alive_s": alive,
                "expires_in_s": None if alive is None or busy
                else round(max(0.0, alive - idle), 1)}

    def memory_bytes(self) -> int:
        memory = self.engine.status().get("memory")
        if isinstance(memory, dict):
            return sum(v for k, v in memory.items()
                       if k in ("model_bytes", "kv_bytes") and isinstance(v, int))
        return self.file.size


class ModelHost:
    """Loaded models by name. open_model(file, progress) loads one (uma.Engine.from_config
    with the daemon's settings; progress None or a Progress); listing() is the model
    directory (uma.model_dir.list_models). max_loaded: most models loaded at once (at least
    1); memory_cap: most bytes their weights and KV caches may take together (0: no cap);
    keep_alive_s: how long a model loaded on demand stays idle before it is unloaded (None:
    until unloaded or pushed out). say(line): told of each load and unload (`uma run` prints
    them)."""

    def __init__(self, open_model: Callable[[ModelFile, Progress | None], Served],
                 listing: Callable[[], Sequence[ModelFile]], *, max_loaded: int = 3,
                 memory_cap: int = 0, keep_alive_s: float | None = KEEP_ALIVE_S,
                 clock: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] | None = None) -> None:
        if max_loaded < 1:
            raise ValueError(f"max_loaded must be at least 1, not {max_loaded}")
        self._open = open_model
        self._listing = listing
        self.max_loaded = max_loaded
        self.memory_cap = memory_cap
        self.keep_alive_s = keep_alive_s
        self._clock = clock
        self._say = say or (lambda line: None)
        self._lock = threading.Lock()  # guards _loaded and _loading
        self._load_lock = threading.Lock()  # one load at a time
        self._loaded: dict[str, Loaded] = {}
        self._loading: dict[str, Future[Loaded]] = {}
        self._stop = threading.Event()
        self._expiry: threading.Thread | None = None

    # --- what is loaded -----------------------------------------------------------------

    def add(self, engine: Served, file: ModelFile, *, keep_alive_s: float | None = None
            ) -> Loaded:
        """A model loaded by the caller (the one `uma run` names), kept until unloaded by
        default."""
        entry = Loaded(file.name, engine, file, self._clock(), keep_alive_s)
        with self._lock:
            if file.name in self._loaded:
                raise ValueError(f"model {file.name!r} is already loaded")
            self._loaded[file.name] = entry
        return entry

    def loaded(self) -> list[Loaded]:
        """The loaded models, the most recently used first."""
        with self._lock:
            return sorted(self._loaded.values(), key=lambda e: -e.used_at)

    def describe(self) -> list[dict[str, object]]:
        """The loaded models as `uma ps` shows them, the most recently used first."""
        now = self._clock()
        return [entry.describe(now) for entry in self.loaded()]

    def find(self, name: str) -> Loaded | None:
        with self._lock:
            return self._loaded.get(self._canonical(name))

    def canonical(self, name: str) -> str:
        """The listing name of the loaded model a request's `model` names by any of its
        names (Loaded.answers_to); otherwise the name without Ollama's tag."""
        with self._lock:
            return self._canonical(name)

    def _canonical(self, name: str) -> str:
        if name.removesuffix(":latest") in self._loaded:
            return name.removesuffix(":latest")
        for entry in self._loaded.values():
            if entry.answers_to(name):
                return entry.name
        return name.removesuffix(":latest")

    # --- using one ----------------------------------------------------------------------

    def hold(self, name: str, *, keep_alive_s: float | None | EllipsisType = ...
             ) -> Loaded | None:
        """Model `name` held, where it is loaded (None otherwise: nothing is loaded here);
        keep_alive_s as load's."""
        with self._lock:
            entry = self._loaded.get(self._canonical(name))
            if entry is not None:
                self._take(entry, keep_alive_s, hold=True)
            return entry

    def _take(self, entry: Loaded, keep_alive_s: float | None | EllipsisType,
              hold: bool) -> None:
        """A loaded entry asked for (under the lock): used now, its keep-alive the request's
        where it names one, held where asked."""
        entry.used_at = self._clock()
        if not isinstance(keep_alive_s, EllipsisType):
            entry.keep_alive_s = keep_alive_s
        entry.holds += hold

    def release(self, entry: Loaded) -> None:
        """Ends a hold that load(hold=True) took; its keep-alive counts from now."""
        with self._lock:
            entry.holds -= 1
            entry.used_at = self._clock()

    @contextmanager
    def use(self, name: str, *, keep_alive_s: float | None | EllipsisType = ...
            ) -> Iterator[Served]:
        """The engine of model `name`, loaded first if it is not (the caller waits for the
        load), held loaded until the block ends (submit inside it: once submitted, its
        request keeps the model busy). keep_alive_s: this request's keep-alive for the
        model from now on (Ollama's keep_alive; ... leaves the model's own)."""
        entry = self.load(name, keep_alive_s=keep_alive_s, hold=True)
        try:
            yield entry.engine
        finally:
            self.release(entry)

    def load(self, name: str, *, keep_alive_s: float | None | EllipsisType = ...,
             hold: bool = False, progress: Progress | None = None) -> Loaded:
        """Model `name` loaded (at once where it is): found in the listing, room made, then
        loaded; callers asking for it meanwhile wait for the same load. progress: told how
        far the load is, where this call is the one loading. Raises ModelNotFoundError (not
        in the listing), ModelLoadError (it would not load: its reason), ModelBusyError (no
        room: every loaded model has requests)."""
        name = self.canonical(name)
        while True:
            with self._lock:
                entry = self._loaded.get(name)
                if entry is not None:
                    self._take(entry, keep_alive_s, hold)
                    return entry
                pending = self._loading.get(name)
                if pending is None:
                    pending = self._loading[name] = Future()
                    mine = True
                else:
                    mine = False
            if not mine:
                pending.result()  # raises its load's error; loaded: taken above next time
                continue
            try:
                loaded = self._load(name, keep_alive_s, progress)
            except BaseException as exc:
                pending.set_exception(exc)
                raise
            finally:
                with self._lock:
                    del self._loading[name]
            pending.set_result(loaded)

    def _load(self, name: str, keep_alive_s: float | None | EllipsisType,
              progress: Progress | None) -> Loaded:
        file = self._file(name)
        if file.error is not None:
            raise ModelLoadError(f"model {name!r} cannot be loaded: {file.error}")
        if self.memory_cap and file.size > self.memory_cap:
            raise ModelLoadError(
                f"model {name!r} takes {size(file.size)} on disk, more than the "
                f"{size(self.memory_cap)} the loaded models may take")
        with self._load_lock:
            self._make_room(file)
            self._say(f"loading {name} ({size(file.size)})")
            began = time.monotonic()
            try:
                engine = self._open(file, progress)
            except BaseException as exc:
                self._say(f"loading {name} failed: {exc}")
                raise
            alive = self.keep_alive_s if isinstance(keep_alive_s, EllipsisType) \
                else keep_alive_s
            entry = Loaded(name, engine, file, self._clock(), alive)
            with self._lock:
                self._loaded[name] = entry
            self._say(f"loaded {name} in {time.monotonic() - began:.1f} s "
                      f"({size(entry.memory_bytes())})")
            return entry

    def _file(self, name: str) -> ModelFile:
        listing = self._listing()
        for file in listing:
            if file.name == name:
                return file
        names = ", ".join(sorted(f.name for f in listing if f.error is None)) or "none"
        raise ModelNotFoundError(f"model {name!r} not found; available: {names}")

    def _make_room(self, file: ModelFile) -> None:
        """Unloads idle models, least recently used first, until one more fits under the
        cap on models and on memory; raises ModelBusyError where the idle ones are not
        enough."""
        while True:
            loaded = self.loaded()
            used = sum(e.memory_bytes() for e in loaded)
            over_count = len(loaded) + 1 > self.max_loaded
            over_memory = self.memory_cap > 0 and loaded and used + file.size > self.memory_cap
            if not over_count and not over_memory:
                return
            if not any(self._close(e, why=f"making room for {file.name}")
                       for e in reversed(loaded)):  # the least recent idle
                why = f"{self.max_loaded} models are loaded" if over_count else \
                    f"the loaded models take {size(used)} of the {size(self.memory_cap)} " \
                    "allowed"
                raise ModelsFullError(
                    f"model {file.name!r} cannot be loaded now: {why} and every one has "
                    f"requests ({', '.join(e.name for e in loaded)}); try again when one "
                    "is idle, or raise the cap")

    # --- unloading ----------------------------------------------------------------------

    def unload(self, name: str) -> None:
        """Unloads model `name`; raises ModelNotFoundError where it is not loaded and
        ModelBusyError where it has requests (they are never cut off)."""
        with self._lock:
            entry = self._loaded.get(self._canonical(name))
            loaded = ", ".join(sorted(self._loaded)) or "none"
        if entry is None:
            raise ModelNotFoundError(f"model {name!r} is not loaded; loaded: {loaded}")
        if not self._close(entry, why="asked to"):
            raise ModelBusyError(f"model {name!r} has requests queued or running; it is "
                                 "unloaded once idle past its keep-alive, or try again "
                                 "when they end")

    def expire(self) -> list[str]:
        """Unloads the models idle past their keep-alive; returns their names."""
        now = self._clock()
        gone = []
        for entry in self.loaded():
            if entry.keep_alive_s is not None and now - entry.used_at >= entry.keep_alive_s \
                    and self._close(entry, why="idle past its keep-alive"):
                gone.append(entry.name)
        return gone

    def _close(self, entry: Loaded, *, idle: bool = True, why: str = "") -> bool:
        """Unloads `entry`, where (idle) it has no requests: checked under the lock `use`
        takes, so no caller gets it between the check and the unload. Returns whether it
        did. why: said with the unload."""
        with self._lock:
            if self._loaded.get(entry.name) is not entry or idle and entry.requests():
                return False
            del self._loaded[entry.name]
        entry.engine.close()
        heap.trim()
        if why:
            self._say(f"unloaded {entry.name} ({why})")
        return True

    def start_expiry(self, every_s: float = 5.0) -> None:
        """Unloads models past their keep-alive every every_s seconds, on a thread of its own,
        until close()."""
        if self._expiry is not None:
            return

        def expiring() -> None:
            while not self._stop.wait(every_s):
                try:
                    self.expire()
                except Exception:  # noqa: BLE001 - an engine that fails to close: next round
                    log.exception("model host: unloading an idle model failed")

        self._expiry = threading.Thread(target=expiring, name="uma-model-expiry", daemon=True)
        self._expiry.start()

    def close(self, keep: Served | None = None) -> None:
        """Unloads every model (but `keep`, which the caller closes), requests and all: the
        daemon is stopping."""
        self._stop.set()
        if self._expiry is not None:
            self._expiry.join()
        for entry in self.loaded():
            if entry.engine is not keep:
                self._close(entry, idle=False)


def size(n_bytes: int) -> str:
    """Bytes as a person reads them: 1.5 GiB, 300 MiB, 512 bytes."""
    if n_bytes >= 2**30:
        return f"{n_bytes / 2**30:.1f} GiB"
    if n_bytes >= 2**20:
        return f"{n_bytes / 2**20:.0f} MiB"
    return f"{n_bytes} bytes"

