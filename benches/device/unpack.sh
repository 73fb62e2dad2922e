# Sourced by the device scripts: unpack the carried llama.cpp source and tokenizers, install the
# carried wheels and record the GPU. Needs OUT (the results folder).
if [ ! -f third_party/llama.cpp/CMakeLists.txt ]; then
  mkdir -p third_party/llama.cpp && tar -xf .device/llama-src.tar.* -C third_party/llama.cpp
fi
if [ -f .device/vocab.tar ] && [ ! -f third_party/llama.cpp/models/ggml-vocab-llama-bpe.gguf ]; then
  tar -xf .device/vocab.tar -C third_party/llama.cpp
fi
python3 -m pip install -q --no-index --no-deps .whl/*.whl
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"
