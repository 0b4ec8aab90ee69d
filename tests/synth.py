"""Synthetic Kineto traces whose right answers are known exactly (times in µs, as Kineto)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

CPU_PID, MAIN_TID = 100, 100


def step(n, ts, dur, tid=MAIN_TID):
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": CPU_PID, "tid": tid,
            "ts": ts, "dur": dur, "args": {"External id": 10_000 + n}}


def op(name, ts, dur, tid=MAIN_TID, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": CPU_PID, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def call(name, ts, dur, corr, tid=MAIN_TID, cat="cuda_runtime"):
    return {"ph": "X", "cat": cat, "name": name, "pid": CPU_PID, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "External id": corr}}


def kernel(name, ts, dur, corr, stream=7, cat="kernel", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "External id": corr, "stream": stream, "device": 0, **args}}


def launched(name, call_ts, kernel_ts, kernel_dur, corr, stream=7, **args):
    """A cudaLaunchKernel call (1 µs) and the kernel it launched."""
    return [call("cudaLaunchKernel", call_ts, 1, corr), kernel(name, kernel_ts, kernel_dur, corr, stream, **args)]


def nccl(kind, call_ts, ts, dur, corr, stream=21, nelems=1024, dtype="Float", group=2, pg="0"):
    names = {"all_gather": ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "_allgather_base"),
             "reduce_scatter": ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                                "_reduce_scatter_base"),
             "all_reduce": ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "allreduce")}
    kname, coll = names[kind]
    out = nelems * group if kind == "all_gather" else nelems // group if kind == "reduce_scatter" else nelems
    args = {"Collective name": coll, "In msg nelems": nelems, "Out msg nelems": out, "Group size": group,
            "dtype": dtype, "Process Group Name": pg, "Process Group Ranks": "[0, 1]"}
    return [call("cuLaunchKernelEx", call_ts, 1, corr, cat="cuda_driver"), kernel(kname, ts, dur, corr, stream, **args)]


def doc(events, rank=0, world_size=2):
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
            "deviceProperties": [], "traceEvents": events}


def write(directory: Path, name: str, document) -> Path:
    path = Path(directory) / name
    data = json.dumps(document).encode()
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return path
