"""A GGUF file's header, read without its weights: its key/values and its tensors' names, shapes
and types, from the first pages of the file.

llama.cpp's own reader (gguf_init_from_file) is compiled into the core and not exposed to
Python, and ``gguf.GGUFReader`` parses every vocabulary string into numpy objects (9 s for
Gemma 3's 262k tokens); this reader memory-maps the file and skips what it is not asked for,
so a listing of many models costs milliseconds each.

Values are kept as written: numbers as Python numbers, strings as bytes (decode what you show),
arrays only where asked for (a vocabulary's strings are stepped over, not copied).
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from uma.errors import InvalidModelError

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # v1 predates llama.cpp's loader of today
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT, where general.alignment is absent

# GGUF value types (gguf.GGUFValueType's numbering): a scalar's struct format
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
          12: "d"}
STRING = 8
ARRAY = 9

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class Value:
    """One key's value as the file holds it."""

    value: Any  # a number, bytes, a list (an array asked for), or None (an array stepped over)
    type: int  # its GGUF value type
    sub_type: int | None = None  # an array's element type
    length: int = 0  # an array's element count


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # ggml's order: the row length first
    type: int  # ggml type (gguf.GGMLQuantizationType's numbering)
    offset: int  # from the start of the data section

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Header:
    version: int
    kv: Mapping[str, Value]
    tensors: tuple[Tensor, ...]
    data_offset: int  # where the tensor data begins in the file

    def get(self, key: str) -> Any:
        """A key's value as held (None where absent)."""
        entry = self.kv.get(key)
        return None if entry is None else entry.value

    def text(self, key: str) -> str | None:
        """A string key's value, decoded (None where absent or not a string)."""
        value = self.get(key)
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else None

    def integer(self, key: str) -> int | None:
        """An integer key's value (None where absent or not an integer)."""
        value = self.get(key)
        return value if type(value) is int else None

    def data_end(self) -> int | None:
        """The file size the tensors need, from their offsets, shapes and types; None where a
        type is one the installed gguf package does not know the size of."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        end = 0
        for t in self.tensors:
            try:
                block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(t.type)]
            except (ValueError, KeyError):
                return None
            end = max(end, t.offset + t.n_elements // block * block_bytes)
        return self.data_offset + end


def read_header(path: str | os.PathLike[str],
                arrays: Callable[[str], bool] = lambda key: False) -> Header:
    """The header of the GGUF file at path; the arrays of the keys `arrays` accepts are read
    whole, the others stepped over. InvalidModelError for a file that is not a GGUF v2/v3 or
    whose header runs past its end; OSError where it cannot be read."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        magic = f.read(4)
        if magic != MAGIC:
            raise InvalidModelError(f"not a GGUF file (it starts with {magic!r})")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            try:
                return _Reader(data, size).header(arrays)
            except InvalidModelError:
                raise
            except (struct.error, ValueError, OverflowError) as exc:  # UnicodeDecodeError too
                raise InvalidModelError(f"its header is cut short or damaged "
                                        f"({type(exc).__name__}: {exc})") from None


class _Reader:
    """A cursor over the mapped file; every read is checked against the file's end."""

    def __init__(self, data: mmap.mmap, size: int) -> None:
        self.data, self.size, self.off = data, size, 4

    def header(self, arrays: Callable[[str], bool]) -> Header:
        version = self.u32()
        if version not in VERSIONS:
            raise InvalidModelError(f"GGUF version {version} is not one llama.cpp reads "
                                    f"({' or '.join(map(str, VERSIONS))}), or the file is "
                                    f"big-endian")
        n_tensors, n_kv = self.u64(), self.u64()
        # each key/value and tensor takes more than 8 bytes: a count beyond that is damage
        if (n_tensors + n_kv) * 8 > self.size:
            raise InvalidModelError(f"its header counts {n_kv} keys and {n_tensors} tensors, "
                                    f"more than its {self.size} bytes hold")
        kv = {}
        for _ in range(n_kv):
            key = self.string().decode()
            kv[key] = self.value(self.u32(), arrays(key))
        tensors = tuple(self.tensor() for _ in range(n_tensors))
        alignment = kv.get("general.alignment")
        align = alignment.value if alignment is not None and type(alignment.value) is int \
            and alignment.value > 0 else DEFAULT_ALIGNMENT
        data_offset = -(-self.off // align) * align
        return Header(version, kv, tensors, data_offset)

    def take(self, n: int) -> int:
        """Moves past n bytes; the offset they start at."""
        start = self.off
        if n < 0 or start + n > self.size:
            raise InvalidModelError(f"its header runs past the end of the file "
                                    f"({self.size} bytes)")
        self.off = start + n
        return start

    def u32(self) -> int:
        return int(_U32.unpack_from(self.data, self.take(4))[0])

    def u64(self) -> int:
        return int(_U64.unpack_from(self.data, self.take(8))[0])

    def string(self) -> bytes:
        n = self.u64()
        start = self.take(n)
        return self.data[start:start + n]

    def value(self, vtype: int, whole: bool) -> Value:
        if vtype == STRING:
            return Value(self.string(), vtype)
        if vtype in SCALAR:
            fmt = "<" + SCALAR[vtype]
            return Value(struct.unpack_from(fmt, self.data, self.take(struct.calcsize(fmt)))[0],
                         vtype)
        if vtype != ARRAY:
            raise InvalidModelError(f"unknown GGUF value type {vtype}")
        sub, n = self.u32(), self.u64()
        items: list[Any] | None = None
        if sub == STRING:
            if whole:
                items = [self.string() for _ in range(n)]
            else:
                self.skip_strings(n)
        elif sub in SCALAR:
            dtype = np.dtype("<" + SCALAR[sub])
            start = self.take(n * dtype.itemsize)
            items = np.frombuffer(self.data, dtype, n, start).tolist() if whole else None
        else:
            raise InvalidModelError(f"unknown GGUF array element type {sub}")
        return Value(items, vtype, sub, n)

    def skip_strings(self, n: int) -> None:
        # The hot loop of a listing (a vocabulary is 30k-260k strings): locals only, and one
        # bounds check at the end (unpack_from past the end raises struct.error itself).
        data, off, unpack = self.data, self.off, _U64.unpack_from
        for _ in range(n):
            off += 8 + unpack(data, off)[0]
        self.take(off - self.off)

    def tensor(self) -> Tensor:
        name = self.string().decode()
        n_dims = self.u32()
        if n_dims > 8:  # GGML_MAX_DIMS is 4
            raise InvalidModelError(f"tensor {name!r} has {n_dims} dimensions")
        shape = tuple(self.u64() for _ in range(n_dims))
        return Tensor(name, shape, self.u32(), self.u64())
