"""`tracekit summary`: one row per rank and step.

- cpu_ns: the step's CPU window, ProfilerStep end − start.
- gpu_span_ns: last end − first start of the GPU activities the step launched.
- gpu_busy_ns: length of the union of those activities (any stream, any kind).
- kernels: number of kernel activities the step launched.
- syncs: host-blocking runtime calls in the step's CPU window, by API.
- overlap_pct, exposed_comm_ns: as `tracekit overlap`; idle_ns = gpu_span_ns − gpu_busy_ns,
  which is the sum of the idle parts of `tracekit breakdown` (idle = no activity of the step).
- collectives: by kind; counted from collective kernels on GPU traces, from the collective
  ops on CPU-only traces (`record_param_comms`, else the `c10d::` dispatcher ops).
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.counts import count_columns
from tracekit.analyses.overlap import overlap
from tracekit.analyses.syncs import SYNC_APIS
from tracekit.intervals import union_ns
from tracekit.model import Trace
from tracekit.names import collective_kind

ALWAYS_REPORTED_SYNCS = ("cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize")


def collective_ops(trace: Trace) -> pl.DataFrame:
    """CPU-side collective calls, with their kind: the `record_param_comms` ops where the trace
    has them, else the c10d dispatcher ops (`c10d::_allgather_base_`, `c10d::allreduce_`, …)
    that newer torch records for gloo."""
    records = trace.ops.filter((pl.col("name") == "record_param_comms") & pl.col("collective").is_not_null())
    if records.height:
        return records.with_columns(coll_kind=collective_kind(pl.col("collective")))
    return (trace.ops.filter(pl.col("name").str.starts_with("c10d::"))
            .with_columns(coll_kind=collective_kind(pl.col("name").str.strip_prefix("c10d::")))
            .filter(pl.col("coll_kind").is_not_null()))


def collective_counts(trace: Trace) -> pl.DataFrame:
    """(step, coll_kind, n): from kernels on GPU traces, from ops on CPU-only ones."""
    if trace.has_gpu:
        source = trace.gpu.filter(pl.col("category") == "comm")
    else:
        source = collective_ops(trace)
    return source.filter(pl.col("step").is_not_null()).group_by("step", "coll_kind").agg(n=pl.len())


def sync_counts(trace: Trace) -> pl.DataFrame:
    """(step, api, n) for host-blocking calls."""
    return (trace.calls.filter(pl.col("name").is_in(SYNC_APIS) & pl.col("step").is_not_null())
            .group_by("step", pl.col("name").alias("api")).agg(n=pl.len()))


def gpu_step_table(trace: Trace) -> pl.DataFrame:
    """Per step: gpu_span_ns, gpu_busy_ns, kernels (steps without GPU work are absent)."""
    gpu = trace.gpu.filter(pl.col("step").is_not_null())
    spans = gpu.group_by("step").agg(
        gpu_start=pl.col("start").min(), gpu_end=pl.col("end").max(),
        kernels=(pl.col("kind") == "kernel").sum().cast(pl.Int64),
    ).with_columns(gpu_span_ns=pl.col("gpu_end") - pl.col("gpu_start"))
    return spans.join(union_ns(gpu, ["step"], "gpu_busy_ns"), on="step", how="left")


def summary(trace: Trace) -> pl.DataFrame:
    """One row per step: step, cpu_ns, gpu_span_ns, gpu_busy_ns, kernels,
    `syncs.<api>` and `collectives.<kind>` counts (dotted names nest in JSON)."""
    steps = trace.steps.with_columns(cpu_ns=pl.col("cpu_end") - pl.col("cpu_start"))
    table = steps.join(gpu_step_table(trace), on="step", how="left").sort("step")
    table = table.select("step", "cpu_ns", "gpu_span_ns", "gpu_busy_ns", "kernels")
    if not trace.has_gpu:
        table = table.with_columns(kernels=pl.lit(None, dtype=pl.Int64))
    syncs = sync_counts(trace).rename({"api": "key"})
    apis = list(ALWAYS_REPORTED_SYNCS) + sorted(set(syncs["key"]) - set(ALWAYS_REPORTED_SYNCS))
    colls = collective_counts(trace).select("step", pl.col("coll_kind").fill_null("other").alias("key"), "n")
    table = count_columns(table, syncs, "syncs", apis)
    table = count_columns(table, colls, "collectives", sorted(set(colls["key"])))
    return (table.join(overlap(trace).select("step", "overlap_pct", "exposed_comm_ns"), on="step", how="left")
            .with_columns(idle_ns=pl.col("gpu_span_ns") - pl.col("gpu_busy_ns")))

