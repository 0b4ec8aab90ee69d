"""`tracekit breakdown`: each step's span on each device, split exactly.

The timeline's segments grouped by (category, cause): compute, comm by collective kind
(exposed communication), memcpy, memset, and idle by its host cause (`timeline.py`,
docs/metrics.md). Parts are integer ns and add up to span_ns; a part's pct is its ns / span_ns
× 100 (2 decimals), its share of its own step, so that `--agg` gives the statistic of the
steps' shares.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.summary import step_rows
from tracekit.analyses.timeline import PRIORITY, timeline
from tracekit.core.model import Trace

ORDER = {c: i for i, c in enumerate([*PRIORITY, "idle"])}
PARTS = pl.List(pl.Struct({"category": pl.String, "cause": pl.String, "ns": pl.Int64, "pct": pl.Float64}))


def parts(segments: pl.DataFrame) -> pl.DataFrame:
    """step, device, category, cause, ns, pct (of the step's span on the device): the partition,
    compute first, then largest first."""
    return (segments.group_by("step", "device", "category", "cause")
            .agg(ns=(pl.col("end") - pl.col("start")).sum())
            .with_columns(pct=(pl.col("ns") / pl.col("ns").sum().over("step", "device") * 100).round(2))
            .sort("step", "device", pl.col("category").replace_strict(ORDER), pl.col("ns"), "cause",
                  descending=[False, False, False, True, False], nulls_last=True))


def breakdown(trace: Trace, scope: str = "step") -> pl.DataFrame:
    """One row per step and device: span_ns and parts [{category, cause, ns, pct}]."""
    table = parts(timeline(trace, scope).segments).group_by("step", "device", maintain_order=True).agg(
        span_ns=pl.col("ns").sum(), parts=pl.struct("category", "cause", "ns", "pct"))
    return (step_rows(trace, scope).select("step", "device")
            .join(table, on=["step", "device"], how="left", nulls_equal=True)
            .with_columns(pl.col("parts").cast(PARTS))
            .with_columns(pl.when(pl.col("device").is_not_null())  # zero-length work
                          .then(pl.col("span_ns").fill_null(0)), pl.when(pl.col("device").is_not_null())
                          .then(pl.col("parts").fill_null(pl.lit([], PARTS)))))


def largest(frame: pl.DataFrame, n: int | None) -> pl.DataFrame:
    """`breakdown`'s frame with each step's `n` largest parts (all with None) and the rest as
    one part, category `other`, cause `<k> more parts`, its ns and pct the sums of theirs: the
    parts still add up to span_ns."""
    if n is None:
        return frame
    ns = pl.element().struct.field("ns")
    kept = pl.col("parts").list.eval(pl.element().sort_by(ns, descending=True, maintain_order=True).head(n))
    rest = pl.col("parts").list.eval(pl.element().sort_by(ns, descending=True, maintain_order=True).slice(n))
    other = pl.struct(category=pl.lit("other"), cause=pl.format("{} more parts", rest.list.len()),
                      ns=rest.list.eval(pl.element().struct.field("ns")).list.sum(),
                      pct=rest.list.eval(pl.element().struct.field("pct")).list.sum().round(2))
    return frame.with_columns(pl.when(rest.list.len() > 0).then(kept.list.concat(pl.concat_list(other)))
                              .otherwise(pl.col("parts")).alias("parts"))
