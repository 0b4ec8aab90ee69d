#!/usr/bin/env bash
# The hf: Llama run (docs/runs/README.md), on a lent H200 machine from a checkout installed
# there (wheels carried; the image's transformers): a ~1.1 B-parameter Llama configuration
# (docs/runs/h200x1/llama-1b/config.json, random weights, nothing downloaded) through fsdp1,
# fsdp2 and fsdp2-compile, batch 4 × 1024, 20 timed steps, 3 recorded (lean) steps.
#   docs/runs/llama.sh OUT
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
out=$1
timeout "${LIMIT:-280}" tracekit profile --nproc 1 --model hf:docs/runs/h200x1/llama-1b/config.json --batch 4 \
  --seq 1024 --variants fsdp1,fsdp2,fsdp2-compile --steps 20 --profile-steps 3 --no-report --out "$out/llama-1b" \
  2>&1 | grep -v -e USDT -e _warn_once -e "Profiler clears" -e memory_map
tracekit report "$out/llama-1b" --format json > "$out/report.json" 2>/dev/null
tracekit report "$out/llama-1b" > "$out/report.txt" 2>&1
tracekit check "$out/llama-1b" > "$out/check.txt" 2>&1
cp "$out/llama-1b/manifest.json" "$out/manifest.json"
rm -rf "$out/llama-1b"
