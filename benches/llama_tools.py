"""Builds llama.cpp's own serving and benchmark tools from the same third_party/llama.cpp that
uma._core links, in the same CMake project (UMA_LLAMA_TOOLS=ON), so every comparison runs
identical ggml objects with identical flags.

    python benches/llama_tools.py                 # build/llama-tools/bin/llama-*
    python benches/llama_tools.py --backend cuda  # build/llama-tools-cuda/bin/llama-*

Not part of the package: only the benchmarks use these binaries.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("llama-server", "llama-bench", "llama-batched-bench", "llama-perplexity",
         "llama-quantize")


def build_dir(backend: str = "cpu") -> Path:
    return ROOT / "build" / ("llama-tools" if backend == "cpu" else f"llama-tools-{backend}")


def ensure_tools(backend: str = "cpu", jobs: int | None = None) -> dict[str, Path]:
    """Paths of the tools, building whatever is missing."""
    out = build_dir(backend)
    paths = {name: out / "bin" / name for name in TOOLS}
    if all(p.exists() for p in paths.values()):
        return paths
    args = [
        "cmake", "-S", str(ROOT), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release",
        "-DUMA_LLAMA_TOOLS=ON", f"-DUMA_BACKEND={backend}",
        f"-DPython_EXECUTABLE={sys.executable}",
    ]
    if shutil.which("ninja"):
        args += ["-G", "Ninja"]
    subprocess.run(args, check=True)
    subprocess.run(["cmake", "--build", str(out), "--target", *TOOLS,
                    "-j", str(jobs or os.cpu_count() or 2)], check=True)
    missing = [str(p) for p in paths.values() if not p.exists()]
    if missing:
        raise FileNotFoundError(f"built, but not found: {', '.join(missing)}")
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cpu", choices=("cpu", "cuda", "vulkan", "metal"))
    parser.add_argument("-j", "--jobs", type=int, default=None)
    ns = parser.parse_args()
    for name, path in ensure_tools(ns.backend, ns.jobs).items():
        print(f"{name}: {path}")
