"""Choosing steps and summarising a per-step report over them (`--steps`, `--agg`).

The statistic row of a report has `step` null, `agg` (its name) and `n_steps`, one per device.
A number column gets the statistic over the steps: a count's (an integer column that is not a
time, `*_ns`, nor a size, `*_bytes`) to a tenth — the mean of 4 and 5 calls is 4.5 calls per
step, never cut to 4; where every statistic of the column is whole, it stays an integer —, a time's or a size's to the whole ns or byte, any other figure's
unrounded (the mean of one step is that step's figure, to its last digit). In a ledger (a list of records, such as breakdown's `parts`), each record's numbers
get it per key, a step without the key counting as 0 (a null figure of a step that has the key
— an unknown `tflops` — stays out of the statistic), except in a rate — `mean_*`, `*_gbps`,
`tflops`, `pct_peak`, a ratio of the record's own figures —, where such a step stays out.

A record's key is its text fields, the numbers that name something (`device`, `stream`) and
the innermost name of a list of names (syncs' `blame`, whose list is the record's own from the
first step that has the key); a kernels group named by its kernel or op is keyed by that name
alone, its `category` and `coll_kind` over the steps their one value, else `mixed`; a list of
records inside a record (syncs' `chains`) has no statistic and is null there. p90 is the 90th
percentile, linearly interpolated.
"""

from __future__ import annotations

import polars as pl

from tracekit.core.errors import UsageError

AGGS = ("median", "mean", "p90", "min", "max")


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


IDENTIFIERS = ("step", "device", "stream")  # numbers that name something: keys, not figures
# Fields that describe a kernels group named by its kernel or op (an op's category is `mixed` in a
# step where it launched a kernel and a memset): not keys; over the steps, their one value, else `mixed`
DESCRIBING = {"kernels": ("category", "coll_kind")}


def is_rate(name: str) -> bool:
    """A record's figure that is a ratio of its own (a mean duration, a throughput): not 0 in a
    step without the record, so such a step stays out of its statistic."""
    return name.startswith("mean_") or name.endswith("_gbps") or name in ("tflops", "pct_peak")


def is_count(name: str, dtype) -> bool:
    """An integer column that is neither a time (`ns`, `*_ns`) nor a size (`bytes`, `*_bytes`)."""
    leaf = name.rsplit(".", 1)[-1]
    return dtype.is_integer() and leaf not in ("ns", "bytes") and not leaf.endswith(("_ns", "_bytes"))


def statistic(column: str, dtype, agg: str) -> pl.Expr:
    """The statistic of `column` over the rows: a count's to a tenth (a float), a time's or a
    size's to the whole ns or byte, another figure's unrounded (the tables round it as they
    round the steps' figures)."""
    expr = pl.col(column)
    value = {"median": expr.median(), "mean": expr.mean(), "p90": expr.quantile(0.9, "linear"),
             "min": expr.min(), "max": expr.max()}[agg]
    if is_count(column, dtype):
        return value.round(1).alias(column)
    if dtype.is_integer():
        return value.round(0).cast(dtype).alias(column)
    return value.alias(column)


def with_aggregate(frame: pl.DataFrame, agg: str | None) -> pl.DataFrame:
    """`frame` with one statistic row per device appended (none without `agg`)."""
    if agg is None:
        return frame
    key = pl.col("device") if "device" in frame.columns else pl.lit(0, pl.Int64)
    steps = frame.filter(pl.col("step").is_not_null()).with_columns(_group=key)
    numbers = [c for c, t in frame.schema.items() if t.is_numeric() and c not in IDENTIFIERS]
    ledgers = [c for c, t in frame.schema.items() if isinstance(t, pl.List) and isinstance(t.inner, pl.Struct)]
    kept = [pl.col("device").first()] if "device" in frame.columns else []
    rows = steps.group_by("_group", maintain_order=True).agg(
        pl.len().cast(pl.Int64).alias("n_steps"), *kept, *[statistic(c, frame.schema[c], agg) for c in numbers])
    rows = whole_counts(rows, {c: frame.schema[c] for c in numbers if is_count(c, frame.schema[c])})
    for column in ledgers:
        rows = rows.join(ledger_statistic(steps, column, agg), on="_group", how="left", nulls_equal=True)
    rows = rows.drop("_group").with_columns(step=pl.lit(None, pl.Int64), agg=pl.lit(agg))
    return pl.concat([frame, rows], how="diagonal_relaxed").select(*frame.columns, "agg", "n_steps")


def whole_counts(rows: pl.DataFrame, counts: dict) -> pl.DataFrame:
    """`rows` with each count column (name → its integer dtype over the steps) back in that
    dtype where every statistic of it is a whole number (the mean of 870 and 870 calls is 870,
    not 870.0); a count with a fraction (4.5) stays a float."""
    whole = [c for c in counts if rows[c].drop_nulls().eq(rows[c].drop_nulls().round(0)).all()]
    return rows.with_columns(pl.col(c).cast(counts[c]) for c in whole)


def is_names(dtype) -> bool:
    return isinstance(dtype, pl.List) and dtype.inner == pl.String


def ledger_statistic(steps: pl.DataFrame, column: str, agg: str) -> pl.DataFrame:
    """_group, the ledger `column`: per record key, the statistic over the group's steps (a step
    without the key counts 0), the keys in the order the steps first have them."""
    fields = {f.name: f.dtype for f in steps.schema[column].inner.fields}
    numbers = [n for n, t in fields.items() if t.is_numeric() and n not in IDENTIFIERS]
    names = [n for n, t in fields.items() if is_names(t)]
    described = DESCRIBING.get(column, ()) if {"name", "op"} & set(fields) else ()
    keys = [n for n, t in fields.items()
            if n not in numbers and n not in described and not isinstance(t, (pl.List, pl.Struct))]
    keys += [f"_innermost.{n}" for n in names]
    records = (steps.select("_group", "step", column).explode(column).drop_nulls(column).unnest(column)
               .with_columns(pl.col(n).list.first().alias(f"_innermost.{n}") for n in names)
               .with_columns(_present=pl.lit(True)))
    every = steps.select("_group", "step").join(records.select("_group", *keys).unique(maintain_order=True),
                                                on="_group", maintain_order="right")
    full = every.join(records.select("_group", "step", *keys, *numbers, "_present"), on=["_group", "step", *keys],
                      how="left", nulls_equal=True, maintain_order="left").with_columns(
        pl.when(pl.col("_present").is_null()).then(None if is_rate(n) else 0).otherwise(pl.col(n)).alias(n)
        for n in numbers)
    per_key = full.group_by("_group", *keys, maintain_order=True).agg(statistic(n, fields[n], agg) for n in numbers)
    per_key = whole_counts(per_key, {n: fields[n] for n in numbers if is_count(n, fields[n])})
    details = records.group_by("_group", *keys, maintain_order=True).agg(
        *[pl.col(n).first() for n in names],
        *[pl.when(pl.col(n).n_unique() == 1).then(pl.col(n).first()).otherwise(pl.lit("mixed")).alias(n)
          for n in described])
    per_key = per_key.join(details, on=["_group", *keys], how="left", nulls_equal=True, maintain_order="left")
    per_key = per_key.with_columns(pl.lit(None, t).alias(n) for n, t in fields.items() if n not in per_key.columns)
    return per_key.group_by("_group", maintain_order=True).agg(pl.struct(*fields).alias(column))
