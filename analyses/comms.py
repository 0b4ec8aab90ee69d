"""`tracekit comms`: collectives per rank, step and process group.

- bytes: the collective's message size in the nccl-tests convention: max(In, Out msg nelems)
  × dtype size — the gathered output of an all-gather, the input of a reduce-scatter, the
  buffer of an all-reduce. From the args Kineto copies onto the NCCL kernel, else from the
  `record_param_comms` op with the same External id.
- kernel_ns: the kernel's duration. algbw = bytes / kernel_ns (GB/s = bytes/ns);
  busbw = algbw × (n−1)/n for all-gather and reduce-scatter, × 2(n−1)/n for all-reduce,
  × 1 otherwise (n = group size).
- On CPU-only traces (gloo) the collectives are the CPU ops (`record_param_comms`, else the
  `c10d::` ops), their duration standing in for kernel time; bytes only where the op has the
  element counts.
- Across the ranks of a run the i-th collective of a process group (launch order: correlation
  id) on each rank is the same collective: transfer_ns = its minimum kernel duration over the
  ranks, wait_ns = kernel_ns − transfer_ns (time spent waiting for peers).
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.counts import known_sum
from tracekit.analyses.summary import collective_ops
from tracekit.loading import COMM_ARGS
from tracekit.model import Trace

DTYPE_BYTES = {
    "Float": 4, "float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Short": 2,
    "Char": 1, "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1, "ComplexFloat": 8, "ComplexDouble": 16,
}


def collective_kernels(trace: Trace) -> pl.DataFrame:
    """One row per collective kernel: step, pg, coll_kind, dtype, group_size, bytes, stream,
    start, end, kernel_ns, algbw_gbps, busbw_gbps, seq (launch order within the pg). On a
    CPU-only trace (gloo) the collective's CPU op stands in for the kernel (stream null)."""
    if trace.has_gpu:
        kernels = trace.gpu.filter(pl.col("category") == "comm")
        ops = trace.ops.filter(pl.col("name") == "record_param_comms").select(
            "ext_id", *[pl.col(c).alias(f"{c}_op") for c in COMM_ARGS]).unique("ext_id")
        kernels = kernels.join(ops, on="ext_id", how="left").with_columns(
            pl.coalesce(c, f"{c}_op").alias(c) for c in COMM_ARGS)
    else:
        kernels = collective_ops(trace).with_columns(stream=pl.lit(None, pl.Int64),
                                                      correlation=pl.col("start"))
    n = pl.col("group_size").cast(pl.Float64)
    factor = (pl.when(pl.col("coll_kind").is_in(["all_gather", "reduce_scatter"])).then((n - 1) / n)
              .when(pl.col("coll_kind") == "all_reduce").then(2 * (n - 1) / n).otherwise(1.0))
    out = kernels.select(
        "step", pl.col("pg_name").fill_null("?").alias("pg"), "coll_kind", "dtype", "group_size",
        (pl.max_horizontal("in_nelems", "out_nelems") * pl.col("dtype").replace_strict(DTYPE_BYTES, default=None))
        .alias("bytes"),
        "stream", "start", "end", "correlation", (pl.col("end") - pl.col("start")).alias("kernel_ns"),
    ).with_columns(algbw_gbps=pl.col("bytes") / pl.col("kernel_ns"))
    out = out.with_columns(busbw_gbps=pl.col("algbw_gbps") * factor)
    return out.sort("correlation").with_columns(seq=pl.int_range(pl.len()).over("pg")).drop("correlation")


def matched_across_ranks(per_rank: list[pl.DataFrame]) -> list[pl.DataFrame]:
    """Each rank's collective kernels with transfer_ns and wait_ns, matching (pg, seq) over ranks."""
    if not per_rank:
        return []
    together = pl.concat([f.select("pg", "seq", "kernel_ns") for f in per_rank])
    transfer = together.group_by("pg", "seq").agg(transfer_ns=pl.col("kernel_ns").min(),
                                                  ranks=pl.len())
    complete = len(per_rank)
    return [f.join(transfer, on=["pg", "seq"], how="left").with_columns(
                transfer_ns=pl.when(pl.col("ranks") == complete).then(pl.col("transfer_ns")))
            .with_columns(wait_ns=pl.col("kernel_ns") - pl.col("transfer_ns")).drop("ranks")
            for f in per_rank]


def census(kernels: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """One row per step: `collectives` = [{pg, kind, dtype, count, bytes, kernel_ns, stream,
    algbw_gbps, busbw_gbps, transfer_ns, wait_ns}] (bandwidths from summed bytes and time)."""
    if "transfer_ns" not in kernels.columns:
        kernels = kernels.with_columns(transfer_ns=pl.lit(None, pl.Int64), wait_ns=pl.lit(None, pl.Int64))
    rows = (kernels.filter(pl.col("step").is_not_null())
            .group_by("step", "pg", pl.col("coll_kind").alias("kind"), "dtype", "stream")
            .agg(count=pl.len().cast(pl.Int64), bytes=known_sum("bytes"), kernel_ns=pl.col("kernel_ns").sum(),
                 busbw_factor=(pl.col("busbw_gbps") / pl.col("algbw_gbps")).first(),
                 transfer_ns=known_sum("transfer_ns"), wait_ns=known_sum("wait_ns"))
            .with_columns(algbw_gbps=(pl.col("bytes") / pl.col("kernel_ns")).round(3))
            .with_columns(busbw_gbps=(pl.col("algbw_gbps") * pl.col("busbw_factor")).round(3))
            .drop("busbw_factor")
            .sort("step", "pg", "kind"))
    per_step = rows.group_by("step", maintain_order=True).agg(collectives=pl.struct(
        "pg", "kind", "dtype", "count", "bytes", "kernel_ns", "stream", "algbw_gbps", "busbw_gbps",
        "transfer_ns", "wait_ns"))
    return steps.select("step").join(per_step, on="step", how="left").sort("step")


def comms(traces: list[Trace]) -> list[pl.DataFrame]:
    """Per trace, the per-step census; traces of one run are matched across ranks."""
    kernels = matched_across_ranks([collective_kernels(t) for t in traces]) if len(traces) > 1 \
        else [collective_kernels(t) for t in traces]
    return [census(k, t.steps) for k, t in zip(kernels, traces)]
