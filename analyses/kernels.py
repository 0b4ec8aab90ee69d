"""`tracekit kernels`: the device work of each step on each device grouped by kernel name,
launching CPU op, both (`op,name`: which kernels each op launched, TraceLens' kernel
launchers) or category — `nsys stats`' `cuda_gpu_kern_sum` per step.

- The activities: the step's kernels, memcpy and memset on the device (launch correlation, as
  every verb), or the whole trace's with scope `trace` (`timeline.activities`).
- Per group: count, total_ns (Σ end − start), mean_ns (total / count, rounded to whole ns),
  pct_of_busy (total / the step's gpu_busy_ns × 100, 2 decimals: time on several streams at once
  counts in each, so the shares may add up to more than 100), category and coll_kind (the
  group's own when all its activities share one, else `mixed`; by name they always do).
- tflops and pct_peak: the group's FLOPs from the recorded shapes (`flops.py`) over its
  kernels' time (memcpy and memset left out: an op's FLOPs over its compute time), and that
  over the device's peak for its dtype (`peaks.py`); null where unknown, and pct_peak null for
  memory-bound kernels (`flops.MEMORY_BOUND`). peak_sku: the row of the peaks table used.
- Groups are ordered by total_ns, largest first; `top` keeps the first N of each step.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.flops import MEMORY_BOUND, device_peaks, roofline
from tracekit.analyses.phases import launch_context
from tracekit.analyses.summary import scoped, step_rows
from tracekit.analyses.timeline import activities, figures, innermost_frames, kept, short_frame, timeline
from tracekit.core.model import Trace

BY = ("name", "op", "op,name", "category")


def shared(column: str) -> pl.Expr:
    """The group's one value of `column` (null when all null), else `mixed`."""
    values = pl.col(column).drop_nulls().unique()
    return pl.when(values.len() > 1).then(pl.lit("mixed")).otherwise(values.first()).alias(column)


def kernels(trace: Trace, by: str = "name", scope: str = "step", peaks: dict | None = None) -> pl.DataFrame:
    """One row per step and device: gpu_busy_ns, peak_sku (the row of the peaks table its
    pct_peak uses, `unknown: <name>` for a device the table lacks, null where the trace names
    no device) and `kernels`, a ledger of the groups [{<by> (op and name for `op,name`),
    category, coll_kind, count, total_ns, mean_ns, pct_of_busy, tflops, pct_peak}],
    largest total first (a step without device work: one row, device and figures null).
    tflops: the FLOPs (`flops.py`) of the group's kernels over their time (memcpy and memset
    left out), null where any of those kernels' FLOPs is unknown or the group has none;
    pct_peak: those FLOPs over what the kernels' peaks allow in their time, Σ FLOPs / Σ (time ×
    the device's peak for the kernel's dtype) × 100 (= tflops / peak where the group has one
    peak; `peaks`: the table, default `peaks.PEAKS`), null where a peak is unknown or any
    kernel is memory-bound (`flops.MEMORY_BOUND`)."""
    work = scoped(activities(trace, scope), scope)
    if by in ("op", "op,name"):
        work = (work.join(launch_context(trace).select("row", "op"), on="row", how="left")
                .join(launch_frames(trace), on="row", how="left").with_columns(op=pl.coalesce("op", "frame")))
    work = work.join(roofline(trace, peaks).select("row", "flops", "family", peak="peak_tflops"), on="row", how="left")
    key = ["category", "coll_kind"] if by == "category" else by.split(",")
    busy = figures(timeline(trace, scope).coarse).select("step", "device", "gpu_busy_ns")
    compute = pl.col("kind") == "kernel"
    groups = (work.group_by("step", "device", *key)
              .agg(*[shared(c) for c in ("category", "coll_kind") if c not in key],
                   count=pl.len().cast(pl.Int64), total_ns=(pl.col("end") - pl.col("start")).sum(),
                   _flops=pl.when(compute.any() & (pl.col("flops").filter(compute).null_count() == 0))
                   .then(pl.col("flops").filter(compute).sum()),
                   _kernel_ns=(pl.col("end") - pl.col("start")).filter(compute).sum(),
                   _attainable=pl.when((pl.col("peak").filter(compute).null_count() == 0)
                                       & ~pl.col("family").is_in(MEMORY_BOUND).any())
                   .then(((pl.col("end") - pl.col("start")) * pl.col("peak") * 1e3).filter(compute).sum()))
              .join(busy, on=["step", "device"], how="left", nulls_equal=True)
              .with_columns(mean_ns=(pl.col("total_ns") / pl.col("count")).round().cast(pl.Int64),
                            pct_of_busy=(pl.col("total_ns") / pl.col("gpu_busy_ns") * 100).round(2),
                            tflops=pl.when(pl.col("_kernel_ns") > 0)
                            .then((pl.col("_flops") / pl.col("_kernel_ns") / 1e3).round(2)))
              .with_columns(pct_peak=pl.when(pl.col("tflops").is_not_null() & (pl.col("_attainable") > 0))
                            .then((pl.col("_flops") / pl.col("_attainable") * 100).round(2)))
              .sort("step", "device", pl.col("total_ns"), *key, descending=[False, False, True, *[False] * len(key)],
                    nulls_last=True))
    fields = [*key, *[c for c in ("category", "coll_kind") if c not in key], "count", "total_ns", "mean_ns",
              "pct_of_busy", "tflops", "pct_peak"]
    table = (groups.group_by("step", "device", maintain_order=True)
             .agg(pl.col("gpu_busy_ns").first(), kernels=pl.struct(*fields))
             .join(device_peaks(trace, peaks).select("device", "peak_sku"), on="device", how="left")
             .select("step", "device", "gpu_busy_ns", "peak_sku", "kernels"))
    empty = pl.lit([], table.schema["kernels"])
    return (step_rows(trace, scope).select("step", "device")  # every step, with device work or not
            .join(table, on=["step", "device"], how="left", nulls_equal=True)
            .with_columns(pl.when(pl.col("device").is_not_null()).then(pl.col("kernels").fill_null(empty))))


NO_CALL = "(no launching call in the trace)"
NOTHING_ENCLOSES = "(no op, frame or annotation encloses its launch)"


def launch_frames(trace: Trace) -> pl.DataFrame:
    """row (into trace.gpu) and frame: what `--by op` names for device work that no CPU op
    launched — the innermost Python frame (`python: <frame>`) or annotation (`annotation:
    <name>`, ProfilerStep# left out) enclosing its launching call, of those that say something
    (`timeline.innermost_frames`, named by `timeline.short_frame`: a CUDA graph replay under
    `cuda/graphs.py(139): replay`,
    a `load_inline` kernel under its Python caller); else why there is none: `NO_CALL` (launched
    before the trace began, or a recording without runtime calls) or `NOTHING_ENCLOSES`."""
    name = pl.col("name")
    frame = short_frame(name)
    marked = trace.ops.filter(((pl.col("cat") == "python_function") | (pl.col("cat") == "user_annotation"))
                              & ~name.str.starts_with("ProfilerStep#")).select(
        "tid", "start", "end", name=pl.when(pl.col("cat") == "python_function").then(pl.lit("python: ") + frame)
        .otherwise(pl.lit("annotation: ") + name))
    frames = kept(trace, ("kernels", "launch-frames"), lambda: innermost_frames(marked).sort("tid", "start"))
    calls = (trace.calls.drop_nulls("correlation").unique("correlation")
             .select("correlation", "tid", c_start="start").sort("tid", "c_start"))
    framed = calls.join_asof(frames.rename({"start": "f_start"}), left_on="c_start", right_on="f_start", by="tid",
                             strategy="backward", check_sortedness=False)
    framed = framed.select("correlation", frame=pl.when(pl.col("end") > pl.col("c_start")).then("name"))
    gpu = trace.gpu.with_row_index("row").select("row", "correlation").join(framed, on="correlation", how="left")
    return gpu.select("row", frame=pl.when(pl.col("frame").is_not_null()).then("frame")
                      .when(pl.col("correlation").is_in(calls["correlation"].implode())).then(pl.lit(NOTHING_ENCLOSES))
                      .otherwise(pl.lit(NO_CALL)))


def top(frame: pl.DataFrame, n: int | None) -> pl.DataFrame:
    """`frame` with each step's ledger cut to its `n` largest totals (all with None)."""
    if n is None:
        return frame
    total = pl.element().struct.field("total_ns")
    return frame.with_columns(pl.col("kernels").list.eval(pl.element().sort_by(total, descending=True,
                                                                               maintain_order=True).head(n)))
