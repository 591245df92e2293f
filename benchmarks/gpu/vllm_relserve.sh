#!/usr/bin/env bash
# benchmarks/vllm_relserve.py at GPU scale: the same benchmark (policies on a real
# vLLM engine, simulator prediction, file order vs GGR hit rate) with a larger model
# and RelServe's workload shape (sizes 1..100, full output limits, one relQuery/s).
#
#   MODEL=/models/Llama-3.1-8B-Instruct bash benchmarks/gpu/vllm_relserve.sh
#
# Needs: a GPU, pip install "semframe[vllm,sched,pandas]", and MODEL = a Hugging
# Face model directory on local disk (nothing is downloaded; HF_HUB_OFFLINE=1).
# Writes benchmarks/results/vllm_relserve.json (move the CPU run's file aside first
# if you want to keep it). Expect 20-40 minutes on one A100/H100 for 100 relQueries.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${MODEL:?set MODEL to a Hugging Face model directory}"
: "${RELQUERIES:=100}"
: "${RATE:=1.0}"
export HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python benchmarks/vllm_relserve.py \
  --model "$MODEL" \
  --relqueries "$RELQUERIES" --rate "$RATE" --max-size 100 --out-scale 1.0 \
  --max-num-seqs 256 --max-num-batched-tokens 4096 --max-model-len 4096 \
  --hit-rows 1000 \
  --vllm-args '{"gpu_memory_utilization": 0.85}'
