#!/usr/bin/env bash
# GPU speed end to end (docs/BENCHMARKS.md "GPU speed"): where a tick's time goes, the engine
# against llama-batched-bench with host and device sampling, and the served path against
# llama-server. Two parts, each within one device call; the second reuses the first's build.
#
#   PART=engine bash benches/device/gpu_speed.sh   # build, tick profile, in-process engine
#   PART=served bash benches/device/gpu_speed.sh   # HTTP/SSE streams, one stream's overhead
#                                                  # and its longest gaps over a minute
#
# Carried into the checkout beforehand (git-ignored): .device/llama-src.tar.xz and
# .device/vocab.tar (benches/device/gpu_pack.sh says what they hold), .whl/*.whl.
# Results: $OUT (default ./out-gpu), one log and one JSON per benchmark and model.
set -uo pipefail
OUT=$(realpath -m "${OUT:-out-gpu}")
mkdir -p "$OUT"
MODELS=${MODELS:-1b}
STREAMS=${STREAMS:-1,8,32}
PART=${PART:-engine}
SAMPLING=${SAMPLING:-on off}  # the engine's device_sampling in decode_throughput, in turn
SERVED=${SERVED:-scaling overhead lone}  # the served part's benchmarks
LONE_PATHS=${LONE_PATHS:-engine,socket,http}
LONE_SECONDS=${LONE_SECONDS:-60}

TARGETS=${TARGETS:-_core llama-batched-bench llama-server} . benches/device/setup.sh
GPU="--gpu-layers 99 --threads 8"
quiet() { grep --line-buffered -v "^ggml_cuda_init\|^  Device"; }

for m in $MODELS; do
  python3 -c "from uma import synth; print(synth.cached_model('$m'))" > /dev/null
  if [[ $PART == engine ]]; then
    # each step of a tick, decode-only, host and device sampling; the bare core loop beside
    timeout 200 python3 benches/profile_tick.py --model "$m" $GPU --streams "$STREAMS" \
      --pp 128 --tg 256 2>&1 | quiet | tee -a "$OUT/profile_$m.txt"
    # the engine against llama-batched-bench, alternating, 3 runs a side
    for ds in $SAMPLING; do
      timeout 200 python3 benches/decode_throughput.py --model "$m" --backend cuda $GPU \
        --streams "$STREAMS" --pp 128 --tg 256 --repeat 3 --device-sampling $ds \
        --out "$OUT/decode_${m}_sampling_$ds.json" 2>&1 | quiet | tee -a "$OUT/log.txt"
    done
  else
    # served: streams over HTTP/SSE against llama-server, then one stream's TTFT and CPU
    [[ $SERVED == *scaling* ]] && timeout 300 python3 benches/decode_scaling.py --model "$m" --backend cuda $GPU \
      --streams "$STREAMS" --tokens 256 --out "$OUT/decode_scaling_$m" 2>&1 | quiet \
      | tee -a "$OUT/log.txt"
    [[ $SERVED == *overhead* ]] && timeout 200 python3 benches/overhead.py --model "$m" --backend cuda $GPU --repeat 3 \
      --out "$OUT/overhead_$m.json" 2>&1 | quiet | tee -a "$OUT/log.txt"
    # one stream alone for a minute a path: the longest gap against the median
    [[ $SERVED == *lone* ]] && timeout 280 python3 benches/lone_stream.py --model "$m" --backend cuda $GPU \
      --seconds "$LONE_SECONDS" --paths "$LONE_PATHS" \
      --out "$OUT/lone_stream_$m.json" 2>&1 | quiet | tee -a "$OUT/log.txt"
  fi
done
ls -la "$OUT"
