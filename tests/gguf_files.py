"""Small GGUF files for the header and listing tests: real headers written by the gguf package
(the writer llama.cpp's converters use), a few kilobytes of zero weights."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

EMBEDDING = {"token_embd.weight": np.zeros((32, 64), np.float32)}


def write_gguf(path: Path, *, arch: str = "llama", context_length: int | None = 4096,
               file_type: int | None = gguf.LlamaFileType.ALL_F32,
               tensors: dict[str, np.ndarray] | None = None,
               extra: dict[str, int] | None = None) -> Path:
    """A GGUF file at path: general.architecture, its context length and file type (None:
    left out), `extra` u32 keys, and the tensors (default: one 32 x 64 f32 embedding)."""
    writer = gguf.GGUFWriter(str(path), arch)
    if context_length is not None:
        writer.add_context_length(context_length)
    if file_type is not None:
        writer.add_file_type(file_type)
    for key, value in (extra or {}).items():
        writer.add_uint32(key, value)
    writer.add_token_list(["<s>", "</s>", "hello"])
    for name, array in (EMBEDDING if tensors is None else tensors).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
