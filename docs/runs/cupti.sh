#!/usr/bin/env bash
# The `cupti` capture mode's runs (docs/runs/README.md, "Recording straight from CUPTI"), on a
# lent one-H200 machine, from a checkout installed there (wheels carried, cupti-python among them):
#   docs/runs/cupti.sh smoke OUT               # a small two-variant run kept as test data
#   docs/runs/cupti.sh cost OUT                # capture cost: large/16, medium/4, large/32
#   docs/runs/cupti.sh ab OUT                  # cupti against cupti-bare (no marks), many rounds:
#                                              # large/16, medium/4, large/16 fsdp2-compile
#   docs/runs/cupti.sh launch NAME PRESET BATCH OUT   # one default-mode launch into OUT/NAME
# A launch: fsdp1,fsdp2,fsdp2-compile, 20 timed steps, --repeats ${REPEATS:-3}, ${PROFILE_STEPS:-1} recorded
# step(s) in the default mode (cupti, in its default rounds), then report, check and diff fsdp1 fsdp2 beside
# its manifest; packed as OUT/NAME.tgz (traces with their names/ steps).
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
ab)
  out=$2; mkdir -p "$out"
  # one process each, no torchrun: `timeout` then stops the benchmark itself; --budget-s ends it
  # with the rounds it has (each round: bare, cupti-bare, bare, cupti, bare, alternated)
  export MASTER_ADDR=127.0.0.1 MASTER_PORT=29541 RANK=0 LOCAL_RANK=0 WORLD_SIZE=1
  # AB_RUNS: "preset batch variant seconds" items, comma-separated
  IFS=, read -ra runs <<< "${AB_RUNS:-large 16 fsdp2 95,medium 4 fsdp2 60,large 16 fsdp2-compile 60}"
  for pbv in "${runs[@]}"; do
    set -- $pbv
    name="ab-$1-$2-$3"
    timeout $(( $4 + 150 )) python3 benchmarks/capture_cost.py --preset "$1" --batch "$2" --variant "$3" --steps 5 \
      --rounds 40 --budget-s "$4" --modes "${AB_MODES:-cupti-bare,cupti}" > "$out/$name.json" 2> "$out/$name.err"
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], d['rounds'], {m: (v['ratio_to_bare'], v['median_95']) for m, v in d['modes'].items()})" "$out/$name.json" || tail -3 "$out/$name.err"
  done ;;
launch)
  name=$2 preset=$3 batch=$4 out=$5; mkdir -p "$out"
  echo "$name: $(date -u +%T)"
  timeout "${LIMIT:-400}" tracekit profile --nproc 1 --preset "$preset" --batch "$batch" \
    --variants fsdp1,fsdp2,fsdp2-compile --steps 20 --profile-steps "${PROFILE_STEPS:-1}" --repeats "${REPEATS:-3}" \
    --no-report --out "$out/$name" 2>&1 | quiet
  tracekit check "$out/$name" --format json > "$out/$name/check.json" 2> "$out/$name/check.err"
  tracekit diff "$out/$name/fsdp1" "$out/$name/fsdp2" > "$out/$name/diff.txt" 2>&1
  echo "$name done: $(date -u +%T)"
  python3 -c "
import json, sys
for v, d in json.load(open(sys.argv[1]))['variants'].items():
    r = (d.get('ranks') or [{}])[0]
    print(v, d['status'], 'recorded/control', r.get('profiler_overhead'), r.get('profiler_overhead_by_round'),
          'recorded/timed', r.get('recorded_to_timed'),
          'recorded', [round(x) for x in r.get('profiled_step_ms', [])], 'control', [round(x) for x in r.get('control_step_ms', [])])
" "$out/$name/manifest.json"
  tail -3 "$out/$name/check.json"; grep -i -m3 "unexplained\|outside" "$out/$name/diff.txt"
  tar czf "$out/$name.tgz" -C "$out" "$name" ;;
esac
