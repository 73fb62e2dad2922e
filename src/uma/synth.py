"""Synthetic GGUF models: real llama.cpp architectures, seeded random weights, real tokenizers.

``write_model`` streams a GGUF file of llama.cpp's ``llama`` architecture (dense, or Mixtral-style
MoE with ``*_exps`` tensors) whose weights are seeded random numbers and whose tokenizer is copied
from one of the vocab files llama.cpp ships in ``models/`` (``ggml-vocab-llama-spm.gguf``,
``ggml-vocab-llama-bpe.gguf``).

Random weights cost exactly what trained ones cost (same shapes, same types, same kernels), so
speed and memory measured on these files are valid; their text output is gibberish, and the file
says so in ``general.name`` and ``general.description``.

Writing is streaming with bounded memory: tensors are written one at a time, each filled from a
seeded random block of at most a few MB that is repeated (the period is odd, so repeats never
line up with rows). ``q8_0`` tensors are written as raw blocks (an f16 scale and 32 int8 values)
without quantizing any floats.

This module imports nothing else from ``uma``, so it works before the compiled core is built.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from uma import templates
from uma.config import cache_root
from uma.gguf_header import read_header

__all__ = [
    "PRESETS",
    "SynthSpec",
    "cached_model",
    "vocab_path",
    "write_model",
]

# Bump when the bytes written for a given spec change, so cached files are regenerated.
_FORMAT_VERSION = 2

_DESCRIPTION = "UMA Serve synthetic model: seeded random weights, output is gibberish"

# Token counts of the vocab files in llama.cpp's models/ dir (checked again when writing).
# deepseek-coder has fill-in-the-middle tokens (the infill tests' vocabulary).
_VOCAB_SIZES: dict[str, int] = {"llama-spm": 32000, "llama-bpe": 128256, "deepseek-coder": 32256}

_DTYPES = ("f32", "f16", "q8_0")
_INT_FIELDS = (
    "n_layer",
    "n_embd",
    "n_head",
    "n_head_kv",
    "n_ff",
    "n_ctx_train",
    "n_expert",
    "n_expert_used",
    "seed",
)

_NORM_EPS = 1e-5
_WEIGHT_STD = 0.02
# The output projection is drawn so that logits have about this standard deviation (std
# _LOGIT_STD / sqrt(n_embd) on RMS-normalised activations). Trained models put most of the
# probability on a few tokens; with every weight at 0.02 the logits were nearly flat (top two
# 2e-4 apart), so any rounding difference flipped greedy choices and top-p kept half the vocab.
_LOGIT_STD = 3.0
_NORM_NOISE_STD = 0.02

# Random data per tensor is generated in a block of at most this many values, then repeated.
# Both periods are odd so that a repeat never starts at the same column of a row.
_PERIOD_VALUES = (1 << 21) - 1  # f32/f16: ~8 MB f32, ~4 MB f16 per block
_PERIOD_Q8_BLOCKS = (1 << 16) - 1  # q8_0: 65535 blocks of 34 bytes, ~2.2 MB

_Q8_BLOCK = 32  # values per q8_0 block
_Q8_BYTES = 34  # f16 scale + 32 x int8
_Q8_DTYPE = np.dtype([("d", "<f2"), ("qs", "i1", (_Q8_BLOCK,))])
_Q8_QSTD = 32.0  # std of the int8 values; scale = std / _Q8_QSTD

# Chat templates as shipped by the models these vocabularies come from (uma.templates).
_CHAT_TEMPLATES: dict[str, str] = {
    "llama-spm": templates.LLAMA2,
    "llama-bpe": templates.LLAMA3,
    "deepseek-coder": templates.CHATML,
}


@dataclass(frozen=True)
class SynthSpec:
    """Shape and content of a synthetic ``llama``-architecture model.

    ``n_expert > 0`` makes a Mixtral-style MoE: ``n_ff`` is then the per-expert FFN width and
    each layer has a router (``ffn_gate_inp``, kept f32 as llama.cpp does) and
    ``ffn_{gate,up,down}_exps`` instead of ``ffn_{gate,up,down}``.
    ``tied_embeddings`` omits ``output.weight``; llama.cpp then uses ``token_embd`` as the output
    projection (as Llama-3.2-1B does). Norm weights are always f32, as in real models.
    """

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int = 4096
    vocab: str = "llama-spm"
    dtype: str = "f16"
    n_expert: int = 0
    n_expert_used: int = 0
    seed: int = 0
    rope_freq_base: float = 10000.0
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        for field in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "n_ctx_train"):
            value = getattr(self, field)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"SynthSpec.{field} must be a positive int, got {value!r}")
        for field in ("n_expert", "n_expert_used", "seed"):
            value = getattr(self, field)
            if not _is_int(value) or value < 0:
                raise ValueError(f"SynthSpec.{field} must be a non-negative int, got {value!r}")
        for field in _INT_FIELDS:  # normalise numpy ints so the spec hashes/serialises cleanly
            object.__setattr__(self, field, int(getattr(self, field)))
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"SynthSpec.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
            )
        if (self.n_embd // self.n_head) % 2 != 0:
            raise ValueError(
                f"SynthSpec.n_head: head size n_embd/n_head = {self.n_embd // self.n_head} "
                "must be even for RoPE"
            )
        if self.n_head % self.n_head_kv != 0:
            raise ValueError(
                f"SynthSpec.n_head_kv ({self.n_head_kv}) must divide n_head ({self.n_head})"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(f"SynthSpec.dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.vocab not in _VOCAB_SIZES:
            raise ValueError(
                f"SynthSpec.vocab must be one of {tuple(_VOCAB_SIZES)}, got {self.vocab!r}"
            )
        if self.n_expert > 0:
            if not 0 < self.n_expert_used <= self.n_expert:
                raise ValueError(
                    f"SynthSpec.n_expert_used must be in 1..n_expert ({self.n_expert}) "
                    f"for a MoE, got {self.n_expert_used}"
                )
            if self.n_expert > 1024:  # LLAMA_MAX_EXPERTS
                raise ValueError(f"SynthSpec.n_expert must be <= 1024, got {self.n_expert}")
        elif self.n_expert_used != 0:
            raise ValueError(
                f"SynthSpec.n_expert_used must be 0 when n_expert is 0, got {self.n_expert_used}"
            )
        if self.dtype == "q8_0":
            for field in ("n_embd", "n_ff"):
                if getattr(self, field) % _Q8_BLOCK != 0:
                    raise ValueError(
                        f"SynthSpec.{field} must be a multiple of {_Q8_BLOCK} for dtype q8_0"
                    )
        rope_ok = isinstance(self.rope_freq_base, (int, float, np.floating))
        if not rope_ok or isinstance(self.rope_freq_base, bool) or not self.rope_freq_base > 0:
            raise ValueError(
                f"SynthSpec.rope_freq_base must be a positive number, got {self.rope_freq_base!r}"
            )
        object.__setattr__(self, "rope_freq_base", float(self.rope_freq_base))
        if not isinstance(self.tied_embeddings, bool):
            raise ValueError(
                f"SynthSpec.tied_embeddings must be a bool, got {self.tied_embeddings!r}"
            )

    @property
    def n_vocab(self) -> int:
        """Number of tokens in the tokenizer (and rows of the embedding matrix)."""
        return _VOCAB_SIZES[self.vocab]

    @property
    def head_dim(self) -> int:
        """Size of one attention head (also the RoPE dimension count)."""
        return self.n_embd // self.n_head

    def n_params(self) -> int:
        """Exact number of parameters (tensor elements) that ``write_model`` writes."""
        return sum(prod(t.ne) for t in _tensor_plan(self))

    def n_params_active(self) -> int:
        """Parameters used per token: for a MoE only ``n_expert_used`` experts count."""
        total = 0
        for t in _tensor_plan(self):
            n = prod(t.ne)
            if t.name.endswith("_exps.weight"):
                n = n // self.n_expert * self.n_expert_used
            total += n
        return total

    def file_size_estimate(self) -> int:
        """Approximate size in bytes of the written file (tensor data exact, metadata estimated)."""
        data = sum(_pad(_nbytes(t.ne, t.qtype), _ALIGNMENT) for t in _tensor_plan(self))
        try:
            meta = vocab_path(self.vocab).stat().st_size
        except FileNotFoundError:
            meta = {"llama-spm": 730_000, "llama-bpe": 7_900_000,
                    "deepseek-coder": 1_160_000}[self.vocab]
        return data + meta + 64 * (len(_tensor_plan(self)) + 32)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


PRESETS: dict[str, SynthSpec] = {
    # ~33 MB f32, for fast tests. Head size 64 (a size every backend's flash attention supports).
    "tiny": SynthSpec(
        n_layer=2, n_embd=128, n_head=2, n_head_kv=1, n_ff=256, n_ctx_train=2048, dtype="f32"
    ),
    "tiny-moe": SynthSpec(
        n_layer=2,
        n_embd=128,
        n_head=2,
        n_head_kv=1,
        n_ff=256,
        n_ctx_train=2048,
        dtype="f32",
        n_expert=4,
        n_expert_used=2,
    ),
    # "tiny" on a code model's vocabulary with fill-in-the-middle tokens (deepseek-coder's)
    "tiny-fim": SynthSpec(
        n_layer=2, n_embd=128, n_head=2, n_head_kv=1, n_ff=256, n_ctx_train=2048, dtype="f32",
        vocab="deepseek-coder",
    ),
    "small": SynthSpec(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=2560, n_ctx_train=2048),
    "134m": SynthSpec(n_layer=12, n_embd=768, n_head=12, n_head_kv=12, n_ff=2048),
    # Same attention/embeddings as "134m"; 2 of 8 experts of width 1024 are active, so the
    # active parameter count equals 134m's.
    "moe-small": SynthSpec(
        n_layer=12, n_embd=768, n_head=12, n_head_kv=12, n_ff=1024, n_expert=8, n_expert_used=2
    ),
    # Llama-3.2-1B shape (tied embeddings, like the real model).
    "1b": SynthSpec(
        n_layer=16,
        n_embd=2048,
        n_head=32,
        n_head_kv=8,
        n_ff=8192,
        n_ctx_train=8192,
        vocab="llama-bpe",
        rope_freq_base=500000.0,
        tied_embeddings=True,
    ),
    # Llama-3.1-8B shape (separate output matrix, like the real model), q8_0.
    "8b": SynthSpec(
        n_layer=32,
        n_embd=4096,
        n_head=32,
        n_head_kv=8,
        n_ff=14336,
        n_ctx_train=8192,
        vocab="llama-bpe",
        dtype="q8_0",
        rope_freq_base=500000.0,
    ),
}


# --------------------------------------------------------------------------- tensor plan

_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT; the writer adds no general.alignment key


@dataclass(frozen=True)
class _Tensor:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the contiguous (row) dimension
    qtype: str  # "f32" | "f16" | "q8_0"
    kind: str  # "norm" | "weight" | "output" (the projection to logits)


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _nbytes(ne: tuple[int, ...], qtype: str) -> int:
    n = prod(ne)
    if qtype == "q8_0":
        return n // _Q8_BLOCK * _Q8_BYTES
    return n * (4 if qtype == "f32" else 2)


@functools.lru_cache(maxsize=64)
def _tensor_plan(spec: SynthSpec) -> tuple[_Tensor, ...]:
    """Tensors in file order with the names and shapes llama.cpp's llama loader expects."""
    e, ff, v = spec.n_embd, spec.n_ff, spec.n_vocab
    n_embd_kv = spec.head_dim * spec.n_head_kv
    w = spec.dtype
    out = [_Tensor("token_embd.weight", (e, v), w,
                   "output" if spec.tied_embeddings else "weight")]
    for i in range(spec.n_layer):
        b = f"blk.{i}."
        out += [
            _Tensor(b + "attn_norm.weight", (e,), "f32", "norm"),
            _Tensor(b + "attn_q.weight", (e, spec.head_dim * spec.n_head), w, "weight"),
            _Tensor(b + "attn_k.weight", (e, n_embd_kv), w, "weight"),
            _Tensor(b + "attn_v.weight", (e, n_embd_kv), w, "weight"),
            _Tensor(b + "attn_output.weight", (spec.head_dim * spec.n_head, e), w, "weight"),
            _Tensor(b + "ffn_norm.weight", (e,), "f32", "norm"),
        ]
        if spec.n_expert == 0:
            out += [
                _Tensor(b + "ffn_gate.weight", (e, ff), w, "weight"),
                _Tensor(b + "ffn_up.weight", (e, ff), w, "weight"),
                _Tensor(b + "ffn_down.weight", (ff, e), w, "weight"),
            ]
        else:
            x = spec.n_expert
            out += [
                # The router stays f32, as convert_hf_to_gguf.py and llama-quantize keep it.
                _Tensor(b + "ffn_gate_inp.weight", (e, x), "f32", "weight"),
                _Tensor(b + "ffn_gate_exps.weight", (e, ff, x), w, "weight"),
                _Tensor(b + "ffn_up_exps.weight", (e, ff, x), w, "weight"),
                _Tensor(b + "ffn_down_exps.weight", (ff, e, x), w, "weight"),
            ]
    out.append(_Tensor("output_norm.weight", (e,), "f32", "norm"))
    if not spec.tied_embeddings:
        out.append(_Tensor("output.weight", (e, v), w, "output"))
    return tuple(out)


# --------------------------------------------------------------------------- vocab


def vocab_path(name: str) -> Path:
    """Path of ``ggml-vocab-<name>.gguf``.

    Looks first in the installed package (``uma/vocab/``), then in
    ``third_party/llama.cpp/models/`` of every directory above this file (a source checkout).
    Raises ``FileNotFoundError`` listing the places searched.
    """
    fname = f"ggml-vocab-{name}.gguf"
    here = Path(__file__).resolve().parent
    candidates = [here / "vocab" / fname]
    candidates += [p / "third_party" / "llama.cpp" / "models" / fname for p in here.parents]
    for c in candidates:
        if c.is_file():
            return c
    looked = "\n  ".join(str(c) for c in candidates)
    raise FileNotFoundError(f"vocab file {fname} not found; looked in:\n  {looked}")


@functools.lru_cache(maxsize=4)
def _tokenizer_kv(path: Path) -> tuple[tuple[str, Any, int, int | None], ...]:
    """All ``tokenizer.*`` key/values of a GGUF file as (key, value, type, sub_type), strings
    as raw bytes so they are copied exactly (uma.gguf_header reads them)."""
    header = read_header(path, arrays=lambda key: key.startswith("tokenizer."))
    return tuple((key, v.value, v.type, v.sub_type) for key, v in header.kv.items()
                 if key.startswith("tokenizer."))


# --------------------------------------------------------------------------- writing


def _model_name(spec: SynthSpec) -> str:
    n = spec.n_params()
    size = f"{n / 1e9:.1f}b" if n >= 1e9 else f"{round(n / 1e6)}m"
    moe = f"-moe{spec.n_expert}x{spec.n_expert_used}" if spec.n_expert else ""
    return f"uma-synthetic-llama{moe}-{size}"


def _tensor_rng(seed: int, name: str) -> np.random.Generator:
    digest = hashlib.sha256(name.encode()).digest()
    return np.random.default_rng([seed, int.from_bytes(digest[:8], "little")])


def _write_repeated(
    fout: BinaryIO, block: np.ndarray, count: int, tick: Callable[[int], None]
) -> None:
    """Write ``count`` items of ``block`` repeated (last copy truncated)."""
    full, rem = divmod(count, len(block))
    raw = block.view(np.uint8)
    for _ in range(full):
        fout.write(raw.data)
        tick(raw.nbytes)
    if rem:
        part = raw[: rem * block.itemsize]
        fout.write(part.data)
        tick(part.nbytes)


def _weight_std(spec: SynthSpec, t: _Tensor) -> float:
    return _LOGIT_STD / spec.n_embd**0.5 if t.kind == "output" else _WEIGHT_STD


def _write_tensor_data(
    fout: BinaryIO, spec: SynthSpec, t: _Tensor, tick: Callable[[int], None]
) -> None:
    rng = _tensor_rng(spec.seed, t.name)
    n = prod(t.ne)
    if t.qtype == "q8_0":
        n_blocks = n // _Q8_BLOCK
        period = min(n_blocks, _PERIOD_Q8_BLOCKS)
        block = np.empty(period, dtype=_Q8_DTYPE)
        scale = _weight_std(spec, t) / _Q8_QSTD
        block["d"] = (scale * rng.uniform(0.75, 1.25, size=period)).astype(np.float16)
        qs = rng.standard_normal((period, _Q8_BLOCK), dtype=np.float32) * _Q8_QSTD
        block["qs"] = np.clip(np.rint(qs), -127, 127).astype(np.int8)
        _write_repeated(fout, block, n_blocks, tick)
        return
    period = min(n, _PERIOD_VALUES)
    values = rng.standard_normal(period, dtype=np.float32)
    if t.kind == "norm":
        values = values * np.float32(_NORM_NOISE_STD) + np.float32(1.0)
    else:
        values *= np.float32(_weight_std(spec, t))
    block = values.astype(np.float32 if t.qtype == "f32" else np.float16)
    _write_repeated(fout, block, n, tick)


def _file_type(dtype: str) -> int:
    import gguf

    return {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }[dtype]


def _add_tensor_infos(writer: Any, plan: tuple[_Tensor, ...]) -> None:
    import gguf

    for t in plan:
        shape = tuple(reversed(t.ne))  # gguf-py takes numpy order and reverses it on write
        nbytes = _nbytes(t.ne, t.qtype)
        if t.qtype == "q8_0":
            # gguf-py convention for quantized data: a uint8 array whose last dim is bytes/row.
            byte_shape = (*shape[:-1], shape[-1] // _Q8_BLOCK * _Q8_BYTES)
            writer.add_tensor_info(
                t.name,
                byte_shape,
                np.dtype(np.uint8),
                nbytes,
                raw_dtype=gguf.GGMLQuantizationType.Q8_0,
            )
        else:
            np_dtype = np.dtype(np.float32 if t.qtype == "f32" else np.float16)
            writer.add_tensor_info(t.name, shape, np_dtype, nbytes)


def _add_metadata(writer: Any, spec: SynthSpec) -> None:
    import gguf

    arch = "llama"
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(_model_name(spec))
    writer.add_description(_DESCRIPTION)
    writer.add_file_type(_file_type(spec.dtype))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_uint32(f"{arch}.vocab_size", spec.n_vocab)
    writer.add_uint32(f"{arch}.context_length", spec.n_ctx_train)
    writer.add_uint32(f"{arch}.embedding_length", spec.n_embd)
    writer.add_uint32(f"{arch}.block_count", spec.n_layer)
    writer.add_uint32(f"{arch}.feed_forward_length", spec.n_ff)
    writer.add_uint32(f"{arch}.attention.head_count", spec.n_head)
    writer.add_uint32(f"{arch}.attention.head_count_kv", spec.n_head_kv)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", _NORM_EPS)
    writer.add_float32(f"{arch}.rope.freq_base", float(spec.rope_freq_base))
    writer.add_uint32(f"{arch}.rope.dimension_count", spec.head_dim)
    if spec.n_expert:
        writer.add_uint32(f"{arch}.expert_count", spec.n_expert)
        writer.add_uint32(f"{arch}.expert_used_count", spec.n_expert_used)

    kvs = _tokenizer_kv(vocab_path(spec.vocab))
    keys = set()
    for key, value, vtype, sub in kvs:
        sub_type = None if sub is None else gguf.GGUFValueType(sub)
        writer.add_key_value(key, value, gguf.GGUFValueType(vtype), sub_type=sub_type)
        keys.add(key)
        if key == "tokenizer.ggml.tokens" and len(value) != spec.n_vocab:
            raise ValueError(
                f"vocab {spec.vocab}: expected {spec.n_vocab} tokens, file has {len(value)}"
            )
    if "tokenizer.chat_template" not in keys:
        writer.add_string("tokenizer.chat_template", _CHAT_TEMPLATES[spec.vocab])


def write_model(
    path: str | os.PathLike[str],
    spec: SynthSpec,
    *,
    progress: Callable[[float], None] | None = None,
) -> Path:
    """Write ``spec`` as a GGUF file at ``path`` and return the path.

    The write is atomic (a temporary file in the same directory, then ``os.replace``); parent
    directories are created. Memory stays bounded (a few MB of random data per tensor) whatever
    the model size. ``progress``, if given, is called with the fraction of tensor bytes written
    (0.0 to 1.0). The output is a deterministic function of ``spec``.
    """
    import gguf

    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    plan = _tensor_plan(spec)
    total = sum(_nbytes(t.ne, t.qtype) for t in plan)

    writer = gguf.GGUFWriter(None, "llama")
    _add_metadata(writer, spec)
    _add_tensor_infos(writer, plan)
    align = writer.data_alignment
    assert align == _ALIGNMENT

    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done / total if total else 1.0)

    try:
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None and len(writer.fout) == 1
        fout = writer.fout[0]
        fout.write(b"\0" * (_pad(fout.tell(), align) - fout.tell()))
        for t in plan:
            nbytes = _nbytes(t.ne, t.qtype)
            start = fout.tell()
            _write_tensor_data(fout, spec, t, tick)
            assert fout.tell() - start == nbytes, t.name
            fout.write(b"\0" * (_pad(nbytes, align) - nbytes))
        fout.flush()
        os.fsync(fout.fileno())
        writer.close()
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    if progress is not None:
        progress(1.0)
    return dest


# --------------------------------------------------------------------------- cache


def models_cache_dir() -> Path:
    """Where models UMA Serve writes or fetches live: $UMA_CACHE_DIR/models,
    $XDG_CACHE_HOME/uma-serve/models or ~/.cache/uma-serve/models."""
    return cache_root() / "models"


def _spec_hash(spec: SynthSpec) -> str:
    payload = json.dumps(
        {"format": _FORMAT_VERSION, **dataclasses.asdict(spec)}, sort_keys=True
    ).encode()
    return hashlib.sha256(payload).hexdigest()[:16]


def cached_model(name_or_spec: str | SynthSpec, cache_dir: Path | None = None) -> Path:
    """Path of a synthetic model file, writing it on first use.

    ``name_or_spec`` is a ``PRESETS`` key or a ``SynthSpec``. Files live in ``cache_dir`` if
    given, else in ``$UMA_CACHE_DIR/models``, ``$XDG_CACHE_HOME/uma-serve/models`` or
    ``~/.cache/uma-serve/models``, named from a hash of the spec; an existing file is reused.
    """
    if isinstance(name_or_spec, SynthSpec):
        spec = name_or_spec
        label = next((k for k, v in PRESETS.items() if v == spec), "custom")
    else:
        try:
            spec = PRESETS[name_or_spec]
        except KeyError:
            raise ValueError(
                f"unknown synthetic model {name_or_spec!r}; presets: {', '.join(PRESETS)}"
            ) from None
        label = name_or_spec
    directory = Path(cache_dir) if cache_dir is not None else models_cache_dir()
    dest = directory / f"uma-synth-{label}-{_spec_hash(spec)}.gguf"
    if dest.is_file():
        return dest
    return write_model(dest, spec)
