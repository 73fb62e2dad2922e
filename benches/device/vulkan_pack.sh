#!/usr/bin/env bash
# Build the Vulkan side of benches/device/vulkan.sh on a machine that has glslc (the GPU machine
# has none): uma._core for the GPU machine's Python and llama.cpp's tools, one CMake tree, into
# build/vulkan-carry/vulkan-bin.tar.xz (git-ignored; carried to the GPU machine). Then, there:
# `bash benches/device/vulkan.sh`.
#
#   VK_INCLUDE=/path/to/include PYTHON=python3.12 bash benches/device/vulkan_pack.sh
#
# VK_INCLUDE: Vulkan headers 1.3.275 or newer, where the system's are older (README, Vulkan).
# PYTHON: the interpreter uma._core is built for (the GPU machine's version; Cython installed).
# The CPU code is built for x86-64 with AVX2 (GGML_NATIVE=OFF): the GPU machine's processor is
# not this one.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
BUILD=${BUILD:-build/vulkan-tools}
OUTDIR=build/vulkan-carry
args=(-DCMAKE_BUILD_TYPE=Release -DUMA_BACKEND=vulkan -DUMA_LLAMA_TOOLS=ON -DGGML_NATIVE=OFF
      -DPython_EXECUTABLE="$(command -v "$PYTHON")")
[ -n "${VK_INCLUDE:-}" ] && args+=(-DVulkan_INCLUDE_DIR="$VK_INCLUDE")
start=$(date +%s)
cmake -S . -B "$BUILD" -G Ninja "${args[@]}" > /dev/null
cmake --build "$BUILD" --target _core llama-bench llama-batched-bench llama-server
echo "build_seconds $(( $(date +%s) - start ))"
stage=$(mktemp -d)
cp "$BUILD"/_core*.so "$BUILD"/bin/llama-bench "$BUILD"/bin/llama-batched-bench \
  "$BUILD"/bin/llama-server "$stage"/
strip "$stage"/*
# ggml's CPU backend links OpenMP's runtime, which a machine without GCC may lack
mkdir -p "$stage"/lib && cp -L "$(gcc -print-file-name=libgomp.so.1)" "$stage"/lib/
# One xz stream with a 64 MiB window: the four binaries hold the same shaders, stored once.
rm -rf "$OUTDIR" && mkdir -p "$OUTDIR"
tar -C "$stage" -cf - . | xz -9 -T1 > "$OUTDIR"/vulkan-bin.tar.xz
rm -rf "$stage"
du -sh "$OUTDIR"
