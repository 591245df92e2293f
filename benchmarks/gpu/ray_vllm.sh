#!/usr/bin/env bash
# benchmarks/ray_scale.py's measured part on a multi-GPU machine: the same movies-shaped
# map on 1, 2, 4 (and 8) vLLM replicas, one GPU each, on the machine's Ray cluster:
# semframe (executor="ray": planned once with GGR, whole prefix groups per replica,
# each replica a vLLM engine with semframe's scheduler) against Ray Data map_batches
# over file-order blocks with the same backend per actor (64 requests in flight each).
# Reported per run: wall seconds and the share of prompt tokens each engine served
# from its prefix cache.
#
#   MODEL=/models/Llama-3.1-8B-Instruct bash benchmarks/gpu/ray_vllm.sh
#
# Needs: GPUs, pip install "semframe[vllm,ray,pandas]", and MODEL = a Hugging Face
# model directory on local disk (nothing is downloaded; HF_HUB_OFFLINE=1).
# REPLICAS defaults to 1,2,4,8 cut to the GPUs present. Writes
# benchmarks/results/ray_vllm.json. Expect about 10 minutes per replica count on
# A100/H100s with the default 20,000 rows (engine start-up included, not timed).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${MODEL:?set MODEL to a Hugging Face model directory}"
: "${ROWS:=20000}"
export HF_HUB_OFFLINE=1
GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ -z "${REPLICAS:-}" ]; then
  REPLICAS=$(for n in 1 2 4 8; do [ "$n" -le "$GPUS" ] && printf '%s,' "$n"; done)
  REPLICAS=${REPLICAS%,}
fi
python benchmarks/ray_scale.py --measured-only \
  --backend vllm --model "$MODEL" \
  --measured-rows "$ROWS" --replica-counts "$REPLICAS" --concurrency 64 \
  --vllm-args '{"gpu_memory_utilization": 0.85, "max_model_len": 4096, "max_num_seqs": 64}' \
  --out benchmarks/results/ray_vllm.json
