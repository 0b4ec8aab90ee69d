#!/usr/bin/env bash
# How the runs in docs/runs/ were made: on the lent 2 × NVIDIA H200 machine (device tool, kind
# nvidia-h200-x2, torch 2.11 + NCCL of its image, torchao 0.17.0 carried as a wheel), from a
# checkout installed there with `pip install --no-deps --no-build-isolation -e .`.
#   docs/runs/h200x2.sh fidelity OUT    # issue: is the profiled step the real step?
#   docs/runs/h200x2.sh workloads OUT   # checkpoint stalls, shapes and recompiles, capacity
# Each output directory is then packed (traces and manifests; checkpoints are deleted).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
part=$1 out=$2
medium="--nproc 2 --preset medium --no-report"
case $part in
fidelity)
  for mode in full light; do
    tracekit profile $medium --variants fsdp1,fsdp2,fsdp2-compile,fsdp2-compile-fp8 --steps 20 \
      --profile-steps 3 --profile-mode $mode --out "$out/medium-$mode"
  done ;;
workloads)
  for mode in sync async; do
    tracekit profile $medium --variants fsdp2 --steps 20 --checkpoint $mode --checkpoint-every 5 \
      --profile-steps 0 --out "$out/checkpoint-$mode"
  done
  tracekit profile $medium --variants fsdp2-compile --steps 20 --inputs variable-length --profile-steps 0 \
    --out "$out/variable-length"
  tracekit profile $medium --variants fsdp2-compile --steps 20 --inputs buckets:256,512,768,1024 \
    --profile-steps 0 --out "$out/buckets"
  tracekit capacity --nproc 2 --variants ddp,fsdp1,fsdp2 --presets small,medium,large --batches 1,4,16 \
    --memory-fraction 0.06 --out "$out/capacity" ;;
esac
