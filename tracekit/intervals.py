"""Interval algebra on polars frames with integer `start`/`end` columns (ns, end exclusive).

- `union_ns`: the length of the union of the intervals of each group.
- |A ∩ B| = |A| + |B| − |A ∪ B|, and |A \\ B| = |A ∪ B| − |B|: every overlap figure is a sum
  of union lengths.
"""

from __future__ import annotations

import polars as pl


def merged(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """The union of each group's intervals as disjoint, sorted runs (by..., start, end)."""
    if frame.height == 0:
        return frame.select(*by, "start", "end")

    def per_group(expr: pl.Expr) -> pl.Expr:
        return expr.over(by) if by else expr

    return (
        frame.select(*by, "start", "end")
        .sort([*by, "start"])
        .with_columns(reach=per_group(pl.col("end").cum_max().shift(1)))
        .with_columns(run=per_group((pl.col("reach").is_null() | (pl.col("start") > pl.col("reach"))).cum_sum()))
        .group_by([*by, "run"], maintain_order=True)
        .agg(start=pl.col("start").min(), end=pl.col("end").max())
        .drop("run")
    )


def union_ns(frame: pl.DataFrame, by: list[str], name: str = "ns") -> pl.DataFrame:
    """Per group of `by`: total length of the union of its intervals (ns)."""
    runs = merged(frame, by)
    return runs.group_by(by).agg(((pl.col("end") - pl.col("start")).sum()).alias(name))
