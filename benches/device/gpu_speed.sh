#!/usr/bin/env bash
# GPU speed end to end (docs/results/gpu-speed.md): where a tick's time goes, the engine
# against llama-batched-bench with host and device sampling, and the served path against
# llama-server. Two parts, each within one device call; the second reuses the first's build.
#
#   PART=engine bash benches/device/gpu_speed.sh   # build, tick profile, in-process engine
#   PART=served bash benches/device/gpu_speed.sh   # HTTP/SSE streams, one stream's overhead
#                                                  # and its longest gaps over a minute
#   PART=kv bash benches/device/gpu_speed.sh       # long context, 8 streams: q8_0 KV against
#                                                  # f16, engine and llama-batched-bench
#   PART=prefix bash benches/device/gpu_speed.sh   # the prefix cache: chat and shared system
#                                                  # prompt against llama-server, RAM restore
#   PART=fair bash benches/device/gpu_speed.sh     # fair share: one app's flood against a
#                                                  # question, two backlogged apps' service
#   PART=grammar bash benches/device/gpu_speed.sh  # constrained decoding: 8 streams with a
#                                                  # JSON schema against plain, mask engines
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
PROFILE=${PROFILE:-1}  # 0: the engine part skips the tick profile
KV_DEPTHS=${KV_DEPTHS:-8192 16384}  # the kv part's prompt tokens a stream
KV_STREAMS=${KV_STREAMS:-8}
FAIR=${FAIR:-flood share}  # the fair part's benchmarks
SHARE_SECONDS=${SHARE_SECONDS:-15}

TARGETS=${TARGETS:-_core llama-batched-bench llama-server} . benches/device/setup.sh
GPU="--gpu-layers 99 --threads 8"
quiet() { grep --line-buffered -v "^ggml_cuda_init\|^  Device"; }

for m in $MODELS; do
  python3 -c "from uma import synth; print(synth.cached_model('$m'))" > /dev/null
  if [[ $PART == engine ]]; then
    # each step of a tick, decode-only, host and device sampling; the bare core loop beside
    [[ $PROFILE == 1 ]] && timeout 200 python3 benches/profile_tick.py --model "$m" $GPU --streams "$STREAMS" \
      --pp 128 --tg 256 2>&1 | quiet | tee -a "$OUT/profile_$m.txt"
    # the engine against llama-batched-bench, alternating, 3 runs a side
    for ds in $SAMPLING; do
      timeout 200 python3 benches/decode_throughput.py --model "$m" --backend cuda $GPU \
        --streams "$STREAMS" --pp 128 --tg 256 --repeat 3 --device-sampling $ds \
        --out "$OUT/decode_${m}_sampling_$ds.json" 2>&1 | quiet | tee -a "$OUT/log.txt"
    done
  elif [[ $PART == kv ]]; then
    # fewer KV bytes a token: q8_0 against f16 at long context, both sides, 3 runs a side
    for depth in $KV_DEPTHS; do
      for kv in f16 q8_0; do
        timeout 280 python3 benches/decode_throughput.py --model "$m" --backend cuda $GPU \
          --streams "$KV_STREAMS" --pp "$depth" --tg 128 --repeat 3 --kv-type $kv \
          --prompts-together \
          --out "$OUT/kv_${m}_${depth}_$kv.json" 2>&1 | quiet | tee -a "$OUT/log.txt"
      done
    done
  elif [[ $PART == prefix ]]; then
    timeout 300 python3 benches/prefix_reuse.py --model "$m" --backend cuda $GPU --repeat 3 \
      --out "$OUT/prefix_reuse_$m.json" 2>&1 | quiet | tee -a "$OUT/log.txt"
    timeout 200 python3 benches/prefix_restore.py --model "$m" $GPU --history 8000 \
      --out "$OUT/prefix_restore_$m.json" 2>&1 | quiet | tee -a "$OUT/log.txt"
  elif [[ $PART == grammar ]]; then
    for schema in ${SCHEMAS:-bounded open}; do
      timeout 280 python3 benches/constrained.py --model "$m" $GPU --repeat 3 --streams 8 \
        --tokens 256 --sides plain "plain, host sampling" "json schema" --schema "$schema" \
        --out "$OUT/constrained_${schema}_$m.json" 2>&1 | quiet | tee -a "$OUT/log.txt"
    done
  elif [[ $PART == fair ]]; then
    [[ $FAIR == *flood* ]] && timeout 280 python3 benches/app_flood.py --model "$m" --backend cuda $GPU \
      --repeat 3 --out "$OUT/app_flood_$m.json" 2>&1 | quiet | tee -a "$OUT/log.txt"
    [[ $FAIR == *share* ]] && timeout 400 python3 benches/app_share.py --model "$m" --backend cuda $GPU \
      --repeat 3 --seconds "$SHARE_SECONDS" --out "$OUT/app_share_$m.json" 2>&1 | quiet \
      | tee -a "$OUT/log.txt"
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
