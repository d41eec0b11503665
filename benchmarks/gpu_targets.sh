#!/bin/bash
# Issue 15's GPU targets on one GPU (BENCHMARKS.md "Issue 15's GPU targets"): bf16 + compile MFU, fp8's speed and
# loss against bf16 on real tokens, document masking's cost, selective activation checkpointing.
#   bash benchmarks/gpu_targets.sh TOKENS [OUT]   # TOKENS: a tokenized folder (e.g. the demo's), OUT: logs and metrics
# Each run's folder is removed after it (a 1B model's final checkpoint is ~24 GB); a run is cut off at its timeout.
set -u
TOKENS=${1:?usage: gpu_targets.sh TOKENS [OUT]}
OUT=${2:-gpu-targets}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/log.txt"
python3 -c "import torch, torchao; print('torch', torch.__version__, 'torchao', torchao.__version__)" 2>&1 | tail -1 | tee -a "$OUT/log.txt"
B=(python3 benchmarks/gpu_throughput.py --config configs/olmo2-1b.yaml --micro-batch 4 --compile --tokens "$TOKENS")
go() { # name, seconds, args...
  local name=$1 secs=$2; shift 2
  local t0 folder
  t0=$(date +%s) folder=$(mktemp -d)
  echo "== $name: $*" | tee -a "$OUT/log.txt"
  timeout "$secs" "${B[@]}" --folder "$folder" "$@" > "$OUT/$name.log" 2>&1
  echo "rc=$? wall=$(( $(date +%s) - t0 ))s" >> "$OUT/$name.log"
  grep -E "^NVIDIA|^tokens/s|Error|^rc=" "$OUT/$name.log" | tail -4 | tee -a "$OUT/log.txt"
  cp "$folder/run/metrics.jsonl" "$OUT/$name.jsonl" 2>/dev/null
  rm -rf "$folder"
}
go bf16 240 --steps 100 --warmup 10
go fp8 240 --steps 100 --warmup 10 --fp8 tensorwise
go docmask 180 --steps 40 --warmup 10 --document-masking
go selective 180 --steps 40 --warmup 10 --activation-checkpointing --ac-policy selective
