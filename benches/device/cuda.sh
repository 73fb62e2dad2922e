#!/usr/bin/env bash
# CUDA build, test suite and decode benchmark on an NVIDIA GPU machine without network access.
#
# Carried into the checkout beforehand (both git-ignored):
#   .device/llama-src.tar.{gz,xz}   the pinned llama.cpp source (third_party/llama.cpp, tarred)
#   .whl/*.whl                 Python wheels the machine lacks (gguf)
# Results go to $OUT (default ./out-cuda): build and test logs, decode_<gpu>.json.
set -uo pipefail
OUT=${OUT:-out-cuda}
mkdir -p "$OUT"
STREAMS=${STREAMS:-1,8,32}
MODEL=${MODEL:-1b}

if [ ! -f third_party/llama.cpp/CMakeLists.txt ]; then
  mkdir -p third_party/llama.cpp && tar -xf .device/llama-src.tar.* -C third_party/llama.cpp
fi
python3 -m pip install -q --no-index --no-deps .whl/*.whl
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"

# One CMake tree: uma._core and llama.cpp's tools link the same CUDA objects.
start=$(date +%s)
cmake -S . -B build/llama-tools-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DUMA_BACKEND=cuda \
  -DUMA_LLAMA_TOOLS=ON -DPython_EXECUTABLE="$(command -v python3)" > "$OUT/configure.log" 2>&1
cmake --build build/llama-tools-cuda --target _core llama-batched-bench llama-server llama-bench \
  -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
echo "build_seconds $(( $(date +%s) - start ))" | tee "$OUT/build_time.txt"
cp build/llama-tools-cuda/_core*.so src/uma/
export PYTHONPATH=$PWD/src
python3 -c "import uma._core as c; print('backends', c.backends())"

timeout "${TEST_TIMEOUT:-240}" python3 -m pytest tests -q -p no:cacheprovider 2>&1 \
  | tee "$OUT/pytest.log" | tail -15

python3 benches/decode_throughput.py --model "$MODEL" --backend cuda --gpu-layers 99 \
  --threads 8 --streams "$STREAMS" --pp 128 --tg 128 --out "$OUT/decode_cuda.json"

python3 benches/profile_tick.py --model "$MODEL" --streams "${PROFILE_STREAMS:-32}" \
  --gpu-layers 99 --threads 8 2>&1 | grep -v "^ggml_cuda_init\|^  Device" | tee "$OUT/profile.txt"
