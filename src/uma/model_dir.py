"""The models on this machine a daemon can serve: every GGUF file in the model directory, the
catalogue's fetched models under their catalogue names, and any files named explicitly, each
described from its header alone (uma.gguf_header: no weights are read).

    >>> for m in list_models("~/models"):
    ...     print(m.name, m.quantization, m.context_length, m.error or "")

A file that cannot be read (not a GGUF, cut short, damaged) is listed with its error; a
listing never fails because of one file.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from uma import catalog
from uma.errors import InvalidModelError
from uma.gguf_header import Header, read_header
from uma.synth import models_cache_dir

# a split model's parts after the first ("name-00002-of-00003.gguf"): llama.cpp loads a split
# model from its first part, which names the rest, so only that one is a model to serve
_LATER_PART = re.compile(r"-(\d{5})-of-\d{5}$")


@dataclass(frozen=True)
class ModelFile:
    """One GGUF file, as its header describes it."""

    name: str  # unique in its listing: the catalogue name, else the file's name without .gguf
    path: Path
    size: int  # bytes on disk (0 where it cannot be read)
    modified: float  # the file's mtime, seconds since the epoch (0 where it cannot be read)
    architecture: str | None = None  # general.architecture: llama, gemma3, qwen2, ...
    quantization: str | None = None  # the weights' type: Q4_K_M, Q8_0, F16, ...
    context_length: int | None = None  # the context it was trained for
    n_params: int | None = None  # None for a split model (its other parts hold the rest)
    error: str | None = None  # why it cannot be served; the facts above are then None

    @property
    def usable(self) -> bool:
        return self.error is None


def default_dir() -> Path:
    """The model directory unless one is set: the model cache, where `uma model fetch`
    and `uma model synth` write ($UMA_CACHE_DIR/models, else ~/.cache/uma-serve/models)."""
    return models_cache_dir()


def list_models(directory: str | os.PathLike[str] | None = None,
                paths: Iterable[str | os.PathLike[str]] = ()) -> tuple[ModelFile, ...]:
    """Every model available, in this order: `paths`, then the catalogue's fetched models,
    then the directory's *.gguf files by name (default_dir() where directory is None). A
    file reached twice is listed once, under its first name; a name already taken gets -2,
    -3, ... A directory that does not exist (or cannot be read) adds nothing."""
    found: dict[Path, str] = {}  # resolved path -> its name before uniqueness
    for path in paths:
        path = Path(path).expanduser()
        found.setdefault(path.resolve(), (catalog.names_of(path) or (path.stem,))[0])
    for entry in catalog.CATALOG.values():
        if entry.fetched:
            found.setdefault(entry.path.resolve(), entry.name)
    folder = default_dir() if directory is None else Path(directory).expanduser()
    for path in _gguf_files(folder):
        found.setdefault(path.resolve(), (catalog.names_of(path) or (path.stem,))[0])
    taken: set[str] = set()
    return tuple(describe(path, _unique(name, taken)) for path, name in found.items())


def _gguf_files(folder: Path) -> list[Path]:
    """The folder's *.gguf files by name; hidden files (a download in progress) and a split
    model's later parts left out."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return []
    return [Path(e.path) for e in entries
            if e.name.lower().endswith(".gguf") and not e.name.startswith(".")
            and _is_file(e) and not _later_part(Path(e.name).stem)]


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()  # follows a link, as llama.cpp's open does
    except OSError:
        return False


def _later_part(stem: str) -> bool:
    match = _LATER_PART.search(stem)
    return match is not None and match.group(1) != "00001"


def _unique(name: str, taken: set[str]) -> str:
    unique, n = name, 1
    while unique in taken:
        n += 1
        unique = f"{name}-{n}"
    taken.add(unique)
    return unique


def describe(path: Path, name: str) -> ModelFile:
    """One file under that name, from its header (read again only once the file changes)."""
    try:
        st = path.stat()
    except OSError as exc:
        return ModelFile(name, path, 0, 0.0, error=exc.strerror or str(exc))
    facts = _facts(str(path), st.st_size, st.st_mtime_ns)
    return ModelFile(name, path, st.st_size, st.st_mtime, *facts)


@functools.lru_cache(maxsize=256)
def _facts(path: str, size: int, mtime_ns: int
           ) -> tuple[str | None, str | None, int | None, int | None, str | None]:
    """(architecture, quantization, context_length, n_params, error) of the file as it is
    at that size and mtime (both in the key: a file replaced in place is read again)."""
    try:
        header = read_header(path)
    except (OSError, InvalidModelError) as exc:
        return None, None, None, None, _reason(exc)
    arch = header.text("general.architecture")
    if arch is None:
        return None, None, None, None, "no general.architecture in its metadata"
    if not header.tensors:
        return None, None, None, None, "it holds no weights (a tokenizer-only file?)"
    end = header.data_end()
    if end is not None and end > size:
        return None, None, None, None, (f"cut short: {size} bytes of the {end} its header "
                                        f"describes")
    split = (header.integer("split.count") or 1) > 1
    return (arch, quantization(header), header.integer(f"{arch}.context_length"),
            None if split else sum(t.n_elements for t in header.tensors), None)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror  # without the path, which the listing shows beside it
    return str(exc)


def quantization(header: Header) -> str:
    """The weights' type as llama.cpp's quantize names it (Q4_K_M, Q8_0, F16): the file's
    general.file_type, else the type that holds most of its weights."""
    from gguf import GGMLQuantizationType, LlamaFileType

    file_type = header.integer("general.file_type")
    if file_type is not None:
        try:  # 1024 marks a type llama.cpp guessed when it wrote the file
            name = LlamaFileType(file_type & ~1024).name
        except ValueError:
            return f"type {file_type}"
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    weights: dict[int, int] = {}
    for t in header.tensors:
        weights[t.type] = weights.get(t.type, 0) + t.n_elements
    most = max(weights, key=weights.__getitem__)
    try:
        return GGMLQuantizationType(most).name
    except ValueError:
        return f"type {most}"
