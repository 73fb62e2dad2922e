#!/usr/bin/env bash
# Vulkan on an NVIDIA GPU (docs/results/vulkan.md): the engine's decode against
# llama-batched-bench and llama-bench built for Vulkan from the same tree, alternating, 3 runs a
# side; then llama-bench for Vulkan against llama-bench for CUDA on the same GPU.
#
# Carried into the checkout beforehand (git-ignored):
#   build/vulkan-carry/   vulkan-bin.tar.xz: uma._core, llama-bench, llama-batched-bench and
#                         llama-server built for Vulkan (benches/device/vulkan_pack.sh: the GPU
#                         machine has no glslc)
#   .gl/*.deb             the Vulkan loader and libglvnd (libvulkan1 libegl1 libglvnd0 libopengl0
#                         libgl1 libglx0 libgles2), unpacked where the machine lacks them
#   .device/llama-src.tar.xz, .device/vocab.tar, .whl/*.whl   as for gpu_speed.sh (CUDA side)
# Results: $OUT (default ./out-vulkan).
#
#   PARTS="decode cuda mixed" bash benches/device/vulkan.sh   # the parts, in this order
#   (DECODE_REPEAT: runs a side for decode, 3; PROFILE_ARGS: more profile_tick.py flags, e.g.
#   --sampling host; MIXED_ARGS: more mixed_load.py flags, e.g. --kv-unified as the CUDA
#   figures of record; SIDES: mixed_load.py's --sides; MIXED_RUNS: that many runs, the sides'
#   order reversed every other run)
# and the diagnoses behind them: PARTS="profile trace snap chunk pp" (where a decode tick's time
# goes, the storm's ticks by kind, what a prefix-cache snapshot costs, what a prompt chunk adds
# to a tick, llama-bench's prompt speed by batch size).
set -uo pipefail
OUT=$(realpath -m "${OUT:-out-vulkan}")
mkdir -p "$OUT"
MODEL=${MODEL:-1b}
STREAMS=${STREAMS:-1,8,32}
PARTS=${PARTS:-decode cuda mixed}
TG=${TG:-256}
GPU="--gpu-layers 99 --threads 8"

# the Vulkan loader and libglvnd (the NVIDIA driver's Vulkan entry point is in
# libGLX_nvidia, which needs libglvnd's dispatch libraries; some machines have the loader but
# not those), and the driver's manifest where the loader does not look
if ! ldconfig -p | grep -q libvulkan.so.1 || ! ldconfig -p | grep -q libGLdispatch.so.0; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && [ -z "${VK_DRIVER_FILES:-}" ] && export VK_DRIVER_FILES=$icd

. benches/device/unpack.sh

VK=build/llama-tools-vulkan/bin  # where benches/llama_tools.py looks for the Vulkan tools
mkdir -p "$VK"
bin=build/vulkan-bin
mkdir -p "$bin" && tar -xJf build/vulkan-carry/vulkan-bin.tar.xz -C "$bin"
cp "$bin"/llama-* "$VK"/
cp "$bin"/_core*.so src/uma/
export PYTHONPATH=$PWD/src
ldconfig -p | grep -q libgomp.so.1 || export LD_LIBRARY_PATH=$PWD/$bin/lib
python3 -c "from uma import _core; import json; print(json.dumps(_core.devices(), indent=1))" \
  | tee "$OUT/devices.json"
grep -q '"Vulkan' "$OUT/devices.json" || { echo "no Vulkan device"; exit 1; }
model=$(python3 -c "from uma import synth; print(synth.cached_model('$MODEL'))")
quiet() { grep --line-buffered -v "^ggml_vulkan\|^ggml_cuda_init\|^  Device"; }

# llama-bench: decode only (-p 0), one sequence, TG tokens, repeated inside each run
bench() {  # bench BIN LABEL
  "$1" -m "$model" -p 0 -n "$TG" -ngl 99 -t 8 -r 3 -o jsonl 2>/dev/null \
    | python3 -c "import json,sys; r=[json.loads(l) for l in sys.stdin if l.startswith('{')][-1]; \
print('$2', round(r['avg_ts'], 1), round(r['stddev_ts'], 1), r['backends'])" | tee -a "$OUT/llama_bench.txt"
}

if [[ $PARTS == *decode* ]]; then
  # the engine against llama-batched-bench (Vulkan), alternating, 3 runs a side
  timeout "${DECODE_S:-300}" python3 benches/decode_throughput.py --model "$MODEL" --backend vulkan $GPU \
    --streams "$STREAMS" --pp 128 --tg "$TG" --repeat "${DECODE_REPEAT:-3}" --device-sampling "${DEVICE_SAMPLING:-auto}" \
    --out "$OUT/decode_${MODEL}_vulkan.json" 2>&1 | quiet | tee -a "$OUT/log.txt"
  # one stream: llama-bench (Vulkan) three times, to set beside the engine's 1-stream runs
  for i in 1 2 3; do bench "$VK/llama-bench" vulkan; done
fi

if [[ $PARTS == *cuda* ]]; then
  # llama-bench for CUDA from the same tree (Hopper only), then both backends alternating
  start=$(date +%s)
  cmake -S . -B build/llama-tools-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DUMA_BACKEND=cuda \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DUMA_LLAMA_TOOLS=ON \
    -DPython_EXECUTABLE="$(command -v python3)" > "$OUT/build_cuda.log" 2>&1
  if timeout "${CUDA_BUILD_S:-330}" cmake --build build/llama-tools-cuda --target llama-bench \
       -j "$(nproc)" >> "$OUT/build_cuda.log" 2>&1; then
    echo "cuda_build_seconds $(( $(date +%s) - start ))" | tee -a "$OUT/llama_bench.txt"
    for i in 1 2 3; do
      bench "$VK/llama-bench" vulkan
      bench build/llama-tools-cuda/bin/llama-bench cuda
    done
  else
    echo "the CUDA build failed or ran out of time"; tail -20 "$OUT/build_cuda.log"
  fi
fi

if [[ $PARTS == *mixed* ]]; then
  # MIXED_RUNS runs; SIDES in order, reversed every other run (alternating)
  sides=${SIDES:-uma slo,uma baseline,llama-server}
  for run in $(seq "${MIXED_RUNS:-1}"); do
    timeout "${MIXED_S:-240}" python3 benches/mixed_load.py --model "$MODEL" --backend vulkan $GPU \
      --streams 8 --background 2 --storm-tokens 6000 --sides "$sides" ${MIXED_ARGS:-} \
      --out "mixed_load_${MODEL}_vulkan_$run" 2>&1 | quiet | tee -a "$OUT/log.txt"
    cp benches/results/mixed_load_"${MODEL}"_vulkan_"$run".{json,timelines.json.xz} "$OUT"/ 2>/dev/null
    sides=$(echo "$sides" | tr ',' '\n' | tac | paste -sd, -)
  done
fi

if [[ $PARTS == *profile* ]]; then
  timeout 240 python3 benches/profile_tick.py --model "$MODEL" --streams "${PROFILE_STREAMS:-1,8}" \
    --tg "$TG" $GPU ${PROFILE_ARGS:-} 2>&1 | quiet | tee -a "$OUT/profile.txt"
fi

if [[ $PARTS == *trace* ]]; then
  # one run a setting in TRACE_ENGINES ("-": the defaults; else KEY=VALUE,... for the engine),
  # after a first run that pays the driver's pipeline compiles for each new shape
  for eng in warmup ${TRACE_ENGINES:--}; do
    args=()
    [[ $eng != - && $eng != warmup ]] && for kv in ${eng//,/ }; do args+=(--engine "$kv"); done
    echo "== engine settings: $eng" | tee -a "$OUT/storm_trace.txt"
    timeout 200 python3 benches/storm_trace.py --model "$MODEL" $GPU --streams 8 --background 2 \
      --storm-tokens 6000 "${args[@]}" ${TRACE_ARGS:-} \
      --out "$OUT/storm_trace_${eng//[^a-z0-9_]/_}.json" 2>&1 \
      | quiet | tee -a "$OUT/storm_trace.txt"
  done
fi

if [[ $PARTS == *snap* ]]; then
  timeout 120 python3 benches/snapshot_cost.py --model "$MODEL" $GPU 2>&1 | quiet \
    | tee -a "$OUT/snapshot.txt"
fi

if [[ $PARTS == *chunk* ]]; then
  for kvu in "" --kv-unified; do
    for history in 0 6000; do
      timeout 120 python3 benches/chunk_cost.py --model "$MODEL" $GPU --history "$history" \
        --chunks "${CHUNKS:-0,1,4,8,16,24,32,48,64,96,128,256}" $kvu 2>&1 | quiet \
        | tee -a "$OUT/chunk.txt"
    done
  done
fi

if [[ $PARTS == *pp* ]]; then
  "$VK/llama-bench" -m "$model" -p "${PP_SIZES:-8,16,32,64,128,256,512}" -n 0 -ngl 99 -t 8 -r 3 \
    2>/dev/null | tee -a "$OUT/pp.txt"
fi

ls -la "$OUT"
