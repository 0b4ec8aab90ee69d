#!/usr/bin/env bash
# The `cupti` capture mode's runs (docs/runs/README.md, "Recording straight from CUPTI"), on a
# lent one-H200 machine, from a checkout installed there (wheels carried, cupti-python among them):
#   docs/runs/cupti.sh smoke OUT               # a small two-variant run kept as test data
#   docs/runs/cupti.sh cost OUT                # capture cost: large/16, medium/4, large/32
#   docs/runs/cupti.sh launch NAME PRESET BATCH OUT   # one default-mode launch into OUT/NAME
# A launch: fsdp1,fsdp2,fsdp2-compile, 20 timed steps, --repeats 3, 3 recorded steps in the
# default mode, then report, check and diff fsdp1 fsdp2 beside its manifest; packed as
# OUT/NAME.tgz (traces with their names/ steps).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
quiet() { grep -v -e USDT -e _warn_once -e "Profiler clears"; }
part=$1
case $part in
smoke)
  out=$2; mkdir -p "$out"
  timeout 150 tracekit profile --nproc 1 --preset small --variants fsdp1,fsdp2 --steps 5 --profile-steps 2 \
    --no-report --out "$out/small-cupti" 2>&1 | quiet
  tracekit check "$out/small-cupti" 2>&1 | tail -5
  tar czf "$out/small-cupti.tgz" -C "$out" small-cupti ;;
cost)
  out=$2; mkdir -p "$out"
  for pb in "large 16" "medium 4" "large 32"; do
    set -- $pb
    timeout 200 torchrun --nproc-per-node 1 benchmarks/capture_cost.py --preset "$1" --batch "$2" --rounds "${ROUNDS:-6}" \
      --steps 5 --modes "${MODES:-timers,cupti,device}" > "$out/capture-cost-$1-$2.json" 2> "$out/capture-cost-$1-$2.err"
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], {m: v['ratio_to_bare'] for m, v in d['modes'].items()}, d['activities_per_step'].get('cupti', [None])[:1])" "$out/capture-cost-$1-$2.json" || tail -3 "$out/capture-cost-$1-$2.err"
  done ;;
launch)
  name=$2 preset=$3 batch=$4 out=$5; mkdir -p "$out"
  echo "$name: $(date -u +%T)"
  timeout "${LIMIT:-400}" tracekit profile --nproc 1 --preset "$preset" --batch "$batch" \
    --variants fsdp1,fsdp2,fsdp2-compile --steps 20 --profile-steps 3 --repeats 3 --no-report --out "$out/$name" 2>&1 | quiet
  tracekit check "$out/$name" --format json > "$out/$name/check.json" 2> "$out/$name/check.err"
  tracekit diff "$out/$name/fsdp1" "$out/$name/fsdp2" > "$out/$name/diff.txt" 2>&1
  tar czf "$out/$name.tgz" -C "$out" "$name" ;;
esac
