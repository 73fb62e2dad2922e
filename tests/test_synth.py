"""Tests for uma.synth: synthetic GGUF models that llama.cpp's llama loader accepts."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from uma import synth  # noqa: E402


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _field(reader: gguf.GGUFReader, key: str):
    field = reader.fields.get(key)
    assert field is not None, f"missing key {key}"
    return field.contents()


def _expected_tensors(spec: synth.SynthSpec) -> dict[str, tuple[int, ...]]:
    """Tensor names and ggml shapes (ne0 first) as llama.cpp's llama load_arch_tensors wants."""
    e, ff, v = spec.n_embd, spec.n_ff, 32000 if spec.vocab == "llama-spm" else 128256
    head = e // spec.n_head
    kv = head * spec.n_head_kv
    out = {"token_embd.weight": (e, v), "output_norm.weight": (e,)}
    if not spec.tied_embeddings:
        out["output.weight"] = (e, v)
    for i in range(spec.n_layer):
        b = f"blk.{i}."
        out |= {
            b + "attn_norm.weight": (e,),
            b + "attn_q.weight": (e, e),
            b + "attn_k.weight": (e, kv),
            b + "attn_v.weight": (e, kv),
            b + "attn_output.weight": (e, e),
            b + "ffn_norm.weight": (e,),
        }
        if spec.n_expert == 0:
            out |= {
                b + "ffn_gate.weight": (e, ff),
                b + "ffn_up.weight": (e, ff),
                b + "ffn_down.weight": (ff, e),
            }
        else:
            x = spec.n_expert
            out |= {
                b + "ffn_gate_inp.weight": (e, x),
                b + "ffn_gate_exps.weight": (e, ff, x),
                b + "ffn_up_exps.weight": (e, ff, x),
                b + "ffn_down_exps.weight": (ff, e, x),
            }
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("synth")
    return {
        name: synth.write_model(d / f"{name}.gguf", synth.PRESETS[name])
        for name in ("tiny", "tiny-moe")
    }


@pytest.mark.parametrize("name", ["tiny", "tiny-moe"])
def test_layout_matches_llama_loader(written: dict[str, Path], name: str) -> None:
    spec = synth.PRESETS[name]
    reader = gguf.GGUFReader(written[name])

    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "general.name").startswith("uma-synthetic-llama")
    assert "gibberish" in _field(reader, "general.description")
    assert _field(reader, "general.file_type") == gguf.LlamaFileType.ALL_F32
    assert _field(reader, "llama.block_count") == spec.n_layer
    assert _field(reader, "llama.embedding_length") == spec.n_embd
    assert _field(reader, "llama.feed_forward_length") == spec.n_ff
    assert _field(reader, "llama.context_length") == spec.n_ctx_train
    assert _field(reader, "llama.attention.head_count") == spec.n_head
    assert _field(reader, "llama.attention.head_count_kv") == spec.n_head_kv
    assert _field(reader, "llama.rope.dimension_count") == spec.n_embd // spec.n_head
    assert _field(reader, "llama.rope.freq_base") == pytest.approx(spec.rope_freq_base)
    assert _field(reader, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    assert _field(reader, "llama.vocab_size") == 32000
    if spec.n_expert:
        assert _field(reader, "llama.expert_count") == spec.n_expert
        assert _field(reader, "llama.expert_used_count") == spec.n_expert_used
    else:
        assert "llama.expert_count" not in reader.fields

    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 32000
    assert _field(reader, "tokenizer.ggml.model") == "llama"
    template = _field(reader, "tokenizer.chat_template")
    assert "[INST]" in template  # what llama_chat_apply_template detects as llama2

    got = {t.name: tuple(int(x) for x in t.shape) for t in reader.tensors}
    assert got == _expected_tensors(spec)
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in reader.tensors)
    assert spec.n_params() == sum(int(t.n_elements) for t in reader.tensors)
    assert spec.file_size_estimate() == pytest.approx(written[name].stat().st_size, rel=0.01)


def test_tokenizer_copied_exactly(written: dict[str, Path]) -> None:
    src = gguf.GGUFReader(synth.vocab_path("llama-spm"))
    dst = gguf.GGUFReader(written["tiny"])
    keys = [k for k in src.fields if k.startswith("tokenizer.")]
    assert "tokenizer.ggml.scores" in keys and "tokenizer.ggml.token_type" in keys
    for key in keys:
        a, b = src.fields[key], dst.fields[key]
        assert a.types == b.types, key
        assert a.contents() == b.contents(), key


def test_weights_are_finite_and_scaled(written: dict[str, Path]) -> None:
    reader = gguf.GGUFReader(written["tiny"])
    tensors = {t.name: np.asarray(t.data, dtype=np.float32) for t in reader.tensors}
    for name, data in tensors.items():
        assert np.isfinite(data).all(), name
        if name.endswith("norm.weight"):
            assert abs(float(data.mean()) - 1.0) < 0.05, name
        elif name == "output.weight":
            # logits of about std 3 on RMS-normalised activations, like a trained model's
            expected = 3.0 / synth.PRESETS["tiny"].n_embd ** 0.5
            assert abs(float(data.std()) - expected) < 0.1 * expected, name
        else:
            assert 0.01 < float(data.std()) < 0.04, name
    # embedding rows differ from each other (the repeated random block does not align to rows)
    emb = tensors["token_embd.weight"].reshape(32000, -1)
    assert not np.array_equal(emb[0], emb[1])


def test_same_seed_identical_different_seed_differs(tmp_path: Path) -> None:
    spec = synth.PRESETS["tiny"]
    a = synth.write_model(tmp_path / "a.gguf", spec)
    b = synth.write_model(tmp_path / "b.gguf", spec)
    c = synth.write_model(tmp_path / "c.gguf", dataclasses.replace(spec, seed=1))
    assert _sha256(a) == _sha256(b)
    assert a.stat().st_size == c.stat().st_size
    ta = {t.name: t for t in gguf.GGUFReader(a).tensors}
    tc = {t.name: t for t in gguf.GGUFReader(c).tensors}
    assert ta.keys() == tc.keys()
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight"):
        assert not np.array_equal(ta[name].data, tc[name].data), name


def test_q8_0_tensors(tmp_path: Path) -> None:
    spec = dataclasses.replace(synth.PRESETS["tiny-moe"], dtype="q8_0")
    path = synth.write_model(tmp_path / "q8.gguf", spec)
    reader = gguf.GGUFReader(path)
    assert _field(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_Q8_0
    block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0]
    assert (block, type_size) == (32, 34)
    got = {t.name: t for t in reader.tensors}
    assert {n: tuple(int(x) for x in t.shape) for n, t in got.items()} == _expected_tensors(spec)
    for name, t in got.items():
        if name.endswith("norm.weight") or name.endswith("ffn_gate_inp.weight"):
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, name
            continue
        assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0, name
        assert int(t.n_bytes) == int(t.n_elements) // block * type_size, name
    assert spec.n_params() == sum(int(t.n_elements) for t in reader.tensors)
    q = got["blk.0.attn_q.weight"]
    values = gguf.quants.dequantize(q.data, q.tensor_type)
    assert np.isfinite(values).all()
    assert 0.01 < float(values.std()) < 0.04


def test_progress_and_atomic_write(tmp_path: Path) -> None:
    seen: list[float] = []
    dest = tmp_path / "a" / "b" / "tiny.gguf"
    out = synth.write_model(dest, synth.PRESETS["tiny"], progress=seen.append)
    assert out == dest and dest.is_file()
    assert seen and seen[-1] == 1.0
    assert all(x <= y for x, y in zip(seen, seen[1:], strict=False))
    assert [p.name for p in dest.parent.iterdir()] == ["tiny.gguf"]  # no temp file left


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n_layer": 0}, "n_layer"),
        ({"n_embd": -1}, "n_embd"),
        ({"n_head": 3}, "n_embd"),  # 128 % 3 != 0
        ({"n_head_kv": 3, "n_head": 4}, "n_head_kv"),
        ({"n_ff": 1.5}, "n_ff"),
        ({"dtype": "q4_0"}, "dtype"),
        ({"vocab": "gpt-2"}, "vocab"),
        ({"n_expert": 4, "n_expert_used": 0}, "n_expert_used"),
        ({"n_expert": 4, "n_expert_used": 5}, "n_expert_used"),
        ({"n_expert_used": 2}, "n_expert_used"),
        ({"seed": -1}, "seed"),
        ({"dtype": "q8_0", "n_ff": 100}, "n_ff"),
        ({"rope_freq_base": 0.0}, "rope_freq_base"),
    ],
)
def test_spec_validation_names_field(kwargs: dict, field: str) -> None:
    base = {"n_layer": 2, "n_embd": 128, "n_head": 2, "n_head_kv": 1, "n_ff": 256}
    with pytest.raises(ValueError, match=field):
        synth.SynthSpec(**{**base, **kwargs})


def test_cached_model_reuses_file(tmp_path: Path) -> None:
    first = synth.cached_model("tiny", cache_dir=tmp_path)
    mtime = first.stat().st_mtime_ns
    again = synth.cached_model("tiny", cache_dir=tmp_path)
    assert again == first
    assert again.stat().st_mtime_ns == mtime
    assert synth.cached_model(synth.PRESETS["tiny"], cache_dir=tmp_path) == first
    other = synth.cached_model(dataclasses.replace(synth.PRESETS["tiny"], seed=7), tmp_path)
    assert other != first and other.parent == tmp_path
    with pytest.raises(ValueError, match="tiny"):
        synth.cached_model("no-such-model", cache_dir=tmp_path)


def test_cached_model_default_dir_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("UMA_CACHE_DIR", str(tmp_path / "c"))
    path = synth.cached_model("tiny")
    assert path.parent == tmp_path / "c" / "models"


def test_vocab_path() -> None:
    assert synth.vocab_path("llama-spm").name == "ggml-vocab-llama-spm.gguf"
    assert synth.vocab_path("llama-bpe").is_file()
    with pytest.raises(FileNotFoundError, match="looked in"):
        synth.vocab_path("no-such-vocab")


def test_preset_sizes() -> None:
    p = synth.PRESETS
    assert 130e6 < p["134m"].n_params() < 140e6
    assert 20e6 < p["small"].n_params() < 30e6
    assert p["1b"].n_params() == 1_235_814_400  # Llama-3.2-1B (tied embeddings)
    assert p["8b"].n_params() == 8_030_261_248  # Llama-3.1-8B
    assert p["8b"].dtype == "q8_0" and p["1b"].vocab == "llama-bpe"
    moe = p["moe-small"]
    assert moe.n_expert == 8 and moe.n_expert_used == 2
    assert abs(moe.n_params_active() - p["134m"].n_params()) < 1e6
    assert p["tiny"].file_size_estimate() < 50e6
