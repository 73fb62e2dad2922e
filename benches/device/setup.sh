# Sourced by the device scripts: unpack the carried llama.cpp source and tokenizers, install the
# carried wheels, build uma._core and llama.cpp's tools for CUDA in one tree (TARGETS), and put
# the fresh core on PYTHONPATH. Needs OUT (the results folder); writes $OUT/build.log.
. benches/device/unpack.sh

start=$(date +%s)  # a no-op when a warm machine still has the build
# CUDA_ARCH: the GPU's own architecture only (90: Hopper) keeps a cold build to minutes
cmake -S . -B build/llama-tools-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DUMA_BACKEND=cuda \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" \
  -DUMA_LLAMA_TOOLS=ON -DPython_EXECUTABLE="$(command -v python3)" > "$OUT/build.log" 2>&1
# shellcheck disable=SC2086 # TARGETS is a list
cmake --build build/llama-tools-cuda --target ${TARGETS:-_core llama-batched-bench llama-server llama-bench} \
  -j "$(nproc)" >> "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
echo "build_seconds $(( $(date +%s) - start ))" | tee -a "$OUT/build.log"
cp build/llama-tools-cuda/_core*.so src/uma/
export PYTHONPATH=$PWD/src
