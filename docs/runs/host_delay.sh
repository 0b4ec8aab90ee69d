#!/usr/bin/env bash
# The injected-host-delay oracle of issue 64 (docs/metrics.md, "Recorded steps named from the full
# step"), on a lent one-GPU machine, from a checkout installed there (cupti-python among the wheels):
#   docs/runs/host_delay.sh OUT            # A, B and A again; diff A B and A A; the verdicts
#   docs/runs/host_delay.sh fsdp OUT       # fsdp1,fsdp2,fsdp2-compile at large/16; diff fsdp1 fsdp2
# A is examples/host_delay.py:plain, B :delayed — the same residual MLP stack, B busy-waiting
# DELAY_MS (default 5, env TRACEKIT_EXAMPLE_DELAY_MS) in the record_function region
# `example::host_delay` before block 2's forward. Each is its own `tracekit profile` (fsdp2, one GPU,
# the default `cupti` recording with its names/ step). Pass: B − A's largest idle item is
# `host: example::host_delay`, its Δ within ±15 % of DELAY_MS and its spread over the steps
# (delta_min_ns … delta_max_ns) excluding 0; A − A has no idle item above 0.5 ms.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
quiet() { grep -v -e USDT -e _warn_once -e "Profiler clears"; }
delay=${TRACEKIT_EXAMPLE_DELAY_MS:-5}
export TRACEKIT_EXAMPLE_DELAY_MS=$delay

if [ "$1" = fsdp ]; then
  out=$2; mkdir -p "$out"
  timeout 500 tracekit profile --nproc 1 --preset large --batch 16 --variants fsdp1,fsdp2,fsdp2-compile \
    --steps 20 --profile-steps 2 --repeats 3 --no-report --out "$out/large-16" 2>&1 | quiet
  tracekit diff "$out/large-16" fsdp1 fsdp2 > "$out/large-16/diff.txt" 2>&1
  tracekit diff --format json --top 100000 "$out/large-16" fsdp1 fsdp2 > "$out/large-16/diff.json" 2>/dev/null
  python3 - "$out/large-16/diff.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
idle = sorted((i for i in d["items"] if i["kind"] == "idle"), key=lambda i: -abs(i["delta_ns"]))[:10]
for i in idle:
    print(f"{i['delta_ns'] / 1e6:+9.3f} ms  {i['name']}  ({i['phase']})")
marks = [i["name"] for i in idle if "tracekit#" in i["name"] or not i["name"].startswith("host: ")]
total = sum(i["delta_ns"] for i in d["items"])
print("PASS" if not marks and total == d["step_delta_ns"] else f"FAIL: {marks}, sum {total} vs {d['step_delta_ns']}")
EOF
  tar czf "$out/large-16.tgz" -C "$out" large-16
  exit 0
fi

out=$1; mkdir -p "$out"
for side in A:plain B:delayed A2:plain; do
  name=${side%%:*} factory=${side#*:}
  timeout 300 tracekit profile --nproc 1 --model examples/host_delay.py:"$factory" --variants fsdp2 \
    --steps 20 --profile-steps 2 --repeats 3 --no-report --out "$out/$name" 2>&1 | quiet
done
tracekit diff "$out/A/fsdp2" "$out/B/fsdp2" > "$out/diff-A-B.txt" 2>&1
tracekit diff --format json --top 100000 "$out/A/fsdp2" "$out/B/fsdp2" > "$out/diff-A-B.json" 2>/dev/null
tracekit diff --format json --top 100000 "$out/A/fsdp2" "$out/A2/fsdp2" > "$out/diff-A-A.json" 2>/dev/null
python3 - "$out" "$delay" <<'EOF'
import json, sys
out, delay_ns = sys.argv[1], float(sys.argv[2]) * 1e6
ab = json.load(open(f"{out}/diff-A-B.json"))
idle = sorted((i for i in ab["items"] if i["kind"] == "idle"), key=lambda i: -abs(i["delta_ns"]))
top = idle[0]
low, high = top.get("delta_min_ns"), top.get("delta_max_ns")
print(f"A−B largest idle item: {top['name']} {top['delta_ns'] / 1e6:+.3f} ms (steps {low} … {high} ns), "
      f"injected {delay_ns / 1e6:.3f} ms")
ok = (top["name"] == "host: example::host_delay" and abs(top["delta_ns"] - delay_ns) <= 0.15 * delay_ns
      and low is not None and low > 0)
aa = json.load(open(f"{out}/diff-A-A.json"))
big = [(i["name"], i["delta_ns"] / 1e6) for i in aa["items"] if i["kind"] == "idle" and abs(i["delta_ns"]) > 500_000]
print("A−A idle items above 0.5 ms:", big or "none")
print("PASS" if ok and not big else "FAIL")
EOF
tar czf "$out/host-delay.tgz" -C "$out" A B A2 diff-A-B.txt diff-A-B.json diff-A-A.json
