#!/usr/bin/env bash
# The GPU figures in one call: CUDA build of uma._core and llama.cpp's tools from the same
# tree, then the mixed-load (1), decode-scaling (2) and overhead (4) scenarios with a ~1B and a
# ~8B llama-shaped synthetic model, UMA Serve and llama-server side by side; SCENARIOS=matrix
# runs the whole scenario matrix instead (PHASES picks its scenarios).
#
#   run: bash benches/device/gpu_pack.sh       (on an NVIDIA machine without network access)
#
# Carried into the checkout beforehand (git-ignored):
#   .device/llama-src.tar.{gz,xz}   the pinned llama.cpp source (third_party/llama.cpp, tarred)
#   .device/vocab.tar   models/ggml-vocab-llama-{bpe,spm}.gguf from that tree, if the source
#                       tarball leaves models/ out (the synthetic models take their tokenizers)
#   .whl/*.whl   wheels the machine lacks: gguf starlette uvicorn h11 anyio click sniffio typer
#                shellingham rich markdown-it-py mdurl pygments tomli msgpack, and typer's
#                pydantic pydantic_core annotated_types typing_inspection annotated_doc
# Results: $OUT (default ./out-gpu), one JSON/CSV per scenario and model, plus logs.
set -uo pipefail
OUT=$(realpath -m "${OUT:-out-gpu}")
mkdir -p "$OUT"
MODELS=${MODELS:-1b 8b}
SCENARIOS=${SCENARIOS:-mixed scaling overhead}
# One KV buffer on both sides: with one buffer per sequence llama.cpp must split a batch that
# mixes prompt chunks and decode rows into several micro-batches (equal tokens per sequence),
# each reading all the weights again.
MIXED_ARGS=${MIXED_ARGS:---kv-unified}
SIDES=${SIDES:-uma bound,uma baseline,llama-server}

. benches/device/setup.sh
GPU="--backend cuda --gpu-layers 99 --threads 8"

for m in $MODELS; do
  # 1. mixed load: 8 interactive streams, 2 background prompts of 6000 tokens; MIXED_RUNS
  # runs, the sides' order reversed every other run (alternating)
  sides=$SIDES
  for run in $(seq "${MIXED_RUNS:-1}"); do
    [[ $SCENARIOS == *mixed* ]] || break
    suffix=$([ "${MIXED_RUNS:-1}" = 1 ] || echo "_$run")
    timeout 240 python3 benches/mixed_load.py --model "$m" $GPU --streams 8 --background 2 \
      --storm-tokens 6000 --sides "$sides" $MIXED_ARGS \
      --out "$OUT/mixed_load_h100_$m$suffix" 2>&1 | grep -v "^ggml_cuda_init\|^  Device" \
      | tee -a "$OUT/log.txt"
    sides=$(echo "$sides" | tr ',' '\n' | tac | paste -sd, -)
  done
  # the scenario matrix (docs/results/scenario-matrix.md): 8 streams, 2 background prompts of 6000 tokens
  # (Poisson: 4 of 1,500-6,000), a burst of 8, an agent chain, a chat growing to 8k tokens
  [[ $SCENARIOS == *matrix* ]] && timeout "${MATRIX_TIMEOUT:-560}" python3 benches/mixed_load.py \
    --model "$m" $GPU --streams 8 --background 2 --storm-tokens 6000 \
    --phases "${PHASES:-mixed,churn,burst,poisson,agent,chat}" --sides "$SIDES" $MIXED_ARGS \
    --out "$OUT/matrix_h100_$m" 2>&1 | grep -v "^ggml_cuda_init\|^  Device" \
    | tee -a "$OUT/log.txt"
  # 2. decode scaling, 1..32 streams, with the bandwidth roofline (CuPy measures the GPU's)
  [[ $SCENARIOS == *scaling* ]] && timeout 200 python3 benches/decode_scaling.py --model "$m" $GPU \
    --out "$OUT/decode_scaling_h100_$m" 2>&1 | grep -v "^ggml_cuda_init\|^  Device" \
    | tee -a "$OUT/log.txt"
  # 4. overhead of one stream
  [[ $SCENARIOS == *overhead* ]] && timeout 150 python3 benches/overhead.py --model "$m" $GPU --repeat 5 \
    --out "$OUT/overhead_h100_$m.json" 2>&1 | grep -v "^ggml_cuda_init\|^  Device" \
    | tee -a "$OUT/log.txt"
done
ls -la "$OUT"
