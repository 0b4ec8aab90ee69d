#!/usr/bin/env bash
# What a host gives N processes at once (issue 29: eight ranks against one alone): each process
# does a fixed piece of work after one start signal; printed: every process's seconds, sorted.
#   bash benchmarks/host_share.sh
cd "$(dirname "$0")/.."
lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|Model name|NUMA node|L3|CPU max MHz|Hypervisor)"; nproc
go() { local label=$1 kind=$2 n=$3; rm -f /tmp/go; local pids=() outs=()
  for k in $(seq $n); do python3 benchmarks/host_share_work.py $kind /tmp/go > /tmp/s$k & pids+=($!); outs+=(/tmp/s$k); done
  sleep 3; touch /tmp/go; wait "${pids[@]}"; echo "$label x$n: $(cat "${outs[@]}" | sort -n | tr '\n' ' ')"; }
for r in 1 2; do for n in 1 2 4 8 12 16; do go cpu cpu $n; done; done
for r in 1 2; do for n in 1 4 8 16; do go mem mem $n; done; done
python3 - <<'PY'
import time, numpy as np
for i in range(3):
    t = time.perf_counter(); a = np.ones(1 << 27); print(f"first touch of 1 GB, round {i}: {time.perf_counter() - t:.3f} s"); del a
PY
