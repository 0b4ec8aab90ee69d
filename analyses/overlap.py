"""`tracekit overlap`: compute/communication overlap per rank, step and device.

The timeline's figures (`timeline.figures`, docs/metrics.md): comm_ns, compute_ns,
overlap_ns, overlap_pct, exposed_comm_ns (communication not hidden by compute) and
comm_alone_ns (communication with nothing else of the step running).

Scope `trace` is HTA's `get_comm_comp_overlap` definition at ns: every activity of the trace,
per device, step null. Scope `hta` is exactly what HTA 0.5 computes: every row is first
shrunk to whole µs (start rounded up, end rounded down; rows left empty vanish), and the rows
HTA takes from the GPU timeline include CUPTI's `cuda_sync` records that carry a stream,
which HTA's name rules class as computation ("Stream Wait Event") or as neither (names
containing "Sync"); its comm is a kernel named `^nccl…Kernel`. Both are projections of a
timeline: the `hta` one of a timeline built from those rows.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from tracekit.analyses.summary import step_rows
from tracekit.analyses.timeline import figures, timeline
from tracekit.core.model import Trace

COLUMNS = ("comm_ns", "compute_ns", "overlap_ns", "overlap_pct", "exposed_comm_ns", "comm_alone_ns")
HTA_COMM = r"^nccl.*Kernel"
HTA_NOT_COMPUTE = r"^nccl.*Kernel|Memcpy|^Memset|Sync"  # HTA's NCCL_COMPUTE_KERNEL_RE, as it matches


def overlap(trace: Trace, scope: str = "step") -> pl.DataFrame:
    """One row per step and device (whole-trace scopes `trace`, `launched` and `hta` (HTA 0.5's
    figure): per device, step null); null figures without device work."""
    if scope == "hta":
        trace, scope = hta_rows(trace), "trace"
    table = step_rows(trace, scope).join(figures(timeline(trace, scope).coarse), on=["step", "device"],
                                         how="left", nulls_equal=True)
    zero = [pl.when(pl.col("device").is_not_null()).then(pl.col(c).fill_null(0))  # zero-length work
            for c in COLUMNS if c != "overlap_pct"]
    return table.select("step", "device", *COLUMNS).with_columns(zero)


def hta_rows(trace: Trace) -> Trace:
    """The trace as HTA 0.5 sees it for overlap: kernels and stream-carrying cuda_sync records,
    each shrunk to whole µs, classed by HTA's name rules."""
    marks = trace.marks.filter((pl.col("cat") == "cuda_sync") & (pl.col("stream") >= 0))
    rows = pl.concat([trace.gpu.filter(pl.col("kind") == "kernel").select("name", "device", "start", "end"),
                      marks.select("name", "device", "start", "end")], how="vertical_relaxed")
    name = pl.col("name")
    rows = rows.with_columns(
        start=(pl.col("start") + 999) // 1000 * 1000, end=pl.col("end") // 1000 * 1000,
        device=pl.col("device").fill_null(0), kind=pl.lit("kernel"), step=pl.lit(None, pl.Int64), coll_kind=pl.lit(None, pl.String),
        correlation=pl.lit(None, pl.Int64),  # HTA takes every row, launched in the trace or not
        category=pl.when(name.str.contains(HTA_COMM)).then(pl.lit("comm"))
        .when(~name.str.contains(HTA_NOT_COMPUTE)).then(pl.lit("compute")).otherwise(pl.lit("memset")),
    ).filter(pl.col("end") > pl.col("start"))
    return replace(trace, gpu=rows, derived={})
