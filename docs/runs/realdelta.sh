#!/usr/bin/env bash
# The "real Δ" runs (docs/runs/README.md), on a lent 2 × H200 machine, from a checkout installed
# there (`pip install --no-deps --no-build-isolation -e .`, wheels carried):
#   docs/runs/realdelta.sh cost OUT      # each capture mode's cost in one process (GPU 0 alone)
#   docs/runs/realdelta.sh seq OUT       # two identical one-GPU launches, one after the other
#   docs/runs/realdelta.sh pair OUT      # two identical one-GPU launches, one per GPU, at once
#   docs/runs/realdelta.sh x2 OUT        # the same at world size 2 (both GPUs)
#   docs/runs/realdelta.sh one NAME OUT  # one one-GPU launch into OUT/NAME (one-GPU machines)
# Each launch: --preset large --batch 16 (GPU-bound), fsdp1,fsdp2,fsdp2-compile, 20 timed steps,
# --repeats 3, 3 recorded steps in the default mode; then report, check and diff fsdp1 fsdp2 as
# JSON beside its manifest (OUT/<launch>/{report,check,diff}.json). Packs what comes back.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
part=$1
if [ "$part" = one ]; then name=$2 out=$3; else out=$2; fi
mkdir -p "$out"
launch() {  # launch NAME NPROC
  timeout "${LIMIT:-520}" tracekit profile --nproc "$2" --preset large --batch 16 --variants fsdp1,fsdp2,fsdp2-compile \
    --steps 20 --profile-steps 3 --repeats 3 --no-report --out "$out/$1" 2>&1 | grep -v -e USDT -e _warn_once -e "Profiler clears"
  tracekit report "$out/$1" --format json > "$out/$1/report.json" 2> "$out/$1/report.err"
  tracekit check "$out/$1" --format json > "$out/$1/check.json" 2> "$out/$1/check.err"
  tracekit diff "$out/$1/fsdp1" "$out/$1/fsdp2" --format json > "$out/$1/diff.json" 2> "$out/$1/diff.err"
  tracekit diff "$out/$1/fsdp1" "$out/$1/fsdp2" > "$out/$1/diff.txt" 2>&1
}
pack() {  # pack NAME: small files, then the traces
  tar czf "$out/$1-manifests.tgz" -C "$out" --exclude='*.pt.trace.json.gz' "$1"
  tar czf "$out/$1-traces.tgz" -C "$out" --exclude='names' "$1"
}
case $part in
cost)
  torchrun --nproc-per-node 1 benchmarks/capture_cost.py --preset large --batch 16 --rounds "${ROUNDS:-5}" --steps 5 \
    > "$out/capture-cost.json" 2> "$out/capture-cost.err" ;;
seq)
  launch launch-a 1 > "$out/launch-a.log" 2>&1
  launch launch-b 1 > "$out/launch-b.log" 2>&1
  pack launch-a; pack launch-b ;;
pair)
  CUDA_VISIBLE_DEVICES=0 launch launch-a 1 > "$out/launch-a.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 launch launch-b 1 > "$out/launch-b.log" 2>&1 &
  wait
  pack launch-a; pack launch-b ;;
one)
  launch "$name" 1 > "$out/$name.log" 2>&1
  pack "$name" && rm -rf "${out:?}/$name" ;;
x2)
  launch launch-x2 2 > "$out/launch-x2.log" 2>&1
  pack launch-x2 ;;
esac
