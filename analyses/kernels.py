"""`tracekit kernels`: the device work of each step on each device grouped by kernel name,
launching CPU op, both (`op,name`: which kernels each op launched, TraceLens' kernel
launchers) or category — `nsys stats`' `cuda_gpu_kern_sum` per step.

- The activities: the step's kernels, memcpy and memset on the device (launch correlation, as
  every verb), or the whole trace's with scope `trace` (`timeline.activities`).
- Per group: count, total_ns (Σ end − start), mean_ns (total / count, rounded to whole ns),
  pct_of_busy (total / the step's gpu_busy_ns × 100, 2 decimals: time on several streams at once
  counts in each, so the shares may add up to more than 100), category and coll_kind (the
  group's own when all its activities share one, else `mixed`; by name they always do).
- tflops and pct_peak: the group's FLOPs from the recorded shapes (`flops.py`) over its total
  time, and that over the device's peak for its dtype (`peaks.py`); null where unknown.
- Groups are ordered by total_ns, largest first; `top` keeps the first N of each step.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.flops import roofline
from tracekit.analyses.phases import launch_context
from tracekit.analyses.summary import scoped, step_rows
from tracekit.analyses.timeline import activities, figures, timeline
from tracekit.core.model import Trace

BY = ("name", "op", "op,name", "category")


def shared(column: str) -> pl.Expr:
    """The group's one value of `column` (null when all null), else `mixed`."""
    values = pl.col(column).drop_nulls().unique()
    return pl.when(values.len() > 1).then(pl.lit("mixed")).otherwise(values.first()).alias(column)


def kernels(trace: Trace, by: str = "name", scope: str = "step", peaks: dict | None = None) -> pl.DataFrame:
    """One row per step and device: gpu_busy_ns and `kernels`, a ledger of the groups
    [{<by> (op and name for `op,name`), category, coll_kind, count, total_ns, mean_ns,
    pct_of_busy, tflops, pct_peak}],
    largest total first (a step without device work: one row, device and figures null).
    tflops: the group's FLOPs (`flops.py`) over its total time; pct_peak: that over the
    device's peak for the group's dtype × 100 (`peaks`: the table, default `peaks.PEAKS`);
    null where any of the group's FLOPs or the peak is unknown."""
    work = scoped(activities(trace, scope), scope)
    if by in ("op", "op,name"):
        work = work.join(launch_context(trace).select("row", "op"), on="row", how="left")
    work = work.join(roofline(trace, peaks).select("row", "flops", peak="peak_tflops"), on="row", how="left")
    key = ["category", "coll_kind"] if by == "category" else by.split(",")
    busy = figures(timeline(trace, scope).coarse).select("step", "device", "gpu_busy_ns")
    groups = (work.group_by("step", "device", *key)
              .agg(*[shared(c) for c in ("category", "coll_kind") if c not in key],
                   count=pl.len().cast(pl.Int64), total_ns=(pl.col("end") - pl.col("start")).sum(),
                   _flops=pl.when(pl.col("flops").null_count() == 0).then(pl.col("flops").sum()),
                   _peak=pl.when(pl.col("peak").n_unique() == 1).then(pl.col("peak").first()))
              .join(busy, on=["step", "device"], how="left", nulls_equal=True)
              .with_columns(mean_ns=(pl.col("total_ns") / pl.col("count")).round().cast(pl.Int64),
                            pct_of_busy=(pl.col("total_ns") / pl.col("gpu_busy_ns") * 100).round(2),
                            tflops=(pl.col("_flops") / pl.col("total_ns") / 1e3).round(2))
              .with_columns(pct_peak=(pl.col("tflops") / pl.col("_peak") * 100).round(2))
              .sort("step", "device", pl.col("total_ns"), *key, descending=[False, False, True, *[False] * len(key)],
                    nulls_last=True))
    fields = [*key, *[c for c in ("category", "coll_kind") if c not in key], "count", "total_ns", "mean_ns",
              "pct_of_busy", "tflops", "pct_peak"]
    table = groups.group_by("step", "device", maintain_order=True).agg(pl.col("gpu_busy_ns").first(),
                                                                       kernels=pl.struct(*fields))
    empty = pl.lit([], table.schema["kernels"])
    return (step_rows(trace, scope).select("step", "device")  # every step, with device work or not
            .join(table, on=["step", "device"], how="left", nulls_equal=True)
            .with_columns(pl.when(pl.col("device").is_not_null()).then(pl.col("kernels").fill_null(empty))))


def top(frame: pl.DataFrame, n: int | None) -> pl.DataFrame:
    """`frame` with each step's ledger cut to its `n` largest totals (all with None)."""
    if n is None:
        return frame
    total = pl.element().struct.field("total_ns")
    return frame.with_columns(pl.col("kernels").list.eval(pl.element().sort_by(total, descending=True,
                                                                               maintain_order=True).head(n)))
