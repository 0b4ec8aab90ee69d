"""Per-step counts as columns: one `prefix.key` column per key, 0 where a step has none;
sums that stay null when nothing is known."""

from __future__ import annotations

import polars as pl

from tracekit.core.model import ENGINE


def count_columns(table: pl.DataFrame, counts: pl.DataFrame, prefix: str, keys: list[str],
                  on: list[str] = ("step",)) -> pl.DataFrame:
    """`table` with a `prefix.key` Int64 column per key from `counts` (`on` columns, key, n;
    one row per `on` and key), joined on `on` (nulls equal), 0 where `counts` has no such row;
    dotted names nest in JSON. One query, whatever the number of keys."""
    on, names = list(on), {key: f"{prefix}.{key}" for key in keys}
    if not names:
        return table
    wide = counts.lazy().group_by(on).agg(
        pl.col("n").filter(pl.col("key") == key).first().cast(pl.Int64).alias(name) for key, name in names.items())
    return (table.lazy().join(wide, on=on, how="left", nulls_equal=True, maintain_order="left")
            .with_columns(pl.col(*names.values()).fill_null(0)).collect(engine=ENGINE))


def known_sum(column: str) -> pl.Expr:
    """The sum, or null when no value is known (rather than polars' 0)."""
    return pl.when(pl.col(column).count() > 0).then(pl.col(column).sum())
