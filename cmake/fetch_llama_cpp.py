"""Fill third_party/llama.cpp when the submodule checkout is empty.

The submodule pins llama.cpp at LLAMA_CPP_COMMIT. Where its git remote cannot be reached, the
identical source ships inside the llama-cpp-python sdist (under ``vendor/llama.cpp/``), which
pip can fetch from the package index. We download that one sdist with pip, check its sha256
against the pinned hash, and extract only the llama.cpp tree. The extracted files stay untracked:
git sees an uninitialised submodule, not a modified one.

Usage: python fetch_llama_cpp.py DEST_DIR
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

LLAMA_CPP_COMMIT = "4df29be4f4c3673f428170fda944a5b19f743bb8"
SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.35"
SDIST_FILE = "llama_cpp_python-0.3.35.tar.gz"
SDIST_SHA256 = "1139dbb54509074b70893fab8554e3b079aa9f4d312058ce4018ef0019e3de12"
VENDOR_PREFIX = "llama_cpp_python-0.3.35/vendor/llama.cpp/"
STAMP = ".uma-source"


def cache_dir() -> Path:
    if os.environ.get("UMA_CACHE_DIR"):
        return Path(os.environ["UMA_CACHE_DIR"]) / "sdist"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "uma-serve" / "sdist"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_sdist(into: Path) -> Path:
    """Fetch the sdist with pip (never a hand-written URL) into ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    target = into / SDIST_FILE
    if target.exists() and sha256_of(target) == SDIST_SHA256:
        return target
    # --no-build-isolation: pip prepares the sdist's metadata with the scikit-build-core that
    # is already installed here instead of building a fresh isolated environment for it.
    cmd = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
        "--no-build-isolation", "--no-binary", SDIST_NAME,
        "--dest", str(into), f"{SDIST_NAME}=={SDIST_VERSION}",
    ]
    print(f"uma: fetching llama.cpp {LLAMA_CPP_COMMIT[:12]} via pip "
          f"({SDIST_NAME}=={SDIST_VERSION})", flush=True)
    subprocess.run(cmd, check=True)
    return target


def extract_vendor_tree(sdist: Path, dest: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix="uma-llama-", dir=dest.parent))
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            members = []
            for member in tar.getmembers():
                if not member.name.startswith(VENDOR_PREFIX):
                    continue
                member.name = member.name[len(VENDOR_PREFIX):]
                # The sdist carries the submodule's `.git` pointer file; copying it would make
                # git treat the directory as a broken checkout.
                if member.name in ("", ".git") or member.name.startswith(".git/"):
                    continue
                members.append(member)
            if not members:
                raise SystemExit(f"uma: {sdist.name} holds no {VENDOR_PREFIX}")
            # The "tar" filter (Python >= 3.10.12) refuses absolute paths and links out of tree.
            safety = {"filter": "tar"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(staging, members=members, **safety)
        (staging / STAMP).write_text(f"{LLAMA_CPP_COMMIT}\n{SDIST_FILE} sha256={SDIST_SHA256}\n")
        # Move the staged tree into the (possibly existing, empty) submodule directory.
        dest.mkdir(parents=True, exist_ok=True)
        for entry in staging.iterdir():
            shutil.move(str(entry), dest / entry.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    dest = Path(argv[1]).resolve()
    if (dest / "CMakeLists.txt").exists():
        return 0
    if dest.exists() and any(p.name != ".git" for p in dest.iterdir()):
        print(f"uma: {dest} is neither empty nor a llama.cpp checkout; refusing to overwrite it",
              file=sys.stderr)
        return 1
    sdist = download_sdist(cache_dir())
    got = sha256_of(sdist)
    if got != SDIST_SHA256:
        sdist.unlink(missing_ok=True)
        print(f"uma: {SDIST_FILE} has sha256 {got}, expected {SDIST_SHA256}; refusing it",
              file=sys.stderr)
        return 1
    extract_vendor_tree(sdist, dest)
    print(f"uma: llama.cpp source ready in {dest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
