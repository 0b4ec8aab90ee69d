"""Per-step counts as columns: one `prefix.key` column per key, 0 where a step has none;
sums that stay null when nothing is known."""

from __future__ import annotations

import polars as pl


def count_columns(table: pl.DataFrame, counts: pl.DataFrame, prefix: str, keys: list[str],
                  on: list[str] = ("step",)) -> pl.DataFrame:
    """`table` with a `prefix.key` Int64 column per key from `counts` (`on` columns, key, n),
    joined on `on` (nulls equal); dotted names nest in JSON."""
    on = list(on)
    for key in keys:
        col = counts.filter(pl.col("key") == key).select(*on, pl.col("n").cast(pl.Int64).alias(f"{prefix}.{key}"))
        table = table.join(col, on=on, how="left", nulls_equal=True).with_columns(pl.col(f"{prefix}.{key}").fill_null(0))
    return table


def known_sum(column: str) -> pl.Expr:
    """The sum, or null when no value is known (rather than polars' 0)."""
    return pl.when(pl.col(column).count() > 0).then(pl.col(column).sum())
