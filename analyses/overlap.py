"""`tracekit overlap`: compute/communication overlap per rank and step.

Over the GPU activities a step launched (ns):
- comm_ns = |C|, C = union of collective kernels; compute_ns = |K|, K = union of the other
  kernels (memcpy/memset excluded);
- overlap_ns = |C ∩ K| = |C| + |K| − |C ∪ K|; overlap_pct = overlap_ns / comm_ns × 100;
- exposed_comm_ns = |C \\ O| = |C ∪ O| − |O|, O = union of everything else the step ran on the
  GPU (kernels and memcpy/memset).

`overlap_trace_scope` computes HTA's `get_comm_comp_overlap` over the whole trace (every step
and none): comm = kernels whose name starts with `nccl…Kernel`, compute = the other kernels,
overlap_pct = |C ∩ K| / |C| × 100, at ns resolution. With `hta_rounding` it computes exactly
what HTA 0.5 does: every row is first shrunk to whole µs (start rounded up, end rounded down;
rows left empty vanish), and the rows HTA takes from the GPU timeline include CUPTI's
`cuda_sync` records that carry a stream, which HTA's name rules class as computation
("Stream Wait Event") or as neither (names containing "Sync").
"""

from __future__ import annotations

import polars as pl

from tracekit.intervals import union_ns
from tracekit.model import Trace


def _unions(frame: pl.DataFrame, by: list[str], parts: dict[str, pl.Expr]) -> pl.DataFrame:
    """Per group, the union length of each named subset."""
    out = frame.select(by).unique()
    for name, cond in parts.items():
        out = out.join(union_ns(frame.filter(cond), by, name), on=by, how="left")
    return out.with_columns(pl.col(name).fill_null(0) for name in parts)


def _figures(table: pl.DataFrame) -> pl.DataFrame:
    return table.with_columns(
        overlap_ns=pl.col("comm_ns") + pl.col("compute_ns") - pl.col("comm_or_compute"),
        exposed_comm_ns=pl.col("comm_or_other") - pl.col("other"),
    ).with_columns(
        overlap_pct=pl.when(pl.col("comm_ns") > 0).then((pl.col("overlap_ns") / pl.col("comm_ns") * 100).round(2)),
    ).select(*[c for c in table.columns if c in ("step",)], "comm_ns", "compute_ns", "overlap_ns", "overlap_pct",
             "exposed_comm_ns")


PARTS = {
    "comm_ns": pl.col("category") == "comm",
    "compute_ns": pl.col("category") == "compute",
    "comm_or_compute": pl.col("category").is_in(["comm", "compute"]),
    "other": pl.col("category") != "comm",
    "comm_or_other": pl.lit(True),
}


def overlap(trace: Trace) -> pl.DataFrame:
    """One row per step: comm_ns, compute_ns, overlap_ns, overlap_pct, exposed_comm_ns
    (null GPU figures on steps without GPU work)."""
    gpu = trace.gpu.filter(pl.col("step").is_not_null())
    table = _figures(_unions(gpu, ["step"], PARTS)) if gpu.height else None
    steps = trace.steps.select("step")
    return steps.join(table, on="step", how="left").sort("step") if table is not None else \
        steps.with_columns(**{c: pl.lit(None, pl.Int64) for c in
                              ("comm_ns", "compute_ns", "overlap_ns", "overlap_pct", "exposed_comm_ns")})


HTA_COMM = r"^nccl.*Kernel"
HTA_NOT_COMPUTE = r"^nccl.*Kernel|Memcpy|^Memset|Sync"  # HTA's NCCL_COMPUTE_KERNEL_RE, as it matches


def overlap_trace_scope(trace: Trace, hta_rounding: bool = False) -> pl.DataFrame:
    """HTA's definition over the whole trace: one row, step null."""
    rows = trace.gpu.filter(pl.col("kind") == "kernel").select("name", "start", "end")
    if hta_rounding:
        marks = trace.marks.filter((pl.col("cat") == "cuda_sync") & (pl.col("stream") >= 0))
        rows = pl.concat([rows, marks.select("name", "start", "end")]).with_columns(
            start=(pl.col("start") + 999) // 1000 * 1000, end=pl.col("end") // 1000 * 1000,
        ).filter(pl.col("end") > pl.col("start"))
    name = pl.col("name")
    rows = rows.with_columns(
        category=pl.when(name.str.contains(HTA_COMM)).then(pl.lit("comm"))
        .when(~name.str.contains(HTA_NOT_COMPUTE)).then(pl.lit("compute")).otherwise(pl.lit("other")),
        scope=pl.lit(0))
    table = _figures(_unions(rows, ["scope"], PARTS)) if rows.height else pl.DataFrame(
        {c: [None] for c in ("comm_ns", "compute_ns", "overlap_ns", "overlap_pct", "exposed_comm_ns")})
    return table.select(pl.lit(None, pl.Int64).alias("step"), pl.all())
