"""Choosing steps and summarising a per-step report over them (`--steps`, `--agg`).

The statistic row of a report has `step` null, `agg` (its name) and `n_steps`, one per device.
A number column gets the statistic over the steps; in a ledger (a list of records, such as
breakdown's `parts`), each record's numbers get it per key (the record's text fields), a step
without the key counting as 0 (a null figure of a step that has the key — an unknown
`tflops` — stays out of the statistic). p90 is the 90th percentile, linearly interpolated.
"""

from __future__ import annotations

import polars as pl

from tracekit.core.errors import UsageError

AGGS = ("median", "mean", "p90", "min", "max")


def parse_steps(text: str) -> str | list[int]:
    """`all`, or step numbers: `3`, `3,5`, `3-7` (inclusive) and mixes of them."""
    if text == "all":
        return "all"
    steps = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            if int(hi or lo) < int(lo):
                raise UsageError(f"--steps {text!r}: a range N-M needs N ≤ M")
            steps += list(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise UsageError(f"--steps {text!r}: use all, N, N,M or N-M") from None
    return steps


def selected(frame: pl.DataFrame, steps, source: str = "the trace") -> pl.DataFrame:
    """The rows of `steps` (rows of step null — whole-trace scope — always stay); a step that
    `source` does not have is a UsageError naming the steps it has."""
    if steps == "all":
        return frame
    have = frame["step"].drop_nulls().unique().sort().to_list()
    absent = sorted(set(steps) - set(have))
    if have and absent:
        raise UsageError(f"--steps: {source} has no step {', '.join(map(str, absent))} "
                         f"(its steps: {', '.join(map(str, have))})")
    return frame.filter(pl.col("step").is_in(steps) | pl.col("step").is_null())


def statistic(expr: pl.Expr, agg: str) -> pl.Expr:
    """The statistic, rounded to 2 decimals (integer columns are cast back by the caller)."""
    return {"median": expr.median(), "mean": expr.mean(), "p90": expr.quantile(0.9, "linear"),
            "min": expr.min(), "max": expr.max()}[agg].round(2)


def with_aggregate(frame: pl.DataFrame, agg: str | None) -> pl.DataFrame:
    """`frame` with one statistic row per device appended (none without `agg`)."""
    if agg is None:
        return frame
    key = pl.col("device") if "device" in frame.columns else pl.lit(0, pl.Int64)
    steps = frame.filter(pl.col("step").is_not_null()).with_columns(_group=key)
    numbers = [c for c, t in frame.schema.items() if t.is_numeric() and c not in ("step", "device")]
    ledgers = [c for c, t in frame.schema.items() if isinstance(t, pl.List) and isinstance(t.inner, pl.Struct)]
    kept = [pl.col("device").first()] if "device" in frame.columns else []
    rows = steps.group_by("_group", maintain_order=True).agg(
        pl.len().cast(pl.Int64).alias("n_steps"), *kept,
        *[statistic(pl.col(c), agg).cast(frame.schema[c], strict=False).alias(c) for c in numbers])
    for column in ledgers:
        rows = rows.join(ledger_statistic(steps, column, agg), on="_group", how="left", nulls_equal=True)
    rows = rows.drop("_group").with_columns(step=pl.lit(None, pl.Int64), agg=pl.lit(agg))
    return pl.concat([frame, rows], how="diagonal_relaxed").select(*frame.columns, "agg", "n_steps")


def ledger_statistic(steps: pl.DataFrame, column: str, agg: str) -> pl.DataFrame:
    """_group, the ledger `column`: per key, the statistic over the group's steps (a step
    without the key counts 0)."""
    inner = steps.schema[column].inner
    numbers = [f.name for f in inner.fields if f.dtype.is_numeric()]
    keys = [f.name for f in inner.fields if f.name not in numbers]
    records = (steps.select("_group", "step", column).explode(column).drop_nulls(column).unnest(column)
               .with_columns(_present=pl.lit(True)))
    every = steps.select("_group", "step").join(records.select("_group", *keys).unique(), on="_group")
    full = every.join(records, on=["_group", "step", *keys], how="left", nulls_equal=True).with_columns(
        pl.when(pl.col("_present").is_null()).then(0).otherwise(pl.col(c)).alias(c) for c in numbers)
    types = dict(zip([f.name for f in inner.fields], [f.dtype for f in inner.fields]))
    per_key = full.group_by("_group", *keys, maintain_order=True).agg(
        statistic(pl.col(c), agg).cast(types[c], strict=False).alias(c) for c in numbers)
    return per_key.group_by("_group", maintain_order=True).agg(pl.struct(*types).alias(column))
