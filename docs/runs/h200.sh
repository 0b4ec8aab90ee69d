#!/usr/bin/env bash
# How the runs in docs/runs/ were made: on a lent NVIDIA H200 machine (device tool; torch 2.11 +
# NCCL of its image, torchao 0.17.0 and this package's dependencies carried as wheels), from a
# checkout installed there with `pip install --no-deps --no-build-isolation -e .`.
#   NPROC=2 docs/runs/h200.sh fidelity OUT    # is the profiled step the real step?
#   NPROC=2 docs/runs/h200.sh workloads OUT   # checkpoint stalls, shapes and recompiles
#   NPROC=2 docs/runs/h200.sh capacity OUT    # largest batch per preset and variant
#   NPROC=2 docs/runs/h200.sh shapes OUT      # one recorded step each: variable-length vs buckets
# NPROC is the number of GPUs (ranks); when only a one-GPU machine is lent it is 1.
# Each output directory is then packed (traces and manifests; checkpoints are deleted).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
part=$1 out=$2
nproc=${NPROC:-2}
medium="--nproc $nproc --preset medium --no-report"
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
    --profile-steps 0 --out "$out/buckets" ;;
shapes)
  for inputs in variable-length buckets:256,512,768,1024; do
    tracekit profile $medium --variants fsdp2-compile --steps 10 --inputs $inputs --profile-steps 1 \
      --profile-mode light --out "$out/${inputs%%:*}"
  done ;;
capacity)
  tracekit capacity --nproc $nproc --variants ddp,fsdp1,fsdp2 --presets small,medium,large --batches 1,4,16 \
    --memory-fraction 0.06 --out "$out/capacity" ;;
esac
