#!/usr/bin/env bash
# The interleaved comparison's runs (docs/runs/README.md, "Compared in one process"; docs/profile.md,
# "Comparing variants"), on a lent one-GPU machine, from a checkout installed there (wheels carried,
# cupti-python among them; the command is `python3 -m tracekit`):
#   docs/runs/interleave.sh launch NAME PRESET BATCH OUT [ARGS...]
#       fsdp1,fsdp2,fsdp2-compile with the A/A control, the defaults (interleaved: 10 rounds of blocks
#       of 5 steps; cupti recording in 9 rounds) into OUT/NAME; the launch's wall time in OUT/NAME/seconds.
#   docs/runs/interleave.sh sequential NAME PRESET BATCH OUT
#       the same variants the way before this design: --compare sequential --repeats 3, timed the same way.
#   docs/runs/interleave.sh analyse NAME - - OUT
#       report, check and diff fsdp1 fsdp2 of OUT/NAME into OUT/NAME-files/ (here or on the GPU machine).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
tk() { python3 -m tracekit "$@"; }
quiet() { grep -v -e USDT -e _warn_once -e "Profiler clears"; }
part=$1 name=$2 preset=$3 batch=$4 out=$5
shift 5
case $part in
launch) args=(--control "$@") ;;
sequential) args=(--compare sequential --repeats 3 "$@") ;;
analyse)
  files="$out/$name-files"
  mkdir -p "$files"
  cp "$out/$name/manifest.json" "$out/$name/seconds" "$files/"
  tk report "$out/$name" > "$files/report.txt" 2>&1
  tk report --format json "$out/$name" > "$files/report.json" 2> /dev/null
  tk check --format json "$out/$name" > "$files/check.json" 2> "$files/check.err"
  tk diff "$out/$name" fsdp1 fsdp2 > "$files/diff.txt" 2>&1
  tk diff --format json "$out/$name" fsdp1 fsdp2 > "$files/diff.json" 2> /dev/null
  exit 0 ;;
esac
start=$(date +%s.%N)
timeout "${LIMIT:-560}" python3 -m tracekit profile --nproc 1 --preset "$preset" --batch "$batch" \
  --variants fsdp1,fsdp2,fsdp2-compile "${args[@]}" --no-report --out "$out/$name" 2>&1 | quiet | tail -25
python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$start" "$(date +%s.%N)" \
  > "$out/$name/seconds"
echo "$name: $(cat "$out/$name/seconds") s"
