#!/usr/bin/env bash
# The real models' decode and prefill against llama-batched-bench on an NVIDIA GPU machine
# without network access (docs/results/decode-throughput.md, "Real models, quantised kernels").
#
#   PART=build bash benches/device/real_models.sh   # unpack llama.cpp, CUDA build (minutes)
#   PART=bench bash benches/device/real_models.sh   # then the benchmark, on the warm machine
#
# The GGUF does not fit one call's transfer (64 MiB): it arrives in chunks carried in .mdl/
# over several calls and kept in /tmp/mdl (MODEL_CHUNKS, joined in name order into MODEL).
# Carried: .device/llama-src.tar.xz (the pinned llama.cpp source, tarred), .mdl/ (a chunk).
set -uo pipefail
OUT=$(realpath -m "${OUT:-out-real}")
mkdir -p "$OUT" /tmp/mdl
MODEL=${MODEL:-/tmp/smollm2.gguf}
[ -d .mdl ] && cp .mdl/* /tmp/mdl/ 2>/dev/null
if [[ ${PART:-build} == build ]]; then
  if [ ! -f third_party/llama.cpp/CMakeLists.txt ]; then
    mkdir -p third_party/llama.cpp && tar -xJf .device/llama-src.tar.xz -C third_party/llama.cpp
  fi
  start=$(date +%s)
  cmake -S . -B build/llama-tools-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DUMA_BACKEND=cuda \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DUMA_LLAMA_TOOLS=ON \
    -DPython_EXECUTABLE="$(command -v python3)" > "$OUT/build.log" 2>&1
  cmake --build build/llama-tools-cuda --target _core llama-batched-bench llama-server \
    llama-bench llama-perplexity -j "$(nproc)" >> "$OUT/build.log" 2>&1 \
    || { tail -50 "$OUT/build.log"; exit 1; }
  echo "build_seconds $(( $(date +%s) - start ))"
  exit 0
fi
cat /tmp/mdl/"${MODEL_CHUNKS:-smol.part}"* > "$MODEL"
sha256sum "$MODEL"
cp build/llama-tools-cuda/_core*.so src/uma/
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 benches/decode_throughput.py --model "$MODEL" --backend cuda --gpu-layers 99 \
  --threads 8 --streams "${STREAMS:-1,4,8}" --prompts-together --repeat "${REPEAT:-3}" \
  --out "$OUT/decode_real_gpu.json" 2>&1 | grep -v "^ggml_cuda_init\|^  Device\|^llama\|^load"
