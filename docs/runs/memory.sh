#!/usr/bin/env bash
# Memory over the step (issue 68), on a lent GPU machine, from a checkout installed there
# (`pip install --no-deps --no-build-isolation -e .`, wheels carried):
#   docs/runs/memory.sh OUT            # NPROC GPUs (default: every GPU visible)
# One launch: --preset large --batch 16, fsdp1,fsdp2,fsdp2-noreshard, 5 timed steps, one recorded
# step, then the memory step (allocator history). Writes beside its manifest memory.json,
# memory.txt, report.json and diff.json (fsdp2 → fsdp2-noreshard), then checks the acceptance
# and exits 1 where it fails:
# - per rank, the categories at the peak add up to the allocator's own peak over the memory
#   step (torch.cuda.max_memory_allocated) within 1 %;
# - parameters, gradients (at the optimizer phase's peak) and AdamW state agree with the
#   parameter count of the large preset within 2 %: fp32 master weights and gradients
#   (bf16 compute, fp32 reduction), 4 B each, two fp32 moments, 8 B, per element held
#   (1/world of them under FSDP);
# - fsdp2-noreshard's peak is above fsdp2's, and unsharded parameters are the largest part of it.
# Packs what comes back (traces left out).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
out=$1/memory-large-16
nproc=${NPROC:-$(python -c "import torch; print(torch.cuda.device_count())")}
timeout "${LIMIT:-520}" tracekit profile --nproc "$nproc" --preset large --batch 16 \
  --variants fsdp1,fsdp2,fsdp2-noreshard --steps 5 --profile-steps 1 --no-report --out "$out" 2>&1 \
  | grep -v -e USDT -e _warn_once -e "Profiler clears"
tracekit memory "$out" --format json > "$out/memory.json" 2> "$out/memory.err"
tracekit memory "$out" > "$out/memory.txt" 2>&1
tracekit report "$out" --format json > "$out/report.json" 2> "$out/report.err"
tracekit diff "$out" fsdp2 fsdp2-noreshard --format json > "$out/diff.json" 2> "$out/diff.err"
python - "$out" "$nproc" <<'EOF' | tee "$out/acceptance.txt"
import json, sys
import torch
from tracekit.runners.model import Transformer, model_config

out, world = sys.argv[1], int(sys.argv[2])
with torch.device("meta"):
    numel = sum(p.numel() for p in Transformer(model_config("large", batch=16)).parameters())
failed = []

def check(ok, line):
    print(("ok   " if ok else "FAIL ") + line)
    if not ok:
        failed.append(line)

for r in json.load(open(f"{out}/memory.json"))["ranks"]:
    cats = {c["category"]: c["bytes"] for c in r["categories"]}
    total = sum(b for c, b in cats.items() if c != "slack")
    alloc = r["peak"]["allocator_peak_bytes"]
    check(alloc and abs(total - alloc) <= 0.01 * alloc,
          f"{r['variant']} rank {r['rank']}: categories {total} B vs max_memory_allocated {alloc} B")
    held = numel / world
    grads = sum(c["bytes"] for c in r["phase_categories"] if c["phase"] == "optimizer" and c["category"] == "grads")
    for name, got, want in (("params", cats.get("params", 0), 4 * held), ("optimizer", cats.get("optimizer", 0), 8 * held),
                            ("grads (optimizer phase)", grads, 4 * held)):
        check(abs(got - want) <= 0.02 * want, f"{r['variant']} rank {r['rank']}: {name} {got} B vs {want:.0f} B")
rows = json.load(open(f"{out}/diff.json"))["memory"]
peak = next(x for x in rows if x["kind"] == "peak")
largest = max((x for x in rows if x["kind"] == "category" and x["name"] != "slack"), key=lambda x: x["delta_bytes"])
check(peak["delta_bytes"] > 0 and largest["name"] == "params_unsharded",
      f"fsdp2-noreshard − fsdp2: peak {peak['delta_bytes']:+} B, largest part {largest['name']} {largest['delta_bytes']:+} B")
sys.exit(1 if failed else 0)
EOF
status=${PIPESTATUS[0]}
tar czf "$1/memory-large-16-manifests.tgz" -C "$1" --exclude='*.pt.trace.json.gz' memory-large-16
exit "$status"
